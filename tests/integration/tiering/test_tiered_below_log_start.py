"""A tiered partition whose log start retention moved below the cutover, while Kafka
still holds its own copy of the trimmed offsets (issue 15: the topic answers as Kafka).

One proxy on the shared Kafka. A one-partition topic gets BEFORE records through Kafka
(three batches) and is tiered; an offload job (its tasks run in the test, as in
test_tiered_retention) moves the first two batches into objects, and Kafka's copy is NOT
dropped (docs/offload.md step 4 not done yet). retention.bytes then drops the oldest
migrated range: the stream's log start L lies below the cutover, Kafka's log start is
still 0. Kafka answers OFFSET_OUT_OF_RANGE below its log start, so the proxy must too:
a Fetch below L was sent to Kafka (no object holds it) and served the trimmed records.
ListOffsets EARLIEST answers L (Kafka's answer, 0, was passed on), and a consumer from
the earliest offset reads exactly [L, cutover): the migrated range from its object, the
rest from Kafka. Then the job finishes (every offset below the cutover in objects, so
ListOffsets is answered by the proxy alone): the same answers.
"""

from __future__ import annotations

import pytest
from confluent_kafka import Consumer, KafkaError, TopicPartition
from cutover_load import wait_until
from test_tiered_retention import (
    BEFORE,
    TieredTopic,
    _earliest_latest,
    _fetch_error_at,
    _migrate,
    _read_from_earliest,
    _start,
)

pytestmark = pytest.mark.kafka


def _kafka_watermarks(cluster, topic: str) -> tuple[int, int]:
    consumer = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": "below-start"})
    try:
        return consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=30)
    finally:
        consumer.close()


def _check_log_starts_at(t: TieredTopic, log_start: int) -> None:
    bootstrap, topic = t.proxy.bootstrap, t.topic
    for offset in (0, log_start - 1):  # Kafka's copy holds them: it would serve them
        assert _fetch_error_at(bootstrap, topic, offset) == KafkaError._AUTO_OFFSET_RESET
    assert _earliest_latest(bootstrap, topic) == (log_start, BEFORE)
    expected = [(o, v) for o, v, _ in t.before[log_start:]]
    assert _read_from_earliest(bootstrap, topic, BEFORE - log_start) == expected


def test_a_fetch_below_a_log_start_below_the_cutover_is_out_of_range(kafka_cluster, tmp_path):
    topic, thread = _start(kafka_cluster, tmp_path, "below-start")
    with thread as proxy:
        t = TieredTopic(kafka_cluster, tmp_path, proxy, topic, before_batches=3)
        assert _migrate(t, first=2) == 2  # the job is not done: [b, cutover) only in Kafka
        ranges = t.ranges()
        assert [r.start_offset for r in ranges] == [0, ranges[0].end_offset]
        assert t.state.backfill_gaps(t.stream) == [(ranges[1].end_offset, BEFORE)]
        t.retention_sees(**{"retention.bytes": t.block_bytes(ranges[1])})
        log_start = ranges[0].end_offset
        assert t.run_retention().trimmed == {t.stream: log_start}
        # the owner wrote the trim; this proxy's reader of the shard applies it next
        wait_until(lambda: t.state.stream(t.stream).log_start_offset == log_start, 30, "read")
        assert _kafka_watermarks(kafka_cluster, topic) == (0, BEFORE)  # Kafka's copy lives
        _check_log_starts_at(t, log_start)

        assert _migrate(t) >= 1  # the rest: the objects hold [log start, cutover)
        assert t.state.backfill_gaps(t.stream) == []
        assert _kafka_watermarks(kafka_cluster, topic) == (0, BEFORE)
        _check_log_starts_at(t, log_start)
