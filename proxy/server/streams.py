"""Reading Kafka frames off asyncio streams: helpers of the connection loops."""

from __future__ import annotations

import asyncio
import struct

_SIZE = struct.Struct(">i")


class UpstreamClosed(Exception):
    """The broker closed the connection or answered out of turn."""


async def read_exactly(reader: asyncio.StreamReader, n: int) -> bytes:
    try:
        return await reader.readexactly(n)
    except asyncio.IncompleteReadError as exc:
        raise UpstreamClosed(
            f"connection closed by the broker, {n - len(exc.partial)} bytes short"
        ) from None


async def read_whole(reader: asyncio.StreamReader, n: int, chunk_bytes: int) -> bytearray:
    """n bytes in one allocation, read a buffer at a time: `readexactly` would gather
    them in the reader's buffer and copy them out, holding two or three times as much."""
    frame = bytearray(n)
    got = 0
    with memoryview(frame) as view:
        while got < n:
            chunk = await reader.read(min(n - got, chunk_bytes))
            if not chunk:
                raise UpstreamClosed(f"connection closed by the broker, {n - got} bytes short")
            view[got : got + len(chunk)] = chunk
            got += len(chunk)
    return frame


def check_correlation_id(expected: int, frame: bytes | bytearray) -> None:
    (correlation_id,) = _SIZE.unpack_from(frame, 0)
    if correlation_id != expected:
        raise UpstreamClosed(f"correlation id {correlation_id}, expected {expected}")
