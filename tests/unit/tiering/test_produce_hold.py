"""Produces held for a stream's cutover or its partition's start go on in the order they
came (proxy/tiered/hold.py, in_order.py), also when a later one would not have to wait.

Each held produce polls on its own timer (a partition's start is not a metadata record),
so without the queue the one whose timer fires first after the start goes first: a
producer's later batch then reaches the sequencer before the earlier one, which a broker
answers OUT_OF_ORDER_SEQUENCE_NUMBER (the cutover-under-load test's failure: "389
(incoming seq. number), 387 (current end sequence number)"). The host is a stand-in for
`TieringService`: pure scheduling, no Kafka, WAL or network (the cutover integration
tests run the real service under a librdkafka producer's load).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from types import SimpleNamespace

import pytest
from kio.schema.errors import ErrorCode

from proxy.config.tiering import TieringConfig
from proxy.metadata.topic_index import TieredTopic
from proxy.tiered.changes import Changes
from proxy.tiered.hold import PARTITION_POLL_S, ProduceHold
from proxy.tiered.in_order import InOrder
from proxy.tiered.service import TieringService

STREAM = 7
TOPIC = TieredTopic(uuid.uuid4(), "t", 0)


class _Info:
    topic_id = TOPIC.topic_id


class _State:
    def __init__(self) -> None:
        self.cut_over = False

    def stream(self, stream: int) -> _Info | None:
        return _Info() if self.cut_over else None

    def cutover(self, stream: int) -> int | None:
        return 0 if self.cut_over else None


class _Topics:
    def topic(self, topic_id: uuid.UUID) -> TieredTopic | None:
        return TOPIC


class _Looks:
    looks = 0

    def known_partitions(self, topic_id: uuid.UUID) -> int | None:
        return None

    async def nudge(self, topic: TieredTopic, partition: int) -> None:
        return None


class _Host:
    """One stream, owned here; the test cuts it over and starts its partition."""

    def __init__(self, hold_ms: int = 5000) -> None:
        self.config = TieringConfig(cutover_hold_ms=hold_ms)
        self.topics = _Topics()
        self.seals: set[int] = set()
        self.cutover = _Looks()
        self._state = _State()
        self._started = False
        self.failed = False  # the rebuild failed
        self._changes = Changes()  # the service's own wake-up

    def state(self, stream: int) -> _State:
        return self._state

    def owned_here(self, stream: int) -> bool:
        return True

    def started(self, stream: int) -> bool:
        return self._started

    def start_failed(self, stream: int) -> bool:
        return self.failed

    async def changed(self, timeout_s: float) -> None:
        await self._changes.wait(timeout_s)

    def cut_over(self) -> None:  # a metadata record: the service notifies
        self._state.cut_over = True
        self._changes.notify()

    def start(self) -> None:  # no notify: a partition's start is not a metadata record
        self._started = True


async def _produce(hold: ProduceHold, name: str, order: list[str]) -> None:
    if hold.needed(STREAM):
        assert await hold.wait(TOPIC, 0, STREAM) is None
    order.append(name)  # the caller's next step: the sequencer (or the hand-off) queue


async def test_held_produces_reach_the_partition_in_the_order_they_came():
    """A waits from before the cutover, B from after it: B's poll timer fires first
    after the start, so B would go first. A produce arriving once the partition started
    (C) still queues behind them."""
    host = _Host()
    hold = ProduceHold(host)
    order: list[str] = []
    a = asyncio.create_task(_produce(hold, "a", order))
    await asyncio.sleep(0.01)
    host.cut_over()  # A moves on to wait for the partition, polling from now
    await asyncio.sleep(PARTITION_POLL_S / 2)
    b = asyncio.create_task(_produce(hold, "b", order))  # polls half a period later
    await asyncio.sleep(PARTITION_POLL_S * 0.7)  # past B's arrival, before A's next poll
    host.start()
    c = asyncio.create_task(_produce(hold, "c", order))
    await asyncio.wait_for(asyncio.gather(a, b, c), 5)
    assert order == ["a", "b", "c"]
    assert not hold.needed(STREAM)  # nothing held: the next produce goes straight on


async def test_a_produce_behind_one_refused_waits_for_the_refusal_and_its_own_deadline():
    """The first held produce times out (REQUEST_TIMED_OUT, the cutover never came):
    the one behind it is answered after it, from its own arrival's deadline."""
    host = _Host(hold_ms=150)
    hold = ProduceHold(host)
    started = time.monotonic()
    first = asyncio.create_task(hold.wait(TOPIC, 0, STREAM))
    await asyncio.sleep(0.05)
    second = asyncio.create_task(hold.wait(TOPIC, 0, STREAM))
    answers = await asyncio.wait_for(asyncio.gather(first, second), 5)
    assert [a.error_code if a else 0 for a in answers] == [ErrorCode.request_timed_out] * 2
    assert time.monotonic() - started >= 0.2  # the second's own 150 ms, from 50 ms in


