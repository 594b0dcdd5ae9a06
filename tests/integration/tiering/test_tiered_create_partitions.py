"""Partitions added to a tiered topic are tiered too, and take records as Kafka's new
partitions do (docs/tiering.md, "Partitions added to a tiered topic"): Kafka is the oracle.

One proxy on the shared Kafka (test_tiered_retention's set-up), a tiered one-partition
topic and a passthrough twin given the same operations through the proxy: BEFORE records
to partition 0, CreatePartitions to 3 (librdkafka's admin client, through the proxy),
records to each new partition and more to partition 0. Every partition of the two reads
the same records at the same offsets. The tiered topic's new partitions are streams cut
over at offset 0 (Kafka's own log of them stays empty). Before, the fleet read a tiered
topic's partition count once: a Produce to a new partition waited for a cutover that
never came and was answered REQUEST_TIMED_OUT, every retry, until the owner restarted.
"""

from __future__ import annotations

import time

import pytest
from confluent_kafka.admin import AdminClient, NewPartitions, NewTopic
from cutover_load import started, tiered_topic_id, topics_command
from raw_kafka import leader_address, produce_v9
from test_tiered_retention import (
    BEFORE,
    TieredTopic,
    _create_topic,
    _produce,
    _read_from_earliest,
    _start,
)

from proxy.metadata.streams import stream_id
from tests.support.batches import build_batch
from tests.support.clients import watermarks
from tests.support.kafka_python import KafkaProducer
from tests.support.leaders import partitions_seen_by_each_broker
from tests.support.waiting import wait_until

pytestmark = pytest.mark.kafka

PARTITIONS = 3
PER_PARTITION = 8

Read = list[tuple[int, bytes]]  # (offset, value)


def _produce_to(bootstrap: str, topic: str, partition: int, prefix: str) -> Read:
    """PER_PARTITION records to the partition: half by librdkafka (idempotent), half by
    kafka-python; what was acknowledged."""
    half = PER_PARTITION // 2
    acked = [(o, v) for o, v, _ in _produce(bootstrap, topic, prefix, half, partition)]
    other = KafkaProducer(bootstrap_servers=bootstrap, acks="all")
    for n in range(half, PER_PARTITION):
        value = f"{prefix}-{n}".encode()
        acked.append((other.send(topic, value, partition=partition).get(60).offset, value))
    other.close()
    return acked


def _grown(cluster, topic: str, partitions: int) -> None:
    """Wait until every broker's own Metadata gives the topic `partitions` partitions (one
    broker's answer is not enough: a producer asking another may still be told the old
    count and fail a record for a new partition at once)."""

    def agreed() -> bool:
        return set(partitions_seen_by_each_broker(cluster.bootstrap, topic).values()) == {
            partitions
        }

    wait_until(agreed, 30, f"every broker sees {partitions} partitions of {topic}")


def test_partitions_added_to_a_tiered_topic_are_tiered_and_answer_as_kafkas(
    kafka_cluster, tmp_path
):
    topic, thread = _start(kafka_cluster, tmp_path, "grown")
    twin = f"{topic}-plain"
    _create_topic(kafka_cluster, twin)
    with thread as proxy:
        t = TieredTopic(kafka_cluster, tmp_path, proxy, topic)  # BEFORE records, tiered
        _produce(proxy.bootstrap, twin, "before0", BEFORE)
        admin = AdminClient({"bootstrap.servers": proxy.bootstrap})
        for name in (topic, twin):
            admin.create_partitions([NewPartitions(name, PARTITIONS)])[name].result(30)
            _grown(kafka_cluster, name, PARTITIONS)

        written: dict[str, dict[int, Read]] = {}
        for name in (topic, twin):
            written[name] = {p: _produce_to(proxy.bootstrap, name, p, f"p{p}") for p in (1, 2)}
            written[name][0] = _produce_to(proxy.bootstrap, name, 0, "after")

        topic_id = t.state.stream(t.stream).topic_id
        for p in range(PARTITIONS):
            stream = stream_id(topic_id, p)
            assert t.tiering.state(stream).cutover(stream) == (BEFORE if p == 0 else 0)
            assert watermarks(kafka_cluster.bootstrap, topic, p) == (0, BEFORE if p == 0 else 0)
        for p in range(PARTITIONS):
            want = PER_PARTITION + (BEFORE if p == 0 else 0)
            tiered, plain = (
                _read_from_earliest(proxy.bootstrap, n, want, p) for n in (topic, twin)
            )
            assert tiered == plain, p
            assert len(tiered) == want and tiered[-PER_PARTITION:] == written[topic][p]
            assert written[topic][p] == written[twin][p]
            assert watermarks(proxy.bootstrap, topic, p) == watermarks(proxy.bootstrap, twin, p)


