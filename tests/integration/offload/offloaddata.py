"""Topics the offload tests read (fixtures in conftest.py), and how they were produced.

`mixed_topic`: 2 partitions written by five idempotent librdkafka producers, one per
codec (gzip, snappy, lz4, zstd, none), plus a transactional producer with a committed and
an aborted transaction (so the log holds transaction markers and aborted records); keys
(some null), headers (some none, some repeated), values of mixed sizes. `compacted_topic`:
cleanup.policy=compact, keys overwritten many times. Every acknowledged record is kept
with its offset and timestamp, so a reader or an export can be checked field by field.
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

CODECS = ("gzip", "snappy", "lz4", "zstd", "none")
PARTITIONS = 2


@dataclass(frozen=True)
class Produced:
    partition: int
    offset: int
    timestamp_ms: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]
    codec: str
    committed: bool  # False: written in a transaction that was aborted


@dataclass
class Topic:
    name: str
    partitions: int
    records: list[Produced] = field(default_factory=list)

    def visible(self) -> list[Produced]:
        """What a read_committed consumer sees, in (partition, offset) order."""
        return sorted((r for r in self.records if r.committed), key=position)


def position(record: Produced) -> tuple[int, int]:
    return record.partition, record.offset


def _record(n: int, codec: str, keyed: bool) -> tuple[bytes | None, bytes | None, list]:
    key = None if n % 7 == 0 and not keyed else f"key-{n % 23}".encode()
    value = None if n % 97 == 5 else (f"{codec}:{n}:".encode() * (1 + n % 40))
    headers = [] if n % 3 == 0 else [("h", str(n).encode()), ("codec", codec.encode())]
    if n % 11 == 0:
        headers.append(("h", None))  # a null header value, and a repeated name
    return key, value, headers


def produce(
    bootstrap: str,
    topic: Topic,
    codec: str,
    count: int,
    *,
    transactional: bool = False,
    keyed: bool = False,
) -> None:
    config = {
        "bootstrap.servers": bootstrap,
        "compression.type": codec,
        "enable.idempotence": True,
        "acks": "all",
        "linger.ms": 20,
        "batch.num.messages": 50,
    }
    if transactional:
        config["transactional.id"] = f"offload-test-{uuid.uuid4().hex[:8]}"
    producer = Producer(config)
    acked: list[Produced] = []
    errors: list[str] = []

    def delivered(err, msg, n: int) -> None:
        if err is not None:
            errors.append(str(err))
            return
        key, value, headers = _record(n, codec, keyed)
        _, timestamp = msg.timestamp()
        acked.append(
            Produced(msg.partition(), msg.offset(), timestamp, key, value, tuple(headers),
                     codec, True)
        )  # fmt: skip

    def send(start: int, stop: int) -> None:
        for n in range(start, stop):
            key, value, headers = _record(n, codec, keyed)
            producer.produce(
                topic.name, value, key, partition=n % topic.partitions, headers=headers,
                on_delivery=lambda err, msg, n=n: delivered(err, msg, n),
            )  # fmt: skip
            producer.poll(0)

    if not transactional:
        send(0, count)
        assert producer.flush(60) == 0
        topic.records += acked
    else:
        producer.init_transactions(30)
        producer.begin_transaction()
        send(0, count // 2)
        producer.commit_transaction(30)
        topic.records += acked
        acked.clear()
        producer.begin_transaction()
        send(count // 2, count)
        producer.flush(30)
        producer.abort_transaction(30)
        topic.records += [_aborted(r) for r in acked]
        _wait_for_markers(bootstrap, topic.name, acked)
    assert not errors, errors


def _wait_for_markers(bootstrap: str, topic: str, last_transaction: list[Produced]) -> None:
    """Until the abort markers are in the logs: the coordinator writes them after it
    answered EndTxn, and a reader must not see the log grow under it."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"w-{uuid.uuid4().hex}"})
    try:
        for partition in {r.partition for r in last_transaction}:
            marker = max(r.offset for r in last_transaction if r.partition == partition) + 1
            deadline = time.monotonic() + 30
            tp = TopicPartition(topic, partition)
            while consumer.get_watermark_offsets(tp, timeout=10)[1] <= marker:
                assert time.monotonic() < deadline, f"no abort marker in {topic}-{partition}"
                time.sleep(0.1)
    finally:
        consumer.close()


def _aborted(record: Produced) -> Produced:
    return dataclasses.replace(record, committed=False)


def create_topic(bootstrap: str, name: str, partitions: int, config: dict[str, str]) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(name, partitions, 3, config=config)])[name].result(30)


def leader_log_dir(kafka_cluster, topic: str, partition: int) -> Path:
    """The partition's directory on its leader's disk."""
    admin = AdminClient({"bootstrap.servers": kafka_cluster.bootstrap})
    leader = admin.list_topics(topic, timeout=30).topics[topic].partitions[partition].leader
    return Path(kafka_cluster.node(leader).data_dir) / "logs" / f"{topic}-{partition}"


def segment_bytes(kafka_cluster, topic: str, partition: int) -> bytes:
    """The partition's log as its leader stores it: its .log files joined in order (a
    follower may lag behind for a moment)."""
    directory = leader_log_dir(kafka_cluster, topic, partition)
    return b"".join(p.read_bytes() for p in sorted(directory.glob("*.log")))
