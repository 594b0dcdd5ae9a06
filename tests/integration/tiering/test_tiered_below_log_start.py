"""A tiered partition whose log start moved below the cutover, while Kafka still holds
its own copy of the trimmed offsets for a while (issue 15: the topic answers as Kafka).

One proxy on the shared Kafka. A one-partition topic gets BEFORE records through Kafka
(five batches) and is tiered; an offload job (its tasks run in the test, as in
test_tiered_retention) moves the first three batches into objects, and Kafka's copy is
NOT dropped (docs/offload.md step 4 not done yet).

1. The trim written, Kafka's copy not deleted yet (what a retention pass leaves between
   its two steps, or after Kafka refused the delete): the stream's log start L1 lies
   below the cutover, Kafka's log start is still 0. Kafka answers OFFSET_OUT_OF_RANGE
   below its log start, so the proxy must too: a Fetch below L1 was sent to Kafka (no
   object holds it) and served the trimmed records. ListOffsets EARLIEST answers L1
   (Kafka's answer, 0, was passed on), and a consumer from the earliest offset reads
   exactly [L1, cutover): the migrated range from its object, the rest from Kafka.
2. A retention pass drops the next migrated range (retention.bytes), and deletes
   Kafka's copy below the new log start L2 too: Kafka's own log starts at L2, and a
   timestamp lookup older than L2 answers L2, as the passthrough topic would (before,
   Kafka's answer below it, offset 0, was passed on).
3. The job finishes (every offset below the cutover in objects, so ListOffsets is
   answered by the proxy alone): the same answers.

And the delete of step 2 reaches only the stream's own topic: DeleteRecords names a topic
by name, and a tiered topic deleted in Kafka and created again under its name (while
its old stream still lives in the metadata) holds other records, which must stay.
"""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient
from test_tiered_retention import (
    BEFORE,
    TieredTopic,
    _create_topic,
    _fetch_error_at,
    _migrate,
    _offset_for_time,
    _produce,
    _read_from_earliest,
    _start,
)

from proxy.clock import now_ms
from proxy.metadata.streams import shard_of
from proxy.upkeep.trims import write_trim
from tests.support.clients import watermarks
from tests.support.waiting import wait_until

pytestmark = pytest.mark.kafka


def _check_log_starts_at(t: TieredTopic, log_start: int) -> None:
    bootstrap, topic = t.proxy.bootstrap, t.topic
    for offset in (0, log_start - 1):  # Kafka's copy holds them: it would serve them
        assert _fetch_error_at(bootstrap, topic, offset) == KafkaError._AUTO_OFFSET_RESET
    assert watermarks(bootstrap, topic) == (log_start, BEFORE)
    expected = [(o, v) for o, v, _ in t.before[log_start:]]
    assert _read_from_earliest(bootstrap, topic, BEFORE - log_start) == expected


def _trim_only(t: TieredTopic, log_start: int) -> None:
    """The StreamTrim a retention pass writes, without the Kafka delete that follows it."""
    tiering = t.tiering
    owner = tiering.shard_owner(shard_of(t.stream, tiering.config.shard_count))
    info = t.state.stream(t.stream)
    verdict = t.proxy.run(lambda: write_trim(tiering, owner, info, log_start, now_ms()))
    assert verdict.accepted, verdict


