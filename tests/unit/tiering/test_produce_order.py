"""A connection's Produce requests reach the tiered partitions in the order they came,
whatever their partition counts (tiered/produce.py): every partition of a request is
handed on before any of the connection's next request. A shortcut that awaited a
one-partition request inside its own task, while a request of many partitions starts a
task per partition, would break that order; this test fails for it.

The host here is a stand-in for `TieringService` that records the order of its
`produce` calls: what is tested is the order the plans start their partitions in, pure
scheduling, with no Kafka, WAL or network under it (the tiered produce integration
tests run the real service).
"""

from __future__ import annotations

import asyncio
import uuid

from prometheus_client import CollectorRegistry, Histogram

from proxy.kafka.codec import encode
from proxy.metrics import Stages
from proxy.tiered.produce import plan_produce
from tests.support.batches import seeded_batch as batch
from tests.support.kio_types import produce_request

VERSION = 9


class _Topics:
    def any(self) -> bool:
        return True

    def topic(self, topic: str | uuid.UUID) -> None:
        return None  # no topic configs to check records against


class _Host:
    """Every partition tiered; `produce` notes its call and yields to the loop twice, so
    a partition handed on late would be seen late."""

    def __init__(self) -> None:
        self.calls: list[tuple[str | uuid.UUID, int, bytes]] = []
        self.topics = _Topics()
        self.bandwidth = None
        self.max_batch_bytes = 1 << 20
        histogram = Histogram("t", "t", ["path", "stage"], registry=CollectorRegistry())
        self.stages = Stages(histogram, "produce")

    def is_tiered(self, topic: str | uuid.UUID, partition: int) -> bool:
        return True

    async def produce_rules(self, topic: str | uuid.UUID) -> None:
        return None

    async def produce(self, topic, partition, records, *args, **kwargs) -> None:
        self.calls.append((topic, partition, bytes(records)))
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        return None


def _plan(host: _Host, layout: dict):
    body = memoryview(encode(produce_request(VERSION, layout)))
    return plan_produce(host, memoryview(b""), body, VERSION)


async def _run(layouts: list[dict]) -> list[tuple[str | uuid.UUID, int, bytes]]:
    host = _Host()
    plans = [_plan(host, layout) for layout in layouts]  # one connection step each, in order
    results = await asyncio.gather(*(plan.local for plan in plans))
    assert [len(r) for r in results] == [sum(len(p) for p in lay.values()) for lay in layouts]
    return host.calls


def _expected(layouts: list[dict]) -> list[tuple[str, int, bytes]]:
    return [
        (name, partition, records)
        for layout in layouts
        for name, parts in layout.items()
        for partition, records in parts
    ]


def test_a_single_partition_request_waits_for_the_many_partition_request_before_it():
    layouts = [
        {"a": [(0, batch(1, 1)), (1, batch(1, 2))], "b": [(0, batch(1, 3))]},
        {"a": [(1, batch(1, 4))]},
        {"a": [(0, batch(1, 5))]},
        {"b": [(0, batch(1, 6))], "a": [(1, batch(1, 7))]},
        {"b": [(0, batch(1, 8))]},
    ]
    assert asyncio.run(_run(layouts)) == _expected(layouts)


def test_requests_of_one_partition_keep_their_order():
    layouts = [{"a": [(0, batch(1, seed))]} for seed in range(8)]
    assert asyncio.run(_run(layouts)) == _expected(layouts)
