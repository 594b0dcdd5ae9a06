"""Untier's seals (proxy/upkeep/seals.py) on a stand-in service: a partition not cut
over yet is sealed too (the cutover loop leaves a sealed stream alone), so that a
partition just added cannot be cut over and take records while its topic is untiered;
its seal ends with its lease, silently once the topic is passthrough. And the cutover
loop's side: it leaves a sealed stream alone, and one topic's failure does not stall it.
The real untier runs in tests/integration/tiering/test_tiered_cutover.py."""

from __future__ import annotations

import uuid
from types import SimpleNamespace

import pytest
from aiokafka.errors import KafkaTimeoutError

from proxy.metadata.streams import stream_id
from proxy.metadata.topic_index import TieredTopic
from proxy.upkeep import seals as seals_module
from proxy.upkeep.cutover import CutoverLoop
from proxy.upkeep.seals import Seals

TOPIC_ID = uuid.UUID(int=7)
CUT, ADDED = stream_id(TOPIC_ID, 0), stream_id(TOPIC_ID, 1)  # partition 1: not cut over


class Partitions:
    def __init__(self) -> None:
        self.running = {CUT: SimpleNamespace(log_end_offset=10)}
        self.removed: list[int] = []

    def get(self, stream: int):
        return self.running.get(stream)

    async def remove(self, stream: int) -> None:
        self.removed.append(stream)
        self.running.pop(stream, None)


def host(tiered: dict) -> SimpleNamespace:
    infos = {CUT: SimpleNamespace(cutover_offset=10)}
    state = SimpleNamespace(stream=infos.get)
    recovered: list[list[int]] = []

    async def recover_streams(state, streams):
        recovered.append(list(streams))

    return SimpleNamespace(
        name="proxy-a",
        config=SimpleNamespace(shard_count=1),
        readers=[SimpleNamespace(state=state)],
        state=lambda stream: state,
        shard_owner=lambda shard: SimpleNamespace(state=state),
        partitions=Partitions(),
        topics=SimpleNamespace(topic=lambda key: tiered.get("topic")),
        recover_streams=recover_streams,
        recovered=recovered,
    )


async def test_a_partition_not_cut_over_is_sealed_and_its_seal_ends_with_its_lease(monkeypatch):
    tiered = {"topic": None}  # the untier was written
    service = host(tiered)
    seals = Seals(service)  # type: ignore[arg-type]
    sealed, refusal = await seals.seal_here(TOPIC_ID, 2)
    assert refusal is None and sorted(sealed) == sorted([CUT, ADDED])
    assert ADDED in seals and CUT in seals
    assert service.partitions.removed == [CUT]  # only a running partition is closed
    monkeypatch.setattr(seals_module.time, "monotonic", lambda: 1e12)  # every lease over
    await seals.expire()
    assert ADDED not in seals  # no StreamUntier ends it: its lease does, and nothing starts
    assert CUT in seals  # ended by its StreamUntier (`untiered`)
    assert service.recovered == []


async def test_a_seal_that_expires_with_the_topic_still_tiered_starts_only_what_ran(monkeypatch):
    tiered = {"topic": SimpleNamespace(topic_id=TOPIC_ID)}  # the untier never came
    service = host(tiered)
    seals = Seals(service)  # type: ignore[arg-type]
    await seals.seal_here(TOPIC_ID, 2)
    monkeypatch.setattr(seals_module.time, "monotonic", lambda: 1e12)
    await seals.expire()
    assert CUT not in seals and ADDED not in seals
    assert service.recovered == [[CUT]]  # the partition not cut over has none to start


@pytest.mark.parametrize("held", [10, 12])
async def test_a_running_partition_past_its_cutover_refuses_the_seal(held):
    service = host({"topic": SimpleNamespace(topic_id=TOPIC_ID)})
    service.partitions.running[CUT].log_end_offset = held
    seals = Seals(service)  # type: ignore[arg-type]
    sealed, refusal = await seals.seal_here(TOPIC_ID, 2)
    if held > 10:
        assert sealed == [] and "untier would lose them" in refusal
        assert CUT not in seals and ADDED not in seals
    else:
        assert refusal is None and ADDED in seals


async def test_the_cutover_loop_leaves_a_sealed_stream_alone():
    """Neither partition is cut over and both are owned here; both are sealed (an untier
    under way): the loop reads nothing of Kafka and writes no cutover."""
    service = SimpleNamespace(
        config=SimpleNamespace(shard_count=1),
        state=lambda stream: SimpleNamespace(stream=lambda s: None),
        shard_owner=lambda shard: SimpleNamespace(),
        seals={CUT, ADDED},
    )
    loop = CutoverLoop(service)  # type: ignore[arg-type]
    loop._partitions[TOPIC_ID] = 2  # noqa: SLF001
    assert await loop._cut_over_topic(TieredTopic(TOPIC_ID, "orders", 1)) is False  # noqa: SLF001


async def test_a_topic_whose_cutover_fails_does_not_hold_the_others_up():
    """Its reads can each take the request timeout (a new partition with no leader, the
    topic deleted in Kafka under a pending cutover): the others are cut over in the same
    round, and it is tried again only after FAILED_TOPIC_S."""
    first, second = TieredTopic(uuid.UUID(int=1), "a", 1), TieredTopic(uuid.UUID(int=2), "b", 1)
    service = SimpleNamespace(topics=SimpleNamespace(topics=lambda: [first, second]))
    loop = CutoverLoop(service)  # type: ignore[arg-type]
    tried: list[str] = []

    async def cut_over_topic(topic: TieredTopic) -> bool:
        tried.append(topic.name)
        if topic is first:
            raise KafkaTimeoutError("end offsets of a-1")
        return False

    loop._cut_over_topic = cut_over_topic  # type: ignore[method-assign]  # noqa: SLF001
    assert await loop._cut_over_ready_streams() is False  # noqa: SLF001
    assert await loop._cut_over_ready_streams() is False  # noqa: SLF001
    assert tried == ["a", "b", "b"]
