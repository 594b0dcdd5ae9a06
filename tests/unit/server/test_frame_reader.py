"""The connection's frame reader (proxy/server/frame_reader.py): frames however the bytes
arrive, views that stay valid while a transport holds them, and flow control both ways.

Fed by hand for the exhaustive cases (every split point), over a real loopback socket
pair, on asyncio's loop and on uvloop, for the rest."""

from __future__ import annotations

import asyncio
import socket
import struct
from collections.abc import Awaitable, Callable

import pytest
import uvloop

from proxy.server.frame_reader import (
    INITIAL_BUFFER_BYTES,
    BufferedFrameReader,
    FrameProtocol,
    RelayFailed,
)
from tests.support.waiting import eventually


def framed(body: bytes) -> bytes:
    return struct.pack(">i", len(body)) + body


def no_check(size: int) -> None:
    pass


async def feed(reader: BufferedFrameReader, data: bytes) -> None:
    """As the event loop does: into `get_buffer`, then `buffer_updated`; waits for a
    read to make room when the buffer is full."""
    while data:
        buffer = reader.get_buffer(-1)
        if not buffer:
            await asyncio.sleep(0)  # full: the reading task makes room
            continue
        n = min(len(buffer), len(data))
        buffer[:n] = data[:n]
        reader.buffer_updated(n)
        data = data[n:]


async def read_frames(reader: BufferedFrameReader, count: int) -> list[bytes]:
    return [bytes(await reader.read_frame(no_check)) for _ in range(count)]


# Small enough that the third frame is larger than the buffer, and that the others cross
# its end (the unread bytes are moved to the front).
CAPACITY = 24
FRAMES = [framed(b"a" * 10), framed(b""), framed(b"xyz" * 7), framed(b"0123456789" * 2)]
STREAM = b"".join(FRAMES)


@pytest.mark.parametrize("split", range(len(STREAM) + 1))
async def test_frames_split_across_reads_at_every_byte_boundary(split):
    reader = BufferedFrameReader(CAPACITY, asyncio.get_running_loop())
    task = asyncio.ensure_future(read_frames(reader, len(FRAMES)))
    await feed(reader, STREAM[:split])
    await asyncio.sleep(0)  # the reader takes what it can of the first part
    await feed(reader, STREAM[split:])
    assert await task == FRAMES


async def test_frames_arriving_a_byte_at_a_time():
    reader = BufferedFrameReader(CAPACITY, asyncio.get_running_loop())
    task = asyncio.ensure_future(read_frames(reader, len(FRAMES)))
    for i in range(len(STREAM)):
        await feed(reader, STREAM[i : i + 1])
        await asyncio.sleep(0)
    assert await task == FRAMES


async def test_a_partial_frame_waits_for_the_rest():
    reader = BufferedFrameReader(CAPACITY, asyncio.get_running_loop())
    await feed(reader, FRAMES[0][:7])
    task = asyncio.ensure_future(reader.read_frame(no_check))
    await asyncio.sleep(0)
    assert not task.done()
    await feed(reader, FRAMES[0][7:])
    assert bytes(await task) == FRAMES[0]


async def test_a_frame_larger_than_the_buffer_is_read_into_its_own():
    reader = BufferedFrameReader(CAPACITY, asyncio.get_running_loop())
    big = framed(bytes(range(256)) * 4)
    after = framed(b"next")
    task = asyncio.ensure_future(read_frames(reader, 2))
    await feed(reader, big + after)
    assert await task == [big, after]


async def test_the_size_is_judged_before_the_body_is_waited_for():
    reader = BufferedFrameReader(CAPACITY, asyncio.get_running_loop())
    await feed(reader, struct.pack(">i", 1000))  # and no body

    def too_big(size: int) -> None:
        raise ValueError(size)

    with pytest.raises(ValueError, match="1000"):
        await reader.read_frame(too_big)


@pytest.mark.parametrize("cut", [0, 2, 4, 9])
async def test_eof_mid_frame_says_how_much_came(cut):
    reader = BufferedFrameReader(CAPACITY, asyncio.get_running_loop())
    await feed(reader, FRAMES[0][:cut])
    reader.feed_eof()
    with pytest.raises(asyncio.IncompleteReadError) as ended:
        await reader.read_frame(no_check)
    assert ended.value.partial == FRAMES[0][:cut]
    assert ended.value.expected == (4 if cut < 4 else len(FRAMES[0]))


