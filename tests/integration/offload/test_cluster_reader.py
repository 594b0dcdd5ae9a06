"""The cluster reader against the real 3-broker Kafka: batches come back byte for byte as
the brokers store them in their segment files (codecs, producer ids, sequences, markers and
all), small fetch sizes cut batches short without losing one, a range is honoured, and bad
requests fail naming the partition and offset."""

from __future__ import annotations

import logging
import time
import uuid

import pytest
from aiokafka.record.default_records import DefaultRecordBatch
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from offloaddata import segment_bytes

from offload_jobs.cluster_reader import ClusterReadError, read_batches
from proxy.records.batches import Compression, iter_batches, read_batch_header
from tests.support.leaders import leader_of, move_leader

pytestmark = [pytest.mark.kafka]


def test_reads_every_batch_byte_exact(kafka_cluster, mixed_topic, compacted_topic):
    # compacted_topic is produced here, so that Kafka's cleaner (15 s backoff) has run by
    # the time its own test reads it
    for partition in range(mixed_topic.partitions):
        batches = list(read_batches(kafka_cluster.bootstrap, mixed_topic.name, partition, 0))
        stored = segment_bytes(kafka_cluster, mixed_topic.name, partition)
        assert b"".join(b.data for b in batches) == stored
        headers = [read_batch_header(b.data) for b in batches]
        assert [(h.base_offset, h.last_offset) for h in headers] == [
            (b.base_offset, b.last_offset) for b in batches
        ]
        codecs = {h.compression for h in headers if not h.is_control}
        assert codecs == set(Compression)
        assert any(h.is_control for h in headers), "transaction markers are batches too"
        assert any(h.is_transactional and not h.is_control for h in headers)
        assert all(h.producer_id >= 0 for h in headers)  # every producer is idempotent


def test_records_decode_to_what_was_produced(kafka_cluster, mixed_topic):
    """Every produced record (committed or aborted) is in the batches, at its offset."""
    found = {}
    for partition in range(mixed_topic.partitions):
        for batch in read_batches(kafka_cluster.bootstrap, mixed_topic.name, partition, 0):
            decoded = DefaultRecordBatch(bytes(batch.data))
            if decoded.is_control_batch:
                continue
            for record in decoded:
                headers = tuple((k, v) for k, v in record.headers)
                found[partition, record.offset] = (record.key, record.value, headers)
    produced = {(r.partition, r.offset): (r.key, r.value, r.headers) for r in mixed_topic.records}
    assert found == produced


def test_small_fetches_cut_batches_and_lose_none(kafka_cluster, mixed_topic):
    """A 1 KiB fetch size makes Kafka cut the last batch of nearly every answer short and
    sometimes return a first batch larger than asked for: the same batches come back."""
    whole = list(read_batches(kafka_cluster.bootstrap, mixed_topic.name, 0, 0))
    small = list(read_batches(kafka_cluster.bootstrap, mixed_topic.name, 0, 0,
                              fetch_max_bytes=1024))  # fmt: skip
    assert [bytes(b.data) for b in small] == [bytes(b.data) for b in whole]


def test_a_range_starts_at_the_batch_holding_start(kafka_cluster, mixed_topic):
    whole = list(read_batches(kafka_cluster.bootstrap, mixed_topic.name, 1, 0))
    inner = whole[10]
    assert inner.last_offset > inner.base_offset, "a batch of several records"
    start, end = inner.base_offset + 1, whole[20].base_offset
    ranged = list(read_batches(kafka_cluster.bootstrap, mixed_topic.name, 1, start, end))
    assert [bytes(b.data) for b in ranged] == [bytes(b.data) for b in whole[10:20]]


def test_an_unreachable_bootstrap_broker_is_passed_over(kafka_cluster, mixed_topic):
    bootstrap = "127.0.0.1:1," + kafka_cluster.bootstrap
    batches = list(read_batches(bootstrap, mixed_topic.name, 0, 0, timeout_s=2))
    assert b"".join(b.data for b in batches) == segment_bytes(kafka_cluster, mixed_topic.name, 0)


