"""Kafka framing: every request and response is an int32 size followed by that many bytes.

`FrameDecoder` is a push parser in the style of h11: `feed()` the bytes as they arrive,
then call `next_frame()` until it returns None. It holds the chunks it was fed without
joining them, so many small frames in one chunk are returned as zero-copy slices of that
chunk, and a large frame arriving in many chunks is joined exactly once, when complete.
"""

from __future__ import annotations

import struct
from collections import deque

FRAME_SIZE = struct.Struct(">i")  # the i32 size before every request and response
DEFAULT_MAX_FRAME_BYTES = 100 * 1024 * 1024  # Kafka's socket.request.max.bytes


class FrameError(Exception):
    """Bytes that are not a valid Kafka frame, header or body; the connection must close."""


class malformed:  # lower case: it reads as a function, `with malformed(...)`
    """Names what was being read in a FrameError raised inside: "malformed {what}: ...",
    so a bad frame says which message it broke in. Other exceptions pass unchanged; none
    is swallowed (`__exit__` returns None, which type checkers see)."""

    __slots__ = ("what",)

    def __init__(self, what: str) -> None:
        self.what = what

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: object, error: BaseException | None, traceback: object) -> None:
        if isinstance(error, FrameError):
            raise FrameError(f"malformed {self.what}: {error}") from None


class FedChunks:
    """The chunks a push parser was fed, unjoined: the base of `FrameDecoder` and of the
    peer protocol's reader (proxy/peer/codec.py), which parse them each their own way."""

    def __init__(self) -> None:
        self._chunks: deque[memoryview] = deque()
        self._buffered = 0  # bytes held in _chunks

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        if not data:
            return
        if not isinstance(data, bytes):
            # What is parsed is returned as views of what was fed: a buffer the caller
            # may reuse must be copied now.
            data = bytes(data)
        self._chunks.append(memoryview(data))
        self._buffered += len(data)


class FrameDecoder(FedChunks):
    """Splits a byte stream into frame bodies (without their 4-byte size prefix)."""

    def __init__(self, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> None:
        super().__init__()
        self.max_frame_bytes = max_frame_bytes
        self._size: int | None = None  # size of the frame being read, once known
        self._error: FrameError | None = None

    @property
    def buffered(self) -> int:
        """Bytes received but not yet returned as frames (including a pending size)."""
        return self._buffered + (4 if self._size is not None else 0)

    def next_frame(self) -> memoryview | None:
        """The next complete frame body, or None until more bytes are fed.

        Raises FrameError as soon as a size is read that is negative or above the limit,
        before any of that frame's body is buffered; the decoder stays failed after that.
        """
        if self._error is not None:
            raise self._error
        if self._size is None:
            if self._buffered < 4:
                return None
            (size,) = FRAME_SIZE.unpack(self._take(4))
            if size < 0:
                self._error = FrameError(f"negative frame size {size}")
                raise self._error
            if size > self.max_frame_bytes:
                self._error = FrameError(f"frame size {size} exceeds limit {self.max_frame_bytes}")
                raise self._error
            self._size = size
        if self._buffered < self._size:
            return None
        body = self._take(self._size)
        self._size = None
        return body

    def _take(self, n: int) -> memoryview:
        """Remove and return the first n buffered bytes (n <= self._buffered)."""
        if n == 0:
            return memoryview(b"")
        self._buffered -= n
        first = self._chunks[0]
        if len(first) > n:
            self._chunks[0] = first[n:]
            return first[:n]
        if len(first) == n:
            return self._chunks.popleft()
        # The bytes span chunks: join them once.
        parts = []
        while n:
            chunk = self._chunks[0]
            if len(chunk) <= n:
                parts.append(self._chunks.popleft())
                n -= len(chunk)
            else:
                parts.append(chunk[:n])
                self._chunks[0] = chunk[n:]
                n = 0
        return memoryview(b"".join(parts))


def frame(payload: bytes | bytearray | memoryview) -> bytes:
    """The payload with its int32 size in front."""
    return b"".join((FRAME_SIZE.pack(len(payload)), payload))


def framed(
    header: bytes | memoryview, body: bytes | memoryview
) -> tuple[bytes, bytes | memoryview, bytes | memoryview]:
    """A request's frame as pieces written one after another, nothing copied: its int32
    size, its header, its body (a split request sent upstream)."""
    return FRAME_SIZE.pack(len(header) + len(body)), header, body
