"""One client connection and the upstream connection that serves it.

Two loops per connection, each owning one direction:

- the client loop reads request frames, decides from the header alone (answer here,
  forward, expect no answer for acks=0), and writes them upstream;
- the upstream loop reads response frames, rewrites the few that name brokers, and hands
  them to the writer, which sends answers strictly in request order.

Backpressure comes from awaiting `drain()` on each side: a client that stops reading
stops the upstream loop, the upstream socket fills, and the broker stops sending. The
number of requests awaiting an answer is bounded too. Any decode error closes this
connection only, with one warning naming the client and the reason.
"""

from __future__ import annotations

import asyncio
import logging
import struct
from collections import deque
from dataclasses import dataclass

from proxy.apis import RESPONSE_REWRITERS
from proxy.apis.api18_api_versions import (
    encode_api_versions_response,
    unsupported_version_response,
)
from proxy.protocol.apis import is_known
from proxy.protocol.frames import FrameError
from proxy.protocol.headers import (
    RequestHeader,
    parse_request_header,
    produce_acks,
    response_header,
    response_header_size,
)

log = logging.getLogger("tierproxy.connection")

_SIZE = struct.Struct(">i")
API_PRODUCE = 0
API_VERSIONS = 18
# Responses can legitimately be far larger than requests (fetch.max.bytes is per request
# and several partitions may each return their max); trust upstream up to this.
MAX_RESPONSE_BYTES = 1 << 30


class UpstreamClosed(Exception):
    """The broker closed the connection or answered out of turn."""


@dataclass(slots=True)
class _Slot:
    """A request awaiting its answer; `data` is the framed answer once it is known."""

    correlation_id: int
    api_key: int
    api_version: int
    data: bytes | None = None


