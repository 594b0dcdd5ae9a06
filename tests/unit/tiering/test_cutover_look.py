"""The cutover loop's look at Kafka's tiered topics, as its logs say it: what concerns
the whole fleet (topics of another Kafka cluster) is said once for the fleet, by the
owner of metadata shard 0, not once per proxy."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from types import SimpleNamespace

from proxy.apis.api03_metadata import TopicsAnswer
from proxy.metadata.topic_index import TieredTopic
from proxy.upkeep.cutover import RESTART_FAILED_S, CutoverLoop

HERE = "MkU3OEVBNTcwNTJENDM2Qk"
COPY = "c2Vjb25kLWNsdXN0ZXItaWQ"
ORDERS = TieredTopic(uuid.uuid4(), "orders", 1, COPY)  # tiered in another cluster


def host(owned: set[int]) -> SimpleNamespace:
    async def describe_topics(names):  # this cluster has no such topic
        return TopicsAnswer(HERE, {}, frozenset(names), {})

    return SimpleNamespace(
        describe_topics=describe_topics,
        config=SimpleNamespace(shard_count=4),
        shard_owner=lambda shard: SimpleNamespace() if shard in owned else None,
        topics=SimpleNamespace(topics=lambda: [ORDERS]),
    )


def look(loop: CutoverLoop) -> None:
    loop._next_topics_check = 0.0  # noqa: SLF001
    asyncio.run(loop._check_topics())  # noqa: SLF001


def test_topics_of_another_cluster_are_said_once_by_the_owner_of_shard_0(caplog):
    caplog.set_level(logging.ERROR, "tierproxy.cutover")
    owned: set[int] = {1}
    loop = CutoverLoop(host(owned))  # type: ignore[arg-type]
    look(loop)
    assert caplog.records == []  # not the owner of shard 0: says nothing
    owned.add(0)  # it takes shard 0 over: says it, once
    look(loop)
    look(loop)
    [said] = caplog.records
    assert said.levelno == logging.ERROR and f"orders of {COPY}" in said.getMessage()
    assert loop.looks == 3


def test_streams_whose_start_failed_are_started_again_every_few_seconds(caplog):
    """A stream of a shard owned here whose rebuild failed (`not_rebuilt`) is started
    again by the cutover loop RESTART_FAILED_S after the failure is seen, then twice as
    long after each retry that fails; a sealed one is not, nor one of a shard not owned
    here; a failing retry is logged and the loop goes on; none left resets the wait."""
    failed, sealed, fine, elsewhere = 11, 12, 13, 21
    started: list[tuple[int, list[int]]] = []

    async def start_streams(shard, streams):
        started.append((shard, streams))
        if len(started) == 2:
            raise OSError("Kafka unreachable")

    def owner(streams):
        return SimpleNamespace(state=SimpleNamespace(stream_ids=lambda: streams))

    error = RuntimeError("tail unreadable")
    partitions = SimpleNamespace(not_rebuilt={failed: error, sealed: error, elsewhere: error})
    service = SimpleNamespace(
        partitions=partitions,
        seals={sealed},
        owned_shards=lambda: {1: owner([failed, sealed, fine])},
        start_streams=start_streams,
    )
    loop = CutoverLoop(service)  # type: ignore[arg-type]

    def round_past_its_time() -> float:
        waited = loop._next_restart - time.monotonic()  # noqa: SLF001
        loop._next_restart = time.monotonic() - 1  # noqa: SLF001 - its time has come
        asyncio.run(loop._restart_failed_streams())  # noqa: SLF001
        return waited

    asyncio.run(loop._restart_failed_streams())  # noqa: SLF001 - seen: not at once
    assert started == []
    assert RESTART_FAILED_S - 1 < round_past_its_time() <= RESTART_FAILED_S
    assert started == [(1, [failed])]
    asyncio.run(loop._restart_failed_streams())  # noqa: SLF001
    assert len(started) == 1  # not before its time
    caplog.set_level(logging.WARNING, "tierproxy.cutover")
    round_past_its_time()  # fails: said, not raised
    assert len(started) == 2 and "not started again" in caplog.text
    assert round_past_its_time() > RESTART_FAILED_S * 2 - 1  # backs off
    assert len(started) == 3
    partitions.not_rebuilt.clear()  # started at last
    asyncio.run(loop._restart_failed_streams())  # noqa: SLF001
    assert loop._restart_after == RESTART_FAILED_S and not loop._next_restart  # noqa: SLF001
    assert len(started) == 3
