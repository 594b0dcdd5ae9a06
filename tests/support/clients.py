"""What a test asks of Kafka (or of a proxy, which must answer the same) through a real
client, librdkafka: watermarks, and DeleteRecords. Each call opens a client of its own
and closes it, so that no answer comes from a cache another call filled."""

from __future__ import annotations

import uuid

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient


def watermarks(
    bootstrap: str, topic: str, partition: int = 0, isolation: str = "read_uncommitted"
) -> tuple[int, int]:
    """(low, high) watermark of the partition: ListOffsets earliest and latest; with
    read_committed, latest is the last stable offset."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"w-{uuid.uuid4().hex}",
            "isolation.level": isolation,
        }
    )
    try:
        return consumer.get_watermark_offsets(
            TopicPartition(topic, partition), timeout=30, cached=False
        )
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
