"""The Parquet export on real Kafka, MinIO and Spark: the mixed topic (every codec,
idempotent and transactional producers, keys, headers) exported from Kafka to a local
directory and from its object copy to MinIO reads back, field by field, as exactly the
records a read_committed consumer sees: no transaction marker, no aborted record. Spark
reads the hive-style layout with topic, partition and date columns. A damaged object
fails its partition with the offset; the other partition is exported."""

from __future__ import annotations

import datetime

import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
from offloadcopies import Copy, offload, other_id, s3_spec, state_of, tampered
from offloaddata import Topic
from pyarrow import fs

from offload_jobs.export import ExportJob, export

pytestmark = [pytest.mark.kafka, pytest.mark.minio, pytest.mark.spark]


def read_back(path: str, filesystem=None) -> list[tuple]:
    table = ds.dataset(
        path, format="parquet", partitioning="hive", filesystem=filesystem
    ).to_table()
    rows = []
    for r in table.to_pylist():
        headers = tuple((h["key"], h["value"]) for h in r["headers"])
        timestamp = int(r["timestamp"].timestamp() * 1000)
        assert r["date"] == r["timestamp"].astimezone(datetime.UTC).date().isoformat()
        rows.append(
            (r["topic"], r["partition"], r["offset"], timestamp, r["key"], r["value"], headers)
        )
    return sorted(rows, key=lambda row: (row[1], row[2]))


def expected(topic: Topic) -> list[tuple]:
    return [
        (topic.name, r.partition, r.offset, r.timestamp_ms, r.key, r.value, r.headers)
        for r in topic.visible()
    ]


def test_export_from_kafka_reads_back_field_by_field(kafka_cluster, spark, mixed_topic, tmp_path):
    lines: list[str] = []
    job = ExportJob(mixed_topic.name, kafka_cluster.bootstrap, str(tmp_path / "out"),
                    rows_per_file=300)  # fmt: skip
    summary = export(spark, job, progress=lines.append)
    assert summary.ok, summary.line()
    assert lines[0] == f"{mixed_topic.name}: exporting 2 partitions from kafka"
    visible = expected(mixed_topic)
    aborted = sum(not r.committed for r in mixed_topic.records)
    assert (summary.records, summary.aborted, summary.markers) == (len(visible), aborted, 4)
    assert summary.undecided == 0 and summary.files >= len(visible) // 300
    assert read_back(str(tmp_path / "out")) == visible
    for path in (tmp_path / "out").rglob("*.parquet"):
        offsets = pq.read_table(path).column("offset").to_pylist()
        assert offsets == sorted(offsets) and len(offsets) <= 300
        assert path.name == f"part-{path.parts[-3].split('=')[1]}-{offsets[0]}.parquet"
    assert f"{len(visible)} records ({aborted} aborted" in summary.line()

    frame = spark.read.parquet(str(tmp_path / "out"))
    assert {"topic", "partition", "date", "offset", "headers"} <= set(frame.columns)
    assert frame.where(f"topic = '{mixed_topic.name}' AND partition = 1").count() == sum(
        1 for row in visible if row[1] == 1
    )


def test_export_from_objects_to_minio(kafka_cluster, s3_server, spark, mixed_topic):
    topic_id, copies = offload(kafka_cluster, s3_server, mixed_topic)
    spec = s3_spec(s3_server)
    prefix = f"exports/{mixed_topic.name}"
    job = ExportJob(
        mixed_topic.name, kafka_cluster.bootstrap, f"s3://{s3_server.bucket}/{prefix}",
        source="objects", store=spec, s3=spec.s3, shard_count=1,
    )  # fmt: skip
    summary = export(spark, job, state_of(topic_id, copies), progress=lambda _: None)
    assert summary.ok, summary.line()
    endpoint = spec.s3["endpoint_url"].split("://")
    minio = fs.S3FileSystem(
        access_key=spec.s3["access_key_id"], secret_key=spec.s3["secret_access_key"],
        region=spec.s3["region"], endpoint_override=endpoint[1], scheme=endpoint[0],
    )  # fmt: skip
    assert read_back(f"{s3_server.bucket}/{prefix}", minio) == expected(mixed_topic)

    # a damaged block stops its partition at the block's first offset; the other goes on
    changed, block = tampered(s3_server, copies[1], other_id(copies[1].stream, 3))
    job = ExportJob(
        mixed_topic.name, kafka_cluster.bootstrap, f"s3://{s3_server.bucket}/{prefix}-bad",
        source="objects", store=spec, s3=spec.s3, shard_count=1,
    )  # fmt: skip
    summary = export(spark, job, state_of(topic_id, [copies[0], changed]), progress=lambda _: None)
    assert not summary.ok
    assert summary.errors == [summary.errors[0]]
    assert summary.errors[0].startswith(f"{mixed_topic.name}-1 at offset {block.start_offset}:")
    assert "block CRC mismatch" in summary.errors[0]
    assert summary.records == sum(1 for row in expected(mixed_topic) if row[1] == 0)


def test_the_whole_topic_reads_the_objects_where_they_are_and_kafka_for_the_rest(
    kafka_cluster, s3_server, spark, mixed_topic, tmp_path
):
    """Partition 0's first half only in Kafka (its second half in an object), partition
    1's second object damaged: the whole-topic export reads partition 0 from both sources
    without a gap or a repeat, and partition 1's objects (the damage fails it, so they
    were read, not Kafka's copy)."""
    topic_id, copies = offload(kafka_cluster, s3_server, mixed_topic)
    half = Copy(copies[0].partition, copies[0].stream, copies[0].end, copies[0].objects[1:])
    changed, block = tampered(s3_server, copies[1], other_id(copies[1].stream, 4))
    lines: list[str] = []
    job = ExportJob(
        mixed_topic.name, kafka_cluster.bootstrap, str(tmp_path / "out"), source="whole",
        store=s3_spec(s3_server), shard_count=1,
    )  # fmt: skip
    summary = export(spark, job, state_of(topic_id, [half, changed]), progress=lines.append)
    assert lines[0] == f"{mixed_topic.name}: exporting 2 partitions from Kafka and the objects"
    assert lines[1].startswith(f"{mixed_topic.name} is tiered (partition 0: cutover ")
    assert "records not uploaded yet (past each partition's objects) are left out" in lines[1]
    assert [e.split(":")[0] for e in summary.errors] == [
        f"{mixed_topic.name}-1 at offset {block.start_offset}"
    ]
    exported = [row for row in read_back(str(tmp_path / "out")) if row[1] == 0]
    assert exported == [row for row in expected(mixed_topic) if row[1] == 0]


def test_bad_settings_are_named():
    with pytest.raises(ValueError, match="export source 'nowhere': one of whole, kafka, objects"):
        ExportJob("t", "h:1", "/tmp/x", source="nowhere")
    with pytest.raises(ValueError, match="needs S3 settings"):
        ExportJob("t", "h:1", "s3://bucket/x")