def test_past_the_log_end_names_partition_and_offset(kafka_cluster, mixed_topic):
    end = list(read_batches(kafka_cluster.bootstrap, mixed_topic.name, 0, 0))[-1].last_offset + 1
    with pytest.raises(ClusterReadError) as caught:
        list(read_batches(kafka_cluster.bootstrap, mixed_topic.name, 0, 0, end + 5))
    assert caught.value.partition == 0 and caught.value.offset == end
    assert f"{mixed_topic.name}-0 at offset {end}" in str(caught.value)


def test_an_unknown_partition_and_setting_are_named(kafka_cluster, mixed_topic):
    with pytest.raises(ClusterReadError, match="no such partition: the topic has 2"):
        list(read_batches(kafka_cluster.bootstrap, mixed_topic.name, 7, 0))
    with pytest.raises(ValueError, match="'fetch_bytes': unknown"):
        list(read_batches(kafka_cluster.bootstrap, mixed_topic.name, 0, 0, fetch_bytes=1))


def test_compacted_topic_reads_byte_exact_with_gaps_allowed(kafka_cluster, compacted_topic):
    """Once the cleaner has left gaps, the read equals the leader's files as they were
    both before and after it (the cleaner may rewrite segments at any moment)."""
    bootstrap, name = kafka_cluster.bootstrap, compacted_topic.name
    deadline = time.monotonic() + 60
    while True:
        before = segment_bytes(kafka_cluster, name, 0)
        batches = list(read_batches(bootstrap, name, 0, 0, allow_gaps=True))
        ends = [0] + [b.last_offset + 1 for b in batches]
        gaps = any(end < b.base_offset for end, b in zip(ends, batches, strict=False))
        if gaps and before == segment_bytes(kafka_cluster, name, 0):
            break
        assert time.monotonic() < deadline, "Kafka's cleaner left no gap in 60 s"
        time.sleep(0.5)
    with pytest.raises(ClusterReadError, match="gap: the next batch Kafka holds starts at"):
        list(read_batches(bootstrap, name, 0, 0))
    assert b"".join(b.data for b in batches) == before
    offsets = [(b.base_offset, b.last_offset) for b in batches]
    assert all(a[1] < b[0] for a, b in zip(offsets, offsets[1:], strict=False))
    latest = {}
    for batch in batches:
        for _, view in iter_batches(batch.data):
            for record in DefaultRecordBatch(bytes(view)):
                latest[record.key] = record.value
    expected = {r.key: r.value for r in compacted_topic.records}  # in offset order: last wins
    assert latest == expected


def test_a_leader_change_mid_read_is_followed(kafka_cluster, caplog):
    admin = AdminClient({"bootstrap.servers": kafka_cluster.bootstrap})
    topic = f"offload-leader-{uuid.uuid4().hex[:8]}"
    admin.create_topics([NewTopic(topic, 1, 3)])[topic].result(30)
    producer = Producer({"bootstrap.servers": kafka_cluster.bootstrap, "linger.ms": 0,
                         "batch.num.messages": 5, "enable.idempotence": True})  # fmt: skip
    for n in range(300):
        producer.produce(topic, b"value %d" % n, partition=0)
        producer.poll(0)
    assert producer.flush(30) == 0
    first = leader_of(admin, topic)
    then = first % 3 + 1  # another broker

    caplog.set_level(logging.INFO, logger="tierproxy.offload")
    reader = read_batches(kafka_cluster.bootstrap, topic, 0, 0, fetch_max_bytes=512)
    head = [next(reader) for _ in range(5)]
    # move_leader waits until the old leader too names the new one: until it has applied
    # the move it answers the reader's next fetch as a leader (a fresh clone's run of
    # 2026-11-28: the whole rest was read from it before it had)
    move_leader(kafka_cluster, topic, 0, then)
    rest = list(reader)
    assert b"".join(b.data for b in head + rest) == segment_bytes(kafka_cluster, topic, 0)
    assert f"{topic}-0: " in caplog.text and "finding the leader again" in caplog.text
