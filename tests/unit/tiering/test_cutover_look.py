"""The cutover loop's look at Kafka's tiered topics, as its logs say it: what concerns
the whole fleet (topics of another Kafka cluster) is said once for the fleet, by the
owner of metadata shard 0, not once per proxy."""

from __future__ import annotations

import asyncio
import logging
import uuid
from types import SimpleNamespace

from proxy.apis.api03_metadata import TopicsAnswer
from proxy.metadata.topic_index import TieredTopic
from proxy.upkeep.cutover import CutoverLoop

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
