"""One client connection and the upstream connection that serves it.

Two loops per connection, each owning one direction:

- the client loop reads request frames, decides from the header alone (answer here,
  forward, expect no answer for acks=0), and writes them upstream;
- the upstream loop reads response frames, rewrites the few that name brokers, and hands
  them to the writer, which sends answers strictly in request order. An answer that is
  not rewritten (Fetch before v16, Produce before v10 and every other API that names no
  broker) is passed on as it arrives, a buffer at a time, never held whole; a large
  Fetch v16+ answer too, walked as it streams and only its trailing tagged fields held
  back (fetch_stream.py).

Backpressure comes from awaiting `drain()` on each side: a client that stops reading
stops the upstream loop, the upstream socket fills, and the broker stops sending; the
client loop awaits `drain()` after answering ApiVersions itself, so a client that sends
those without reading stops being read. The number of requests awaiting an answer is
bounded too.

Bad input (a frame size out of range, a connection closed mid-frame, a header the proxy
cannot read, an unknown API key or version, an ApiVersions body that does not parse)
closes this connection only, with one warning naming the client and the reason and
`tierproxy_rejected_frames{reason}` counting it. Requests read before the bad frame are
still answered first, as Kafka does: it reads a connection's next request only once it
has answered the last.
"""

from __future__ import annotations

import asyncio
import logging
import struct
import time
from collections import deque

from proxy.apis import NODE_ENDPOINTS_SINCE, RESPONSE_REWRITERS
from proxy.apis.api01_fetch import request_rack_id
from proxy.apis.api18_api_versions import (
    check_api_versions_request,
    unsupported_version_response,
)
from proxy.apis.fetch_stream import rewrite_tail, walk_fetch_answer
from proxy.kafka.frames import FrameError
from proxy.kafka.headers import (
    RequestHeader,
    header_rejection_reason,
    parse_request_header,
    produce_acks,
    response_header,
    response_header_size,
)
from proxy.kafka.proxy_header import detect
from proxy.kafka.proxy_header import parse as parse_proxy_header
from proxy.kafka.versions import is_known
from proxy.server.slots import Plan, Slot
from proxy.server.streams import (
    UpstreamClosed,
    check_correlation_id,
    read_exactly,
    read_whole,
    stream_walked_answer,
)
from proxy.server.zoning import ConnectionZone
from proxy.tiered.answers import TieredAnswers
from proxy.tiered.deletes import plan_delete_records
from proxy.tiered.epochs import plan_offset_for_leader_epoch
from proxy.tiered.fetch import plan_fetch
from proxy.tiered.offsets import plan_list_offsets
from proxy.tiered.produce import count_in_flight, plan_produce
from proxy.tiered.txn_refusal import plan_add_partitions_to_txn

log = logging.getLogger("tierproxy.connection")

_SIZE = struct.Struct(">i")
API_PRODUCE = 0
API_FETCH = 1
API_LIST_OFFSETS = 2
API_DELETE_RECORDS = 21
API_OFFSET_FOR_LEADER_EPOCH = 23
API_ADD_PARTITIONS_TO_TXN = 24
# split (or answered in part) when tiering
TIERED_APIS = frozenset(
    (
        API_PRODUCE,
        API_FETCH,
        API_LIST_OFFSETS,
        API_DELETE_RECORDS,
        API_OFFSET_FOR_LEADER_EPOCH,
        API_ADD_PARTITIONS_TO_TXN,
    )
)
API_VERSIONS = 18
# Responses can legitimately be far larger than requests (fetch.max.bytes is per request
# and several partitions may each return their max); trust upstream up to this.
MAX_RESPONSE_BYTES = 1 << 30
# After bad input, how long the answers to the requests read before it may take.
OWED_ANSWERS_TIMEOUT_S = 10.0


class _ClientGone(Exception):
    """Writing to the client failed: it went away while an answer was on its way."""


