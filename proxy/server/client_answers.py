"""Sending a connection's answers to its client, strictly in request order.

The asyncio side of `connection_state.AnswerOrder`: answers are queued as their requests
are read and written once every answer before them is written, each in one system call;
an answer streamed from a broker waits for its turn. Flow control: `room` is set while
fewer requests than `limits.max_inflight_requests` await an answer, `all_answered` while
none does.
"""

from __future__ import annotations

import asyncio
import time

from proxy.server.connection_state import AnswerOrder, Slot
from proxy.server.zoning import ConnectionZone


class ClientGone(Exception):
    """Writing to the client failed: it went away while an answer was on its way."""


class ClientAnswers:
    def __init__(
        self,
        proxy,  # proxy.server.app.Proxy: its metrics, and its tap (read at each write)
        writer: asyncio.StreamWriter,
        zone: ConnectionZone,
        max_inflight: int,
    ) -> None:
        self.order = AnswerOrder(max_inflight)
        self.room = asyncio.Event()  # set while fewer than max in-flight requests
        self.room.set()
        self.all_answered = asyncio.Event()  # set while no answer is owed
        self.all_answered.set()
        self._proxy = proxy
        self._metrics = proxy.metrics
        self._writer = writer
        self._zone = zone
        self._local_answer = asyncio.Event()  # set when an answer is made here
        # Bytes written and not yet added to the metrics (`publish`): a prometheus_client
        # inc takes a lock, so the counters are updated per batch of answers.
        self._bytes_out = 0
        self._to_client = 0

    def enqueue(self, slot: Slot) -> None:
        self.order.owe(slot, time.perf_counter())
        self.all_answered.clear()
        if not self.order.has_room:
            self.room.clear()

    def flush(self) -> None:
        """Send every answer that is ready, in request order."""
        order = self.order
        for slot in order.ready():
            assert slot.data is not None
            self.write(*slot.data, local=slot.local)
            self._metrics.answered(slot.api_key, time.perf_counter() - slot.read_at)
            if slot.ready_at:  # a tiered answer: encoding, and its turn behind earlier ones
                self._metrics.answer_stage(slot.api_key, slot.ready_at)
        if order.has_room:
            self.room.set()
        if order.all_answered:
            self.all_answered.set()

    def answered_here(self) -> None:
        """An answer was made here (a tiered part): send what is ready, and wake a
        streamed answer waiting for its turn behind it."""
        self.flush()
        self.publish()  # made by a tiered task, not one of the connection's loops
        self._local_answer.set()
        self._local_answer = asyncio.Event()

    async def wait_turn(self, slot: Slot) -> None:
        """Until every answer owed before `slot`'s is sent, so that its own can stream.
        Every upstream answer before it is ready (upstream answers in order); one made
        here may not be yet."""
        self.flush()
        while not self.order.is_next(slot):
            await self._local_answer.wait()
            self.flush()

    def streamed(self, slot: Slot) -> None:
        """`slot`'s answer was sent as it streamed: send the answers queued behind it."""
        self._metrics.answered(slot.api_key, time.perf_counter() - slot.read_at)
        self.order.streamed(slot)
        self.flush()

    def write(self, *pieces: bytes | bytearray | memoryview, local: bool = False) -> None:
        """Queue pieces of an answer for the client: one send for all of them (uvloop
        tries to send on every `write`, so two writes would be two system calls)."""
        if len(pieces) == 1:
            self._writer.write(pieces[0])
        else:
            self._writer.writelines(pieces)
        size = sum(len(piece) for piece in pieces)
        self._bytes_out += size
        if not local:  # a broker's answer: it crossed the proxy-to-broker hop too
            self._to_client += size
        tap = self._proxy.tap
        if tap is not None:
            for piece in pieces:
                tap(piece)

    def publish(self) -> None:
        """Add the bytes written since the last call to the metrics: the connection
        calls it before its loops wait for more to read, and as it closes."""
        if self._bytes_out:
            self._metrics.bytes_out.inc(self._bytes_out)
            self._bytes_out = 0
        if self._to_client:
            self._zone.count_to_client(self._to_client)
            self._to_client = 0

    async def drain(self) -> None:
        try:
            await self._writer.drain()
        except ConnectionError:
            raise ClientGone from None
