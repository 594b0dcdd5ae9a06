"""Request and response headers, read and written by hand: they are on every frame.

Request header v1: api_key int16, api_version int16, correlation_id int32, client_id
nullable string (int16 length, even in v2: Kafka kept it non-compact so any broker can
read it). v2 adds a tagged-field section. v0 (ControlledShutdown v0 only) has no client id.
Response header v0 is the correlation id; v1 adds a tagged-field section.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from proxy.kafka.frames import FrameError
from proxy.kafka.versions import (
    API_VERSIONS,
    APIS,
    is_flexible,
    is_known,
    request_header_version,
    response_header_version,
    spec,
)
from proxy.kafka.wire import INT16, INT32, read_int16, skip_nullable_string, skip_tagged_fields

_FIXED = struct.Struct(">hhi")  # api_key, api_version, correlation_id
API_PRODUCE = 0


@dataclass(frozen=True, slots=True)
class RequestHeader:
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    size: int  # bytes taken by the header: the body is frame[size:]


def parse_request_header(frame: memoryview | bytes) -> RequestHeader:
    """Read a request header without touching the body.

    Raises FrameError for a truncated header, an API key the proxy does not know, or a
    version of it the proxy cannot read, except for ApiVersions: any version of it
    parses, so that an unknown one can be answered with UNSUPPORTED_VERSION as Kafka does.
    """
    frame = memoryview(frame)
    if len(frame) < _FIXED.size:
        raise FrameError(f"request header truncated: {len(frame)} bytes, need at least 8")
    api_key, api_version, correlation_id = _FIXED.unpack_from(frame, 0)
    api = spec(api_key)
    if api_key != API_VERSIONS and not api.min_version <= api_version <= api.max_version:
        raise FrameError(f"unsupported version {api_version} of {api.name} (api key {api_key})")
    offset = _FIXED.size
    client_id = None
    try:
        length, offset = read_int16(frame, offset)
        if length >= 0:
            end = offset + length
            if end > len(frame):
                raise FrameError(f"client id of {length} bytes at byte {offset} of {len(frame)}")
            # Kafka decodes strings leniently too; a bad byte must not cost the connection.
            client_id = bytes(frame[offset:end]).decode("utf-8", errors="replace")
            offset = end
        if request_header_version(api_key, api_version) >= 2:
            offset = skip_tagged_fields(frame, offset)
    except FrameError as exc:
        raise FrameError(f"truncated {api.name} v{api_version} request header: {exc}") from None
    return RequestHeader(api_key, api_version, correlation_id, client_id, offset)


def request_header(api_key: int, api_version: int, correlation_id: int, client_id: str) -> bytes:
    """A request header for the proxy's own requests (header v1 or v2)."""
    encoded = client_id.encode()
    head = _FIXED.pack(api_key, api_version, correlation_id) + INT16.pack(len(encoded)) + encoded
    return head + b"\x00" if request_header_version(api_key, api_version) >= 2 else head


def response_header(correlation_id: int, api_key: int, api_version: int) -> bytes:
    head = INT32.pack(correlation_id)
    return head + b"\x00" if response_header_version(api_key, api_version) >= 1 else head


def response_header_size(api_key: int, api_version: int, frame: memoryview | bytes) -> int:
    """Bytes taken by the header of this response frame: its body is frame[size:]."""
    frame = memoryview(frame)
    if len(frame) < 4:
        raise FrameError(f"response header truncated: {len(frame)} bytes, need at least 4")
    if response_header_version(api_key, api_version) == 0:
        return 4
    try:
        return skip_tagged_fields(frame, 4)
    except FrameError as exc:
        raise FrameError(f"truncated response header: {exc}") from None


def produce_acks(api_version: int, body: memoryview | bytes) -> int:
    """The `acks` of a Produce request body (v3+), read without decoding the rest.

    The body starts with the nullable transactional_id (compact from v9), then acks.
    acks=0 means the broker sends no response at all.
    """
    body = memoryview(body)
    try:
        offset = skip_nullable_string(body, 0, compact=is_flexible(API_PRODUCE, api_version))
        acks, _ = read_int16(body, offset)
    except FrameError as exc:
        raise FrameError(f"truncated Produce v{api_version} request: {exc}") from None
    return acks


def header_rejection_reason(frame: memoryview) -> str:
    """The metric label for a request header `parse_request_header` refused."""
    if len(frame) < 8:
        return "truncated_header"
    api_key, api_version = struct.unpack_from(">hh", frame)
    if api_key not in APIS:
        return "unknown_api_key"
    if api_key != API_VERSIONS and not is_known(api_key, api_version):
        return "unsupported_version"
    return "truncated_header"