class ClientConnection:
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
        self.upstream_reader: asyncio.StreamReader | None = None
        self.upstream_writer: asyncio.StreamWriter | None = None
        self._pending: deque[_Slot] = deque()  # every answer owed, in request order
        self._awaiting_upstream: deque[_Slot] = deque()
        self._room = asyncio.Event()  # set while fewer than max in-flight requests
        self._room.set()
        self._upstream_task: asyncio.Task[None] | None = None
        self._max_frame = proxy.config.limits.max_frame_bytes
        self._max_inflight = proxy.config.limits.max_inflight_requests

    # -- lifecycle -------------------------------------------------------------------

    async def serve(self) -> None:
        metrics = self.proxy.metrics
        metrics.connections.inc()
        metrics.connections_accepted.labels(self.listener).inc()
        try:
            await self._client_loop()
        except FrameError as exc:
            self._reject(str(exc), exc.__class__.__name__)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass  # the client went away; nothing to report
        except UpstreamClosed as exc:
            metrics.upstream_errors.labels("closed").inc()
            log.info("client %s: upstream closed: %s", self.peer, exc)
        except OSError as exc:
            metrics.upstream_errors.labels("connect").inc()
            log.warning("client %s: cannot reach upstream: %s", self.peer, exc)
        finally:
            metrics.connections.dec()
            await self._close()

    def _reject(self, reason: str, kind: str) -> None:
        self.proxy.metrics.rejected_frames.labels(kind).inc()
        log.warning("closing client %s: %s", self.peer, reason)

    async def _close(self) -> None:
        task = self._upstream_task
        if task is not None:
            if task.done() and not task.cancelled() and task.exception() is not None:
                log.info("client %s: upstream closed: %s", self.peer, task.exception())
            task.cancel()
        for writer in (self.upstream_writer, self.client_writer):
            if writer is not None:
                writer.close()
        for writer in (self.upstream_writer, self.client_writer):
            if writer is not None:
                try:
                    await writer.wait_closed()
                except (OSError, asyncio.CancelledError):
                    pass

    # -- client to upstream ------------------------------------------------------------

    async def _client_loop(self) -> None:
        reader = self.client_reader
        metrics = self.proxy.metrics
        while True:
            size_bytes = await reader.readexactly(4)
            (size,) = _SIZE.unpack(size_bytes)
            if size < 0:
                raise FrameError(f"negative frame size {size}")
            if size > self._max_frame:
                raise FrameError(f"frame size {size} exceeds limit {self._max_frame}")
            frame = memoryview(await reader.readexactly(size))
            header = parse_request_header(frame)
            metrics.requests.labels(str(header.api_key)).inc()
            metrics.bytes_in.inc(size + 4)
            if not self._room.is_set():
                await self._room.wait()
            if header.api_key == API_VERSIONS:
                self._answer_api_versions(header)
                continue
            expects_answer = True
            if header.api_key == API_PRODUCE:
                expects_answer = produce_acks(header.api_version, frame[header.size :]) != 0
            if not is_known(header.api_key, header.api_version):
                raise FrameError(
                    f"unsupported version {header.api_version} of api key {header.api_key}"
                )
            if self.upstream_writer is None:
                await self._connect_upstream()
            if expects_answer:
                slot = _Slot(header.correlation_id, header.api_key, header.api_version)
                self._enqueue(slot)
                self._awaiting_upstream.append(slot)
            assert self.upstream_writer is not None
            self.upstream_writer.write(size_bytes)
            self.upstream_writer.write(frame)
            await self.upstream_writer.drain()
            if self._upstream_task is not None and self._upstream_task.done():
                self._upstream_task.result()  # re-raise why upstream stopped

    def _answer_api_versions(self, header: RequestHeader) -> None:
        ranges = self.proxy.api_ranges()
        if is_known(API_VERSIONS, header.api_version):
            payload = response_header(header.correlation_id, API_VERSIONS, header.api_version)
            payload += encode_api_versions_response(header.api_version, ranges)
        else:  # as Kafka does: a v0 answer saying UNSUPPORTED_VERSION, so the client downgrades
            payload = unsupported_version_response(header.correlation_id, ranges)
        slot = _Slot(header.correlation_id, API_VERSIONS, header.api_version)
        slot.data = _SIZE.pack(len(payload)) + payload
        self._enqueue(slot)
        self._flush()

    def _enqueue(self, slot: _Slot) -> None:
        self._pending.append(slot)
        if len(self._pending) >= self._max_inflight:
            self._room.clear()

    async def _connect_upstream(self) -> None:
        host, port = self.proxy.upstream_address_for(self.target_node)
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
                frame = await reader.readexactly(size)
                if not self._awaiting_upstream:
                    raise UpstreamClosed("an answer to no request")
                slot = self._awaiting_upstream.popleft()
                (correlation_id,) = _SIZE.unpack_from(frame, 0)
                if correlation_id != slot.correlation_id:
                    raise UpstreamClosed(
                        f"correlation id {correlation_id}, expected {slot.correlation_id}"
                    )
                rewrite = RESPONSE_REWRITERS.get(slot.api_key)
                if rewrite is None:
                    slot.data = size_bytes + frame
                else:
                    view = memoryview(frame)
                    head = response_header_size(slot.api_key, slot.api_version, view)
                    body = rewrite(slot.api_version, view[head:], self.proxy.brokers.advertise)
                    slot.data = _SIZE.pack(head + len(body)) + frame[:head] + body
                self._flush()
                await self.client_writer.drain()
        except (UpstreamClosed, ConnectionError, asyncio.IncompleteReadError) as exc:
            if not isinstance(exc, UpstreamClosed):
                exc = UpstreamClosed(str(exc) or exc.__class__.__name__)
            # Stop the client loop too: the client sees its connection close and retries.
            self.client_writer.close()
            raise exc from None

    def _flush(self) -> None:
        """Send every answer that is ready, in request order."""
        pending = self._pending
        tap = self.proxy.tap
        sent = 0
        while pending and pending[0].data is not None:
            data = pending.popleft().data
            assert data is not None
            self.client_writer.write(data)
            sent += len(data)
            if tap is not None:
                tap(data)
        if sent:
            self.proxy.metrics.bytes_out.inc(sent)
        if len(pending) < self._max_inflight:
            self._room.set()
