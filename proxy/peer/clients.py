"""Calls to other proxies over the peer protocol, on asyncio sockets; the messages and
frames are `peer/codec.py`, the listener that answers them `peer_server.py`.

`PeerClients` keeps one pipelined connection per peer address, opened on first use and
opened again after it breaks; answers are matched to their calls by correlation id.

Errors: a Kafka error code travels in the answer (a call that returns no error code,
`held`, raises `PeerRefused` for one); bytes that are not a frame fail every call waiting
on that connection with `PeerUnavailable`; arguments that cannot make a message raise
ValueError before any I/O.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
import uuid
import weakref
from collections.abc import Callable, Sequence
from contextlib import suppress

from kio.schema.errors import ErrorCode

from proxy.apis.api61_describe_producers import DescribedProducer
from proxy.errors import TierproxyError
from proxy.handoff.objects import S3WalLocation
from proxy.partition.rules import ProduceResult
from proxy.partition.sequence_holes import ProducerBatch
from proxy.peer.codec import (
    DEFAULT_MAX_FRAME_BYTES,
    PROTOCOL,
    REFERENCE_PROTOCOL,
    PeerFrameReader,
    PeerProtocolError,
    encode,
    for_peer,
    frame_size,
)
from proxy.peer.messages import (
    AdminRequest,
    AdminResponse,
    AppendRequest,
    AppendResponse,
    BackfillRequest,
    CatchUpRequest,
    CleanCommitRequest,
    FetchRequest,
    FetchResponse,
    HeldRequest,
    HeldResponse,
    PeerMessage,
    PingRequest,
    PingResponse,
    ProducerCatchUpRequest,
    ProducersRequest,
    ProducersResponse,
    ShardReadRequest,
    TrimRequest,
    TrimResponse,
)
from proxy.peer.server import READ_BYTES, Answer, Request, peer_name

__all__ = ["Address", "PeerClients", "PeerRefused", "PeerUnavailable"]

# The same logger as peer_server.py: both ends of the peer protocol log as one.
log = logging.getLogger("tierproxy.peers")

Address = tuple[str, int]

_FETCH_ANSWER_HEAD = frame_size(FetchResponse(0, 0))  # a fetch answer's frame, less records
_LSO_TRAILER = 8  # the last stable offset after the records, when asked for


class PeerUnavailable(ConnectionError):
    """The connection to a peer could not be opened, or broke while the call waited. The
    next call opens a new one."""


class PeerRefused(TierproxyError):
    """The peer answered a call that returns no error code with one (`error_code`):
    it cannot serve such calls (UNSUPPORTED_VERSION), or its handler failed. Raised, not
    returned as an empty answer, so a caller asking in a loop waits before asking again."""

    def __init__(self, message: str, error_code: int) -> None:
        super().__init__(message)
        self.error_code = error_code


class _PeerConnection:
    """One pipelined connection: requests are written as they come, answers are matched to
    their callers by correlation id. Once failed it stays failed; the pool opens another."""

    def __init__(self, address: Address, connect_timeout_s: float, max_frame_bytes: int) -> None:
        self.address = address
        self.name = peer_name(address)
        self._connect_timeout_s = connect_timeout_s
        self._max_frame_bytes = max_frame_bytes
        self._pending: dict[int, tuple[asyncio.Future[PeerMessage], type]] = {}
        # calls not answered yet that must hear at once if this connection fails
        self._on_lost: dict[object, Callable[[], None]] = {}
        self._next_cid = 0
        # time.monotonic() of the last bytes read: a call that times out with nothing read
        # since it was written leaves a connection presumed dead (`call`)
        self._read_at = 0.0
        self._failure: str | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._reading: asyncio.Task[None] | None = None
        # Shared by every caller waiting for it: one connect per address, whoever asked.
        self._opening = asyncio.get_running_loop().create_task(self._open())

    @property
    def failed(self) -> bool:
        return self._failure is not None

    async def _open(self) -> None:
        host, port = self.address
        try:
            async with asyncio.timeout(self._connect_timeout_s):
                reader, writer = await asyncio.open_connection(host, port)
        except TimeoutError:
            self._fail(f"cannot connect within {self._connect_timeout_s} s")
            return
        except OSError as exc:
            self._fail(f"cannot connect: {exc}")
            return
        self._writer = writer
        if self._failure is not None:  # closed while connecting
            writer.close()
            return
        self._reading = asyncio.get_running_loop().create_task(self._read(reader))

    async def call(
        self,
        request: Request,
        expect: type | None,
        timeout_s: float,
        on_lost: Callable[[], None] | None = None,
    ) -> PeerMessage | None:
        """Send `request` under a correlation id of this connection; wait for its answer of
        type `expect`, or only until it is written when `expect` is None. `on_lost` is
        called, synchronously, if the connection fails before the answer: before any later
        call can pick another connection (a hand-off's drop is recorded before the next
        one is sent: sequence_holes.py)."""
        cid = None
        sent_at: float | None = None
        token = object()
        if on_lost is not None:
            self._on_lost[token] = on_lost
        try:
            async with asyncio.timeout(timeout_s):
                # Shared, so a timeout here leaves the connect to the others; and it always
                # yields once, even when open, so calls that waited for the connect resume
                # first: requests are written in the order of the calls.
                await asyncio.wait((self._opening,))
                if self._failure is not None or self._writer is None:
                    raise self._unavailable()
                cid = self._new_cid()
                pieces = encode(
                    dataclasses.replace(request, correlation_id=cid),
                    max_frame_bytes=self._max_frame_bytes,
                )
                waiter = None
                if expect is not None:
                    waiter = asyncio.get_running_loop().create_future()
                    self._pending[cid] = (waiter, expect)
                try:
                    sent_at = time.monotonic()
                    await self._send(pieces)
                    return None if waiter is None else await waiter
                finally:
                    self._pending.pop(cid, None)  # a late answer to it is dropped
                    if waiter is not None and waiter.done() and not waiter.cancelled():
                        waiter.exception()  # retrieved: _fail sets it when the write fails
        except TimeoutError:
            what = type(request).__name__ + ("" if cid is None else f" {cid}")
            if sent_at is not None and self._read_at < sent_at:
                # Nothing came back since this call was written, not even another call's
                # answer: a half-open connection (the peer gone without a close, a
                # silent partition) that TCP may take many minutes to notice. The calls
                # still waiting on it fail now, and the next call opens another (this
                # one's own loss is its TimeoutError, not its `on_lost`).
                self._on_lost.pop(token, None)
                self._fail(f"nothing read for {timeout_s} s: presumed dead")
            raise TimeoutError(
                f"peer {self.name}: {what} not answered within {timeout_s} s"
            ) from None
        finally:
            self._on_lost.pop(token, None)

    async def _send(self, pieces: list) -> None:
        assert self._writer is not None
        try:
            if self._writer.is_closing():  # reset, the reader not told yet: uvloop's
                # transport raises RuntimeError on a write then (asyncio's ignores it)
                raise ConnectionResetError("the connection was closed")
            self._writer.writelines(pieces)
            await self._writer.drain()  # backpressure: a peer that stops reading stops us
        except ConnectionError as exc:
            self._fail(f"connection lost: {exc}")
            raise self._unavailable() from None

    def _new_cid(self) -> int:
        cid = self._next_cid
        while cid in self._pending:  # only after 2**32 calls, with one still waiting
            cid = (cid + 1) & 0xFFFF_FFFF
        self._next_cid = (cid + 1) & 0xFFFF_FFFF
        return cid

    async def _read(self, reader: asyncio.StreamReader) -> None:
        frames = PeerFrameReader(self._max_frame_bytes)
        try:
            while data := await reader.read(READ_BYTES):
                self._read_at = time.monotonic()
                frames.feed(data)
                while (message := frames.next_message()) is not None:
                    self._answer(message)
            self._fail("the peer closed the connection")
        except PeerProtocolError as exc:
            log.warning("peer %s: closing the connection: %s", self.name, exc)
            self._fail(f"bad frame: {exc}")
        except OSError as exc:
            self._fail(f"connection lost: {exc}")

    def _answer(self, message: PeerMessage) -> None:
        if not isinstance(message, Answer):
            raise PeerProtocolError(f"a {type(message).__name__} is not an answer")
        entry = self._pending.get(message.correlation_id)
        if entry is None:
            return  # the call timed out or was cancelled
        waiter, expect = entry
        if not isinstance(message, expect):
            raise PeerProtocolError(
                f"a {type(message).__name__} answers correlation id {message.correlation_id}, "
                f"which expects a {expect.__name__}"
            )
        del self._pending[message.correlation_id]
        if not waiter.done():
            waiter.set_result(message)

    def _unavailable(self) -> PeerUnavailable:
        return PeerUnavailable(f"peer {self.name}: {self._failure}")

    def _fail(self, reason: str) -> None:
        if self._failure is not None:
            return
        self._failure = reason
        lost, self._on_lost = list(self._on_lost.values()), {}
        for hook in lost:
            hook()
        for waiter, _ in self._pending.values():
            if not waiter.done():
                waiter.set_exception(self._unavailable())
        self._pending.clear()
        if self._writer is not None:
            self._writer.close()

    async def close(self) -> None:
        self._fail("the client is closed")
        tasks = [task for task in (self._opening, self._reading) if task is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._writer is not None:
            with suppress(OSError, TimeoutError):
                async with asyncio.timeout(self._connect_timeout_s):
                    await self._writer.wait_closed()


class PeerClients:
    """Calls to other proxies: one pipelined connection per (host, port), opened on demand.

    A connection that fails fails every call waiting on it with PeerUnavailable; the next
    call opens a new one. A call that times out raises TimeoutError and leaves the
    connection to the others."""

    def __init__(
        self,
        *,
        connect_timeout_s: float = 5.0,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        timeout_margin_s: float = 5.0,
        admin_timeout_s: float = 30.0,
    ) -> None:
        self.connect_timeout_s = connect_timeout_s
        self.max_frame_bytes = max_frame_bytes
        self.timeout_margin_s = timeout_margin_s
        self.admin_timeout_s = admin_timeout_s
        self._connections: dict[Address, _PeerConnection] = {}
        # the member each connection's ping named (`append`'s header, `held`): one TCP
        # connection reaches one process; a new connection is asked again
        self._named: weakref.WeakKeyDictionary[_PeerConnection, str] = weakref.WeakKeyDictionary()
        self._naming: set[_PeerConnection] = set()  # pings in flight (`_is`)
        self._retiring: set[asyncio.Task[None]] = set()
        self._closed = False

    def _is(self, connection: _PeerConnection, member: str) -> bool:
        """Whether `connection` is known to reach `member`; if not known yet, its ping is
        sent (once at a time, in the background) and answers for the calls after this."""
        name = self._named.get(connection)
        if name is None and connection not in self._naming and not connection.failed:
            self._naming.add(connection)
            task = asyncio.get_running_loop().create_task(self._name_soon(connection))
            self._retiring.add(task)
            task.add_done_callback(self._retiring.discard)
        return name == member

    async def _name_soon(self, connection: _PeerConnection) -> None:
        try:
            await self._ping_name(connection)
        except Exception as exc:  # the next call with a header asks again
            log.debug("peer %s: its name not known: %r", connection.name, exc)
        finally:
            self._naming.discard(connection)

    async def _ping_name(self, connection: _PeerConnection) -> str:
        """The name the proxy on `connection` answers a ping with, noted in `_named`."""
        ping = await connection.call(PingRequest(0), PingResponse, self.admin_timeout_s)
        assert isinstance(ping, PingResponse)
        self._named[connection] = ping.name
        return ping.name

    async def append(
        self,
        address: Address,
        stream_id: int,
        acks: int,
        timeout_ms: int,
        *,
        records: bytes | bytearray | memoryview | None = None,
        location: S3WalLocation | None = None,
        timeout_s: float | None = None,
        batch: ProducerBatch | None = None,
        hole: Callable[[], int] | None = None,
        on_lost: Callable[[], None] | None = None,
        peer_protocol: int = PROTOCOL,
        transactional_id: str | None = None,
        produce_version: int = -1,
        header: bytes | bytearray | memoryview | None = None,
        member: str | None = None,
    ) -> ProduceResult | None:
        """The owner's answer to appending `records` (direct) or the batches at `location`
        (s3) to `stream_id`; None for acks=0, once the request is written. The default
        timeout is the request's own `timeout_ms` plus `timeout_margin_s`. `batch` and
        `hole()` (asked now, as the connection is picked) tell the owner whose batches
        these are and the sender's last drop before them, unless the owner's `peer_protocol`
        (its heartbeat's) predates them: `codec.for_peer`; `on_lost`:
        `_PeerConnection.call`. `transactional_id` and `produce_version`: a transactional
        Produce's, for the owner's verification (only with `batch`; dropped by `for_peer`
        for an owner that predates it). `header`: the batch's first 61 bytes, only with
        `location`, for an owner that may answer `referenced` (the answer's
        `ProduceResult.referenced`: keep the S3-WAL object until `held` releases it);
        dropped by `for_peer` for an owner older than `REFERENCE_PROTOCOL`, and, with
        `member` (the owner's name), until a ping on the connection it goes on named that
        member (`_named`: asked on the first such call of a connection, not waited for,
        so every call on it until the ping is answered goes without its header; the
        request is written now, in the order the calls came): only the member the sender
        will ask about it may take it by reference."""
        hole_seq = -1 if hole is None or batch is None else hole()
        if batch is None:
            transactional_id, produce_version = None, -1
        request = for_peer(
            AppendRequest(
                0,
                stream_id,
                acks,
                timeout_ms,
                records,
                location,
                batch=batch,
                hole=hole_seq,
                transactional_id=transactional_id,
                produce_version=produce_version if transactional_id is not None else -1,
                header=header,
            ),
            peer_protocol,
        )
        if timeout_s is None:
            timeout_s = max(timeout_ms, 0) / 1000 + self.timeout_margin_s
        expect = None if acks == 0 else AppendResponse
        connection = self._connection(address)
        if request.header is not None and member is not None and not self._is(connection, member):
            # by bytes, until a ping says whom this connection reaches
            request = dataclasses.replace(request, header=None)
        response = await connection.call(request, expect, timeout_s, on_lost)
        assert response is None or isinstance(response, AppendResponse)
        return None if response is None else response.result()

    async def admin(
        self,
        address: Address,
        op: str,
        topic: str,
        topic_id: uuid.UUID,
        *,
        timeout_s: float | None = None,
    ) -> tuple[int, str]:
        """(error code, message) from the owner of the topic's metadata shard."""
        request = AdminRequest(0, op, topic, topic_id)
        timeout = self.admin_timeout_s if timeout_s is None else timeout_s
        response = await self._connection(address).call(request, AdminResponse, timeout)
        assert isinstance(response, AdminResponse)
        return response.error_code, response.message

    async def ping(self, address: Address, *, timeout_s: float | None = None) -> PingResponse:
        """The proxy's answer to a ping: its name in the fleet and its version. A listener
        that predates pings closes the connection (PeerUnavailable)."""
        timeout = self.admin_timeout_s if timeout_s is None else timeout_s
        response = await self._connection(address).call(PingRequest(0), PingResponse, timeout)
        assert isinstance(response, PingResponse)
        return response

    async def backfill(
        self,
        address: Address,
        object_id: int,
        size: int,
        stream_id: int,
        start_offset: int,
        end_offset: int,
        *,
        timeout_s: float | None = None,
    ) -> tuple[int, str]:
        """(error code, message) from the owner of the stream's metadata shard, asked to
        commit an offload job's stream object holding [start_offset, end_offset)."""
        request = BackfillRequest(0, object_id, size, stream_id, start_offset, end_offset)
        timeout = self.admin_timeout_s if timeout_s is None else timeout_s
        response = await self._connection(address).call(request, AdminResponse, timeout)
        assert isinstance(response, AdminResponse)
        return response.error_code, response.message

    async def clean_commit(
        self, address: Address, request: CleanCommitRequest, *, timeout_s: float | None = None
    ) -> tuple[int, str]:
        """(error code, message) from the owner of the stream's metadata shard, asked to
        commit the objects `tierproxy clean` wrote (the request's correlation id is
        replaced)."""
        timeout = self.admin_timeout_s if timeout_s is None else timeout_s
        response = await self._connection(address).call(request, AdminResponse, timeout)
        assert isinstance(response, AdminResponse)
        return response.error_code, response.message

    async def trim(
        self, address: Address, stream_id: int, offset: int, timeout_ms: int
    ) -> tuple[int, int, str]:
        """(error code, log start, message) from the owner of the stream's metadata shard,
        asked to move the stream's log start up to `offset` (-1: its high watermark)."""
        request = TrimRequest(0, stream_id, offset, timeout_ms)
        timeout = self.admin_timeout_s + timeout_ms / 1000
        response = await self._connection(address).call(request, TrimResponse, timeout)
        assert isinstance(response, TrimResponse)
        return response.error_code, response.log_start_offset, response.message

    async def catch_up(self, address: Address, stream_id: int, timeout_ms: int) -> tuple[int, str]:
        """(error code, message) from the owner of `stream_id`, asked to append the
        transaction markers in Kafka's log of its partition up to the high watermark as of
        now (only to an owner at `codec.CATCH_UP_PROTOCOL` or later)."""
        request = CatchUpRequest(0, stream_id, timeout_ms)
        timeout = timeout_ms / 1000 + self.timeout_margin_s
        response = await self._connection(address).call(request, AdminResponse, timeout)
        assert isinstance(response, AdminResponse)
        return response.error_code, response.message

    async def catch_up_producer(
        self, address: Address, producer_id: int, timeout_ms: int
    ) -> tuple[int, str]:
        """(error code, message) from a member of the fleet, asked to catch up every tiered
        partition it owns where `producer_id` has a transaction open (only to a member at
        `codec.PRODUCER_CATCH_UP_PROTOCOL` or later)."""
        request = ProducerCatchUpRequest(0, producer_id, timeout_ms)
        timeout = timeout_ms / 1000 + self.timeout_margin_s
        response = await self._connection(address).call(request, AdminResponse, timeout)
        assert isinstance(response, AdminResponse)
        return response.error_code, response.message

    async def read_shard(
        self, address: Address, shard: int, offset: int, timeout_ms: int
    ) -> tuple[int, str]:
        """(error code, message) from a member of the fleet, asked to read metadata shard
        `shard` until every record below `offset` is applied, within `timeout_ms` (only
        to a member at `codec.SHARD_READ_PROTOCOL` or later)."""
        request = ShardReadRequest(0, shard, offset, timeout_ms)
        timeout = timeout_ms / 1000 + self.timeout_margin_s
        response = await self._connection(address).call(request, AdminResponse, timeout)
        assert isinstance(response, AdminResponse)
        return response.error_code, response.message

    async def held(
        self,
        address: Address,
        locations: Sequence[S3WalLocation],
        timeout_ms: int,
        *,
        peer_protocol: int,
        member: str | None = None,
    ) -> tuple[int, ...]:
        """The indexes, increasing, of `locations` (of appends the owner at `address`
        answered `referenced`) that it no longer needs: this proxy may delete those
        objects once no owner holds them. The owner waits up to `timeout_ms` for them to
        be released; this call's own timeout is that plus `timeout_margin_s`. Only to an
        owner at `REFERENCE_PROTOCOL` or later (ValueError before any I/O otherwise; an
        older owner never answers `referenced`). PeerRefused for an answer with an error
        code; an index past `locations` (a broken owner) is dropped with a warning, its
        object kept for the orphan sweep.
        `member`: the owner's name; the proxy at `address` is asked only if its ping, on
        the connection the request then goes on, answers that name (once per connection),
        else PeerRefused (UNKNOWN_MEMBER_ID): another proxy at that address now knows none
        of the locations and would release them all."""
        if peer_protocol < REFERENCE_PROTOCOL:
            raise ValueError(
                f"a held request to a peer at protocol {peer_protocol}: it reads them from "
                f"{REFERENCE_PROTOCOL} on"
            )
        request = HeldRequest(0, timeout_ms, tuple(locations))
        timeout = timeout_ms / 1000 + self.timeout_margin_s
        connection = self._connection(address)
        if member is not None:
            name = self._named.get(connection)
            if name is None:
                name = await self._ping_name(connection)
            if name != member:
                raise PeerRefused(
                    f"peer at {address[0]}:{address[1]} is {name!r}, not {member!r}: "
                    f"not asked about {member}'s locations",
                    ErrorCode.unknown_member_id,
                )
        response = await connection.call(request, HeldResponse, timeout)
        assert isinstance(response, HeldResponse)
        if response.error_code:
            raise PeerRefused(
                f"peer {connection.name}: held request answered error code {response.error_code}",
                response.error_code,
            )
        released = response.released
        if released and released[-1] >= len(request.locations):
            count = len(request.locations)
            log.warning("peer %s: released indexes %s of %d", connection.name, released, count)
            released = tuple(index for index in released if index < count)
        return released

    async def producers(
        self, address: Address, stream_id: int
    ) -> tuple[int, tuple[DescribedProducer, ...]]:
        """(error code, producers) from the owner of `stream_id`, as DescribeProducers
        answers them (only to an owner at `codec.PRODUCERS_PROTOCOL` or later)."""
        request = ProducersRequest(0, stream_id)
        response = await self._connection(address).call(
            request, ProducersResponse, self.timeout_margin_s
        )
        assert isinstance(response, ProducersResponse)
        return response.error_code, response.producers

    async def fetch(
        self,
        address: Address,
        stream_id: int,
        offset: int,
        max_bytes: int,
        max_wait_ms: int,
        *,
        timeout_s: float | None = None,
        stable: bool = False,
    ) -> FetchResponse:
        """The owner's answer to reading `stream_id` from `offset` on, waiting up to
        `max_wait_ms` for data past it; its records are a view of the received bytes.
        `max_bytes` is cut to what a frame holds. The default timeout is `max_wait_ms` plus
        `timeout_margin_s`. `stable` asks for the owner's last stable offset too: only for
        an owner at `STABLE_PROTOCOL` or later (an older one drops the connection)."""
        head = _FETCH_ANSWER_HEAD + (_LSO_TRAILER if stable else 0)
        max_bytes = min(max_bytes, max(self.max_frame_bytes - head, 0))
        request = FetchRequest(0, stream_id, offset, max_bytes, max_wait_ms, stable)
        if timeout_s is None:
            timeout_s = max_wait_ms / 1000 + self.timeout_margin_s
        response = await self._connection(address).call(request, FetchResponse, timeout_s)
        assert isinstance(response, FetchResponse)
        return response

    def _connection(self, address: Address) -> _PeerConnection:
        if self._closed:
            raise RuntimeError("the peer clients are closed")
        connection = self._connections.get(address)
        if connection is None or connection.failed:
            if connection is not None:
                task = asyncio.get_running_loop().create_task(connection.close())
                self._retiring.add(task)
                task.add_done_callback(self._retiring.discard)
            connection = _PeerConnection(address, self.connect_timeout_s, self.max_frame_bytes)
            self._connections[address] = connection
        return connection

    async def close(self) -> None:
        """Close every connection; calls still waiting fail with PeerUnavailable."""
        self._closed = True
        connections = list(self._connections.values())
        self._connections.clear()
        await asyncio.gather(*(c.close() for c in connections), *self._retiring)
