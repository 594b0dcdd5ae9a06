"""Reading a connection's Kafka frames into a buffer it owns (`asyncio.BufferedProtocol`).

The event loop receives straight into the reader's buffer (`get_buffer`/`buffer_updated`,
which uvloop and asyncio's TLS layer support) and the connection loops get `memoryview`
slices of it: a request or an answer is forwarded with no copy made in Python, and no
per-frame allocation (`asyncio.StreamReader` copied each byte three times: into a `bytes`,
onto its `bytearray`, and out again).

Validity: a view that `readexactly`, `read`, `peek` or `read_frame` returns is valid until
the next read call on the same reader. Whatever keeps bytes longer copies them: in
connection.py a request planned by tiering (the planners keep it), an answer queued
behind others, and the structure fetch_stream.py walks (`stream_walked_answer`).

The transports the views are written to may keep a piece they could not send at once
(uvloop holds the object, it does not copy it): the buffer's start is reused only once
those transports hold nothing (`forwards_to`); until then the reader moves on to a fresh
buffer and leaves the old one to the views that still hold it.

Flow control: reading pauses while the buffer is full and resumes once a read has made
room, so a connection holds at most its buffer (which starts small and doubles up to the
capacity while its bytes are mostly unread), plus a frame larger than the capacity, read
into a buffer of its own; writing is an ordinary `asyncio.StreamWriter` whose
`drain()` waits while the transport's buffer is above its limit.

Relaying without waking the loop: a connection loop that waits for its next frame
(`wait_frame`) may name a `relay` (`set_relay`), called as bytes arrive while it waits.
The relay forwards the whole frames it can from where they lie (`next_frame`,
`consume`) and leaves the rest; the loop is woken only for a frame the relay left, a
frame too large to wait for whole, or the connection's end. A request or small answer
that needs nothing but forwarding costs no future, no task step and no coroutine frames:
that is most of the proxy's Python per request (docs/benchmarks.md, "The relay").

Memory at rest: a buffer that grew (and the spare it left) goes back to the initial size
once the reader has waited `idle_shrink_s` with nothing unread, so a connection that
once carried large requests or answers and then idles holds 16 KiB, not twice the
capacity (2 MiB by default) for the rest of its life. One timer per grown reader, armed
when it starts waiting empty; a reader that keeps receiving pays nothing per frame.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Protocol, cast

from proxy.kafka.frames import FRAME_SIZE


class RelayFailed(Exception):
    """The relay set on a reader raised: the connection cannot go on (its cause is the
    relay's exception)."""


class FrameReader(Protocol):
    """What the connection loops read with; views are valid until the next read."""

    @property
    def buffered(self) -> int:
        """Bytes received and not read yet."""
        ...

    def has_frame(self) -> bool:
        """Whether a whole frame is buffered: the next `read_frame` will not wait."""
        ...

    async def readexactly(self, n: int) -> memoryview:
        """n bytes; IncompleteReadError if the connection ends first."""
        ...

    async def read(self, n: int, minimum: int = 1) -> memoryview:
        """Between `minimum` and n bytes, as many as have arrived; fewer only at the end
        of the connection (empty once nothing is left)."""
        ...

    async def peek(self, n: int) -> memoryview:
        """The next n bytes, left unread; IncompleteReadError if the connection ends."""
        ...

    async def read_frame(self, check_size: Callable[[int], None]) -> memoryview:
        """The next frame with its 4-byte size in front, in one piece; `check_size` judges
        the size before any of the body is waited for. IncompleteReadError if the
        connection ends first (its `partial` is what came of the frame, size included)."""
        ...


def _unreferenced(buffer: bytearray) -> bool:
    """Whether no view of `buffer` is left anywhere: a bytearray with live exports cannot
    be resized. (The buffer has room for one byte more: bytearray allocates its size + 1.)"""
    try:
        buffer.append(0)
    except BufferError:
        return False
    del buffer[-1]
    return True


# A connection's buffer starts this small and doubles, up to its capacity, as its unread
# bytes need: an idle connection holds little (bytearray(n) writes every byte of it).
INITIAL_BUFFER_BYTES = 16 * 1024
# A grown buffer goes back to the initial size after the reader waited this long with
# nothing unread: longer than the gaps of a busy connection (a consumer's long poll is
# 0.5 s by default, a producer's linger milliseconds), short against a connection's life.
IDLE_SHRINK_S = 10.0


class BufferedFrameReader:
    """A `FrameReader` over a buffer of up to `capacity` bytes, fed by `FrameProtocol`."""

    def __init__(
        self,
        capacity: int,
        loop: asyncio.AbstractEventLoop,
        idle_shrink_s: float = IDLE_SHRINK_S,
    ) -> None:
        self._capacity = capacity
        self._idle_shrink_s = idle_shrink_s
        self._idle_since = 0.0  # when the wait with nothing unread began
        self._idle_timer: asyncio.TimerHandle | None = None
        self.idle_looks = 0  # times the idle timer looked at the reader (tests wait on it)
        self._loop = loop
        self._size = min(capacity, INITIAL_BUFFER_BYTES)  # the buffer's, now
        self._buffer = bytearray(self._size)
        self._view = memoryview(self._buffer)
        self._spare: bytearray | None = None  # an earlier buffer, reused once unreferenced
        self._start = 0  # unread bytes: [_start, _end)
        self._end = 0
        self._large: memoryview | None = None  # a read larger than the buffer, direct
        self._large_got = 0
        self._want = 0  # bytes (or large-read bytes) the waiting read needs
        self._waiter: asyncio.Future[None] | None = None
        self._eof = False
        self._exception: BaseException | None = None
        self._transport: asyncio.Transport | None = None
        self._paused = False
        self._consumers: tuple[asyncio.WriteTransport, ...] = ()
        self._relay: Callable[[], None] | None = None
        self._frame_limit = capacity  # `wait_frame` waits for frames up to this, whole
        self._at_boundary = False  # the loop waits in `wait_frame`: the relay may run
        self._relay_error: Exception | None = None

    def forwards_to(self, *transports: asyncio.WriteTransport) -> None:
        """The transports this reader's views are written to: its buffer's start is
        reused only while they hold no unsent data."""
        self._consumers = transports

    def set_relay(self, relay: Callable[[], None] | None, frame_limit: int) -> None:
        """`relay()` runs as bytes arrive while the loop waits in `wait_frame`, and takes
        the whole frames it forwards itself (`next_frame`, `consume`); what it raises is
        raised in the loop by `wait_frame`, as `RelayFailed`. `wait_frame` returns at once
        for a frame larger than `frame_limit` (at most the capacity)."""
        self._relay = relay
        self._frame_limit = min(frame_limit, self._capacity)

    @property
    def buffered(self) -> int:
        return self._end - self._start

    @property
    def held_bytes(self) -> int:
        """The bytes of the buffer and of the spare it keeps for reuse (not those views
        handed out still keep alive)."""
        return self._size + (len(self._spare) if self._spare is not None else 0)

    def has_frame(self) -> bool:
        start = self._start
        if self._end - start < 4:
            return False
        (size,) = FRAME_SIZE.unpack_from(self._buffer, start)
        return self._end - start >= 4 + size

    def next_frame(self) -> memoryview | None:
        """The next frame, its size in front, if it is buffered whole (and no larger than
        `frame_limit`), left unread: `consume(len(frame))` takes it. Valid until the next
        read, as every view."""
        start = self._start
        size = self._next_size(start)
        if size < 0 or self._end - start < 4 + size or 4 + size > self._frame_limit:
            return None
        return self._view[start : start + 4 + size]

    def _next_size(self, start: int) -> int:
        """The size the frame at `start` gives itself, -1 if it is not buffered yet."""
        if self._end - start < 4:
            return -1
        return FRAME_SIZE.unpack_from(self._buffer, start)[0]

    def consume(self, n: int) -> None:
        """Take n bytes of what `next_frame` showed."""
        self._start += n

    # -- fed by the protocol ---------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:
        self._transport = transport

    def get_buffer(self, sizehint: int) -> memoryview:
        large = self._large
        if large is not None:
            return large[self._large_got :]
        return self._view[self._end :]

    def buffer_updated(self, nbytes: int) -> None:
        if self._large is not None:
            self._large_got += nbytes
            if self._large_got >= self._want:
                self._large = None  # what comes next goes to the buffer again
                self._wake()
            return
        self._end += nbytes
        if self._end == self._size:
            if self._size < self._capacity and (self._end - self._start) * 2 > self._size:
                # mostly unread: a larger buffer (the views handed out stay in the old)
                self._replace(min(self._size * 2, self._capacity))
            else:  # nothing more until a read makes room
                self._pause()
        if self._end - self._start < self._want:
            return
        if self._at_boundary and self._relay is not None:
            try:
                self._relay()
            except Exception as exc:  # noqa: BLE001 - raised in the loop, by `wait_frame`
                self._relay_error = exc
            need = self._frame_need()
            if need and self._relay_error is None:  # nothing left for the loop: wait on
                self._want = need
                self._make_room(need)
                self._resume()
                return
        self._at_boundary = False  # the loop takes over from the frame it is woken for
        self._wake()

    def feed_eof(self) -> None:
        self._eof = True
        self._disarm()
        self._wake()

    def set_exception(self, exc: BaseException) -> None:
        self._exception = exc
        self._disarm()
        self._wake()

    # -- reads -----------------------------------------------------------------------

    async def readexactly(self, n: int) -> memoryview:
        start = self._start
        if self._end - start < n:
            if n > self._capacity:
                return await self._read_large(n)
            await self._fill(n)
            start = self._start
        self._start = start + n
        return self._view[start : start + n]

    async def read(self, n: int, minimum: int = 1) -> memoryview:
        if self._end - self._start < minimum:
            try:
                await self._fill(minimum)
            except asyncio.IncompleteReadError:
                pass  # the end: what is left
        start = self._start
        stop = min(self._end, start + n)
        self._start = stop
        return self._view[start:stop]

    async def peek(self, n: int) -> memoryview:
        if self._end - self._start < n:
            await self._fill(n)
        return self._view[self._start : self._start + n]

    async def wait_frame(self) -> None:
        """Until the next frame is buffered whole, or its size says it is larger than
        `frame_limit` (or out of range), or the connection ended; the relay, if set, runs
        meanwhile. Reads nothing: the loop reads the frame it was woken for. Raises what
        the relay raised."""
        while need := self._frame_need():
            if self._exception is not None or self._eof:
                return
            await self._wait(need, at_boundary=True)
            if self._relay_error is not None:
                raise RelayFailed(repr(self._relay_error)) from self._relay_error

    def _frame_need(self) -> int:
        """The bytes the next frame needs buffered before `wait_frame` returns (4 for
        its size, then all of it); 0 once it may return."""
        start = self._start
        have = self._end - start
        if have < 4:
            return 4
        size = self._next_size(start)
        if size < 0 or 4 + size > self._frame_limit or have >= 4 + size:
            return 0
        return 4 + size

    async def read_frame(self, check_size: Callable[[int], None]) -> memoryview:
        if self._end - self._start < 4:
            await self._fill(4)
        (size,) = FRAME_SIZE.unpack_from(self._buffer, self._start)
        check_size(size)
        try:
            return await self.readexactly(size + 4)
        except asyncio.IncompleteReadError as exc:
            raise asyncio.IncompleteReadError(exc.partial, size + 4) from None

    # -- inside ----------------------------------------------------------------------

    async def _fill(self, n: int) -> None:
        """Until at least n (<= capacity) unread bytes are in the buffer, in one piece."""
        while self._end - self._start < n:
            if self._exception is not None:
                raise self._exception
            if self._eof:
                raise asyncio.IncompleteReadError(bytes(self._view[self._start : self._end]), n)
            await self._wait(n)

    async def _wait(self, n: int, at_boundary: bool = False) -> None:
        """Once, until bytes arrive that make n unread (or the end); `at_boundary`: the
        loop waits between frames, so the relay may run meanwhile."""
        self._make_room(n)
        self._resume()
        self._want = n
        self._at_boundary = at_boundary
        self._waiter = self._loop.create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None
            self._want = 0
            self._at_boundary = False

    def _make_room(self, n: int) -> None:
        """Before waiting for n (<= capacity) unread bytes: room for them from `_start`;
        the idle timer armed if a grown buffer is left empty."""
        if n > self._size:
            self._replace(min(max(n, self._size * 2), self._capacity))
        elif self._size - self._start < n:
            self._move_to_front()
        elif self._start == self._end and self._start and self._consumers_idle():
            self._start = self._end = 0  # empty: start over at the front, no copy
        if self._start == self._end and self._size > INITIAL_BUFFER_BYTES:
            self._idle_since = self._loop.time()  # a grown buffer, nothing unread
            if self._idle_timer is None:
                self._arm(self._idle_shrink_s)

    def _move_to_front(self) -> None:
        """Put the unread bytes at the buffer's start: in place if no transport holds a
        view of it, else in the spare buffer or a fresh one (the old one stays with the
        views that hold it)."""
        start, end = self._start, self._end
        if start == 0:
            return
        if not self._consumers_idle():
            self._replace(self._size)
            return
        if end > start:
            self._view[: end - start] = self._view[start:end]  # memoryview: a memmove
        self._start, self._end = 0, end - start

    def _replace(self, size: int) -> None:
        """Move the unread bytes to the start of another buffer of `size` bytes: the
        spare if it is that size and unreferenced, else a new one. The old one becomes
        the spare; the views handed out keep it alive, unchanged."""
        start, end = self._start, self._end
        spare = self._spare
        self._spare = self._buffer
        self._view.release()  # views handed out keep the old buffer alive, not this
        if spare is None or len(spare) != size or not _unreferenced(spare):
            spare = bytearray(size)
        old = memoryview(self._buffer)
        self._buffer, self._size = spare, size
        self._view = memoryview(spare)
        self._view[: end - start] = old[start:end]
        old.release()
        self._start, self._end = 0, end - start

    def _arm(self, delay: float) -> None:
        self._idle_timer = self._loop.call_later(delay, self._shrink_if_idle)

    def _disarm(self) -> None:
        if self._idle_timer is not None:
            self._idle_timer.cancel()
            self._idle_timer = None

    def _shrink_if_idle(self) -> None:
        """The idle timer: back to a buffer of the initial size, and no spare, if the
        reader has waited `idle_shrink_s` with nothing unread; again later if it has
        waited less; not at all if it is busy (the next empty wait arms it again)."""
        self._idle_timer = None
        self.idle_looks += 1
        empty = self._start == self._end and self._large is None
        if self._waiter is None or not empty or self._eof or self._exception is not None:
            return
        if self._want > INITIAL_BUFFER_BYTES:  # waits for a large read: it needs the room
            return
        waited = self._loop.time() - self._idle_since
        if waited < self._idle_shrink_s:
            self._arm(self._idle_shrink_s - waited)
            return
        self._spare = None
        if self._size > INITIAL_BUFFER_BYTES:
            # a new buffer, not the old one cut: views handed out keep the old one alive
            self._view.release()
            self._buffer = bytearray(INITIAL_BUFFER_BYTES)
            self._view = memoryview(self._buffer)
            self._size = INITIAL_BUFFER_BYTES
            self._start = self._end = 0

    def _consumers_idle(self) -> bool:
        for transport in self._consumers:  # a loop, not all(): this runs per frame
            if transport.get_write_buffer_size():
                return False
        return True

    async def _read_large(self, n: int) -> memoryview:
        """A read larger than the buffer, into a buffer of its own (the caller's)."""
        have = self._end - self._start
        large = memoryview(bytearray(n))
        large[:have] = self._view[self._start : self._end]
        self._start = self._end
        self._move_to_front()  # room again for what follows the large read
        self._large, self._large_got, self._want = large, have, n
        try:
            while self._large_got < n:
                if self._exception is not None:
                    raise self._exception
                if self._eof:
                    raise asyncio.IncompleteReadError(bytes(large[: self._large_got]), n)
                self._resume()
                self._waiter = self._loop.create_future()
                try:
                    await self._waiter
                finally:
                    self._waiter = None
        finally:
            self._large, self._want = None, 0
        return large

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _pause(self) -> None:
        if not self._paused and self._transport is not None:
            self._paused = True
            self._transport.pause_reading()

    def _resume(self) -> None:
        if self._paused and self._transport is not None:
            self._paused = False
            self._transport.resume_reading()


class FrameProtocol(asyncio.BufferedProtocol):
    """The asyncio adapter: feeds a `BufferedFrameReader`, and is the protocol of the
    connection's `asyncio.StreamWriter` (whose `drain()` waits here while writing is
    paused). `on_connection(reader, writer)` is called once connected.

    Not an `asyncio.streams.FlowControlMixin`: uvloop treats any `asyncio.Protocol`
    subclass as a plain protocol and would never call `get_buffer`."""

    def __init__(
        self,
        capacity: int,
        on_connection: Callable[[BufferedFrameReader, asyncio.StreamWriter], None] | None = None,
        idle_shrink_s: float = IDLE_SHRINK_S,
    ) -> None:
        self._loop = asyncio.get_running_loop()
        self.reader = BufferedFrameReader(capacity, self._loop, idle_shrink_s)
        self.writer: asyncio.StreamWriter | None = None
        self._on_connection = on_connection
        self._closed: asyncio.Future[None] = self._loop.create_future()
        self._over_ssl = False
        self._writing_paused = False
        self._connection_lost = False
        self._drain_waiters: list[asyncio.Future[None]] = []
        self.get_buffer = self.reader.get_buffer  # type: ignore[method-assign]
        self.buffer_updated = self.reader.buffer_updated  # type: ignore[method-assign]

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        self._over_ssl = transport.get_extra_info("sslcontext") is not None
        self.reader.connection_made(transport)
        self.writer = asyncio.StreamWriter(transport, self, None, self._loop)
        if self._on_connection is not None:
            self._on_connection(self.reader, self.writer)

    def eof_received(self) -> bool:
        self.reader.feed_eof()
        return not self._over_ssl  # as StreamReaderProtocol: keep a plain socket writable

    def connection_lost(self, exc: Exception | None) -> None:
        if exc is None:
            self.reader.feed_eof()
        else:
            self.reader.set_exception(exc)
        if not self._closed.done():
            self._closed.set_result(None)
        self._connection_lost = True
        self._writing_paused = False
        self._wake_drains(exc or ConnectionResetError("Connection lost"))

    @property
    def writing_paused(self) -> bool:
        """Whether the transport's buffer is above its limit (`drain()` would wait), or
        the connection is gone: a relay writes nothing then."""
        return self._writing_paused or self._connection_lost

    # -- what StreamWriter.drain() and wait_closed() use -----------------------------

    def pause_writing(self) -> None:
        self._writing_paused = True

    def resume_writing(self) -> None:
        self._writing_paused = False
        self._wake_drains(None)

    async def _drain_helper(self) -> None:
        if self._connection_lost:
            raise ConnectionResetError("Connection lost")
        if not self._writing_paused:
            return
        waiter: asyncio.Future[None] = self._loop.create_future()
        self._drain_waiters.append(waiter)
        try:
            await waiter
        finally:
            self._drain_waiters.remove(waiter)

    def _wake_drains(self, exc: BaseException | None) -> None:
        for waiter in self._drain_waiters:
            if not waiter.done():
                if exc is None:
                    waiter.set_result(None)
                else:
                    waiter.set_exception(exc)

    def _get_close_waiter(self, stream: asyncio.StreamWriter) -> asyncio.Future[None]:
        return self._closed


async def open_frames(
    host: str, port: int, capacity: int, **kwargs
) -> tuple[BufferedFrameReader, asyncio.StreamWriter]:
    """`asyncio.open_connection` with a `BufferedFrameReader` (kwargs: ssl, ...)."""
    loop = asyncio.get_running_loop()
    _, protocol = await loop.create_connection(
        lambda: FrameProtocol(capacity), host, port, **kwargs
    )
    assert protocol.writer is not None
    return protocol.reader, protocol.writer
