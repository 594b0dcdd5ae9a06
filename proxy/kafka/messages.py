"""Whole Kafka messages to and from bytes with kio, for the proxy's own requests.

The proxy's control connections (ApiVersions and Metadata towards upstream) and the
devstack's readiness probe build complete requests here; client traffic never goes
through this module. `decode_response` uses kio's native reader, which trusts array
counts (a corrupt one can exhaust memory) and refuses unknown tagged fields: it is for
tests and the devstack only; the proxy reads network bytes with proxy.protocol.wire.
"""

from __future__ import annotations

import io
import struct
from typing import Any, TypeVar

from kio.serial import entity_reader, entity_writer
from kio.static.primitive import i16, i32

T = TypeVar("T")
_SIZE = struct.Struct(">i")


def encode_request(request: Any, correlation_id: int, client_id: str = "tierproxy") -> bytes:
    """A framed request (size prefix, header of the right version, body)."""
    header_type = request.__header_schema__
    buffer = io.BytesIO()
    buffer.write(b"\0\0\0\0")
    entity_writer(header_type)(
        buffer,
        header_type(
            request_api_key=i16(request.__api_key__),
            request_api_version=i16(request.__version__),
            correlation_id=i32(correlation_id),
            client_id=client_id,
        ),
    )
    entity_writer(type(request))(buffer, request)
    frame = buffer.getbuffer()
    _SIZE.pack_into(frame, 0, len(frame) - 4)
    return bytes(frame)


def decode_response(frame: bytes | memoryview, response_type: type[T]) -> tuple[int, T]:
    """(correlation id, response) from a response frame without its size prefix."""
    header, offset = entity_reader(response_type.__header_schema__)(frame, 0)  # type: ignore[attr-defined]
    response, _ = entity_reader(response_type)(frame, offset)
    return int(header.correlation_id), response
