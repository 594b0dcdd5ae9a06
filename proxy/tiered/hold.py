"""A produce to a tiered stream that cannot take it yet, held until it can.

Two waits, both at most `cutover_hold_ms` from the produce's arrival:
- the partition's cutover is not read here yet (its topic was just tiered, or the
  partition just added): until its stream record is, or a look at Kafka finds the topic
  has no such partition (UNKNOWN_TOPIC_OR_PARTITION, Kafka's answer), or the topic is
  untiered; else REQUEST_TIMED_OUT (retriable);
- the stream's shard is owned here and its partition not started yet (just cut over, or
  the shard just claimed: the rebuild reads the WAL, the objects and Kafka's tail).

The produces that wait go on in the order they came, and a produce of the same stream
that would not have to wait goes on behind them (`InOrder`, in_order.py): each polls on
its own timer, so without the queue the first to see the partition started would go
first, and a producer's later batch reach the sequencer before its earlier one (refused
OUT_OF_ORDER_SEQUENCE_NUMBER, which clients take as fatal; a broker never makes that gap).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Container
from typing import Protocol

from kio.schema.errors import ErrorCode

from proxy.config.tiering import TieringConfig
from proxy.metadata.state import MetadataState
from proxy.metadata.topic_index import TieredTopic, TopicIndex
from proxy.partition.rules import ProduceResult
from proxy.tiered.in_order import InOrder
from proxy.tiered.owners import not_owner

CUTOVER_POLL_S = 0.5  # a wait for the cutover looks again at least this often
PARTITION_POLL_S = 0.1  # ... for the partition (its start is not a metadata record)


class Looks(Protocol):
    """The cutover loop's looks at Kafka's tiered topics (upkeep/cutover.py)."""

    @property
    def looks(self) -> int: ...

    def known_partitions(self, topic_id: uuid.UUID) -> int | None: ...

    async def nudge(self, topic: TieredTopic, partition: int) -> None: ...


class HoldHost(Protocol):
    """What the hold needs of the tiered service."""

    @property
    def config(self) -> TieringConfig: ...

    @property
    def topics(self) -> TopicIndex: ...

    @property
    def seals(self) -> Container[int]: ...

    @property
    def cutover(self) -> Looks: ...

    def state(self, stream: int) -> MetadataState: ...

    def owned_here(self, stream: int) -> bool: ...

    def started(self, stream: int) -> bool:
        """The stream's partition is started here (it takes produces)."""
        ...

    def start_failed(self, stream: int) -> bool:
        """The stream's last rebuild here failed: it is not being started (until the
        cutover loop rebuilds it again, or its shard is claimed again)."""
        ...

    async def changed(self, timeout_s: float) -> None: ...


class ProduceHold:
    def __init__(self, host: HoldHost) -> None:
        self._host = host
        self._turns = InOrder()  # per stream, the produces held and those behind them

    def needed(self, stream: int) -> bool:
        """A produce of `stream` must go through `wait`: it cannot be taken yet, or an
        earlier one is still held."""
        host = self._host
        if self._turns.busy(stream) or host.state(stream).cutover(stream) is None:
            return True
        return not host.started(stream) and host.owned_here(stream)

    async def wait(self, topic: TieredTopic, partition: int, stream: int) -> ProduceResult | None:
        """Until the produce can go on (None), in the stream's arrival order; or the
        answer if it cannot (module docstring). The caller goes on at once when None:
        the next held produce is let go only once this one's step ends."""
        deadline = time.monotonic() + self._host.config.cutover_hold_ms / 1000
        async with self._turns.turn(stream):
            return await self._hold(topic, partition, stream, deadline)

    async def _hold(
        self, topic: TieredTopic, partition: int, stream: int, deadline: float
    ) -> ProduceResult | None:
        host = self._host
        if host.state(stream).cutover(stream) is None:  # not tiered yet (no info copied)
            code = await self._wait_for_cutover(topic, partition, stream, deadline)
            if code == ErrorCode.unknown_topic_or_partition:
                message = f"{topic.name} has no partition {partition}"
                return ProduceResult(code, error_message=message)
            if code:
                return ProduceResult(
                    code, error_message=f"{topic.name}-{partition} is being cut over to tiered"
                )
        if stream in host.seals:
            return not_owner(f"{topic.name}-{partition} is being untiered")
        if not host.started(stream) and host.owned_here(stream):
            await self.wait_for_partition(stream, deadline)
        return None

    async def wait_for_partition(self, stream: int, deadline: float | None = None) -> None:
        """A stream of a shard owned here whose partition is being started (its cutover
        was just read, or the shard just claimed): wait for it, until `deadline` (else at
        most cutover_hold_ms), unless it is sealed for an untier or its topic is no longer
        tiered."""
        host = self._host
        if deadline is None:
            deadline = time.monotonic() + host.config.cutover_hold_ms / 1000
        while not host.started(stream) and host.owned_here(stream):
            if host.start_failed(stream):  # nothing to wait for: not served here
                return
            info = host.state(stream).stream(stream)
            if stream in host.seals or info is None or host.topics.topic(info.topic_id) is None:
                return
            left = deadline - time.monotonic()
            if left <= 0:
                return
            await host.changed(min(left, PARTITION_POLL_S))

    async def _wait_for_cutover(
        self, topic: TieredTopic, partition: int, stream: int, deadline: float
    ) -> int:
        """Until the partition is cut over: 0; REQUEST_TIMED_OUT at `deadline` or once the
        topic is no longer tiered (retriable); UNKNOWN_TOPIC_OR_PARTITION once a look at
        Kafka begun after this produce finds the topic has no such partition (as Kafka
        answers a produce to it)."""
        host = self._host
        cutover = host.cutover
        looks = cutover.looks
        if host.state(stream).stream(stream) is None:  # a partition added since the last look?
            await cutover.nudge(topic, partition)
        while host.state(stream).stream(stream) is None:
            count = cutover.known_partitions(topic.topic_id)
            if cutover.looks > looks + 1 and count is not None and partition >= count:
                return ErrorCode.unknown_topic_or_partition
            left = deadline - time.monotonic()
            if left <= 0 or host.topics.topic(topic.topic_id) is None:
                return ErrorCode.request_timed_out
            await host.changed(min(left, CUTOVER_POLL_S))
        return 0
