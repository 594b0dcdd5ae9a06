"""What a test asks of Kafka (or of a proxy, which must answer the same) through a real
client, librdkafka: watermarks, DeleteRecords, a read from the earliest offset. Each call
opens a client of its own and closes it, so that no answer comes from a cache another
call filled."""

from __future__ import annotations

import time
import uuid

from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient

RETRY_BACKOFF_S = 0.1  # librdkafka's retry.backoff.ms default
# Kafka's retriable errors a ListOffsets meets while a leader moves or restarts. Named here:
# the KafkaError `get_watermark_offsets` raises does not carry librdkafka's retriable flag.
RETRIABLE = frozenset(
    {
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.REQUEST_TIMED_OUT,
        KafkaError._TRANSPORT,
    }
)


def watermarks(
    bootstrap: str, topic: str, partition: int = 0, isolation: str = "read_uncommitted"
) -> tuple[int, int]:
    """(low, high) watermark of the partition: ListOffsets earliest and latest; with
    read_committed, latest is the last stable offset. A retriable error (a partition whose
    leader is moving or just restarted: NOT_LEADER_OR_FOLLOWER) is asked again, as an
    application must: librdkafka's `get_watermark_offsets` returns it rather than retrying
    (the Java client's `offsetsForTimes` retries it within its timeout)."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"w-{uuid.uuid4().hex}",
            "isolation.level": isolation,
        }
    )
    deadline = time.monotonic() + 30
    try:
        while True:
            try:
                return consumer.get_watermark_offsets(
                    TopicPartition(topic, partition), timeout=30, cached=False
                )
            except KafkaException as exc:
                if exc.args[0].code() not in RETRIABLE or time.monotonic() > deadline:
                    raise
                time.sleep(RETRY_BACKOFF_S)
    finally:
        consumer.close()


def delete_records(
    bootstrap: str, offsets: dict[tuple[str, int], int]
) -> dict[tuple[str, int], int | KafkaError]:
    """DeleteRecords up to each offset: (topic, partition) -> the low watermark answered,
    or the KafkaError of that partition."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    asked = [TopicPartition(t, p, o) for (t, p), o in offsets.items()]
    results: dict[tuple[str, int], int | KafkaError] = {}
    for tp, future in admin.delete_records(asked, request_timeout=60).items():
        try:
            results[tp.topic, tp.partition] = future.result().low_watermark
        except KafkaException as exc:
            results[tp.topic, tp.partition] = exc.args[0]
    return results


def read_from_earliest(
    bootstrap: str, topic: str, partitions: int, timeout: float = 60.0
) -> dict[int, list[tuple[int, bytes]]]:
    """Every record of the topic's partitions from ListOffsets earliest up to their high
    watermarks as of the call, read by a fresh consumer (never joining a group, never
    resetting): partition -> (offset, value) in the order they came."""
    marks = {p: watermarks(bootstrap, topic, p) for p in range(partitions)}
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"r-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
            "auto.offset.reset": "error",
        }
    )
    read: dict[int, list[tuple[int, bytes]]] = {p: [] for p in range(partitions)}
    position = dict.fromkeys(range(partitions), -1)
    try:
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
        deadline = time.monotonic() + timeout
        while any(max(position[p] + 1, low) < high for p, (low, high) in marks.items()):
            if time.monotonic() > deadline:
                raise AssertionError(f"{topic}: read to {position}, not to {marks}")
            for msg in consumer.consume(1000, 0.5):
                if msg.error() is not None:
                    raise AssertionError(f"{topic}: {msg.error()}")
                read[msg.partition()].append((msg.offset(), msg.value()))
                position[msg.partition()] = msg.offset()
    finally:
        consumer.close()
    return read
