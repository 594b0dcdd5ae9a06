"""The tiered side of a client connection (docs/tiering.md, "A Produce request", "Reading
a tiered topic").

A Produce or Fetch with tiered partitions is answered here when nothing of it went upstream, or
merged with upstream's answer when part did; either way the answer takes its place in
the connection's request order. `ClientConnection` mixes this in: the methods use its
slots, writers and zone accounting.
"""

from __future__ import annotations

import asyncio
import logging
import struct

from proxy.apis import RESPONSE_REWRITERS
from proxy.kafka.headers import RequestHeader, response_header, response_header_size
from proxy.server.slots import Plan, Slot
from proxy.tiered.produce import count_in_flight

log = logging.getLogger("tierproxy.connection")

_SIZE = struct.Struct(">i")


class TieredAnswers:
    async def _tiered_request(
        self, header: RequestHeader, plan: Plan, expects_answer: bool, size: int
    ) -> None:
        """A Produce, Fetch, ListOffsets or DeleteRecords with tiered partitions: those are
        under way in `plan.local`; the rest, if any, goes upstream as a smaller request,
        and the answers are merged."""
        assert plan.local is not None
        if plan.upstream_frame is not None and self.upstream_writer is None:
            await self._connect_upstream()
        if not expects_answer:
            self._background.add(plan.local)
            plan.local.add_done_callback(self._background.discard)
        else:
            slot = Slot(header.correlation_id, header.api_key, header.api_version, plan=plan)
            slot.local = plan.upstream_frame is None
            self._enqueue(slot)
            if slot.local:
                plan.local.add_done_callback(lambda _: self._answer_locally(slot, size))
            else:
                self._awaiting_upstream.append(slot)
                count_in_flight(self.proxy.tiering.in_flight, plan.passthrough_topics, 1)
        if plan.upstream_frame is not None:
            assert self.upstream_writer is not None
            self.upstream_writer.writelines(plan.upstream_frame)
            self.zone.count_to_broker(sum(len(piece) for piece in plan.upstream_frame))
            await self.upstream_writer.drain()
        elif expects_answer:
            await self.client_writer.drain()  # a client not reading stops being read

    def _answer_locally(self, slot: Slot, request_size: int) -> None:
        assert slot.plan is not None and slot.plan.local is not None
        if self.client_writer.is_closing():
            # The client went away (or the proxy is stopping) while the tiered partitions
            # worked: nobody to answer. Writing to the closed transport would raise here,
            # in a done callback, where nothing catches it. The client retries the batch;
            # the sequencer answers the retry with the original offsets.
            return
        payload = response_header(slot.correlation_id, slot.api_key, slot.api_version)
        payload += self._merged_body(slot, None)
        slot.data = (_SIZE.pack(len(payload)) + payload,)
        self.zone.count_local(request_size, len(payload) + 4)
        self._flush()
        self._local_answer.set()
        self._local_answer = asyncio.Event()

    async def _merged(self, slot: Slot, frame: bytearray) -> tuple[bytes, ...]:
        """Upstream's answer to the passthrough part, merged with the tiered results."""
        assert slot.plan is not None and slot.plan.local is not None
        await asyncio.wait([slot.plan.local])
        view = memoryview(frame)
        head = response_header_size(slot.api_key, slot.api_version, view)
        body = self._merged_body(slot, view[head:])
        rewriter = RESPONSE_REWRITERS.get(slot.api_key)  # ListOffsets, DeleteRecords: none
        if rewriter is not None:
            body = rewriter(slot.api_version, body, self.zone.advertise)
        return (_SIZE.pack(head + len(body)) + bytes(view[:head]) + bytes(body),)

    def _merged_body(self, slot: Slot, upstream: memoryview | None) -> bytes:
        plan = slot.plan
        assert plan is not None and plan.local is not None
        try:
            local = plan.local.result()
        except Exception as exc:  # a bug: answer the tiered partitions, keep the connection
            log.exception("client %s: tiered api key %d failed", self.peer, slot.api_key)
            local = plan.failed(exc)
        return plan.merge(slot.api_version, upstream, local)

    def _answered_upstream(self, slot: Slot) -> None:
        self._awaiting_upstream.popleft()
        if slot.plan is not None:
            count_in_flight(self.proxy.tiering.in_flight, slot.plan.passthrough_topics, -1)
            slot.plan = None
