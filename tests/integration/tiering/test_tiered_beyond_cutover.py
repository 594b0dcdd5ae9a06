"""What Kafka's log holds past a tiered partition's cutover never reaches a consumer.

A topic gets records through the proxy, is tiered at cutover C, and gets more records
through the proxy (offsets C on, in the stream). Then Kafka's own log of the partition
grows past C behind the proxy: records a producer writes straight to a broker, or the
ABORT marker Kafka's transaction coordinator writes at C for a transactional producer
whose AddPartitionsToTxn reached it. Consumers reading from the beginning through the
proxy (librdkafka, read_committed by default; aiokafka, read_uncommitted) get every
record the proxy acknowledged once, in order, at its offset, and none of Kafka's past C:
Kafka's answers are cut at C (fetch_clamp.py) and a cut of records is counted
(tierproxy_kafka_beyond_cutover); a marker is expected there (transactions on tiered
partitions) and not counted. A group that committed offset C with the leader epoch of
Kafka's records resumes there: librdkafka validates that epoch with OffsetForLeaderEpoch,
Kafka answers an end past C, the proxy the stream's high watermark, and the consumer reads
on from C instead of taking the answer for a truncation or skipping ahead.
"""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from cutover_load import proxy_config, started, tiered_topic_id, topics_command, wait_owned

from proxy.config import parse_config
from proxy.devstack.paths import free_port_block
from proxy.devstack.proxy_thread import ProxyThread
from proxy.metadata.streams import stream_id
from tests.support.clients import watermarks
from tests.support.waiting import wait_until

pytestmark = pytest.mark.kafka

BEFORE, AFTER, DIRECT = 40, 25, 7
Records = list[tuple[int, bytes]]  # (offset, value)


def _produce(bootstrap: str, topic: str, prefix: str, count: int) -> Records:
    acked: Records = []
    errors: list[str] = []

    def delivered(err, msg) -> None:
        if err is not None:
            errors.append(str(err))
        else:
            acked.append((msg.offset(), msg.value()))

    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    for n in range(count):
        producer.produce(topic, f"{prefix}-{n}".encode(), partition=0, on_delivery=delivered)
    assert producer.flush(60) == 0
    assert not errors, errors[:5]
    return sorted(acked)