class RejectedFrame(FrameError):
    """Bad input from the client; `reason` is the label of `tierproxy_rejected_frames`."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class ClientConnection(TieredAnswers):
    def __init__(
        self,
        proxy,  # proxy.server.app.Proxy; not imported to keep the import graph acyclic
        client_reader: asyncio.StreamReader,
        client_writer: asyncio.StreamWriter,
        target_node: int | None,
        listener: str,
    ) -> None:
        self.proxy = proxy
        self.client_reader = client_reader
        self.client_writer = client_writer
        self.target_node = target_node
        self.listener = listener
        peer = client_writer.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if peer else "unknown"
        self.zone = ConnectionZone(proxy, self.peer, peer[0] if peer else None, listener)
        self.upstream_reader: asyncio.StreamReader | None = None
        self.upstream_writer: asyncio.StreamWriter | None = None
        self._pending: deque[Slot] = deque()  # every answer owed, in request order
        self._awaiting_upstream: deque[Slot] = deque()
        self._room = asyncio.Event()  # set while fewer than max in-flight requests
        self._room.set()
        self._all_answered = asyncio.Event()  # set while no answer is owed
        self._all_answered.set()
        self._upstream_task: asyncio.Task[None] | None = None
        self._local_answer = asyncio.Event()  # set when a tiered Produce is answered here
        self._background: set[asyncio.Future] = set()  # acks=0 tiered produce under way
        self._max_frame = proxy.config.limits.max_frame_bytes
        self._max_inflight = proxy.config.limits.max_inflight_requests
        self._chunk_bytes = proxy.config.limits.buffer_bytes

    # -- lifecycle -------------------------------------------------------------------

    async def serve(self) -> None:
        metrics = self.proxy.metrics
        metrics.connections.inc()
        metrics.connections_accepted.labels(self.listener).inc()
        try:
            await self._client_loop()
        except RejectedFrame as exc:
            self._reject(exc)
            await self._answer_owed()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass  # the client went away; nothing to report
        except UpstreamClosed:
            pass  # counted and logged by the upstream loop
        except OSError as exc:
            metrics.upstream_errors.labels("connect").inc()
            log.warning(
                "client %s: cannot reach upstream: %s",
                self.peer,
                exc,
                extra={"client": self.peer, "reason": "upstream_unreachable"},
            )
        finally:
            metrics.connections.dec()
            await self._close()

    def _reject(self, exc: RejectedFrame) -> None:
        self.proxy.metrics.rejected_frames.labels(exc.reason).inc()
        log.warning(
            "closing client %s on %s: %s",
            self.peer,
            self.listener,
            exc,
            extra={"client": self.peer, "reason": exc.reason},
        )

    async def _answer_owed(self) -> None:
        """Send the answers owed for requests read before the bad frame, then return."""
        answered = asyncio.ensure_future(self._all_answered.wait())
        waits: set[asyncio.Future] = {answered}
        if self._upstream_task is not None:
            waits.add(self._upstream_task)  # ends early if upstream goes away
        try:
            async with asyncio.timeout(OWED_ANSWERS_TIMEOUT_S):
                await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
                if self._all_answered.is_set():
                    await self.client_writer.drain()
        except (TimeoutError, ConnectionError):
            pass
        finally:
            answered.cancel()

    async def _close(self) -> None:
        for slot in self._pending:  # read, never answered: the request's outcome
            self.proxy.metrics.unanswered.labels(str(slot.api_key)).inc()
        for slot in self._awaiting_upstream:  # never answered: no longer in flight
            if slot.plan is not None:
                count_in_flight(self.proxy.tiering.in_flight, slot.plan.passthrough_topics, -1)
                slot.plan = None
        task = self._upstream_task
        if task is not None:
            if task.done() and not task.cancelled():
                task.exception()  # already logged by the upstream loop; mark it retrieved
            task.cancel()
        for writer in (self.upstream_writer, self.client_writer):
            if writer is not None:
                writer.close()
        for writer in (self.upstream_writer, self.client_writer):
            if writer is not None:
                try:
                    await writer.wait_closed()
                except (OSError, asyncio.CancelledError):
                    # Cut it now: a TLS close left under way when the proxy stops would
                    # outlive the event loop (unclosed transport, EBUSY on loop close).
                    writer.transport.abort()

    # -- client to upstream ------------------------------------------------------------

    async def _client_loop(self) -> None:
        metrics = self.proxy.metrics
        read_ahead = None  # a first frame size read while looking for a PROXY header
        if self.proxy.config.listeners.proxy_protocol != "off":
            read_ahead = await self._read_proxy_header()
        while True:
            if read_ahead is None:
                size_bytes = await self._read_client(4, between_frames=True)
            else:
                size_bytes, read_ahead = read_ahead, None
            (size,) = _SIZE.unpack(size_bytes)
            if size < 0:
                raise RejectedFrame("negative_frame_size", f"negative frame size {size}")
            if size > self._max_frame:  # before reading any of the body
                raise RejectedFrame(
                    "oversized_frame", f"frame size {size} exceeds limit {self._max_frame}"
                )
            frame = memoryview(await self._read_client(size, between_frames=False))
            try:
                header = parse_request_header(frame)
            except FrameError as exc:
                raise RejectedFrame(header_rejection_reason(frame), str(exc)) from None
            metrics.request(header.api_key)
            metrics.bytes_in.inc(size + 4)
            self.zone.on_client_id(header.client_id)
            if not self._room.is_set():
                await self._room.wait()
            if header.api_key == API_VERSIONS:
                answer = self._answer_api_versions(header, frame[header.size :])
                self.zone.count_local(size + 4, answer)
                await self.client_writer.drain()  # a client not reading stops being read
                continue
            if not is_known(header.api_key, header.api_version):  # never forward the unknown
                raise RejectedFrame(
                    "unsupported_version",
                    f"unsupported version {header.api_version} of api key {header.api_key}",
                )
            expects_answer = True
            plan = None
            if header.api_key == API_PRODUCE:
                try:
                    acks = produce_acks(header.api_version, frame[header.size :])
                except FrameError as exc:
                    raise RejectedFrame("malformed_request", str(exc)) from None
                expects_answer = acks != 0
            elif header.api_key == API_FETCH and self.zone.wants_fetch_rack:
                try:
                    rack = request_rack_id(header.api_version, frame[header.size :])
                except FrameError:
                    rack = None  # forwarded as it is: the broker judges the request
                self.zone.on_fetch_rack(rack)
            if self.proxy.tiering is not None and header.api_key in TIERED_APIS:
                plan = await self._plan(header, frame)
                if plan is not None and plan.local is not None:
                    await self._tiered_request(header, plan, expects_answer, size + 4)
                    continue
            if self.upstream_writer is None:
                await self._connect_upstream()
            if expects_answer:
                slot = Slot(header.correlation_id, header.api_key, header.api_version, plan=plan)
                self._enqueue(slot)
                self._awaiting_upstream.append(slot)
                if plan is not None:
                    count_in_flight(self.proxy.tiering.in_flight, plan.passthrough_topics, 1)
            assert self.upstream_writer is not None
            self.upstream_writer.writelines((size_bytes, frame))  # one send, not two
            self.zone.count_to_broker(size + 4)
            await self.upstream_writer.drain()
            if self._upstream_task is not None and self._upstream_task.done():
                self._upstream_task.result()  # re-raise why upstream stopped

    async def _plan(self, header: RequestHeader, frame: memoryview) -> Plan | None:
        """How a Produce, Fetch, ListOffsets, DeleteRecords or OffsetForLeaderEpoch splits
        between the tiered partitions, answered here, and the rest (None or a plan with no
        local part: all of it goes upstream); an AddPartitionsToTxn naming a tiered topic
        is refused here whole."""
        tiering, version = self.proxy.tiering, header.api_version
        head, body = frame[: header.size], frame[header.size :]
        try:
            if header.api_key == API_PRODUCE:
                return plan_produce(tiering, head, body, version)
            if header.api_key == API_FETCH:
                return await plan_fetch(tiering, head, body, version, reader=id(self))
            if header.api_key == API_DELETE_RECORDS:
                return await plan_delete_records(tiering, head, body, version)
            if header.api_key == API_OFFSET_FOR_LEADER_EPOCH:
                return plan_offset_for_leader_epoch(tiering, head, body, version)
            if header.api_key == API_ADD_PARTITIONS_TO_TXN:
                return plan_add_partitions_to_txn(tiering, body, version, self.peer)
            return plan_list_offsets(tiering, head, body, version)
        except FrameError as exc:
            raise RejectedFrame("malformed_request", str(exc)) from None

    async def _read_proxy_header(self) -> bytes | None:
        """Take the client's real address from a PROXY header, if the connection starts
        with one; return the 4 bytes read if it does not (the first frame's size)."""
        first = await self._read_client(4, between_frames=True)
        if detect(first) == "none":
            if self.proxy.config.listeners.proxy_protocol == "required":
                raise RejectedFrame("missing_proxy_header", "no PROXY protocol header")
            return first
        buffer = first
        try:
            while (parsed := parse_proxy_header(buffer))[0] is None:
                buffer += await self._read_client(parsed[1], between_frames=False)
        except FrameError as exc:
            raise RejectedFrame("malformed_proxy_header", str(exc)) from None
        header = parsed[0]
        if header.source_address is not None:  # None: the balancer's own health check
            self.peer = f"{header.source_address}:{header.source_port} (via {self.peer})"
            self.zone.peer = self.peer
            self.zone.source_address = header.source_address
        return None

    async def _read_client(self, n: int, between_frames: bool) -> bytes:
        try:
            return await self.client_reader.readexactly(n)
        except asyncio.IncompleteReadError as exc:
            upstream = self._upstream_task
            if upstream is not None and upstream.done():
                upstream.result()  # the proxy closed the client: upstream went away
            if between_frames and not exc.partial:
                raise  # a clean end: the client went away between frames
            part = "frame size" if between_frames else "frame"
            raise RejectedFrame(
                "truncated_frame",
                f"connection closed after {len(exc.partial)} of the {n} bytes of a {part}",
            ) from None

    def _answer_api_versions(self, header: RequestHeader, body: memoryview) -> int:
        """Answer here (queued behind earlier answers); the answer's size."""
        if is_known(API_VERSIONS, header.api_version):
            try:
                check_api_versions_request(header.api_version, body)
            except FrameError as exc:  # Kafka closes on a body it cannot read
                raise RejectedFrame(
                    "malformed_request", f"ApiVersions v{header.api_version} request: {exc}"
                ) from None
            payload = response_header(header.correlation_id, API_VERSIONS, header.api_version)
            payload += self.proxy.api_versions_body(header.api_version)
        else:  # as Kafka does: a v0 answer saying UNSUPPORTED_VERSION, so the client downgrades
            payload = unsupported_version_response(header.correlation_id, self.proxy.api_ranges())
        slot = Slot(header.correlation_id, API_VERSIONS, header.api_version, local=True)
        slot.data = (_SIZE.pack(len(payload)) + payload,)
        self._enqueue(slot)
        self._flush()
        return len(payload) + 4

    def _enqueue(self, slot: Slot) -> None:
        slot.read_at = time.perf_counter()
        self._pending.append(slot)
        self._all_answered.clear()
        if len(self._pending) >= self._max_inflight:
            self._room.clear()

    async def _connect_upstream(self) -> None:
        node_id, host, port = self.proxy.upstream_address_for(self.target_node)
        self.zone.on_upstream(node_id)
        self.upstream_reader, self.upstream_writer = await self.proxy.open_upstream(host, port)
        self._upstream_task = asyncio.create_task(self._upstream_loop())

    # -- upstream to client ------------------------------------------------------------

    async def _upstream_loop(self) -> None:
        reader = self.upstream_reader
        assert reader is not None
        try:
            while True:
                try:
                    size_bytes = await reader.readexactly(4)
                except asyncio.IncompleteReadError:
                    raise UpstreamClosed("connection closed by the broker") from None
                (size,) = _SIZE.unpack(size_bytes)
                if not 4 <= size <= MAX_RESPONSE_BYTES:
                    raise UpstreamClosed(f"response frame size {size} out of range")
                if not self._awaiting_upstream:
                    raise UpstreamClosed("an answer to no request")
                slot = self._awaiting_upstream[0]  # popped once answered in full
                if slot.plan is not None and slot.plan.local is not None:
                    frame = await read_whole(reader, size, self._chunk_bytes)
                    check_correlation_id(slot.correlation_id, frame)
                    slot.data = await self._merged(slot, frame)
                    self._answered_upstream(slot)
                    self._flush()
                    await self._drain_client()
                elif _rewrites(slot) and not _walks(slot, size, self._chunk_bytes):
                    frame = await read_whole(reader, size, self._chunk_bytes)
                    check_correlation_id(slot.correlation_id, frame)
                    slot.data = self._rewritten(slot, size_bytes, frame)
                    self._answered_upstream(slot)
                    self._flush()
                    await self._drain_client()
                else:
                    correlation_id = await read_exactly(reader, 4)
                    check_correlation_id(slot.correlation_id, correlation_id)
                    await self._pass_through(slot, size_bytes + correlation_id, size - 4)
                    self._answered_upstream(slot)
        except _ClientGone:
            # Not upstream's fault: the client loop sees the connection end and closes.
            raise ConnectionResetError("the client went away") from None
        except (UpstreamClosed, FrameError, ConnectionError, asyncio.IncompleteReadError) as exc:
            # FrameError here is a response a rewriter could not read: upstream's fault.
            reason = str(exc) or exc.__class__.__name__
            self._upstream_lost(reason)
            # Stop the client loop too: the client sees its connection close and retries.
            self.client_writer.close()
            raise UpstreamClosed(reason) from None

    def _rewritten(
        self, slot: Slot, size_bytes: bytes, frame: bytearray
    ) -> tuple[bytes | bytearray | memoryview, ...]:
        """The framed answer with the brokers it names replaced by the proxy's listeners,
        in pieces: an answer that names none (most Fetch answers) is not copied."""
        view = memoryview(frame)
        head = response_header_size(slot.api_key, slot.api_version, view)
        body = view[head:]
        rewritten = RESPONSE_REWRITERS[slot.api_key](slot.api_version, body, self.zone.advertise)
        if rewritten is body:
            return size_bytes, frame
        return _SIZE.pack(head + len(rewritten)), view[:head], rewritten

    async def _pass_through(self, slot: Slot, head: bytes, remaining: int) -> None:
        """Send an answer on as it arrives, a buffer at a time: a Fetch answer may be tens
        of MiB, and the proxy holds no more of it than its buffers, however large."""
        # Every upstream answer owed before this one is ready (upstream answers in order);
        # a tiered Produce answered here may not be yet.
        self._flush()
        while self._pending[0] is not slot:
            await self._local_answer.wait()
            self._flush()
        reader = self.upstream_reader
        assert reader is not None
        unsent_head: bytes | None = head  # sent with the first chunk, in one system call
        if slot.api_key == API_FETCH and _rewrites(slot):  # large, v16+ (`_walks`)
            version = slot.api_version
            await stream_walked_answer(
                reader, head, remaining, walk_fetch_answer(version), self._chunk_bytes,
                self._write, self._drain_client,
                lambda tail: rewrite_tail(version, tail, self.zone.advertise),
            )  # fmt: skip
            unsent_head, remaining = None, 0
        while remaining:
            chunk = await reader.read(min(remaining, self._chunk_bytes))
            if not chunk:
                raise UpstreamClosed(f"connection closed by the broker, {remaining} bytes short")
            if unsent_head is None:
                self._write(chunk)
            else:
                self._write(unsent_head, chunk)
                unsent_head = None
            remaining -= len(chunk)
            await self._drain_client()
        if unsent_head is not None:  # an answer of nothing but its correlation id
            self._write(unsent_head)
        self.proxy.metrics.answered(slot.api_key, time.perf_counter() - slot.read_at)
        self._pending.popleft()
        self._flush()  # the local answers queued behind this one

    async def _drain_client(self) -> None:
        try:
            await self.client_writer.drain()
        except ConnectionError:
            raise _ClientGone from None

    def _upstream_lost(self, reason: str) -> None:
        self.proxy.metrics.upstream_errors.labels("closed").inc()
        if not self._awaiting_upstream:  # e.g. the broker closed an idle connection
            log.info("client %s: upstream closed: %s", self.peer, reason)
            return
        # Often a request the broker could not parse: the proxy forwards bodies unread.
        oldest = self._awaiting_upstream[0]
        log.warning(
            "closing client %s on %s: upstream closed with %d request(s) unanswered, "
            "the oldest api key %d v%d correlation id %d: %s",
            self.peer,
            self.listener,
            len(self._awaiting_upstream),
            oldest.api_key,
            oldest.api_version,
            oldest.correlation_id,
            reason,
            extra={"client": self.peer, "reason": "upstream_closed"},
        )

    def _flush(self) -> None:
        """Send every answer that is ready, in request order."""
        pending = self._pending
        while pending and pending[0].data is not None:
            slot = pending.popleft()
            assert slot.data is not None
            self._write(*slot.data, local=slot.local)
            self.proxy.metrics.answered(slot.api_key, time.perf_counter() - slot.read_at)
        if len(pending) < self._max_inflight:
            self._room.set()
        if not pending:
            self._all_answered.set()

    def _write(self, *pieces: bytes | bytearray | memoryview, local: bool = False) -> None:
        """Queue pieces of an answer for the client: one send for all of them (uvloop
        tries to send on every `write`, so two writes would be two system calls)."""
        if len(pieces) == 1:
            self.client_writer.write(pieces[0])
        else:
            self.client_writer.writelines(pieces)
        size = sum(len(piece) for piece in pieces)
        self.proxy.metrics.bytes_out.inc(size)
        if not local:  # a broker's answer: it crossed the proxy-to-broker hop too
            self.zone.count_to_client(size)
        tap = self.proxy.tap
        if tap is not None:
            for piece in pieces:
                tap(piece)


def _walks(slot: Slot, size: int, buffer_bytes: int) -> bool:
    """Whether a Fetch answer to rewrite is walked as it streams (fetch_stream.py) rather
    than read whole: one larger than the connection's buffer. A smaller one, such as
    the answers that name a moved leader (its partitions carry no records), is read whole
    and rewritten at its own length."""
    return slot.api_key == API_FETCH and size > buffer_bytes


def _rewrites(slot: Slot) -> bool:
    """Whether this answer is rewritten (read whole) or passed through as it comes.

    Produce and Fetch answers name brokers only from the version that added KIP-951
    node endpoints; below it their rewriters return the body untouched.
    """
    if slot.api_key not in RESPONSE_REWRITERS:
        return False
    since = NODE_ENDPOINTS_SINCE.get(slot.api_key)
    return since is None or slot.api_version >= since
