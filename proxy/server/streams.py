"""Reading Kafka frames off a connection's `FrameReader`: helpers of the connection loops.

The reader's views are valid until its next read (frame_reader.py): what is kept longer
is copied here (`read_whole`, and the pieces `stream_walked_answer` gathers).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from proxy.kafka.frames import FrameError
from proxy.kafka.wire import INT32
from proxy.server.frame_reader import FrameReader


class UpstreamClosed(Exception):
    """The broker closed the connection or answered out of turn."""


async def read_exactly(reader: FrameReader, n: int) -> memoryview:
    try:
        return await reader.readexactly(n)
    except asyncio.IncompleteReadError as exc:
        raise UpstreamClosed(
            f"connection closed by the broker, {n - len(exc.partial)} bytes short"
        ) from None


async def read_whole(reader: FrameReader, n: int, chunk_bytes: int) -> bytearray:
    """n bytes in one allocation of the caller's own, read a buffer at a time."""
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


def check_correlation_id(expected: int, frame: bytes | bytearray | memoryview) -> None:
    (correlation_id,) = INT32.unpack_from(frame, 0)
    if correlation_id != expected:
        raise UpstreamClosed(f"correlation id {correlation_id}, expected {expected}")


# structure and small fixed fields are gathered and sent with the next large piece
_GATHER_BELOW = 4096


async def stream_walked_answer(
    reader: FrameReader,
    head: bytes,
    remaining: int,
    walk,  # fetch_stream.Walk
    chunk_bytes: int,
    write: Callable[..., None],
    drain: Callable[[], Awaitable[None]],
    rewrite_tail: Callable[[memoryview], bytes | memoryview],
) -> None:
    """Pass on an answer of `remaining` bytes after `head` (its size and correlation id)
    as `walk` reads it: the bytes it asks for are read and sent on, those it jumps over
    pass through a buffer at a time, and what follows where it stops (the trailing tagged
    fields) is read whole and sent as `rewrite_tail` makes it. FrameError if the answer
    ends before the walk."""
    pending: list[bytes | memoryview] = [head]
    gathered = len(head)
    try:
        want = next(walk)
        while True:
            size = abs(want)
            if size > remaining:
                raise FrameError(f"the answer ends {size - remaining} bytes early")
            if want > 0 or size < _GATHER_BELOW:
                data = bytes(await read_exactly(reader, size))  # kept past the next read
                pending.append(data)
                gathered += size
                remaining -= size
                if gathered >= chunk_bytes:
                    write(*pending)
                    pending, gathered = [], 0
                    await drain()
                want = walk.send(data if want > 0 else b"")
                continue
            while size:
                chunk = await reader.read(min(size, chunk_bytes))
                if not chunk:
                    raise UpstreamClosed(f"connection closed by the broker, {size} bytes short")
                write(*pending, chunk)
                pending, gathered = [], 0
                size -= len(chunk)
                remaining -= len(chunk)
                await drain()
            want = walk.send(b"")
    except StopIteration:
        pass
    tail = await read_exactly(reader, remaining)
    write(*pending, rewrite_tail(memoryview(tail)))
    await drain()