def test_a_fetch_below_a_log_start_below_the_cutover_is_out_of_range(kafka_cluster, tmp_path):
    topic, thread = _start(kafka_cluster, tmp_path, "below-start")
    with thread as proxy:
        t = TieredTopic(kafka_cluster, tmp_path, proxy, topic, before_batches=5)
        assert _migrate(t, first=3) == 3  # the job is not done: [c, cutover) only in Kafka
        ranges = t.ranges()
        assert len(ranges) == 3 and ranges[0].start_offset == 0
        assert t.state.backfill_gaps(t.stream) == [(ranges[2].end_offset, BEFORE)]

        first = ranges[0].end_offset  # 1. the trim alone: Kafka's copy lives
        _trim_only(t, first)
        wait_until(lambda: t.state.stream(t.stream).log_start_offset == first, 30, "read")
        assert watermarks(kafka_cluster.bootstrap, topic) == (0, BEFORE)
        _check_log_starts_at(t, first)

        t.retention_sees(**{"retention.bytes": t.block_bytes(ranges[2])})  # 2. retention
        log_start = ranges[1].end_offset
        report = t.run_retention()
        assert report.trimmed == {t.stream: log_start}
        assert report.kafka_trimmed == {t.stream: log_start}
        wait_until(lambda: t.state.stream(t.stream).log_start_offset == log_start, 30, "read")
        assert watermarks(kafka_cluster.bootstrap, topic) == (log_start, BEFORE)
        _check_log_starts_at(t, log_start)
        for below in (t.before[0], t.before[first], t.before[log_start - 1], t.before[log_start]):
            timestamp = below[2]
            expected = next(o for o, _, ts in t.before if o >= log_start and ts >= timestamp)
            assert _offset_for_time(proxy.bootstrap, topic, timestamp) == expected, below

        assert _migrate(t) >= 1  # 3. the rest: the objects hold [log start, cutover)
        assert t.state.backfill_gaps(t.stream) == []
        assert watermarks(kafka_cluster.bootstrap, topic) == (log_start, BEFORE)
        _check_log_starts_at(t, log_start)


def _created_again(cluster, topic: str) -> None:
    """The topic deleted in Kafka (not through the proxy) and created under its name
    again, once Kafka has finished deleting it."""
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    admin.delete_topics([topic])[topic].result(30)

    def created() -> bool:
        try:
            _create_topic(cluster, topic)
        except KafkaException as exc:  # TOPIC_ALREADY_EXISTS: still being deleted
            if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise
            return False
        return True

    wait_until(created, 60, f"{topic} created again", interval_s=0.5)


def test_retention_leaves_alone_a_topic_created_again_under_the_streams_name(
    kafka_cluster, tmp_path, monkeypatch
):
    topic, thread = _start(kafka_cluster, tmp_path, "recreated")
    with thread as proxy:
        t = TieredTopic(kafka_cluster, tmp_path, proxy, topic, before_batches=5)
        assert _migrate(t, first=3) == 3
        ranges = t.ranges()
        # The fleet drops a topic deleted in Kafka directly once the owner's check of Kafka
        # finds it (test_tiered_topic_deletion.py): up to two checks, TOPICS_CHECK_S
        # apart. That window is held open here, for a retention pass to run in it.
        cutover = t.tiering.cutover

        async def not_yet() -> None:
            return None

        monkeypatch.setattr(cutover, "_check_topics", not_yet)
        _created_again(kafka_cluster, topic)
        others = _produce(kafka_cluster.bootstrap, topic, "other", BEFORE)  # straight to Kafka
        assert watermarks(kafka_cluster.bootstrap, topic) == (0, BEFORE)

        # The old stream is still tiered in the metadata, and the configs are read by name:
        # retention trims it as before, its Kafka delete would land in the new topic.
        t.retention_sees(**{"retention.bytes": t.block_bytes(ranges[2])})
        log_start = ranges[1].end_offset
        assert 0 < log_start < BEFORE
        report = t.run_retention()
        assert (report.trimmed, report.kafka_trimmed) == ({t.stream: log_start}, {})
        wait_until(lambda: t.state.stream(t.stream).log_start_offset == log_start, 30, "read")
        report = t.run_retention()  # nothing left to try again
        assert (report.trimmed, report.kafka_trimmed) == ({}, {})
        assert watermarks(kafka_cluster.bootstrap, topic) == (0, BEFORE)
        expected = [(o, v) for o, v, _ in others]
        assert _read_from_earliest(kafka_cluster.bootstrap, topic, BEFORE) == expected

        monkeypatch.undo()  # the check finds the topic id gone: the stream is dropped
        wait_until(lambda: t.state.stream(t.stream) is None, 30, "the stream dropped")
        assert watermarks(proxy.bootstrap, topic) == (0, BEFORE)  # the new topic, as Kafka's
        assert _read_from_earliest(proxy.bootstrap, topic, BEFORE) == expected
