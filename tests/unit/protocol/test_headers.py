import datetime
import importlib
import io
import struct

import pytest
from kio.schema.request_header.v1.header import RequestHeader as RequestHeaderV1
from kio.schema.request_header.v2.header import RequestHeader as RequestHeaderV2
from kio.serial import entity_writer
from kio.static.primitive import i16, i32, i32Timedelta

from proxy.kafka.frames import FrameError
from proxy.kafka.headers import (
    RequestHeader,
    parse_request_header,
    produce_acks,
    request_header,
    response_header,
    response_header_size,
)
from proxy.kafka.versions import APIS


def kio_header(api_key: int, api_version: int, correlation_id: int, client_id: str | None):
    header_type = (
        RequestHeaderV2
        if api_version >= (APIS[api_key].first_flexible or 99)
        else (RequestHeaderV1)
    )
    out = io.BytesIO()
    entity_writer(header_type)(
        out,
        header_type(
            request_api_key=i16(api_key),
            request_api_version=i16(api_version),
            correlation_id=i32(correlation_id),
            client_id=client_id,
        ),
    )
    return out.getvalue()


def test_parse_header_v1():
    data = kio_header(3, 8, 42, "my-client") + b"BODY"
    header = parse_request_header(memoryview(data))
    assert header == RequestHeader(3, 8, 42, "my-client", len(data) - 4)
    assert bytes(memoryview(data)[header.size :]) == b"BODY"


def test_parse_header_v2_with_null_client_id():
    data = kio_header(3, 12, -7, None) + b"B"
    header = parse_request_header(data)
    assert (header.api_key, header.api_version, header.correlation_id) == (3, 12, -7)
    assert header.client_id is None
    assert data[header.size :] == b"B"


def test_parse_header_v2_skips_its_tagged_fields():
    head = kio_header(1, 13, 5, "c")[:-1]  # drop kio's empty tag section
    tags = b"\x02" + b"\x00\x03abc" + b"\x07\x01z"  # two tagged fields
    header = parse_request_header(head + tags + b"BODY")
    assert header.size == len(head) + len(tags)


def test_client_id_with_invalid_utf8_is_read_leniently():
    data = struct.pack(">hhih", 3, 1, 1, 2) + b"\xff\xfe"
    assert parse_request_header(data).client_id == "\ufffd\ufffd"


def test_unknown_api_key():
    with pytest.raises(FrameError, match=r"^unknown API key 999$"):
        parse_request_header(struct.pack(">hhih", 999, 0, 1, -1))


def test_unsupported_version():
    with pytest.raises(FrameError, match=r"^unsupported version 42 of Produce \(api key 0\)$"):
        parse_request_header(struct.pack(">hhih", 0, 42, 1, -1))


def test_api_versions_at_an_unknown_version_still_parses():
    # Newer than the proxy knows: header v2, as Kafka reads it, to answer UNSUPPORTED_VERSION.
    data = kio_header(18, 4, 99, "x")
    data = data[:2] + struct.pack(">h", 77) + data[4:]
    header = parse_request_header(data)
    assert (header.api_key, header.api_version, header.correlation_id) == (18, 77, 99)
    assert header.size == len(data)


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\x00\x03\x00\x01\x00\x00\x00",  # 7 bytes
        struct.pack(">hhi", 3, 1, 1),  # no client id length
        struct.pack(">hhih", 3, 1, 1, 10) + b"short",  # client id cut
        struct.pack(">hhih", 3, 12, 1, -1),  # v2 without its tag section
        struct.pack(">hhih", 3, 12, 1, -1) + b"\x01\x00\x05ab",  # tag value cut
    ],
)
def test_truncated_headers(data):
    with pytest.raises(FrameError, match="truncated"):
        parse_request_header(data)


def test_request_header_for_the_proxy_s_own_requests():
    assert request_header(3, 8, 7, "tierproxy") == kio_header(3, 8, 7, "tierproxy")
    assert request_header(3, 12, 7, "tierproxy") == kio_header(3, 12, 7, "tierproxy")


def test_response_headers():
    assert response_header(5, 3, 8) == b"\x00\x00\x00\x05"
    assert response_header(5, 3, 9) == b"\x00\x00\x00\x05\x00"
    assert response_header(5, 18, 3) == b"\x00\x00\x00\x05"  # ApiVersions: always v0


def test_response_header_size():
    assert response_header_size(3, 8, b"\x00\x00\x00\x05BODY") == 4
    assert response_header_size(3, 9, b"\x00\x00\x00\x05\x00BODY") == 5
    tagged = b"\x00\x00\x00\x05" + b"\x01" + b"\x00\x02hi" + b"BODY"  # one tagged field
    assert response_header_size(3, 9, tagged) == len(tagged) - 4
    assert response_header_size(18, 3, b"\x00\x00\x00\x05\x00BODY") == 4


def test_response_header_size_errors():
    with pytest.raises(FrameError, match="truncated"):
        response_header_size(3, 8, b"\x00\x00")
    with pytest.raises(FrameError, match="truncated"):
        response_header_size(3, 9, b"\x00\x00\x00\x05\x01\x00\x09")


def produce_body(api_version: int, transactional_id: str | None, acks: int) -> bytes:
    module = importlib.import_module(f"kio.schema.produce.v{api_version}.request")
    request = module.ProduceRequest(
        transactional_id=transactional_id,
        acks=i16(acks),
        timeout=i32Timedelta.parse(datetime.timedelta(seconds=30)),
        topic_data=(),
    )
    out = io.BytesIO()
    entity_writer(type(request))(out, request)
    return out.getvalue()


@pytest.mark.parametrize("api_version", range(APIS[0].min_version, APIS[0].max_version + 1))
@pytest.mark.parametrize("transactional_id", [None, "", "tx-ünïcode"])
@pytest.mark.parametrize("acks", [-1, 0, 1])
def test_produce_acks(api_version, transactional_id, acks):
    body = produce_body(api_version, transactional_id, acks)
    assert produce_acks(api_version, memoryview(body)) == acks


def test_produce_acks_of_a_truncated_body():
    body = produce_body(9, "tx", 0)
    with pytest.raises(FrameError, match=r"^truncated Produce v9 request"):
        produce_acks(9, body[:4])
