"""The verification job on real Kafka, MinIO and Spark: the mixed topic's batches, read
from Kafka with the cluster reader, are written into stream objects in MinIO and committed
to a metadata state (the real rules, as the offload job's commits would be); verify
reports a clean copy as OK, and a tampered object, a range nobody committed and an object
that was never uploaded as mismatches naming the partition and offset."""

from __future__ import annotations

import json

import pytest
from offloadcopies import Copy, build, offload, other_id, s3_spec, state_of, tampered

from offload_jobs.verify import VerifyJob, verify

pytestmark = [pytest.mark.kafka, pytest.mark.minio, pytest.mark.spark]


@pytest.fixture(scope="module")
def offloaded(kafka_cluster, s3_server, mixed_topic):
    return offload(kafka_cluster, s3_server, mixed_topic)


def job_for(kafka_cluster, s3_server, topic: str) -> VerifyJob:
    return VerifyJob(topic, kafka_cluster.bootstrap, s3_spec(s3_server), shard_count=1)


def test_a_faithful_copy_verifies(kafka_cluster, s3_server, spark, mixed_topic, offloaded):
    topic_id, copies = offloaded
    lines: list[str] = []
    job = job_for(kafka_cluster, s3_server, mixed_topic.name)
    report = verify(spark, job, state_of(topic_id, copies), progress=lines.append)
    assert report.ok, report.table()
    assert lines[0] == f"{mixed_topic.name}: verifying 2 of 2 partitions"
    produced = len(mixed_topic.records)
    markers = 2 * 2  # a commit and an abort marker in each partition
    assert sum(p.kafka_records for p in report.partitions) == produced + markers
    for p, c in zip(report.partitions, copies, strict=True):
        assert (p.start, p.end) == (0, c.end)
        assert p.kafka_batches == p.object_batches > 10
    document = json.loads(report.to_json())
    assert document["ok"] is True and len(document["partitions"]) == 2
    assert report.table().splitlines()[0] == f"verification of {mixed_topic.name}: OK"


def test_a_tampered_object_names_the_partition_and_offset(
    kafka_cluster, s3_server, spark, mixed_topic, offloaded
):
    topic_id, copies = offloaded
    changed, block = tampered(s3_server, copies[1], other_id(copies[1].stream, 1))
    built = changed.objects[1][2]
    job = job_for(kafka_cluster, s3_server, mixed_topic.name)
    report = verify(spark, job, state_of(topic_id, [copies[0], changed]), progress=lambda _: None)
    assert not report.ok
    assert report.partitions[0].ok
    mismatches = report.partitions[1].mismatches
    assert mismatches[0].offset == block.start_offset
    assert "block CRC mismatch" in mismatches[0].what and built.key in mismatches[0].what
    # the block's batches are then missing from the copy, and nothing else is
    assert {m.offset for m in mismatches} <= set(range(block.start_offset, block.end_offset))
    assert f"{mixed_topic.name}-1 offset {block.start_offset}:" in report.table()


def test_a_missing_range_and_a_missing_object_are_named(
    kafka_cluster, s3_server, spark, mixed_topic, offloaded
):
    topic_id, copies = offloaded
    first_only = Copy(0, copies[0].stream, copies[0].end, copies[0].objects[:1])
    one = copies[1]
    start, end, never_put = build(one.stream, one.batches[1], object_id=other_id(one.stream, 2))
    missing = Copy(1, one.stream, one.end, [one.objects[0], (start, end, never_put)])
    job = job_for(kafka_cluster, s3_server, mixed_topic.name)
    report = verify(spark, job, state_of(topic_id, [first_only, missing]), progress=lambda _: None)
    gap_start = copies[0].objects[0][1]
    zero, one = report.partitions
    assert zero.mismatches[0].offset == gap_start
    missing = zero.kafka_batches - zero.object_batches
    assert zero.mismatch_count == 1, "the range nobody committed is one mismatch"
    assert f"({missing} batches, " in zero.mismatches[0].what
    assert zero.mismatches[0].what.endswith("are in Kafka, not in the objects")
    assert one.mismatches[0].offset == start
    assert "unreadable" in one.mismatches[0].what and never_put.key in one.mismatches[0].what
    table = report.table()
    assert f"{mixed_topic.name}-0 offset {gap_start}: batches [{gap_start}," in table
