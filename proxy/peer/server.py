"""The peer protocol's listener on asyncio sockets; the messages and frames are
`peer/codec.py`, the calls to other proxies `peer_clients.py`.

`PeerServer` answers other proxies: appends to the tiered partitions this proxy owns,
fetches of their tail not uploaded yet, and admin requests for the metadata shards it owns.
Each request runs in its own task and its answer is written as soon as it is ready, so one
slow partition does not hold up the others on the connection (answers carry the correlation
id).

Errors: a Kafka error code travels in the answer, also when a handler raises; bytes that
are not a frame close that connection.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from contextlib import suppress
from typing import Any

from kio.schema.errors import ErrorCode

from proxy import __version__
from proxy.apis.api61_describe_producers import DescribedProducer
from proxy.errors import TierproxyError
from proxy.lifecycle import run_connection
from proxy.partition.rules import ProduceResult
from proxy.peer.codec import (
    DEFAULT_MAX_FRAME_BYTES,
    PeerFrameReader,
    PeerProtocolError,
    encode,
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
    FetchResult,
    HeldRequest,
    HeldResponse,
    PingRequest,
    PingResponse,
    ProducerCatchUpRequest,
    ProducersRequest,
    ProducersResponse,
    ShardReadRequest,
    TrimRequest,
    TrimResponse,
)

__all__ = ["PeerServer"]

# The same logger as peer_clients.py: both ends of the peer protocol log as one.
log = logging.getLogger("tierproxy.peers")
# what a store, a disk or a peer does to a request (a subsystem's failure, TierproxyError,
# or the OS's): answered with a storage error and a WARNING; anything else is a bug
_FAILURES = (TierproxyError, OSError)

OnAppend = Callable[[AppendRequest], Awaitable[ProduceResult]]
OnAdmin = Callable[[AdminRequest], Awaitable[tuple[int, str]]]
OnFetch = Callable[[FetchRequest], Awaitable[FetchResult]]
OnBackfill = Callable[[BackfillRequest], Awaitable[tuple[int, str]]]
OnCleanCommit = Callable[[CleanCommitRequest], Awaitable[tuple[int, str]]]
OnTrim = Callable[[TrimRequest], Awaitable[tuple[int, int, str]]]
OnCatchUp = Callable[[CatchUpRequest | ProducerCatchUpRequest], Awaitable[tuple[int, str]]]
# stream id -> (error code, its producers as DescribeProducers shows them), once its partition
# is started if it is being started (up to 1 s)
OnProducers = Callable[[int], Awaitable[tuple[int, tuple[DescribedProducer, ...]]]]
OnShardRead = Callable[[ShardReadRequest], Awaitable[tuple[int, str]]]
# the indexes of the request's locations this owner no longer needs, once some are or
# its timeout_ms has passed (any order; repeats are dropped)
OnHeld = Callable[[HeldRequest], Awaitable[tuple[int, ...]]]

_MAX_MESSAGE_CHARS = 4096  # an error message stays far below the i16 string limit


def _describe(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    return text[:_MAX_MESSAGE_CHARS]


# -- shared with peer_clients.py -----------------------------------------------------------

Request = (
    AppendRequest
    | AdminRequest
    | FetchRequest
    | BackfillRequest
    | CleanCommitRequest
    | TrimRequest
    | PingRequest
    | CatchUpRequest
    | ProducerCatchUpRequest
    | ProducersRequest
    | ShardReadRequest
    | HeldRequest
)
Answer = (
    AppendResponse
    | AdminResponse
    | FetchResponse
    | TrimResponse
    | PingResponse
    | ProducersResponse
    | HeldResponse
)
READ_BYTES = 256 * 1024


def peer_name(address: object) -> str:
    if isinstance(address, tuple) and len(address) >= 2:
        return f"{address[0]}:{address[1]}"
    return str(address)


# -- server --------------------------------------------------------------------------------


class PeerServer:
    """Serves appends (`on_append`), admin requests (`on_admin`) and, given `on_fetch`,
    fetches to other proxies, given `on_backfill`, offload jobs' commits, given
    `on_clean_commit`, `tierproxy clean`'s commits, given `on_trim`, DeleteRecords on
    tiered partitions, given `on_catch_up`, the catch-up of a tiered partition's
    transaction markers before AddPartitionsToTxn is answered (and of a producer's
    partitions before InitProducerId is), given `on_producers`, DescribeProducers on
    tiered partitions owned here, given `on_shard_read`, a read of a metadata shard up to
    an offset before a DeleteRecords is answered, given `on_held`, which S3-WAL objects
    of appends answered `referenced` this owner still needs;
    without a handler such a request is answered UNSUPPORTED_VERSION. A ping is answered
    with `name` (the proxy's fleet.name) and this code's version, without any handler.

    Handlers start in the order their requests arrive (each one's first step runs before the
    next one's), so an owner can queue one stream's batches in the order they were sent.
    At most `max_inflight` requests per connection are handled at once; past that the
    connection is not read, so a peer that sends faster than the owner appends (or stops
    reading answers) is slowed by TCP; a fetch holds its slot while it long-polls. A
    connection that ends or sends a bad frame gets the answers already owed for up to
    `linger_s` before it is closed."""

    def __init__(
        self,
        host: str,
        port: int,
        on_append: OnAppend,
        on_admin: OnAdmin,
        on_fetch: OnFetch | None = None,
        *,
        on_backfill: OnBackfill | None = None,
        on_clean_commit: OnCleanCommit | None = None,
        on_trim: OnTrim | None = None,
        on_catch_up: OnCatchUp | None = None,
        on_producers: OnProducers | None = None,
        on_shard_read: OnShardRead | None = None,
        on_held: OnHeld | None = None,
        name: str = "",
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        max_inflight: int = 1024,
        linger_s: float = 10.0,
    ) -> None:
        self.host = host
        self._requested_port = port
        self._on_append = on_append
        self._on_admin = on_admin
        self._on_fetch = on_fetch
        self._on_backfill = on_backfill
        self._on_clean_commit = on_clean_commit
        self._on_trim = on_trim
        self._on_catch_up = on_catch_up
        self._on_producers = on_producers
        self._on_shard_read = on_shard_read
        self._on_held = on_held
        self.name = name
        self.max_frame_bytes = max_frame_bytes
        self.max_inflight = max_inflight
        self.linger_s = linger_s
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        self._server = await asyncio.start_server(
            self._accept, self.host, self._requested_port, reuse_address=True
        )
        log.info("peer protocol listening on %s:%d", self.host, self.port)

    @property
    def port(self) -> int:
        """The bound port (the one the OS chose when started with port 0)."""
        if self._server is None or not self._server.sockets:
            raise RuntimeError("the peer server is not started")
        return self._server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        """Stop listening and end every connection now; requests in flight are cancelled."""
        if self._server is None:
            return
        self._server.close()
        tasks = list(self._connections)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self._server.wait_closed()

    def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # A plain callback, so close() cancels the connection even before it first runs.
        run_connection(self._connections, writer, self._serve(reader, writer))

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = peer_name(writer.get_extra_info("peername"))
        frames = PeerFrameReader(self.max_frame_bytes)
        inflight: set[asyncio.Task[None]] = set()
        slots = asyncio.Semaphore(self.max_inflight)

        def finished(task: asyncio.Task[None]) -> None:
            inflight.discard(task)
            slots.release()
            if not task.cancelled() and task.exception() is not None:
                log.error("peer %s: answering failed", peer, exc_info=task.exception())

        try:
            while data := await reader.read(READ_BYTES):
                frames.feed(data)
                while (request := frames.next_message()) is not None:
                    if not isinstance(request, Request):
                        raise PeerProtocolError(f"a {type(request).__name__} is not a request")
                    await slots.acquire()
                    task = asyncio.create_task(self._handle(request, writer, peer))
                    inflight.add(task)
                    task.add_done_callback(finished)
        except PeerProtocolError as exc:
            log.warning("peer %s: closing its connection: %s", peer, exc)
        except OSError as exc:
            log.info("peer %s: connection lost: %s", peer, exc)
        except asyncio.CancelledError:
            for task in inflight:
                task.cancel()
            raise
        finally:
            await self._finish(inflight, writer)

    async def _finish(
        self, inflight: set[asyncio.Task[None]], writer: asyncio.StreamWriter
    ) -> None:
        if inflight:
            _, late = await asyncio.wait(set(inflight), timeout=self.linger_s)
            for task in late:
                task.cancel()
            await asyncio.gather(*late, return_exceptions=True)
        writer.close()
        with suppress(OSError, TimeoutError):
            async with asyncio.timeout(self.linger_s):
                await writer.wait_closed()

    async def _handle(self, request: Request, writer: asyncio.StreamWriter, peer: str) -> None:
        response: Answer
        if isinstance(request, PingRequest):
            response = PingResponse(request.correlation_id, self.name, __version__)
        elif isinstance(request, AppendRequest):
            response = await self._append(request, peer)
            if request.acks == 0:
                return
        elif isinstance(request, FetchRequest):
            response = await self._fetch(request, peer)
        elif isinstance(request, BackfillRequest):
            response = await self._backfill(request, peer)
        elif isinstance(request, CleanCommitRequest):
            what = f"clean commit of stream {request.stream_id} from {peer}"
            refusal = "this proxy takes no clean commits"
            response = await self._coded(request, self._on_clean_commit, refusal, what)
        elif isinstance(request, TrimRequest):
            response = await self._trim(request, peer)
        elif isinstance(request, CatchUpRequest | ProducerCatchUpRequest):
            response = await self._catch_up(request, peer)
        elif isinstance(request, ProducersRequest):
            response = await self._producers(request, peer)
        elif isinstance(request, ShardReadRequest):
            what = f"read of metadata shard {request.shard} to {request.offset} for {peer}"
            refusal = "this proxy reads no metadata shard"
            response = await self._coded(request, self._on_shard_read, refusal, what)
        elif isinstance(request, HeldRequest):
            response = await self._held(request, peer)
        else:
            response = await self._admin(request, peer)
        if writer.is_closing():
            return
        writer.writelines(encode(response, max_frame_bytes=self.max_frame_bytes))
        with suppress(ConnectionError):  # the read loop sees the connection go
            await writer.drain()

    async def _append(self, request: AppendRequest, peer: str) -> AppendResponse:
        cid = request.correlation_id
        try:
            result = await self._on_append(request)
            if result.referenced and request.header is None:
                # the sender may predate the flag (it would drop the connection) and
                # would release the object the owner still needs: an owner's bug
                raise ValueError("an append without a batch header answered as referenced")
            return AppendResponse.from_result(cid, result)
        except _FAILURES as exc:  # the store or the disk failed (S3 throttling, a full
            # disk): the asker retries on the storage error; no traceback, it is no bug
            log.warning("append to stream %d from peer %s failed: %s", request.stream_id, peer, exc)
            return AppendResponse(cid, ErrorCode.kafka_storage_error, error_message=_describe(exc))
        except Exception as exc:
            log.exception("append to stream %d from peer %s failed", request.stream_id, peer)
            return AppendResponse(cid, ErrorCode.kafka_storage_error, error_message=_describe(exc))

    async def _fetch(self, request: FetchRequest, peer: str) -> FetchResponse:
        cid = request.correlation_id
        if self._on_fetch is None:
            # no data answer uses this code, so the asker knows the owner serves no tail at
            # all (and reads only what is committed) instead of retrying
            return FetchResponse(cid, ErrorCode.unsupported_version)
        try:
            result = await self._on_fetch(request)
            response = FetchResponse.from_result(cid, result, stable=request.stable)
            if (size := frame_size(response)) > self.max_frame_bytes:
                raise ValueError(f"an answer of {size} bytes is over the frame limit")
            return response
        except _FAILURES as exc:
            stream, offset = request.stream_id, request.offset
            log.warning(
                "fetch of stream %d at %d from peer %s failed: %s", stream, offset, peer, exc
            )
            return FetchResponse(cid, ErrorCode.kafka_storage_error)
        except Exception:
            stream, offset = request.stream_id, request.offset
            log.exception("fetch of stream %d at %d from peer %s failed", stream, offset, peer)
            return FetchResponse(cid, ErrorCode.kafka_storage_error)

    async def _admin(self, request: AdminRequest, peer: str) -> AdminResponse:
        cid = request.correlation_id
        try:
            code, message = await self._on_admin(request)
            return AdminResponse(cid, code, message[:_MAX_MESSAGE_CHARS])
        except Exception as exc:
            log.exception("admin %s of %s from peer %s failed", request.op, request.topic, peer)
            return AdminResponse(cid, ErrorCode.unknown_server_error, _describe(exc))

    async def _backfill(self, request: BackfillRequest, peer: str) -> AdminResponse:
        stream, object_id = request.stream_id, request.object_id
        what = f"backfill of stream {stream} object {object_id} from {peer}"
        refusal = "this proxy takes no backfill commits"
        return await self._coded(request, self._on_backfill, refusal, what)

    async def _trim(self, request: TrimRequest, peer: str) -> TrimResponse:
        cid = request.correlation_id
        if self._on_trim is None:
            return TrimResponse(cid, ErrorCode.unsupported_version, -1, "this proxy takes no trims")
        try:
            code, log_start, message = await self._on_trim(request)
            return TrimResponse(cid, code, log_start, message[:_MAX_MESSAGE_CHARS])
        except Exception as exc:
            log.exception("trim of stream %d from %s failed", request.stream_id, peer)
            return TrimResponse(cid, ErrorCode.unknown_server_error, -1, _describe(exc))

    async def _producers(self, request: ProducersRequest, peer: str) -> ProducersResponse:
        cid = request.correlation_id
        if self._on_producers is None:
            return ProducersResponse(cid, ErrorCode.unsupported_version)
        try:
            return ProducersResponse(cid, *await self._on_producers(request.stream_id))
        except Exception:
            log.exception("producers of stream %d for %s failed", request.stream_id, peer)
            return ProducersResponse(cid, ErrorCode.unknown_server_error)

    async def _held(self, request: HeldRequest, peer: str) -> HeldResponse:
        cid = request.correlation_id
        if self._on_held is None:
            return HeldResponse(cid, (), ErrorCode.unsupported_version)
        try:
            released = sorted(set(await self._on_held(request)))
            if released and not 0 <= released[0] <= released[-1] < len(request.locations):
                count = len(request.locations)
                raise ValueError(f"released indexes {released} of {count} locations")
            return HeldResponse(cid, tuple(released))
        except Exception:
            count = len(request.locations)
            log.exception("held request of %d locations from %s failed", count, peer)
            return HeldResponse(cid, (), ErrorCode.unknown_server_error)

    async def _catch_up(
        self, request: CatchUpRequest | ProducerCatchUpRequest, peer: str
    ) -> AdminResponse:
        if isinstance(request, CatchUpRequest):
            what = f"catch-up of stream {request.stream_id} from {peer}"
        else:
            what = f"catch-up of producer id {request.producer_id}'s streams from {peer}"
        return await self._coded(request, self._on_catch_up, "this proxy catches up nothing", what)

    async def _coded(
        self,
        request: BackfillRequest
        | CleanCommitRequest
        | CatchUpRequest
        | ProducerCatchUpRequest
        | ShardReadRequest,
        handler: Callable[[Any], Awaitable[tuple[int, str]]] | None,
        refusal: str,
        what: str,
    ) -> AdminResponse:
        """A request answered (error code, message) by `handler`: UNSUPPORTED_VERSION
        with `refusal` without one, UNKNOWN_SERVER_ERROR if it raises (logged as `what`)."""
        cid = request.correlation_id
        if handler is None:
            return AdminResponse(cid, ErrorCode.unsupported_version, refusal)
        try:
            code, message = await handler(request)
            return AdminResponse(cid, code, message[:_MAX_MESSAGE_CHARS])
        except Exception as exc:
            log.exception("%s failed", what)
            return AdminResponse(cid, ErrorCode.unknown_server_error, _describe(exc))
