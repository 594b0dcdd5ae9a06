"""`tierproxy export --iceberg`: a topic appended to an Iceberg table, incrementally and
exactly once (docs/offload.md, "Iceberg tables").

The driver loads the table (creating it on the first run) and reads the offsets the last
snapshot covers (`iceberg_offsets`); it plans the same tasks as the Parquet export (the
objects where the fleet's metadata commits ranges, Kafka's log for the rest), cut to
start where that snapshot stopped. One Spark task per partition reads its batches,
decodes them once (`export_records`, read_committed, skipping what the last run
decided) and writes data files into the table's location (`iceberg_table.FileWriter`);
it returns their descriptions and the offset it read to. The driver then appends every
file in one snapshot whose summary holds the new offsets. If any partition fails,
nothing is committed: the next run starts from the same offsets.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from offload_jobs import iceberg_offsets
from offload_jobs.cluster_reader import ClusterReadError
from offload_jobs.export import ExportJob, PartitionExport, plan, task_batches, tiered_partitions
from offload_jobs.export_records import ExportDecodeError, RecordDecoder, Resume
from offload_jobs.iceberg_table import (
    CatalogSpec,
    FileWriter,
    commit,
    load_or_create,
    open_catalog,
    snapshot_summaries,
)
from offload_jobs.kafka_client import describe_topic
from offload_jobs.object_source import ObjectReadError
from offload_jobs.progress import TaskProgress
from proxy.metadata.state import MetadataState

# Test hook: with this set, the driver says so and waits, its files written and not
# committed, to be killed (tests/integration/offload/test_export_iceberg.py).
HOLD_BEFORE_COMMIT = "TIERPROXY_TEST_HOLD_BEFORE_COMMIT"


def resumed(task: PartitionExport, resume: Resume, source: str) -> PartitionExport | None:
    """The task cut to start at `resume.start`; None when nothing is left to read."""
    start = resume.start
    ranges = tuple(r for r in task.ranges if r.end_offset > start)
    gaps = tuple((max(a, start), b) for a, b in task.gaps if b > start)
    if source == "kafka":
        if max(task.start, start) >= task.end:
            return None
        return dataclasses.replace(task, start=max(task.start, start))
    if not ranges and not gaps:
        return None
    return dataclasses.replace(task, ranges=ranges, gaps=gaps)


def read_end(task: PartitionExport) -> int:
    """The offset a task reads to: everything below it is decided by this run (or left
    open, and said so)."""
    return max([task.end, *(r.end_offset for r in task.ranges), *(b for _, b in task.gaps)])


@dataclass
class IcebergPartitionResult:
    partition: int
    end: int = 0
    open: dict[int, int] = field(default_factory=dict)
    batches: int = 0
    bytes: int = 0
    records: int = 0
    aborted: int = 0
    markers: int = 0
    undecided: int = 0
    files: list = field(default_factory=list)  # pyiceberg DataFiles
    error: str | None = None


def export_partition(
    job: ExportJob, metadata, io_properties: dict[str, str], resumes: Mapping[int, Resume],
    task: PartitionExport,
) -> IcebergPartitionResult:  # fmt: skip
    """One task, on an executor: read, decode, write data files (a file per day, or per
    `rows_per_file` rows of a day, each in offset order)."""
    result = IcebergPartitionResult(task.partition, end=read_end(task))
    where = f"{job.topic}-{task.partition}"
    decoder = RecordDecoder(resumes.get(task.partition))
    try:
        writer = FileWriter(metadata, io_properties)

        def write(date: str, rows) -> None:
            rows.sort(key=lambda row: row[0])  # committed transactions come at their marker
            result.files.append(writer.write(job.topic, task.partition, date, rows))

        for batch in task_batches(job, task):
            decoder.add(batch)
            for date, rows in decoder.drain(job.rows_per_file):
                write(date, rows)
        decoded = decoder.finish()
        for date, rows in sorted(decoded.by_date.items()):
            write(date, rows)
    except ClusterReadError as exc:
        result.error = str(exc)
        return result
    except (ExportDecodeError, ObjectReadError) as exc:
        result.error = f"{where} at {exc}"
        return result
    except OSError as exc:
        result.error = f"{where}: writing to the table's location: {exc}"
        return result
    for name in ("batches", "bytes", "records", "aborted", "markers", "undecided", "open"):
        setattr(result, name, getattr(decoded, name))
    return result


@dataclass
class IcebergSummary:
    topic: str
    table: str
    partitions: int = 0
    batches: int = 0
    bytes: int = 0
    records: int = 0
    aborted: int = 0
    markers: int = 0
    undecided: int = 0
    files: int = 0
    snapshot_id: int | None = None
    offsets: dict[int, Resume] = field(default_factory=dict)
    seconds: float = 0.0
    errors: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.errors

    def line(self) -> str:
        mib = self.bytes / (1 << 20)
        rate = mib / self.seconds if self.seconds > 0 else 0.0
        if self.errors:
            head = f"exported nothing of {self.topic} to {self.table} (nothing committed)"
        elif self.snapshot_id is None:
            head = f"{self.topic}: nothing new for {self.table} (no snapshot)"
        else:
            head = f"exported {self.topic} to {self.table} (snapshot {self.snapshot_id})"
        text = (
            f"{head}: {mib:.1f} MiB, {self.batches} batches, {self.records} records "
            f"({self.aborted} aborted and {self.undecided} undecided left out, {self.markers} "
            f"transaction markers), {self.files} files in {self.seconds:.1f} s ({rate:.1f} MiB/s)"
        )
        return text + "".join(f"\n  FAILED: {error}" for error in self.errors)


def export_iceberg(
    spark,
    job: ExportJob,
    catalog_spec: CatalogSpec,
    states: Mapping[int, MetadataState] | None = None,
    progress: Callable[[str], None] = print,
    redraw: Callable[[str], None] | None = None,
) -> IcebergSummary:
    """Run the job on `spark`: one snapshot appended, or none (nothing new, or a failed
    partition: then nothing is committed)."""
    started = time.monotonic()
    table = load_or_create(open_catalog(catalog_spec), catalog_spec, job.topic)
    before = iceberg_offsets.last_offsets(snapshot_summaries(table))
    topic_id, partitions = describe_topic(job.bootstrap, job.topic, **job.cluster_settings)
    if job.source != "kafka" and states is None:
        from offload_jobs.verify import read_states

        states = asyncio.run(read_states(job.bootstrap, job.metadata_topic, job.shard_count))
    planned = plan(job, topic_id, partitions, states)
    tasks = [
        t for t in (resumed(p, before.get(p.partition, Resume()), job.source) for p in planned) if t
    ]
    name = ".".join(catalog_spec.identifier)
    sources = "Kafka and the objects" if job.source == "whole" else job.source
    progress(f"{job.topic}: exporting {len(tasks)} partitions from {sources} to {name}")
    if job.source == "whole" and states is not None:
        tiered = tiered_partitions(topic_id, partitions, states, job.shard_count)
        if tiered:
            progress(f"{job.topic} is tiered: records not uploaded yet are left for a later run")
    results: list[IcebergPartitionResult] = []
    if tasks:
        watcher = TaskProgress(spark, len(tasks), "partitions exported", progress, redraw)
        try:
            rdd = spark.sparkContext.parallelize(tasks, len(tasks))
            run = functools.partial(export_partition, job, table.metadata, table.io.properties,
                                    before)  # fmt: skip
            results = rdd.map(watcher.counting(run, lambda r: r.bytes)).collect()
            watcher.finished()
        finally:
            watcher.stop()
    summary = IcebergSummary(job.topic, name, partitions=len(tasks), offsets=before)
    files: list[Any] = []
    runs = {}
    for r in sorted(results, key=lambda r: r.partition):
        if r.error:
            summary.errors.append(r.error)
            continue
        for key in ("batches", "bytes", "records", "aborted", "markers", "undecided"):
            setattr(summary, key, getattr(summary, key) + getattr(r, key))
        files += r.files
        runs[r.partition] = (r.end, r.open)
    summary.files = len(files)
    after = iceberg_offsets.advanced(before, runs)
    if not summary.errors and files:
        _hold_if_asked(progress, len(files))
        properties = iceberg_offsets.encode(job.topic, after)
        properties["tierproxy.records"] = str(summary.records)
        summary.snapshot_id = commit(table, files, properties)
        summary.offsets = after
    summary.seconds = time.monotonic() - started
    return summary


def _hold_if_asked(progress: Callable[[str], None], files: int) -> None:
    if os.environ.get(HOLD_BEFORE_COMMIT):
        progress(f"holding before the commit: {files} data files written")
        threading.Event().wait()  # until the test kills this process