def test_a_topic_created_again_with_fewer_partitions_and_tiered_again_takes_records(
    kafka_cluster, tmp_path
):
    """The partition counts are kept by topic id: kept by name, the new topic inherited
    the old one's 3, and the cutover loop waited forever for partitions 1 and 2 of a
    topic that has only partition 0 (its produce answered REQUEST_TIMED_OUT)."""
    topic, thread = _start(kafka_cluster, tmp_path, "shrunk")
    with thread as proxy:
        t = TieredTopic(kafka_cluster, tmp_path, proxy, topic)
        admin = AdminClient({"bootstrap.servers": proxy.bootstrap})
        admin.create_partitions([NewPartitions(topic, PARTITIONS)])[topic].result(30)
        old_id = t.state.stream(t.stream).topic_id
        last = stream_id(old_id, PARTITIONS - 1)
        wait_until(lambda: started(t.tiering, last), 30, "the new partitions cut over")

        admin.delete_topics([topic])[topic].result(30)
        wait_until(lambda: t.tiering.topics.topic(topic) is None, 30, "dropped")
        admin.create_topics([NewTopic(topic, 1, 3)])[topic].result(30)
        _grown(kafka_cluster, topic, 1)
        assert topics_command("tier", topic, t.tiering.peer_port).returncode == 0
        new_id = tiered_topic_id(proxy, topic)
        assert new_id != old_id
        wait_until(lambda: started(t.tiering, stream_id(new_id, 0)), 30, "tiered again")
        records = _produce_to(proxy.bootstrap, topic, 0, "again")
        assert [o for o, _ in records] == list(range(PER_PARTITION))
        assert _read_from_earliest(proxy.bootstrap, topic, PER_PARTITION) == records
        assert watermarks(kafka_cluster.bootstrap, topic) == (0, 0)  # all in the stream


def test_a_produce_to_a_partition_just_added_asks_for_a_look_at_kafka(
    kafka_cluster, tmp_path, monkeypatch
):
    """Partitions added in Kafka directly while the fleet's periodic look is far off (an
    hour here): the produce waiting for the new partition's cutover has the owner look
    at Kafka at once, and it is acknowledged at offset 0, as Kafka's new partition would
    take it. Without the nudge it waits for the look and is answered REQUEST_TIMED_OUT."""
    topic, thread = _start(kafka_cluster, tmp_path, "nudged")
    with thread as proxy:
        t = TieredTopic(kafka_cluster, tmp_path, proxy, topic)
        cutover = t.tiering.cutover
        monkeypatch.setattr("proxy.upkeep.cutover.TOPICS_CHECK_S", 3600.0)

        def far_off() -> bool:  # a look that started before the patch set the next in 5 s
            return cutover._next_topics_check > time.monotonic() + 600  # noqa: SLF001

        wait_until(far_off, 30, "a look with the next one an hour off")
        admin = AdminClient({"bootstrap.servers": kafka_cluster.bootstrap})
        admin.create_partitions([NewPartitions(topic, 2)])[topic].result(30)
        _grown(kafka_cluster, topic, 2)

        acked = [(o, v) for o, v, _ in _produce(proxy.bootstrap, topic, "new", 3, 1)]
        assert [o for o, _ in acked] == [0, 1, 2]
        stream = stream_id(t.state.stream(t.stream).topic_id, 1)
        assert t.tiering.state(stream).cutover(stream) == 0
        assert _read_from_earliest(proxy.bootstrap, topic, 3, 1) == acked


def test_a_produce_to_a_partition_the_topic_does_not_have_is_answered_as_kafka_does(
    kafka_cluster, tmp_path
):
    """A raw client's Produce to partition 5 and to partition -1 of a one-partition topic:
    Kafka answers UNKNOWN_TOPIC_OR_PARTITION on the passthrough twin. On the tiered topic
    the proxy held the first for a cutover that never comes and answered
    REQUEST_TIMED_OUT after cutover_hold_ms (30 s), each retry asking the fleet to look
    at Kafka; the second failed the whole request's tiered part with
    KAFKA_STORAGE_ERROR. Now: UNKNOWN_TOPIC_OR_PARTITION, the first once a look at Kafka
    begun after the produce finds no such partition, the second at once."""
    topic, thread = _start(kafka_cluster, tmp_path, "missing")
    twin = f"{topic}-plain"
    _create_topic(kafka_cluster, twin)
    with thread as proxy:
        TieredTopic(kafka_cluster, tmp_path, proxy, topic)
        for partition in (5, -1):
            answers = [
                produce_v9(
                    leader_address(proxy.bootstrap, name), name, partition, build_batch([b"v"])
                )
                for name in (twin, topic)
            ]
            codes = [a.error_code.name for a in answers]
            assert codes == ["unknown_topic_or_partition"] * 2, answers
        assert watermarks(kafka_cluster.bootstrap, topic) == (0, BEFORE)
