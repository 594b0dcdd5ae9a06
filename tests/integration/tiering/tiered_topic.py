"""A tiered topic for the integration tests of what an owner does to its objects
(compaction, bandwidth): a proxy, a topic of a few partitions with PER_ROUND records each
through Kafka, then tiered, then rounds of records each committed as one stream set object,
and what was acknowledged, to compare with what a consumer reads back.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from cutover_load import create_topic, one_proxy, started, tiered_topic_id, topics_command
from tieredfleet import topic_id_of

from proxy.devstack.proxy_thread import ProxyThread
from proxy.metadata.streams import shard_of, stream_id
from proxy.objects.store import ObjectNotFound
from tests.support.waiting import wait_for, wait_until

Acked = dict[int, list[tuple[int, bytes]]]  # partition -> (offset, value), in offset order


def create_spread_topic(cluster, name: str, partitions: int, shards: int) -> str:
    """A new topic whose partitions' streams fall in every one of `shards` metadata shards
    (topic ids are random: a topic that misses one is deleted and another made)."""
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    for attempt in range(20):
        topic = f"{name}-{attempt}"
        admin.create_topics([NewTopic(topic, partitions, 3)])[topic].result(30)
        topic_id = wait_for(
            lambda topic=topic: topic_id_of(admin, topic), lambda found: found is not None, topic
        )
        if len({shard_of(stream_id(topic_id, p), shards) for p in range(partitions)}) == shards:
            return topic
        admin.delete_topics([topic])[topic].result(30)
    raise AssertionError(f"20 topics of {partitions} partitions, none in all {shards} shards")


def produce(
    bootstrap: str, topic: str, partitions: int, prefix: str, count: int, pad: int = 0
) -> Acked:
    """`count` idempotent records to each partition, values `pad` bytes longer than
    their name; what was acknowledged."""
    acked: Acked = {p: [] for p in range(partitions)}
    errors: list[str] = []

    def delivered(err, msg) -> None:
        if err is not None:
            errors.append(str(err))
        else:
            acked[msg.partition()].append((msg.offset(), msg.value()))

    producer = Producer(
        {"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5}
    )
    for p in range(partitions):
        for n in range(count):
            value = f"{prefix}-{p}-{n}".encode() + b"." * pad
            producer.produce(topic, value, key=b"k%d" % n, partition=p, on_delivery=delivered)
            producer.poll(0)
    assert producer.flush(60) == 0
    assert not errors, errors[:5]
    return {p: sorted(records) for p, records in acked.items()}


def read_all(bootstrap: str, topic: str, ends: dict[int, int], timeout_s: float = 60) -> Acked:
    """Every partition from its beginning to `ends[p]`: (offset, value) in order."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"c-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
            "auto.offset.reset": "error",
        }
    )
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in ends])
    got: Acked = {p: [] for p in ends}
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline and any(len(got[p]) < ends[p] for p in ends):
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            assert msg.error() is None, msg.error()
            got[msg.partition()].append((msg.offset(), msg.value()))
    finally:
        consumer.close()
    return got


class TieredTopic:
    """The tiered topic, its streams, and what was acknowledged for each partition."""

    def __init__(
        self, proxy: ProxyThread, topic: str, partitions: int, per_round: int, pad: int = 0
    ) -> None:
        self.proxy, self.topic = proxy, topic
        self.partitions, self.per_round, self.pad = partitions, per_round, pad
        self.tiering = proxy.proxy.tiering
        self.acked = produce(proxy.bootstrap, topic, partitions, "kafka", per_round, pad)
        assert topics_command("tier", topic, self.tiering.peer_port).returncode == 0
        topic_id = tiered_topic_id(proxy, topic)
        self.streams = [stream_id(topic_id, p) for p in range(partitions)]
        for s in self.streams:
            wait_until(lambda s=s: started(self.tiering, s), 30, "started")
            assert self.tiering.state(s).cutover(s) == per_round

    def produce(self, prefix: str) -> None:
        """`per_round` records to each partition, through the proxy (the tiered path)."""
        acked = produce(
            self.proxy.bootstrap, self.topic, self.partitions, prefix, self.per_round, self.pad
        )
        for p, records in acked.items():
            self.acked[p] += records

    def round(self, prefix: str) -> None:
        """`produce`, then one upload: one stream set object."""
        self.produce(prefix)
        self.proxy.run(lambda: self.tiering.uploader.flush())
        for p, s in enumerate(self.streams):
            end = self.acked[p][-1][0] + 1
            wait_until(lambda s=s, e=end: self.tiering.state(s).stream_end(s) == e, 30, prefix)

    def ranges(self, p: int):
        s = self.streams[p]
        return self.tiering.state(s).committed_ranges(s)

    def owner_state(self, p: int):
        s = self.streams[p]
        return self.tiering.assignment.owner(self.tiering.state(s).shard).state

    def exists(self, key: str) -> bool:
        try:
            self.proxy.run(lambda: self.tiering.store.size(key))
        except ObjectNotFound:
            return False
        return True

    def read_all(self, timeout_s: float = 60) -> Acked:
        ends = {p: records[-1][0] + 1 for p, records in self.acked.items()}
        return read_all(self.proxy.bootstrap, self.topic, ends, timeout_s)

    def read_matches_acked(self) -> None:
        assert self.read_all() == self.acked


@contextmanager
def one_partition_tiered(cluster, tmp_path, prefix: str, per_round: int) -> Iterator[TieredTopic]:
    """A proxy of its own that never uploads on its own, and a one-partition topic named
    `prefix`-something, `per_round` records through Kafka, then tiered."""
    suffix = uuid.uuid4().hex[:8]
    topic = f"{prefix}-{suffix}"
    create_topic(cluster, topic, 1)
    with one_proxy(cluster, tmp_path, f"{prefix}-{suffix}", upload_interval_s=3600.0) as proxy:
        yield TieredTopic(proxy, topic, 1, per_round)
