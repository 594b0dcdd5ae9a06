import datetime

import pytest
from kio.schema.api_versions.v0.response import ApiVersionsResponse as ApiVersionsResponseV0
from kio.schema.api_versions.v3.request import ApiVersionsRequest
from kio.schema.errors import ErrorCode

from proxy.apis.api18_api_versions import (
    RESPONSES,
    UNSUPPORTED_VERSION,
    ApiVersionsError,
    encode_api_versions_response,
    intersect,
    parse_api_versions_response,
    proxy_supported_ranges,
    unsupported_version_response,
)
from proxy.kafka.codec import decode, encode
from proxy.kafka.frames import FrameError
from proxy.kafka.headers import response_header_size
from proxy.kafka.schema_walk import validate

RANGES = {0: (3, 12), 3: (0, 13), 18: (0, 4)}


@pytest.mark.parametrize("api_version", sorted(RESPONSES))
def test_encode_then_parse_gives_the_ranges_back(api_version):
    body = encode_api_versions_response(api_version, RANGES)
    assert parse_api_versions_response(api_version, memoryview(body)) == RANGES


def test_encoded_v3_answer_as_kio_reads_it():
    body = encode_api_versions_response(3, RANGES, throttle_ms=250)
    answer = decode(RESPONSES[3], body)
    assert answer.error_code == ErrorCode.none
    assert [(k.api_key, k.min_version, k.max_version) for k in answer.api_keys] == [
        (0, 3, 12),
        (3, 0, 13),
        (18, 0, 4),
    ]
    assert answer.throttle_time == datetime.timedelta(milliseconds=250)
    assert answer.supported_features == () and answer.finalized_features == ()


def test_unsupported_version_response_is_what_kafka_sends():
    payload = unsupported_version_response(1234, RANGES)
    assert payload[:4] == (1234).to_bytes(4, "big")
    assert response_header_size(18, 7, payload) == 4  # header v0
    answer = decode(ApiVersionsResponseV0, payload[4:])
    assert answer.error_code == ErrorCode.unsupported_version
    # KIP-511: just the ApiVersions range, from which the client picks its version.
    assert [(k.api_key, k.min_version, k.max_version) for k in answer.api_keys] == [(18, 0, 4)]


def test_unsupported_version_response_falls_back_to_the_proxy_s_own_range():
    answer = decode(ApiVersionsResponseV0, unsupported_version_response(1, {})[4:])
    assert [(k.api_key, k.min_version, k.max_version) for k in answer.api_keys] == [(18, 0, 4)]


def test_upstream_unsupported_version_answer_comes_in_the_v0_shape():
    body = encode_api_versions_response(0, {18: (0, 3)}, error_code=UNSUPPORTED_VERSION)
    with pytest.raises(ApiVersionsError) as raised:
        parse_api_versions_response(4, body)  # asked v4, answered in v0 shape
    assert raised.value.error_code == UNSUPPORTED_VERSION
    assert raised.value.ranges == {18: (0, 3)}


def test_upstream_error_other_than_unsupported_version():
    body = encode_api_versions_response(3, {}, error_code=ErrorCode.cluster_authorization_failed)
    with pytest.raises(ApiVersionsError, match="error code 31") as raised:
        parse_api_versions_response(3, body)
    assert raised.value.ranges == {}


def test_malformed_upstream_answer():
    body = encode_api_versions_response(3, RANGES)
    with pytest.raises(FrameError, match="ApiVersionsResponse v3"):
        parse_api_versions_response(3, body[:-3])
    with pytest.raises(FrameError, match="bytes after the end"):
        parse_api_versions_response(3, body + b"\x00")


def test_intersect():
    upstream = {0: (3, 12), 1: (4, 17), 3: (0, 13), 50: (0, 0), 18: (0, 4)}
    proxy = {0: (3, 13), 1: (4, 18), 3: (1, 12), 18: (0, 4), 60: (0, 2)}
    caps = {1: 15, 18: 4}
    assert intersect(upstream, proxy, caps) == {
        0: (3, 12),
        1: (4, 15),
        3: (1, 12),
        18: (0, 4),
    }


def test_intersect_drops_keys_left_without_a_version():
    assert intersect({0: (3, 5)}, {0: (6, 9)}, {}) == {}
    assert intersect({1: (4, 17)}, {1: (4, 18)}, {1: 3}) == {}


def test_proxy_supported_ranges_cover_the_rewritten_apis():
    ranges = proxy_supported_ranges()
    for api_key in (0, 1, 3, 10, 18, 60):
        assert api_key in ranges


def test_validate_an_api_versions_request_body():
    body = encode(ApiVersionsRequest(client_software_name="x", client_software_version="1"))
    validate(ApiVersionsRequest, body)
    with pytest.raises(FrameError, match=r"^malformed ApiVersionsRequest v3: truncated"):
        validate(ApiVersionsRequest, body[:-2])
    with pytest.raises(FrameError, match=r"^1 bytes after the end of ApiVersionsRequest v3$"):
        validate(ApiVersionsRequest, body + b"\x00")


def test_common_ranges_keeps_what_every_broker_supports():
    from proxy.apis.api18_api_versions import common_ranges

    old = {0: (3, 11), 1: (4, 16), 3: (0, 12), 68: (0, 0)}
    new = {0: (3, 12), 1: (4, 17), 3: (0, 13), 50: (0, 1)}
    assert common_ranges([old, new]) == {0: (3, 11), 1: (4, 16), 3: (0, 12)}
    assert common_ranges([{0: (3, 5)}, {0: (6, 9)}]) == {}  # no version in common
    assert common_ranges([old]) == old
