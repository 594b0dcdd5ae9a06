"""`tierproxy export --iceberg` on real Kafka, MinIO and Spark (local), the table read back
with pyiceberg and compared with what a read_committed consumer reads from the topic
(Kafka is the oracle: every record exactly once; key, value, headers, timestamp and its
type byte-exact):

- a first run creates the table and appends the topic; a run after more was produced
  appends only the new records (a transaction left open at the first run's end included,
  once it commits: not before, and never twice); a run with nothing new commits nothing;
- a run killed (kill -9 of the command's process group: driver and Spark) after its data
  files were written and before its commit leaves no trace in the table; the run after
  it exports every record once;
- a tiered topic whose partitions span the cutover: below it from Kafka's log, from it on
  from the proxy's objects, one log."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pyarrow as pa
import pytest
import yaml
from confluent_kafka import Consumer, Producer, TopicPartition
from offloadcopies import offload, s3_spec, state_of
from offloaddata import Topic, create_topic, produce

from offload_jobs.export import ExportJob, plan
from offload_jobs.export_iceberg import export_iceberg
from offload_jobs.iceberg_offsets import OFFSETS_KEY, decode
from offload_jobs.iceberg_table import CatalogSpec, open_catalog, s3_io

pytestmark = [pytest.mark.kafka, pytest.mark.minio, pytest.mark.spark]

KINDS = {1: "CreateTime", 2: "LogAppendTime"}
HELD = Path(__file__).with_name("export_held.py")  # the export, held before its commit


def consumed(bootstrap: str, topic: str, partitions: int) -> list[tuple]:
    """Every record a read_committed consumer reads, (partition, offset) order."""
    consumer = Consumer({
        "bootstrap.servers": bootstrap, "group.id": f"oracle-{uuid.uuid4().hex}",
        "isolation.level": "read_committed", "enable.partition.eof": True,
        "enable.auto.commit": False,
    })  # fmt: skip
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    rows, at_end = [], set()
    try:
        while len(at_end) < partitions:
            msg = consumer.poll(10)
            assert msg is not None, "the consumer read nothing for 10 s"
            if msg.error():
                assert msg.error().code() == -191, msg.error()  # _PARTITION_EOF
                at_end.add(msg.partition())
                continue
            kind, timestamp = msg.timestamp()
            headers = tuple(msg.headers() or ())
            rows.append((topic, msg.partition(), msg.offset(), timestamp, KINDS[kind],
                         msg.key(), msg.value(), headers))  # fmt: skip
    finally:
        consumer.close()
    return sorted(rows, key=lambda r: (r[1], r[2]))


def fleet_config(bootstrap: str, metadata: str, tmp_path: Path) -> Path:
    """A fleet's config for the command: its metadata topic (created here, empty: the
    exported topic is not tiered) and a local object store in `tmp_path`."""
    create_topic(bootstrap, metadata, 1, {})
    config = tmp_path / "proxy.yaml"
    config.write_text(yaml.safe_dump({
        "upstream": {"bootstrap": bootstrap},
        "tiering": {
            "metadata_topic": metadata, "shard_count": 1,
            "object_store": {"kind": "local", "directory": str(tmp_path / "objects")},
        },
    }))  # fmt: skip
    return config


def table_rows(spec: CatalogSpec) -> list[tuple]:
    table = open_catalog(spec).load_table(spec.identifier).scan().to_arrow()
    micros = table.column("timestamp").cast(pa.int64()).to_pylist()
    rows = []
    for r, us in zip(table.to_pylist(), micros, strict=True):
        assert us % 1000 == 0
        headers = tuple((h["key"], h["value"]) for h in r["headers"])
        rows.append((r["topic"], r["partition"], r["offset"], us // 1000, r["timestamp_type"],
                     r["key"], r["value"], headers))  # fmt: skip
    return sorted(rows, key=lambda r: (r[1], r[2]))


def snapshots(spec: CatalogSpec) -> list:
    return open_catalog(spec).load_table(spec.identifier).snapshots()


def current_offsets(spec: CatalogSpec):
    table = open_catalog(spec).load_table(spec.identifier)
    return decode(table.current_snapshot().summary.additional_properties)


def end_offsets(bootstrap: str, topic: str, partitions: int) -> dict[int, int]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "watermarks"})
    try:
        return {
            p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
            for p in range(partitions)
        }
    finally:
        consumer.close()


def minio_spec(s3_server, tmp_path, name: str) -> CatalogSpec:
    io = s3_io(s3_spec(s3_server).s3)
    warehouse = f"s3://{s3_server.bucket}/iceberg-test-{uuid.uuid4().hex[:8]}"
    return CatalogSpec(f"sqlite:///{tmp_path / 'catalog.db'}", name, warehouse, io)


def test_first_run_then_only_what_is_new_exactly_once(kafka_cluster, s3_server, spark, tmp_path):
    bootstrap = kafka_cluster.bootstrap
    topic = Topic(f"iceberg-{uuid.uuid4().hex[:8]}", 2)
    create_topic(bootstrap, topic.name, 2, {"message.timestamp.type": "LogAppendTime"})
    produce(bootstrap, topic, "zstd", 300)
    produce(bootstrap, topic, "gzip", 100, transactional=True)  # a commit and an abort
    spec = minio_spec(s3_server, tmp_path, "kafka.events")
    job = ExportJob(topic.name, bootstrap, "", rows_per_file=120)
    lines: list[str] = []

    first = export_iceberg(spark, job, spec, progress=lines.append)
    assert first.ok and first.snapshot_id is not None, first.line()
    assert lines[0] == f"{topic.name}: exporting 2 partitions from kafka to kafka.events"
    oracle = consumed(bootstrap, topic.name, 2)
    assert table_rows(spec) == oracle and first.records == len(oracle) == 350
    assert first.aborted == 50 and first.files >= 4
    table = open_catalog(spec).load_table(spec.identifier)
    assert table.properties["tierproxy.topic"] == topic.name
    assert [f.name for f in table.spec().fields] == ["timestamp_day"]
    offsets = current_offsets(spec)
    ends = end_offsets(bootstrap, topic.name, 2)
    assert {p: (r.end, r.open) for p, r in offsets.items()} == {p: (e, {}) for p, e in ends.items()}

    # more: a transaction left open, then plain records after it (decided at once)
    pending = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"t-{topic.name}"})
    pending.init_transactions(30)
    pending.begin_transaction()
    for n in range(40):
        pending.produce(topic.name, f"open-{n}".encode(), b"k", partition=n % 2,
                        headers=[("h", None), ("h", b"")])  # fmt: skip
    pending.flush(30)
    produce(bootstrap, topic, "snappy", 60)
    second = export_iceberg(spark, job, spec, progress=lambda _: None)
    assert second.ok and second.records == 60 and second.undecided == 40, second.line()
    rows = table_rows(spec)
    assert len(rows) == len(set(rows)) == 410
    opened = decode(
        open_catalog(spec)
        .load_table(spec.identifier)
        .current_snapshot()
        .summary.additional_properties
    )
    assert all(len(r.open) == 1 and r.start < r.end for r in opened.values())

    pending.commit_transaction(30)
    third = export_iceberg(spark, job, spec, progress=lambda _: None)
    assert third.ok and third.records == 40 and third.undecided == 0, third.line()
    assert table_rows(spec) == consumed(bootstrap, topic.name, 2)
    assert len(snapshots(spec)) == 3

    again = export_iceberg(spark, job, spec, progress=lambda _: None)  # nothing new
    assert again.ok and again.snapshot_id is None and again.records == 0, again.line()
    assert "nothing new" in again.line()
    assert len(snapshots(spec)) == 3
    assert table_rows(spec) == consumed(bootstrap, topic.name, 2)


def test_a_run_killed_before_its_commit_leaves_nothing_and_the_next_one_exports_once(
    kafka_cluster, s3_server, spark, tmp_path
):
    bootstrap = kafka_cluster.bootstrap
    topic = Topic(f"iceberg-kill-{uuid.uuid4().hex[:8]}", 2)
    create_topic(bootstrap, topic.name, 2, {})
    produce(bootstrap, topic, "lz4", 200)
    metadata = f"{topic.name}-metadata"  # the fleet's: empty, the topic is not tiered
    config = fleet_config(bootstrap, metadata, tmp_path)
    catalog = tmp_path / "catalog.db"
    command = [
        sys.executable, str(HELD), "export", topic.name, "--config", str(config),
        "--iceberg", "raw.events", "--catalog", str(catalog), "--master", "local[2]",
    ]  # fmt: skip
    spec = CatalogSpec(str(catalog), "raw.events", (tmp_path / "objects" / "iceberg").as_uri())
    job = ExportJob(topic.name, bootstrap, "")
    assert export_iceberg(spark, job, spec, progress=lambda _: None).ok
    produce(bootstrap, topic, "none", 100)  # the killed run's share

    proc = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith("holding before the commit"):
                break
        else:
            pytest.fail(
                f"the run ended before its commit: {proc.stderr.read() if proc.stderr else ''}"
            )
        os.killpg(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(60)
        for stream in (proc.stdout, proc.stderr):
            stream.close()
    files = set((tmp_path / "objects" / "iceberg").rglob("*.parquet"))
    table = open_catalog(spec).load_table(spec.identifier)
    committed = {task.file.file_path.removeprefix("file://") for task in table.scan().plan_files()}
    orphans = {str(f) for f in files} - committed
    assert len(orphans) >= 2, "the killed run wrote no data files"
    assert len(table.snapshots()) == 1 and len(table_rows(spec)) == 200

    after = export_iceberg(spark, job, spec, progress=lambda _: None)
    assert after.ok and after.records == 100, after.line()
    assert table_rows(spec) == consumed(bootstrap, topic.name, 2)
    assert len(snapshots(spec)) == 2


def test_a_topic_spanning_the_cutover_reads_kafka_below_and_the_objects_above(
    kafka_cluster, s3_server, spark, mixed_topic, tmp_path
):
    topic_id, copies = offload(kafka_cluster, s3_server, mixed_topic)
    states = state_of(topic_id, copies, spanning=True)
    spec = minio_spec(s3_server, tmp_path, "mixed")
    job = ExportJob(mixed_topic.name, kafka_cluster.bootstrap, "", source="whole",
                    store=s3_spec(s3_server), shard_count=1)  # fmt: skip
    # each partition: Kafka's log below the cutover, the proxy's object from it on
    for task, copy in zip(plan(job, topic_id, 2, states), copies, strict=True):
        cutover = copy.objects[-1][0]
        assert task.gaps == ((0, cutover),) and task.ranges[0].start_offset == cutover
    summary = export_iceberg(spark, job, spec, states, progress=lambda _: None)
    assert summary.ok, summary.line()
    assert table_rows(spec) == consumed(kafka_cluster.bootstrap, mixed_topic.name, 2)
    offsets = current_offsets(spec)
    assert {p: r.end for p, r in offsets.items()} == {c.partition: c.end for c in copies}
    assert OFFSETS_KEY in snapshots(spec)[0].summary.additional_properties


def test_json_values_into_columns_with_bad_ones_kept_as_dead_letters(
    kafka_cluster, s3_server, spark, tmp_path
):
    """The command as a user runs it, with `--value-schema`: every JSON value's fields in
    their columns, as json.loads reads the value the consumer got; a value that is not
    JSON or does not fit kept whole with its reason, the run not stopped; a run without
    the flag decodes the next records with the table's columns."""
    bootstrap = kafka_cluster.bootstrap
    topic = f"iceberg-json-{uuid.uuid4().hex[:8]}"
    create_topic(bootstrap, topic, 1, {})
    values = [json.dumps({"id": n, "who": f"c{n % 3}", "amount": n / 4}).encode()
              for n in range(50)]  # fmt: skip
    values[10], values[20], values[30] = b"{broken", b'{"id": "eleven"}', None
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    for value in values:
        producer.produce(topic, value, b"k", partition=0)
    assert producer.flush(30) == 0
    metadata = f"{topic}-metadata"
    config = fleet_config(bootstrap, metadata, tmp_path)
    schema_file = tmp_path / "orders.json"
    schema_file.write_text('{"id": "long", "who": "string", "amount": "double"}')
    catalog = tmp_path / "catalog.db"
    command = [
        sys.executable, "-m", "proxy.cli", "export", topic, "--config", str(config),
        "--iceberg", "raw.orders", "--catalog", str(catalog), "--master", "local[1]",
    ]  # fmt: skip

    first = subprocess.run(
        [*command, "--value-schema", str(schema_file)], capture_output=True, text=True, timeout=300
    )
    assert first.returncode == 0, first.stdout + first.stderr
    assert "2 values not decoded (their reason in value_error)" in first.stdout, first.stdout
    producer.produce(topic, b'{"id": 99, "who": "late"}', b"k", partition=0)
    assert producer.flush(30) == 0
    second = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert second.returncode == 0, second.stdout + second.stderr

    spec = CatalogSpec(str(catalog), "raw.orders", (tmp_path / "objects" / "iceberg").as_uri())
    table = open_catalog(spec).load_table(spec.identifier).scan().to_arrow().to_pylist()
    read = sorted(table, key=lambda r: r["offset"])
    oracle = consumed(bootstrap, topic, 1)
    assert [r["value"] for r in read] == [row[6] for row in oracle]
    for row in read:
        if row["offset"] in (10, 20):
            assert row["id"] is row["who"] is row["amount"] is None, row
            continue
        fields = json.loads(row["value"]) if row["value"] is not None else {}  # 30: none
        assert row["value_error"] is None, row
        got = (row["id"], row["who"], row["amount"])
        assert got == (fields.get("id"), fields.get("who"), fields.get("amount")), row
    errors = {r["offset"]: r["value_error"] for r in read if r["value_error"]}
    assert sorted(errors) == [10, 20], errors
    assert errors[10].startswith("not JSON") and "field 'id': expected long" in errors[20]
    assert read[-1]["who"] == "late"  # the second run decoded with the table's columns
