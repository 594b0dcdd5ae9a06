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

The relay: most frames need nothing but forwarding (a request of an API and version
the proxy knows, from the client id seen before, not for a tiered topic; an answer
up to `RELAY_ANSWER_BYTES` whose turn has come). Those are forwarded from the readers'
callbacks as they arrive (`_relay_requests`, `_relay_answers`; frame_reader.py's
`set_relay`), and each loop wakes only for a frame its relay leaves: the first request,
ApiVersions, a new client id, a tiered request, a large or split answer, a slow peer.
Both paths keep the same order, counts and flow control; the relay stops wherever the
loop would wait.

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
from functools import cache
from typing import NoReturn, cast

from proxy.apis import HANDLING, TIERED_API_KEYS, ApiHandling
from proxy.apis.api01_fetch import request_rack_id
from proxy.apis.fetch_stream import rewrite_tail, walk_fetch_answer
from proxy.kafka.api_keys import ApiKey
from proxy.kafka.frames import FRAME_SIZE, FrameError
from proxy.kafka.headers import RequestHeader, produce_acks, response_header_size
from proxy.kafka.proxy_header import detect
from proxy.kafka.proxy_header import parse as parse_proxy_header
from proxy.kafka.versions import is_known, request_header_version
from proxy.server.client_answers import ClientAnswers, ClientGone
from proxy.server.connection_state import (
    RejectedFrame,
    Slot,
    api_versions_answer,
    check_forwardable,
    check_request_size,
    read_request_header,
)
from proxy.server.frame_reader import BufferedFrameReader, FrameProtocol, RelayFailed
from proxy.server.split_answers import SplitAnswers
from proxy.server.streams import (
    UpstreamClosed,
    check_correlation_id,
    read_exactly,
    read_whole,
    stream_walked_answer,
)
from proxy.server.zoning import ConnectionZone
from proxy.tiered.planners import PLANNERS, Plan, TieredRequest
from proxy.tiered.produce import count_in_flight

log = logging.getLogger("tierproxy.connection")

# Responses can legitimately be far larger than requests (fetch.max.bytes is per request
# and several partitions may each return their max); trust upstream up to this.
MAX_RESPONSE_BYTES = 1 << 30
# After bad input, how long the answers to the requests read before it may take.
OWED_ANSWERS_TIMEOUT_S = 10.0
# Answers up to this size are relayed whole from the upstream reader's callback; a larger
# one streams through the upstream loop as it arrives, a buffer at a time.
RELAY_ANSWER_BYTES = 64 * 1024
# Counts made by the relay reach the metrics this long after, at most (`_publish_soon`).
PUBLISH_DELAY_S = 0.1
# A framed request's fixed start: size, api key, version, correlation id, client id length.
_REQUEST_START = struct.Struct(">ihhih")


@cache
def _relayed_header_version(api_key: int, api_version: int) -> int:
    """The header version of a request the relay may forward (1 or 2), 0 if the client
    loop must read it: ApiVersions (answered here), ControlledShutdown v0 (no client
    id), or an API or version the proxy does not know (refused there)."""
    if api_key == ApiKey.API_VERSIONS or not is_known(api_key, api_version):
        return 0
    version = request_header_version(api_key, api_version)
    return version if version >= 1 else 0