def _librdkafka(bootstrap: str, topic: str, want: int, start: TopicPartition | None = None):
    """Assigned from offset 0, or from `start` (with its leader epoch, validated)."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"g-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
            "auto.offset.reset": "error",
        }
    )
    consumer.assign([start or TopicPartition(topic, 0, 0)])
    got: Records = []
    deadline = time.monotonic() + 60
    try:
        while len(got) < want and time.monotonic() < deadline:
            msg = consumer.poll(0.2)
            if msg is not None:
                assert msg.error() is None, msg.error()
                got.append((msg.offset(), msg.value()))
        # nothing more: what Kafka holds past the cutover is not served after them
        end = time.monotonic() + 1.5
        while time.monotonic() < end:
            msg = consumer.poll(0.2)
            assert msg is None or msg.error() is not None, (msg.offset(), msg.value())
    finally:
        consumer.close()
    return got


async def _aiokafka(bootstrap: str, topic: str, want: int) -> Records:
    from aiokafka import AIOKafkaConsumer
    from aiokafka.structs import TopicPartition as AioPartition

    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await consumer.start()
    got: Records = []
    try:
        tp = AioPartition(topic, 0)
        consumer.assign([tp])
        consumer.seek(tp, 0)
        deadline = time.monotonic() + 60
        while len(got) < want and time.monotonic() < deadline:
            for records in (await consumer.getmany(timeout_ms=200)).values():
                got.extend((r.offset, r.value) for r in records)
        more = await consumer.getmany(timeout_ms=1500)
        assert not any(more.values()), more
    finally:
        await consumer.stop()
    return got


def _tiered(cluster, tmp_path, suffix: str, topic: str, config: dict | None = None):
    """A proxy, a 1-partition topic with BEFORE records through it, tiered, and AFTER
    more: (proxy, cutover, what the proxy acknowledged)."""
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    admin.create_topics([NewTopic(topic, 1, 3, config=config or {})])[topic].result(30)
    settings = proxy_config(cluster, tmp_path, f"b-{suffix}", "zone-a", suffix, free_port_block(8))
    proxy = ProxyThread(parse_config(settings)).start()
    try:
        wait_owned([proxy], 2)
        tiering = proxy.proxy.tiering
        acked = _produce(proxy.bootstrap, topic, "before", BEFORE)
        assert topics_command("tier", topic, tiering.peer_port).returncode == 0
        stream = stream_id(tiered_topic_id(proxy, topic), 0)
        wait_until(lambda: started(tiering, stream), 30, "partition started")
        cutover = tiering.state(stream).cutover(stream)
        assert cutover == BEFORE
        acked += _produce(proxy.bootstrap, topic, "after", AFTER)
        assert [offset for offset, _ in acked] == list(range(BEFORE + AFTER))
    except BaseException:
        proxy.stop()
        raise
    return proxy, cutover, acked


def _clamped(proxy, api: str) -> float:
    registry = proxy.proxy.metrics.registry
    return registry.get_sample_value("tierproxy_kafka_beyond_cutover_total", {"api": api}) or 0


def test_records_written_to_a_broker_past_the_cutover_are_not_served(kafka_cluster, tmp_path):
    suffix = uuid.uuid4().hex[:8]
    topic = f"beyond-{suffix}"
    proxy, cutover, acked = _tiered(kafka_cluster, tmp_path, suffix, topic)
    try:
        direct = _produce(kafka_cluster.bootstrap, topic, "direct", DIRECT)
        assert [offset for offset, _ in direct] == list(range(cutover, cutover + DIRECT))
        assert watermarks(kafka_cluster.bootstrap, topic)[1] == cutover + DIRECT

        assert _librdkafka(proxy.bootstrap, topic, len(acked)) == acked
        assert asyncio.run(_aiokafka(proxy.bootstrap, topic, len(acked))) == acked
        assert _clamped(proxy, "fetch") >= 2
        assert proxy.proxy.tiering.beyond_cutover.counts["fetch"] >= 2
    finally:
        proxy.stop()


def test_an_abort_marker_at_the_cutover_skips_no_tiered_record(kafka_cluster, tmp_path):
    suffix = uuid.uuid4().hex[:8]
    topic = f"marker-{suffix}"
    # records of a few bytes pass; the transactional producer's 4 KB one is refused by the
    # broker after its AddPartitionsToTxn went through: the abort leaves only a marker
    proxy, cutover, acked = _tiered(
        kafka_cluster, tmp_path, suffix, topic, {"max.message.bytes": "1024"}
    )
    try:
        producer = Producer(
            {"bootstrap.servers": kafka_cluster.bootstrap, "transactional.id": f"tx-{suffix}"}
        )
        producer.init_transactions(30)
        producer.begin_transaction()
        failed: list[KafkaError] = []
        producer.produce(topic, b"x" * 4096, partition=0, on_delivery=lambda e, m: failed.append(e))
        with pytest.raises(KafkaException):
            producer.commit_transaction(30)
        assert failed and failed[0].code() == KafkaError.MSG_SIZE_TOO_LARGE, failed
        producer.abort_transaction(30)
        # the ABORT marker, at C: the coordinator writes it once EndTxn is answered, so
        # the leader's high watermark reaches it a moment after abort_transaction returns
        # (a fresh clone's run of 2026-11-28 read C, not C + 1, right after it)
        end = lambda: watermarks(kafka_cluster.bootstrap, topic)[1]  # noqa: E731
        wait_until(lambda: end() > cutover, 30, "the abort marker at the cutover")
        assert end() == cutover + 1

        assert _librdkafka(proxy.bootstrap, topic, len(acked)) == acked
        assert asyncio.run(_aiokafka(proxy.bootstrap, topic, len(acked))) == acked
        assert _clamped(proxy, "fetch") == 0  # a marker past the cutover is expected

        # a consumer at C with the leader epoch of Kafka's records before it (as a group
        # commits it) validates it: Kafka answers the epoch's end past C (its marker), the
        # proxy the stream's high watermark, and the consumer reads on from C
        consumer = Consumer({"bootstrap.servers": kafka_cluster.bootstrap, "group.id": "e"})
        consumer.assign([TopicPartition(topic, 0, cutover - 1)])
        msg = consumer.poll(30)
        consumer.close()
        assert msg is not None and msg.error() is None and msg.offset() == cutover - 1
        epoch = msg.leader_epoch()
        assert epoch is not None and epoch >= 0
        start = TopicPartition(topic, 0, cutover, leader_epoch=epoch)
        assert _librdkafka(proxy.bootstrap, topic, len(acked) - cutover, start) == acked[cutover:]
        assert _clamped(proxy, "offset_for_leader_epoch") == 0
    finally:
        proxy.stop()
