"""The keyed workload of the compacted-topic tests, and the pair of topics it goes to:
a passthrough one, cleaned by Kafka (the oracle), and a tiered one, cleaned by the proxy
or by `tierproxy clean` (test_tiered_compacted.py says how the two are made comparable)."""

from __future__ import annotations

import time
import uuid

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from cutover_load import started, tiered_topic_id, topics_command

from proxy.metadata.streams import stream_id
from tests.support.clients import watermarks
from tests.support.waiting import wait_until

KEYS = 10
SEGMENT_MS = 1000
HOUR_MS = 3_600_000
CODECS = ["none", "gzip", "snappy", "lz4", "zstd"]
# record timestamps a minute old: Kafka rolls a segment on record timestamps (the new
# batch's against the segment's first), and markers carry the wall clock
BASE_TS = int(time.time() * 1000) - 60_000

Rec = tuple[int, bytes | None, bytes | None, tuple, int]  # offset, key, value, headers, ts


def create_compacted(
    bootstrap: str, topic: str, policy: str, delete_retention_ms: int = HOUR_MS
) -> None:
    config = {
        "cleanup.policy": policy,
        "min.cleanable.dirty.ratio": "0.01",
        "segment.ms": str(SEGMENT_MS),
        "delete.retention.ms": str(delete_retention_ms),
    }
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, 1, 3, config=config)])[topic].result(30)


def round_records(n: int) -> list[tuple[bytes, bytes | None, list, int]]:
    """Round n's records: (key, value or None, headers, timestamp)."""
    out = []
    for i in range(30):
        key = f"k{(i * 7 + n) % KEYS}".encode()
        value = None if (i + n) % 9 == 0 else f"v{n}-{i}".encode()
        headers = [("round", str(n).encode())] if i % 3 == 0 else []
        out.append((key, value, headers, BASE_TS + n * 1000 + i))
    return out


def produce(bootstrap: str, topic: str, records, codec: str) -> None:
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "enable.idempotence": True,
            "linger.ms": 20,
            "compression.type": codec,
        }
    )
    errors: list[str] = []
    for key, value, headers, ts in records:
        producer.produce(
            topic,
            value,
            key,
            partition=0,
            headers=headers,
            timestamp=ts,
            on_delivery=lambda err, _m: errors.append(str(err)) if err else None,
        )
    assert producer.flush(60) == 0
    assert not errors, errors[:3]


def transaction(bootstrap: str, topic: str, records, commit: bool) -> None:
    producer = Producer(
        {"bootstrap.servers": bootstrap, "transactional.id": f"tx-{uuid.uuid4().hex}"}
    )
    producer.init_transactions(30)
    producer.begin_transaction()
    for key, value, headers, ts in records:
        producer.produce(topic, value, key, partition=0, headers=headers, timestamp=ts)
    producer.flush(30)
    if commit:
        producer.commit_transaction(30)
    else:
        producer.abort_transaction(30)


def read_all(bootstrap: str, topic: str, last: int) -> list[Rec]:
    """Every record up to offset `last` (which is never cleaned away), read_uncommitted."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"c-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
            "isolation.level": "read_uncommitted",
        }
    )
    consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
    got: list[Rec] = []
    deadline = time.monotonic() + 60
    try:
        while (not got or got[-1][0] < last) and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            assert msg.error() is None, msg.error()
            headers = tuple(msg.headers() or ())
            got.append((msg.offset(), msg.key(), msg.value(), headers, msg.timestamp()[1]))
    finally:
        consumer.close()
    assert got and got[-1][0] == last, f"read up to {got[-1][0] if got else None}, not {last}"
    return got


def latest(records: list[Rec]) -> dict[bytes | None, bytes | None]:
    latest = {}
    for _, key, value, _, _ in records:
        latest[key] = value
    return latest


class Pair:
    """The passthrough topic (Kafka's cleaner) and the tiered one (the proxy's)."""

    def __init__(
        self, cluster, proxy, policy: str = "compact", delete_retention_ms: int = HOUR_MS
    ) -> None:
        self.kafka, self.proxy = cluster.bootstrap, proxy
        self.tiering = proxy.proxy.tiering
        suffix = uuid.uuid4().hex[:8]
        self.plain, self.tiered = f"compacted-kafka-{suffix}", f"compacted-tiered-{suffix}"
        for topic in (self.plain, self.tiered):
            create_compacted(self.kafka, topic, policy, delete_retention_ms)
        assert topics_command("tier", self.tiered, self.tiering.peer_port).returncode == 0
        self.stream = stream_id(tiered_topic_id(proxy, self.tiered), 0)
        wait_until(lambda: started(self.tiering, self.stream), 30, "started")
        self.written: list[tuple[bytes, bytes | None]] = []  # committed, in order

    def both(self, step) -> None:
        """`step(bootstrap, topic)` on both topics; then both end at the same offset."""
        step(self.kafka, self.plain)
        step(self.proxy.bootstrap, self.tiered)

        def same_end() -> bool:
            return (
                watermarks(self.kafka, self.plain)[1]
                == watermarks(self.proxy.bootstrap, self.tiered)[1]
            )

        wait_until(same_end, 30, "both topics at the same end (markers written)")

    def committed(self) -> int:
        """Upload the tiered topic's tail; its committed end."""
        end = watermarks(self.proxy.bootstrap, self.tiered)[1]
        self.proxy.run(lambda: self.tiering.uploader.flush())
        state = self.tiering.state(self.stream)
        wait_until(lambda: state.stream_end(self.stream) == end, 30, "uploaded")
        return end

    def clean(self, now_ms: int | None = None):
        cleaner = self.tiering.log_cleaner
        return self.proxy.run(lambda: cleaner.run_once(now_ms, refresh_configs=True))

    def delete_records(self, offset: int) -> dict[str, int | str]:
        """DeleteRecords below `offset` on both topics (the tiered one through the proxy):
        topic -> the new log start, or the error's name."""
        out: dict[str, int | str] = {}
        for bootstrap, topic in ((self.kafka, self.plain), (self.proxy.bootstrap, self.tiered)):
            admin = AdminClient({"bootstrap.servers": bootstrap})
            [future] = admin.delete_records([TopicPartition(topic, 0, offset)]).values()
            try:
                out[topic] = future.result(30).low_watermark
            except KafkaException as exc:
                out[topic] = exc.args[0].name()
        return out

    def both_cleaned_from(self, first: int, last: int) -> tuple[list[Rec], list[Rec]]:
        """(Kafka's, the proxy's) records from `first` to `last`, once Kafka's cleaner has
        cleaned below `last` (the proxy cleaned before this is called)."""

        def kafka_cleaned() -> bool:
            below = [r for r in read_all(self.kafka, self.plain, last) if r[0] < last]
            return len({r[1] for r in below}) == len(below)

        wait_until(kafka_cleaned, 120, "Kafka's cleaner cleaned the topic", interval_s=2)
        plain = read_all(self.kafka, self.plain, last)
        tiered = read_all(self.proxy.bootstrap, self.tiered, last)
        assert plain[0][0] >= first and tiered[0][0] >= first
        return plain, tiered