class ClientConnection:
    """One client connection; its requests that tiered partitions split are answered by
    `SplitAnswers`, which uses it as its `SplitHost`."""

    def __init__(
        self,
        proxy,  # proxy.server.app.Proxy; not imported to keep the import graph acyclic
        client_reader: BufferedFrameReader,
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
        self.upstream_reader: BufferedFrameReader | None = None
        self.upstream_writer: asyncio.StreamWriter | None = None
        limits = proxy.config.limits
        self._answers = ClientAnswers(proxy, client_writer, self.zone, limits.max_inflight_requests)
        self._order = self._answers.order
        self._split = SplitAnswers(self)
        self._upstream_task: asyncio.Task[None] | None = None
        self._max_frame = proxy.config.limits.max_frame_bytes
        # Requests read and not yet added to the metrics (`_publish`): per API key, and
        # their bytes (in; and to the broker, the part forwarded).
        self._requests: dict[int, int] = {}
        self._bytes_in = 0
        self._to_broker = 0
        self._relayed = [0, 0]  # requests, answers forwarded by the relay (not the loop)
        self._chunk_bytes = proxy.config.limits.buffer_bytes
        # The relay's state: the client id's bytes (length in front) as the client loop
        # last read them, the transports and protocols it writes to, its publish timer.
        self._client_id_raw: bytes | None = None
        self._upstream_transport: asyncio.WriteTransport | None = None
        self._upstream_protocol: FrameProtocol | None = None
        self._client_protocol = cast(FrameProtocol, client_writer.transport.get_protocol())
        # From the config, not from `proxy.tiering`: the broker listeners open before the
        # tiered service exists, and a connection accepted then is served once it does
        # (`Proxy._serving`). Taken from `proxy.tiering` here, such a connection relayed
        # every Fetch and Produce of tiered partitions to Kafka for its whole life.
        self._tiered_keys = TIERED_API_KEYS if proxy.config.tiering.enabled else frozenset()
        self._publish_timer: asyncio.TimerHandle | None = None
        # Requests larger than the limit are judged by their size before the body is read.
        client_reader.set_relay(None, self._max_frame + 4)

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
        except RelayFailed as exc:
            self._relay_failed("requests", exc)
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
            if self._publish_timer is not None:
                self._publish_timer.cancel()
                self._publish_timer = None
            self._publish()

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
        answered = asyncio.ensure_future(self._answers.all_answered.wait())
        waits: set[asyncio.Future] = {answered}
        if self._upstream_task is not None:
            waits.add(self._upstream_task)  # ends early if upstream goes away
        try:
            async with asyncio.timeout(OWED_ANSWERS_TIMEOUT_S):
                await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
                if self._answers.all_answered.is_set():
                    await self.client_writer.drain()
        except (TimeoutError, ConnectionError):
            pass
        finally:
            answered.cancel()

    async def _close(self) -> None:
        for slot in self._order.pending:  # read, never answered: the request's outcome
            self.proxy.metrics.unanswered.labels(str(slot.api_key)).inc()
        for slot in self._order.awaiting_upstream:  # never answered: no longer in flight
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
        reader = self.client_reader
        requests = self._requests
        if self.proxy.config.listeners.proxy_protocol != "off":
            await self._read_proxy_header()
        while True:
            self._relay_requests()  # those already buffered, first
            if not reader.has_frame():
                self._publish()  # the metrics, before waiting for more to read
                await reader.wait_frame()  # the relay forwards what it can meanwhile
            # The frame, its size in front: a view of the reader's buffer, valid until
            # the next read (frame_reader.py), forwarded as it is in one send.
            framed = await self._read_request()
            size = len(framed) - 4
            frame = framed[4:]
            header = read_request_header(frame)
            self._client_id_raw = _client_id_bytes(framed)
            requests[header.api_key] = requests.get(header.api_key, 0) + 1
            self._bytes_in += size + 4
            if header.client_id != self.zone.client_id:
                self._publish()  # counted in the zone of the requests before
            self.zone.on_client_id(header.client_id)
            if not self._answers.room.is_set():
                await self._answers.room.wait()
            if header.api_key == ApiKey.API_VERSIONS:
                answer = self._answer_api_versions(header, frame[header.size :])
                self.zone.count_local(size + 4, answer)
                await self.client_writer.drain()  # a client not reading stops being read
                continue
            expects_answer = check_forwardable(header, frame)
            plan = None
            if header.api_key == ApiKey.FETCH and self.zone.wants_fetch_rack:
                try:
                    rack = request_rack_id(header.api_version, frame[header.size :])
                except FrameError:
                    rack = None  # forwarded as it is: the broker judges the request
                self._publish()  # counted in the zone of the requests before
                self.zone.on_fetch_rack(rack)
            if self.proxy.tiering is not None and header.api_key in TIERED_API_KEYS:
                # A copy: a plan keeps the request beyond the next read.
                framed = memoryview(bytes(framed))
                frame = framed[4:]
                plan = await self._plan(header, frame)
                if plan is not None and plan.local is not None:
                    await self._split.request(header, plan, expects_answer, size + 4)
                    continue
            if self.upstream_writer is None:
                await self.connect_upstream()
            if expects_answer:
                slot = Slot(header.correlation_id, header.api_key, header.api_version, plan=plan)
                self.enqueue(slot)
                self.forwarded(slot)
            assert self.upstream_writer is not None
            self.upstream_writer.write(framed)
            self._to_broker += size + 4
            await self.upstream_writer.drain()
            if self._upstream_task is not None and self._upstream_task.done():
                self._upstream_task.result()  # re-raise why upstream stopped

    def _relay_requests(self) -> None:
        """Forward the buffered requests that need nothing but forwarding, as the client
        loop would, up to the first that needs more (left for the loop), or until the
        loop would wait: no room for another answer owed, upstream not writable."""
        transport = self._upstream_transport
        if transport is None:
            return
        reader = self.client_reader
        upstream = self._upstream_protocol
        assert upstream is not None
        order = self._order
        requests = self._requests
        relayed = 0
        while (framed := reader.next_frame()) is not None:
            if upstream.writing_paused or not order.has_room or len(framed) < 14:
                break
            _, api_key, api_version, correlation_id, id_size = _REQUEST_START.unpack_from(framed)
            header_version = _relayed_header_version(api_key, api_version)
            if not header_version or api_key in self._tiered_keys:
                break
            if api_key == ApiKey.FETCH and self.zone.wants_fetch_rack:
                break
            end = 14 + max(0, id_size)
            if framed[12:end] != self._client_id_raw:  # the zone may change
                break
            if header_version == 2:
                if end >= len(framed) or framed[end]:  # tagged fields: the loop reads them
                    break
                end += 1
            expects_answer = True
            if api_key == ApiKey.PRODUCE:
                try:
                    expects_answer = produce_acks(api_version, framed[end:]) != 0
                except FrameError:
                    break  # the loop refuses it
            size = len(framed)
            reader.consume(size)
            requests[api_key] = requests.get(api_key, 0) + 1
            self._bytes_in += size
            self._to_broker += size
            if expects_answer:
                slot = Slot(correlation_id, api_key, api_version)
                self._answers.enqueue(slot)
                order.forwarded(slot)
            transport.write(framed)
            relayed += 1
        if relayed:
            self._relayed[0] += relayed
            self._publish_soon()

    def _relay_answers(self) -> None:
        """Send on the buffered answers up to `RELAY_ANSWER_BYTES` whose turn has come,
        as the upstream loop would (rewritten where they name brokers), up to the first
        that needs more: one to merge with a tiered part, one behind an answer made here
        that is not ready, a client not reading."""
        reader = self.upstream_reader
        assert reader is not None
        order = self._order
        answers = self._answers
        client = self._client_protocol
        relayed = 0
        while (framed := reader.next_frame()) is not None:
            slot = order.next_from_upstream()
            if slot is None or slot.plan is not None or client.writing_paused:
                break
            if not order.is_next(slot) or len(framed) < 8:
                break
            if FRAME_SIZE.unpack_from(framed, 4)[0] != slot.correlation_id:
                break  # the loop closes the connection over it
            api = HANDLING.get(slot.api_key)
            data: tuple[bytes | bytearray | memoryview, ...] = (framed,)
            if api is not None and api.rewrites(slot.api_version):
                try:
                    data = self._rewritten(api, slot, framed)
                except FrameError:
                    break  # the loop reports it
            reader.consume(len(framed))
            order.answered_upstream()
            answers.write(*data)
            answers.streamed(slot)
            relayed += 1
        if relayed:
            self._relayed[1] += relayed
            self._publish_soon()

    def _publish_soon(self) -> None:
        """The relay's counts, to the metrics within `PUBLISH_DELAY_S`: one timer per
        connection at a time, not a publish per request."""
        if self._publish_timer is None:
            self._publish_timer = asyncio.get_running_loop().call_later(
                PUBLISH_DELAY_S, self._published_late
            )

    def _published_late(self) -> None:
        self._publish_timer = None
        self._publish()

    def _publish(self) -> None:
        """Add what was counted since the last call to the metrics: per batch of
        requests, not per request (a prometheus_client inc takes a lock)."""
        metrics = self.proxy.metrics
        if self._requests:
            for api_key, count in self._requests.items():
                metrics.request(api_key, count)
            self._requests.clear()
        if self._bytes_in:
            metrics.bytes_in.inc(self._bytes_in)
            self._bytes_in = 0
        if self._to_broker:
            self.zone.count_to_broker(self._to_broker)
            self._to_broker = 0
        relayed = self._relayed
        if relayed[0] or relayed[1]:
            metrics.relayed_frames.labels("request").inc(relayed[0])
            metrics.relayed_frames.labels("answer").inc(relayed[1])
            relayed[0] = relayed[1] = 0
        self._answers.publish()

    async def _plan(self, header: RequestHeader, frame: memoryview) -> Plan | None:
        """How a request of an API `HANDLING` marks tiered splits between the tiered
        partitions, answered here, and the rest (None or a plan with no local part: all
        of it goes upstream); `proxy.tiered.planners`."""
        request = TieredRequest(
            frame[: header.size], frame[header.size :], header.api_version, id(self), self.peer
        )
        try:
            return await PLANNERS[header.api_key](self.proxy.tiering, request)
        except FrameError as exc:
            raise RejectedFrame("malformed_request", str(exc)) from None

    async def _read_proxy_header(self) -> None:
        """Take the client's real address from a PROXY header, if the connection starts
        with one (if not, its first 4 bytes, a frame size, are left unread)."""
        reader = self.client_reader
        try:
            first = bytes(await reader.peek(4))
        except asyncio.IncompleteReadError as exc:
            self._truncated(exc, "frame size")
        if detect(first) == "none":
            if self.proxy.config.listeners.proxy_protocol == "required":
                raise RejectedFrame("missing_proxy_header", "no PROXY protocol header")
            return
        buffer = b""
        want = 4
        try:
            while True:
                try:
                    buffer += await reader.readexactly(want)
                except asyncio.IncompleteReadError as exc:
                    self._truncated(exc, "frame")
                parsed = parse_proxy_header(buffer)
                if parsed[0] is not None:
                    break
                want = parsed[1]
        except FrameError as exc:
            raise RejectedFrame("malformed_proxy_header", str(exc)) from None
        header = parsed[0]
        if header.source_address is not None:  # None: the balancer's own health check
            self.peer = f"{header.source_address}:{header.source_port} (via {self.peer})"
            self.zone.peer = self.peer
            self.zone.source_address = header.source_address

    async def _read_request(self) -> memoryview:
        """The next request frame, its size in front (valid until the next read)."""
        try:
            return await self.client_reader.read_frame(self._check_size)
        except asyncio.IncompleteReadError as exc:
            if len(exc.partial) < 4:  # a clean end if nothing came
                self._truncated(exc, "frame size")
            partial = exc.partial[4:]
            expected = (exc.expected or 4) - 4
            self._truncated(asyncio.IncompleteReadError(partial, expected), "frame")

    def _check_size(self, size: int) -> None:
        check_request_size(size, self._max_frame)  # before reading any of the body

    def _truncated(self, exc: asyncio.IncompleteReadError, part: str) -> NoReturn:
        """The client closed mid-read: a clean end between frames (IncompleteReadError
        again), else RejectedFrame; why upstream stopped, if it did so first."""
        upstream = self._upstream_task
        if upstream is not None and upstream.done():
            upstream.result()  # the proxy closed the client: upstream went away
        if part == "frame size" and not exc.partial:
            raise exc  # a clean end: the client went away between frames
        raise RejectedFrame(
            "truncated_frame",
            f"connection closed after {len(exc.partial)} of the {exc.expected} bytes of a {part}",
        ) from None

    def _answer_api_versions(self, header: RequestHeader, body: memoryview) -> int:
        """Answer here (queued behind earlier answers); the answer's size."""
        proxy = self.proxy
        payload = api_versions_answer(header, body, proxy.api_versions_body, proxy.api_ranges)
        slot = Slot(header.correlation_id, ApiKey.API_VERSIONS, header.api_version, local=True)
        slot.data = (FRAME_SIZE.pack(len(payload)) + payload,)
        self.enqueue(slot)
        self._answers.flush()
        return len(payload) + 4

    # -- SplitHost: what the split answers use -------------------------------------------

    def enqueue(self, slot: Slot) -> None:
        self._answers.enqueue(slot)

    def forwarded(self, slot: Slot) -> None:
        self._order.forwarded(slot)
        if slot.plan is not None:  # passthrough topics in flight (cutover drains them)
            count_in_flight(self.proxy.tiering.in_flight, slot.plan.passthrough_topics, 1)

    def answered_here(self) -> None:
        self._answers.answered_here()

    async def connect_upstream(self) -> None:
        node_id, host, port = self.proxy.upstream_address_for(self.target_node)
        self.zone.on_upstream(node_id)
        self.upstream_reader, self.upstream_writer = await self.proxy.open_upstream(host, port)
        # Each reader's views are written to the other side (frame_reader.py).
        self.client_reader.forwards_to(self.upstream_writer.transport)
        self.upstream_reader.forwards_to(self.client_writer.transport)
        self._upstream_transport = self.upstream_writer.transport
        self._upstream_protocol = cast(FrameProtocol, self._upstream_transport.get_protocol())
        self.client_reader.set_relay(self._relay_requests, self._max_frame + 4)
        self.upstream_reader.set_relay(self._relay_answers, RELAY_ANSWER_BYTES)
        self._upstream_task = asyncio.create_task(self._upstream_loop())

    # -- upstream to client ------------------------------------------------------------

    async def _upstream_loop(self) -> None:
        reader = self.upstream_reader
        assert reader is not None
        try:
            while True:
                self._relay_answers()  # those already buffered, first
                if not reader.has_frame():
                    self._publish()  # the metrics, before waiting for more to read
                    await reader.wait_frame()  # the relay sends what it can meanwhile
                try:
                    (size,) = FRAME_SIZE.unpack(await reader.peek(4))
                except asyncio.IncompleteReadError:
                    raise UpstreamClosed("connection closed by the broker") from None
                if not 4 <= size <= MAX_RESPONSE_BYTES:
                    raise UpstreamClosed(f"response frame size {size} out of range")
                slot = self._order.next_from_upstream()  # taken once answered in full
                if slot is None:
                    raise UpstreamClosed("an answer to no request")
                api = HANDLING.get(slot.api_key)
                rewrites = api is not None and api.rewrites(slot.api_version)
                if slot.plan is not None and slot.plan.local is not None:
                    await reader.readexactly(4)
                    frame = await read_whole(reader, size, self._chunk_bytes)
                    check_correlation_id(slot.correlation_id, frame)
                    slot.data = await self._split.merged(slot, frame)
                    self._answered_upstream(slot)
                    self._answers.flush()
                    await self._answers.drain()
                elif api is not None and rewrites and not _walks(api, size, self._chunk_bytes):
                    framed = await read_exactly(reader, size + 4)
                    check_correlation_id(slot.correlation_id, framed[4:])
                    if not self._order.is_next(slot):  # queued beyond the next read
                        framed = memoryview(bytearray(framed))
                    slot.data = self._rewritten(api, slot, framed)
                    self._answered_upstream(slot)
                    self._answers.flush()
                    await self._answers.drain()
                else:  # as it comes; an answer to rewrite here is one to walk (Fetch v16+)
                    await self._pass_through(slot, size, walk=rewrites)
                    self._answered_upstream(slot)
        except ClientGone:
            # Not upstream's fault: the client loop sees the connection end and closes.
            raise ConnectionResetError("the client went away") from None
        except RelayFailed as exc:
            self._relay_failed("answers", exc)
            self.client_writer.close()  # the client loop ends with it
            raise UpstreamClosed(str(exc)) from None
        except (UpstreamClosed, FrameError, ConnectionError, asyncio.IncompleteReadError) as exc:
            # FrameError here is a response a rewriter could not read: upstream's fault.
            reason = str(exc) or exc.__class__.__name__
            self._upstream_lost(reason)
            # Stop the client loop too: the client sees its connection close and retries.
            self.client_writer.close()
            raise UpstreamClosed(reason) from None

    def _rewritten(
        self, api: ApiHandling, slot: Slot, framed: memoryview
    ) -> tuple[bytes | bytearray | memoryview, ...]:
        """The framed answer with the brokers it names replaced by the proxy's listeners,
        in pieces: an answer that names none (most Fetch answers) is not copied."""
        view = framed[4:]
        head = response_header_size(slot.api_key, slot.api_version, view)
        body = view[head:]
        assert api.rewrite is not None  # `rewrites`
        rewritten = api.rewrite(slot.api_version, body, self.zone.advertise)
        if rewritten is body:
            return (framed,)
        return FRAME_SIZE.pack(head + len(rewritten)), view[:head], rewritten

    async def _pass_through(self, slot: Slot, size: int, walk: bool) -> None:
        """Send an answer of `size` bytes (after its own size) on as it arrives, a buffer
        at a time: a Fetch answer may be tens of MiB, and the proxy holds no more of it
        than its buffers, however large. Its turn comes first, so that each piece read is
        written before the next read (the reader's views are valid until then)."""
        answers = self._answers
        await answers.wait_turn(slot)
        reader = self.upstream_reader
        assert reader is not None
        if walk:  # a large Fetch v16+ answer (`_walks`)
            head = bytes(await read_exactly(reader, 8))  # kept while the walk reads on
            check_correlation_id(slot.correlation_id, head[4:])
            version = slot.api_version
            await stream_walked_answer(
                reader, head, size - 4, walk_fetch_answer(version), self._chunk_bytes,
                answers.write, answers.drain,
                lambda tail: rewrite_tail(version, tail, self.zone.advertise),
            )  # fmt: skip
            answers.streamed(slot)
            return
        remaining = size + 4
        first = True
        while remaining:
            chunk = await reader.read(min(remaining, self._chunk_bytes), 8 if first else 1)
            if len(chunk) < (8 if first else 1):
                raise UpstreamClosed(f"connection closed by the broker, {remaining} bytes short")
            if first:  # size and correlation id in front
                check_correlation_id(slot.correlation_id, chunk[4:8])
                first = False
            answers.write(chunk)
            remaining -= len(chunk)
            await answers.drain()
        answers.streamed(slot)

    def _answered_upstream(self, slot: Slot) -> None:
        self._order.answered_upstream()
        if slot.plan is not None:
            count_in_flight(self.proxy.tiering.in_flight, slot.plan.passthrough_topics, -1)
            slot.plan = None

    def _relay_failed(self, direction: str, exc: RelayFailed) -> None:
        """A fault of the proxy's own, not of the client or the broker: said loudly, with
        its traceback, and the connection closed (the client reconnects)."""
        log.error(
            "closing client %s on %s: relaying %s failed: %s",
            self.peer,
            self.listener,
            direction,
            exc,
            exc_info=exc.__cause__,
            extra={"client": self.peer, "reason": "relay_failed"},
        )

    def _upstream_lost(self, reason: str) -> None:
        self.proxy.metrics.upstream_errors.labels("closed").inc()
        oldest = self._order.next_from_upstream()
        if oldest is None:  # e.g. the broker closed an idle connection
            log.info("client %s: upstream closed: %s", self.peer, reason)
            return
        # Often a request the broker could not parse: the proxy forwards bodies unread.
        log.warning(
            "closing client %s on %s: upstream closed with %d request(s) unanswered, "
            "the oldest api key %d v%d correlation id %d: %s",
            self.peer,
            self.listener,
            len(self._order.awaiting_upstream),
            oldest.api_key,
            oldest.api_version,
            oldest.correlation_id,
            reason,
            extra={"client": self.peer, "reason": "upstream_closed"},
        )


def _client_id_bytes(framed: memoryview) -> bytes | None:
    """A framed request's client id as it lies, its length in front (what the relay
    compares), if the frame is long enough to hold one."""
    if len(framed) < 14:
        return None
    end = 14 + max(0, _REQUEST_START.unpack_from(framed)[4])
    return bytes(framed[12:end]) if end <= len(framed) else None


def _walks(api: ApiHandling | None, size: int, buffer_bytes: int) -> bool:
    """Whether an answer to rewrite is walked as it streams (fetch_stream.py) rather than
    read whole: a Fetch answer larger than the connection's buffer. A smaller one, such
    as the answers that name a moved leader (its partitions carry no records), is read
    whole and rewritten at its own length."""
    return api is not None and api.walks_large_answers and size > buffer_bytes