async def test_eof_mid_frame_larger_than_the_buffer():
    reader = BufferedFrameReader(CAPACITY, asyncio.get_running_loop())
    big = framed(b"b" * 100)
    task = asyncio.ensure_future(reader.read_frame(no_check))
    await feed(reader, big[:60])
    await asyncio.sleep(0)
    reader.feed_eof()
    with pytest.raises(asyncio.IncompleteReadError) as ended:
        await task
    assert ended.value.partial == big[:60]


async def test_read_returns_what_has_come_and_empty_at_the_end():
    reader = BufferedFrameReader(CAPACITY, asyncio.get_running_loop())
    await feed(reader, b"abcdef")
    assert bytes(await reader.read(4)) == b"abcd"
    assert bytes(await reader.read(100)) == b"ef"
    reader.feed_eof()
    assert bytes(await reader.read(100)) == b""


async def test_a_frame_larger_than_the_first_buffer_grows_it():
    reader = BufferedFrameReader(1 << 20, asyncio.get_running_loop())
    small = framed(b"s" * 100)
    big = framed(bytes(range(256)) * 400)  # 100 KiB: more than the first buffer
    task = asyncio.ensure_future(read_frames(reader, 3))
    await feed(reader, small + big + small)
    assert await task == [small, big, small]


async def test_an_unread_buffer_grows_instead_of_pausing_until_its_capacity():
    capacity = 64 * 1024
    reader = BufferedFrameReader(capacity, asyncio.get_running_loop())
    kept = []
    data = bytes(range(256)) * (capacity // 256)
    await feed(reader, data)  # nobody reads: it grows until it holds all of it
    assert reader.buffered == capacity
    kept.append(await reader.readexactly(10))
    assert bytes(await reader.read(capacity)) == data[10:]
    assert bytes(kept[0]) == data[:10]


class HoldingTransport:
    """A transport that has not sent what it was given yet (or has)."""

    def __init__(self) -> None:
        self.unsent = 0

    def get_write_buffer_size(self) -> int:
        return self.unsent


async def test_a_view_a_transport_still_holds_is_never_overwritten():
    reader = BufferedFrameReader(CAPACITY, asyncio.get_running_loop())
    transport = HoldingTransport()
    reader.forwards_to(transport)  # type: ignore[arg-type]
    first = framed(b"f" * 12)
    await feed(reader, first + b"\x00\x00")
    held = await reader.read_frame(no_check)  # 16 bytes: the next frame must move
    transport.unsent = len(held)
    task = asyncio.ensure_future(reader.read_frame(no_check))
    second = framed(b"s" * 16)
    await feed(reader, second[2:])
    assert bytes(await task) == second
    assert bytes(held) == first  # the reader moved to another buffer, not over it
    # once the transport has sent everything, the buffer is reused in place again
    transport.unsent = 0
    later = framed(b"L" * 18)
    task = asyncio.ensure_future(reader.read_frame(no_check))
    await feed(reader, later)
    assert bytes(await task) == later


async def test_a_grown_buffer_goes_back_to_the_initial_size_once_idle():
    reader = BufferedFrameReader(1 << 20, asyncio.get_running_loop(), idle_shrink_s=0.05)
    big = framed(bytes(range(256)) * 2000)  # 500 KiB: the buffer grows to 512 KiB
    task = asyncio.ensure_future(read_frames(reader, 1))
    await feed(reader, big)
    assert await task == [big]
    assert reader.held_bytes >= len(big)
    waiting = asyncio.ensure_future(read_frames(reader, 3))  # nothing unread: idle
    await eventually(lambda: reader.held_bytes == INITIAL_BUFFER_BYTES, what="the buffer shrinks")
    small = framed(b"s" * 100)
    await feed(reader, small + big + small)  # it grows again as it needs
    assert await waiting == [small, big, small]


async def test_a_view_handed_out_keeps_its_bytes_when_the_buffer_shrinks():
    reader = BufferedFrameReader(1 << 20, asyncio.get_running_loop(), idle_shrink_s=0.05)
    big = framed(bytes(range(256)) * 2000)
    task = asyncio.ensure_future(reader.read_frame(no_check))
    await feed(reader, big)
    view = await task  # a transport may still hold it
    waiting = asyncio.ensure_future(reader.read_frame(no_check))
    await eventually(lambda: reader.held_bytes == INITIAL_BUFFER_BYTES, what="the buffer shrinks")
    assert bytes(view) == big
    await feed(reader, FRAMES[0])
    assert bytes(await waiting) == FRAMES[0]


async def test_a_reader_that_received_since_it_began_waiting_keeps_its_buffer():
    # The timer is armed when the reader waits with nothing unread; half a frame comes
    # before it goes off: it looks, finds bytes unread, and leaves the buffer as it is.
    reader = BufferedFrameReader(1 << 20, asyncio.get_running_loop(), idle_shrink_s=0.05)
    big = framed(bytes(range(256)) * 2000)
    task = asyncio.ensure_future(read_frames(reader, 1))
    await feed(reader, big)
    assert await task == [big]
    grown = reader.held_bytes
    task = asyncio.ensure_future(read_frames(reader, 1))
    await asyncio.sleep(0)  # it waits, nothing unread: the timer is armed
    await feed(reader, big[:1000])
    await eventually(lambda: reader.idle_looks == 1, what="the idle timer looks")
    assert not task.done() and reader.held_bytes == grown
    await feed(reader, big[1000:])
    assert await task == [big]


# -- the relay: frames forwarded from the reader's callback ------------------------------


class Relay:
    """Takes every frame whose first body byte is not b"!" (those it leaves to the loop)."""

    def __init__(self, reader: BufferedFrameReader) -> None:
        self.reader = reader
        self.took: list[bytes] = []
        self.calls = 0

    def __call__(self) -> None:
        self.calls += 1
        while (frame := self.reader.next_frame()) is not None:
            if frame[4:5] == b"!":
                return
            self.took.append(bytes(frame))
            self.reader.consume(len(frame))


async def test_frames_the_relay_takes_never_wake_the_waiting_loop():
    reader = BufferedFrameReader(CAPACITY, asyncio.get_running_loop())
    relay = Relay(reader)
    reader.set_relay(relay, CAPACITY)
    waiting = asyncio.ensure_future(reader.wait_frame())
    await asyncio.sleep(0)
    # every split point of frames that cross the buffer's end: relayed, none left
    relayed = [framed(b"a" * 10), framed(b""), framed(b"0123456789" * 2), framed(b"b" * 3)]
    stream = b"".join(relayed)
    for i in range(len(stream)):
        await feed(reader, stream[i : i + 1])
        await asyncio.sleep(0)
        assert not waiting.done()
    assert relay.took == relayed and reader.buffered == 0
    left = framed(b"!left")
    await feed(reader, left[:3])  # a part: still waiting
    await asyncio.sleep(0)
    assert not waiting.done()
    await feed(reader, left[3:] + framed(b"after"))
    await waiting  # woken for the frame the relay left, which is read as usual
    assert relay.took == relayed
    assert bytes(await reader.read_frame(no_check)) == left
    assert bytes(await reader.read_frame(no_check)) == framed(b"after")


async def test_the_relay_runs_only_while_the_loop_waits_for_a_frame():
    reader = BufferedFrameReader(CAPACITY, asyncio.get_running_loop())
    relay = Relay(reader)
    reader.set_relay(relay, CAPACITY)
    reading = asyncio.ensure_future(reader.read_frame(no_check))  # the loop mid-frame
    await asyncio.sleep(0)
    await feed(reader, framed(b"a" * 5) + framed(b"b"))
    assert bytes(await reading) == framed(b"a" * 5)
    assert relay.calls == 0  # nothing taken from under a read
    await reader.wait_frame()  # a whole frame is there: no wait, no relay
    assert relay.calls == 0 and bytes(await reader.read_frame(no_check)) == framed(b"b")


@pytest.mark.parametrize("size", [CAPACITY - 3, CAPACITY * 3, -5])
async def test_wait_frame_returns_at_once_for_a_frame_over_the_limit(size):
    """Over the limit (or a size out of range): the loop judges it by its size, before
    its body comes, as `read_frame` does; the relay never sees it whole."""
    reader = BufferedFrameReader(CAPACITY, asyncio.get_running_loop())
    relay = Relay(reader)
    reader.set_relay(relay, CAPACITY - 4)
    waiting = asyncio.ensure_future(reader.wait_frame())
    await asyncio.sleep(0)
    await feed(reader, struct.pack(">i", size))
    await asyncio.wait_for(waiting, 5)
    assert relay.took == [] and reader.buffered == 4


async def test_wait_frame_returns_at_the_end_and_after_a_relay_error():
    reader = BufferedFrameReader(CAPACITY, asyncio.get_running_loop())
    reader.set_relay(Relay(reader), CAPACITY)
    waiting = asyncio.ensure_future(reader.wait_frame())
    await asyncio.sleep(0)
    await feed(reader, framed(b"x")[:3])
    reader.feed_eof()
    await asyncio.wait_for(waiting, 5)
    with pytest.raises(asyncio.IncompleteReadError):
        await reader.read_frame(no_check)

    broken = BufferedFrameReader(CAPACITY, asyncio.get_running_loop())

    def fails() -> None:
        raise RuntimeError("the relay broke")

    broken.set_relay(fails, CAPACITY)
    waiting = asyncio.ensure_future(broken.wait_frame())
    await asyncio.sleep(0)
    await feed(broken, framed(b"y"))
    with pytest.raises(RelayFailed, match="the relay broke") as failed:
        await asyncio.wait_for(waiting, 5)
    assert isinstance(failed.value.__cause__, RuntimeError)


# -- over a loopback socket pair, on both event loops ----------------------------------

LOOPS = {"asyncio": asyncio.run, "uvloop": uvloop.run}
Peer = Callable[[FrameProtocol, socket.socket, asyncio.AbstractEventLoop], Awaitable[None]]


def run_on(loop_name: str, capacity: int, test: Peer, **options) -> None:
    """`test(protocol, peer, loop)` on `loop_name`: a `FrameProtocol` of `capacity` (and
    `options`) on one end of a socket pair, the other end (non-blocking) for the test to
    drive."""

    async def run() -> None:
        ours, theirs = socket.socketpair()
        theirs.setblocking(False)
        loop = asyncio.get_running_loop()
        _, protocol = await loop.create_connection(
            lambda: FrameProtocol(capacity, **options), sock=ours
        )
        assert protocol.writer is not None
        try:
            await test(protocol, theirs, loop)
        finally:
            protocol.writer.close()
            await protocol.writer.wait_closed()
            theirs.close()

    LOOPS[loop_name](asyncio.wait_for(run(), 30))


@pytest.mark.parametrize("loop_name", LOOPS)
def test_frames_over_a_socket_in_pieces(loop_name):
    frames = [framed(bytes([i % 256]) * (i * 37 % 300)) for i in range(200)]
    stream = b"".join(frames)

    async def test(protocol, peer, loop) -> None:
        async def send() -> None:
            steps = (1, 7, 63, 64, 65, 1000)  # around the buffer's size, and across frames
            at = i = 0
            while at < len(stream):
                step = steps[i % len(steps)]
                await loop.sock_sendall(peer, stream[at : at + step])
                at, i = at + step, i + 1
            peer.shutdown(socket.SHUT_WR)

        sender = asyncio.ensure_future(send())
        got = [bytes(await protocol.reader.read_frame(no_check)) for _ in frames]
        await sender
        assert got == frames
        with pytest.raises(asyncio.IncompleteReadError) as ended:
            await protocol.reader.read_frame(no_check)
        assert ended.value.partial == b""  # a clean end between frames

    run_on(loop_name, 64, test)


@pytest.mark.parametrize("capacity", [4096, 64 * 1024])  # the second grows to it first
@pytest.mark.parametrize("loop_name", LOOPS)
def test_a_full_buffer_pauses_reading_until_a_read_makes_room(loop_name, capacity):
    data = bytes(range(256)) * 4096  # 1 MiB: far more than the buffer and the sockets

    async def test(protocol, peer, loop) -> None:
        peer.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        sender = asyncio.ensure_future(loop.sock_sendall(peer, data))
        reader = protocol.reader
        assert bytes(await reader.peek(capacity)) == data[:capacity]  # the buffer is full
        assert not protocol.writer.transport.is_reading()
        assert not sender.done()  # what the sockets hold is less than 1 MiB
        got = bytearray()
        while len(got) < len(data):
            got += await reader.read(len(data) - len(got))
            assert reader.buffered <= capacity
        await sender
        assert got == data

    run_on(loop_name, capacity, test)


@pytest.mark.parametrize("capacity", [4096, 1 << 20])  # read on its own; the buffer grows
@pytest.mark.parametrize("loop_name", LOOPS)
def test_a_frame_larger_than_the_buffer_over_a_socket(loop_name, capacity):
    big = framed(bytes(range(256)) * 1000)
    small = framed(b"after")

    async def test(protocol, peer, loop) -> None:
        sender = asyncio.ensure_future(loop.sock_sendall(peer, big + small))
        assert bytes(await protocol.reader.read_frame(no_check)) == big
        assert bytes(await protocol.reader.read_frame(no_check)) == small
        await sender

    run_on(loop_name, capacity, test)


@pytest.mark.parametrize("loop_name", LOOPS)
def test_eof_mid_frame_over_a_socket(loop_name):
    async def test(protocol, peer, loop) -> None:
        await loop.sock_sendall(peer, FRAMES[2][:9])
        peer.shutdown(socket.SHUT_WR)
        with pytest.raises(asyncio.IncompleteReadError) as ended:
            await protocol.reader.read_frame(no_check)
        assert ended.value.partial == FRAMES[2][:9]

    run_on(loop_name, 4096, test)


@pytest.mark.parametrize("loop_name", LOOPS)
def test_drain_waits_while_the_peer_does_not_read(loop_name):
    size = 4 << 20  # more than the socket buffers take

    async def test(protocol, peer, loop) -> None:
        writer = protocol.writer
        writer.transport.set_write_buffer_limits(high=4096)
        writer.write(b"w" * size)
        drained = asyncio.ensure_future(writer.drain())
        await asyncio.sleep(0)
        assert not drained.done()
        got = 0
        while got < size:
            got += len(await loop.sock_recv(peer, 1 << 16))
        await drained

    run_on(loop_name, 4096, test)


@pytest.mark.parametrize("loop_name", LOOPS)
def test_a_grown_buffer_shrinks_when_idle_and_reads_on_over_a_socket(loop_name):
    big = framed(bytes(range(256)) * 1000)
    frames = [framed(bytes([i]) * (i * 611 % 9000)) for i in range(60)]

    async def test(protocol, peer, loop) -> None:
        reader = protocol.reader
        await loop.sock_sendall(peer, big)
        assert bytes(await reader.read_frame(no_check)) == big
        grown = reader.held_bytes
        waiting = asyncio.ensure_future(reader.read_frame(no_check))
        await eventually(
            lambda: reader.held_bytes == INITIAL_BUFFER_BYTES, what="the buffer shrinks"
        )
        assert grown > INITIAL_BUFFER_BYTES
        sender = asyncio.ensure_future(loop.sock_sendall(peer, b"".join([big, *frames, big])))
        got = [bytes(await waiting)]
        got += [bytes(await reader.read_frame(no_check)) for _ in range(len(frames) + 1)]
        await sender
        assert got == [big, *frames, big]

    run_on(loop_name, 1 << 20, test, idle_shrink_s=0.05)


@pytest.mark.parametrize("loop_name", LOOPS)
def test_the_relay_over_a_socket_takes_every_frame_and_wakes_for_the_rest(loop_name):
    frames = [framed(bytes([i % 200 + 40]) * (i * 37 % 300)) for i in range(200)]
    frames[150] = framed(b"!" + frames[150][5:])  # one the relay leaves
    stream = b"".join(frames)

    async def test(protocol, peer, loop) -> None:
        reader = protocol.reader
        relay = Relay(reader)
        reader.set_relay(relay, 4096)

        async def send() -> None:
            await loop.sock_sendall(peer, stream)
            peer.shutdown(socket.SHUT_WR)

        sender = asyncio.ensure_future(send())
        left = []
        while True:  # as connection.py's loops go
            relay()  # what is buffered, first
            if not reader.has_frame():
                await reader.wait_frame()  # the relay takes what comes meanwhile
                if not reader.has_frame():
                    break  # the end
            left.append(bytes(await reader.read_frame(no_check)))
        await sender
        assert left == [frames[150]]
        assert relay.took == frames[:150] + frames[151:]
        assert relay.calls < len(frames)  # several frames per call: the loop woke little

    run_on(loop_name, 1024, test)  # every frame fits: the relay may take each whole
