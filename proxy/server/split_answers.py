"""The answers to the requests a proxy that tiers topics splits (docs/tiering.md, "A
Produce request", "Reading a tiered topic").

A request with tiered partitions (`proxy.apis.HANDLING`, `tiered`) is answered here when
nothing of it went upstream, or merged with upstream's answer when part did; either way
the answer takes its place in the connection's request order. `SplitAnswers` is one
client connection's; it uses the connection only through `SplitHost`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Protocol

from proxy.apis import HANDLING
from proxy.kafka.frames import FRAME_SIZE
from proxy.kafka.headers import RequestHeader, response_header, response_header_size
from proxy.server.connection_state import Slot
from proxy.server.zoning import ConnectionZone
from proxy.tiered.planners import AfterUpstream, Plan

log = logging.getLogger("tierproxy.connection")


class SplitHost(Protocol):
    """What the split answers need of their client connection (`ClientConnection`)."""

    peer: str
    zone: ConnectionZone
    client_writer: asyncio.StreamWriter
    upstream_writer: asyncio.StreamWriter | None

    async def connect_upstream(self) -> None: ...

    def enqueue(self, slot: Slot) -> None:
        """Owe an answer, behind those owed already."""

    def forwarded(self, slot: Slot) -> None:
        """Its request went upstream: the broker's next unclaimed answer is for it."""

    def answered_here(self) -> None:
        """An answer owed was just made here: send what is ready."""


class SplitAnswers:
    def __init__(self, host: SplitHost) -> None:
        self._host = host
        self._background: set[asyncio.Future] = set()  # acks=0 tiered produce under way

    async def request(
        self, header: RequestHeader, plan: Plan, expects_answer: bool, size: int
    ) -> None:
        """A request with tiered partitions: those are under way in `plan.local`; the
        rest, if any, goes upstream as a smaller request, and the answers are merged."""
        host = self._host
        assert plan.local is not None
        if plan.upstream_frame is not None and host.upstream_writer is None:
            await host.connect_upstream()
        if not expects_answer:
            self._background.add(plan.local)
            plan.local.add_done_callback(self._background.discard)
        else:
            slot = Slot(header.correlation_id, header.api_key, header.api_version, plan=plan)
            slot.local = plan.upstream_frame is None
            host.enqueue(slot)
            if slot.local:
                plan.local.add_done_callback(lambda _: self._answer_locally(slot, size))
            else:
                host.forwarded(slot)
        if plan.upstream_frame is not None:
            assert host.upstream_writer is not None
            host.upstream_writer.writelines(plan.upstream_frame)
            host.zone.count_to_broker(sum(len(piece) for piece in plan.upstream_frame))
            await host.upstream_writer.drain()
        elif expects_answer:
            await host.client_writer.drain()  # a client not reading stops being read

    def _answer_locally(self, slot: Slot, request_size: int) -> None:
        assert slot.plan is not None and slot.plan.local is not None
        host = self._host
        if host.client_writer.is_closing():
            # The client went away (or the proxy is stopping) while the tiered partitions
            # worked: nobody to answer. Writing to the closed transport would raise here,
            # in a done callback, where nothing catches it. The client retries the batch;
            # the sequencer answers the retry with the original offsets.
            return
        slot.ready_at = time.perf_counter()
        payload = response_header(slot.correlation_id, slot.api_key, slot.api_version)
        payload += self._merged_body(slot, None)
        slot.data = (FRAME_SIZE.pack(len(payload)) + payload,)
        host.zone.count_local(request_size, len(payload) + 4)
        host.answered_here()

    async def merged(self, slot: Slot, frame: bytearray) -> tuple[bytes, ...]:
        """Upstream's answer to the passthrough part, merged with the tiered results; a
        plan that acts after upstream (`AfterUpstream`) is handed the answer first."""
        plan = slot.plan
        assert plan is not None and plan.local is not None
        view = memoryview(frame)
        head = response_header_size(slot.api_key, slot.api_version, view)
        if isinstance(plan, AfterUpstream) and not plan.local.done():
            try:
                plan.upstream_answered(slot.api_version, view[head:])
            except Exception as exc:  # a bug: answer with `failed`, keep the connection
                plan.local.set_exception(exc)
        await asyncio.wait([plan.local])
        body: bytes | memoryview = self._merged_body(slot, view[head:])
        rewriter = HANDLING[slot.api_key].rewrite  # ListOffsets, DeleteRecords: none
        if rewriter is not None:
            body = rewriter(slot.api_version, memoryview(body), self._host.zone.advertise)
        return (FRAME_SIZE.pack(head + len(body)) + bytes(view[:head]) + bytes(body),)

    def _merged_body(self, slot: Slot, upstream: memoryview | None) -> bytes:
        plan = slot.plan
        assert plan is not None and plan.local is not None
        try:
            local = plan.local.result()
        except Exception as exc:  # a bug: answer the tiered partitions, keep the connection
            log.exception("client %s: tiered api key %d failed", self._host.peer, slot.api_key)
            local = plan.failed(exc)
        return plan.merge(slot.api_version, upstream, local)