async def test_turns_go_in_call_order_and_a_cancelled_one_keeps_its_place():
    turns = InOrder()
    order: list[str] = []
    gate = asyncio.Event()

    async def take(name: str, wait: bool = False) -> None:
        async with turns.turn("k"):
            if wait:
                await gate.wait()
            order.append(name)

    first = asyncio.create_task(take("first", wait=True))
    await asyncio.sleep(0)
    cancelled = asyncio.create_task(take("cancelled"))
    third = asyncio.create_task(take("third"))
    await asyncio.sleep(0)
    assert turns.busy("k") and not turns.busy("other")
    cancelled.cancel()
    await asyncio.sleep(0.01)
    assert order == []  # the cancelled turn did not let the third overtake the first
    gate.set()
    await asyncio.wait_for(asyncio.gather(first, third), 5)
    with pytest.raises(asyncio.CancelledError):
        await cancelled
    assert order == ["first", "third"]
    assert not turns.busy("k")


async def test_a_place_taken_first_waits_after_its_own_work_and_a_failed_one_keeps_its_place():
    """The hand-off's use (owners.py): each call takes its place at once, does its own
    work concurrently (an S3-WAL PUT, a GET), then waits for the places before it. The
    second's work ends first, yet it goes after the first; the third fails before its
    place was ready, and the fourth still waits for the first, not for the failure."""
    turns = InOrder()
    order: list[str] = []
    gates = {name: asyncio.Event() for name in ("first", "second", "failed", "fourth")}

    async def call(name: str) -> None:
        place = turns.take("s")
        try:
            await gates[name].wait()  # the concurrent work
            if name == "failed":
                raise OSError("the PUT failed")
            await place.ready()
            order.append(name)
        finally:
            place.end()

    tasks = [asyncio.create_task(call(name)) for name in gates]
    await asyncio.sleep(0)
    assert [turns.take("t").behind, turns.take("t").behind] == [False, True]
    for name in ("second", "failed", "fourth"):
        gates[name].set()
    await asyncio.sleep(0.01)
    assert order == []  # all behind the first, whose work is not done
    assert isinstance(tasks[2].exception(), OSError)
    gates["first"].set()
    await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 5)
    assert order == ["first", "second", "fourth"]
    assert not turns.busy("s")


async def test_a_wait_ends_when_the_partitions_rebuild_fails():
    """The rebuild of a partition being started failed: nothing is being started, so a
    request waiting for it goes on at once (the caller answers NOT_LEADER_OR_FOLLOWER)
    instead of waiting its whole deadline, and so does every later one."""
    host = _Host(hold_ms=30_000)
    hold = ProduceHold(host)
    host.cut_over()
    waiting = asyncio.create_task(hold.wait_for_partition(STREAM))
    await asyncio.sleep(0.01)
    assert not waiting.done()
    host.failed = True
    host._changes.notify()  # the rebuild's end notifies (shards.recover_streams)
    await asyncio.wait_for(waiting, 1)
    started = time.monotonic()
    await asyncio.wait_for(hold.wait_for_partition(STREAM), 1)
    assert time.monotonic() - started < 0.5


async def test_the_partition_here_is_waited_for_only_where_its_shard_is_owned():
    """`TieringService.partition_here` is the one get-or-wait of every caller at the owner
    (reads, produce hand-offs, DeleteRecords' trim, the marker catch-up): a started
    partition at once, one owned here waited for until the caller's deadline, another
    proxy's stream never. `not_served` says why a stream owned here is not served, and
    nothing for another owner's stream."""

    class _Partitions:
        def __init__(self) -> None:
            self.started: dict[int, str] = {}
            self.not_rebuilt: dict[int, BaseException] = {}

        def get(self, stream: int) -> str | None:
            return self.started.get(stream)

    partitions = _Partitions()
    waits: list[tuple[int, float | None]] = []

    async def wait_for_partition(stream: int, deadline: float | None = None) -> None:
        waits.append((stream, deadline))
        partitions.started[stream] = "partition"  # the rebuild ends

    service = SimpleNamespace(
        partitions=partitions,
        owned_here=lambda stream: stream == STREAM,
        hold=SimpleNamespace(wait_for_partition=wait_for_partition),
    )
    assert await TieringService.partition_here(service, STREAM + 1) is None
    assert waits == []  # another proxy's stream: no wait
    assert await TieringService.partition_here(service, STREAM, 12.5) == "partition"
    assert waits == [(STREAM, 12.5)]
    assert await TieringService.partition_here(service, STREAM) == "partition"
    assert len(waits) == 1  # started: no wait
    assert TieringService.not_served(service, STREAM) is None
    partitions.not_rebuilt[STREAM + 1] = OSError("the WAL read failed")
    assert TieringService.not_served(service, STREAM + 1) is None  # its owner's matter
    partitions.not_rebuilt[STREAM] = OSError("the WAL read failed")
    why = TieringService.not_served(service, STREAM)
    assert why is not None and "the WAL read failed" in why
