"""Request headers written by kio parse back, for every API key and version in the table."""

import io

from hypothesis import given, settings
from hypothesis import strategies as st
from kio.schema.request_header.v1.header import RequestHeader as KioHeaderV1
from kio.schema.request_header.v2.header import RequestHeader as KioHeaderV2
from kio.serial import entity_writer
from kio.static.primitive import i16, i32

from proxy.kafka.headers import RequestHeader, parse_request_header
from proxy.kafka.versions import APIS, request_header_version

EVERY_VERSION = [
    (api_key, version)
    for api_key, api in sorted(APIS.items())
    for version in range(api.min_version, api.max_version + 1)
]


def kio_header(api_key: int, version: int, correlation_id: int, client_id: str | None) -> bytes:
    header_type = KioHeaderV2 if request_header_version(api_key, version) == 2 else KioHeaderV1
    out = io.BytesIO()
    entity_writer(header_type)(
        out,
        header_type(
            request_api_key=i16(api_key),
            request_api_version=i16(version),
            correlation_id=i32(correlation_id),
            client_id=client_id,
        ),
    )
    return out.getvalue()


@settings(max_examples=40, deadline=None)
@given(
    correlation_id=st.integers(min_value=-(2**31), max_value=2**31 - 1),
    client_id=st.none() | st.text(max_size=40),
    body=st.binary(max_size=20),
)
def test_every_known_header_parses_back(correlation_id, client_id, body):
    for api_key, version in EVERY_VERSION:
        head = kio_header(api_key, version, correlation_id, client_id)
        parsed = parse_request_header(memoryview(head + body))
        assert parsed == RequestHeader(api_key, version, correlation_id, client_id, len(head))


@settings(max_examples=50, deadline=None)
@given(
    version=st.integers(min_value=APIS[18].max_version + 1, max_value=2**15 - 1),
    correlation_id=st.integers(min_value=-(2**31), max_value=2**31 - 1),
    client_id=st.none() | st.text(max_size=40),
)
def test_api_versions_headers_of_any_version_parse(version, correlation_id, client_id):
    head = kio_header(18, version, correlation_id, client_id)
    assert parse_request_header(head) == RequestHeader(
        18, version, correlation_id, client_id, len(head)
    )
