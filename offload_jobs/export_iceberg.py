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
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from pyiceberg.exceptions import CommitFailedException

from offload_jobs import iceberg_offsets
from offload_jobs.export import (
    ExportJob,
    ExportSummary,
    PartitionExport,
    PartitionResult,
    add_up,
    plan,
    run_task,
    tiered_partitions,
)
from offload_jobs.export_records import RecordDecoder, Resume
from offload_jobs.iceberg_table import (
    CatalogSpec,
    FileWriter,
    commit,
    load_or_create,
    open_catalog,
    snapshot_summaries,
)
from offload_jobs.kafka_client import describe_topic
from offload_jobs.progress import TaskProgress
from offload_jobs.value_columns import ValueSchema
from proxy.metadata.state import MetadataState


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
class IcebergPartitionResult(PartitionResult):
    """`files`: pyiceberg DataFiles; `end` and `open`: where the partition's next run
    resumes (`Resume`)."""

    end: int = 0
    open: dict[int, int] = field(default_factory=dict)
    value_errors: int = 0  # values the table's value columns could not take


def export_partition(
    job: ExportJob, metadata, io_properties: dict[str, str], resumes: Mapping[int, Resume],
    task: PartitionExport,
) -> IcebergPartitionResult:  # fmt: skip
    """One task, on an executor: read, decode (resuming where the last snapshot stopped),
    write data files (a file per day, or per `rows_per_file` rows of a day, each in
    offset order)."""
    result = IcebergPartitionResult(task.partition, end=read_end(task))

    def writer() -> Callable[[str, list], None]:
        files = FileWriter(metadata, io_properties)

        def write(date: str, rows: list) -> None:
            before = files.value_errors
            result.files.append(files.write(job.topic, task.partition, date, rows))
            result.value_errors += files.value_errors - before

        return write

    decoder = RecordDecoder(resumes.get(task.partition))
    decoded = run_task(job, task, decoder, result, writer, "the table's location")
    if decoded is not None:
        result.open = decoded.open
    return result


@dataclass
class IcebergSummary(ExportSummary):
    """`destination`: the table's name."""

    snapshot_id: int | None = None
    offsets: dict[int, Resume] = field(default_factory=dict)
    value_errors: int = 0

    def line(self) -> str:
        text = super().line()
        if not self.value_errors:
            return text
        head, sep, failures = text.partition("\n")
        note = f"; {self.value_errors} values not decoded (their reason in value_error)"
        return head + note + sep + failures

    def head(self) -> str:
        if self.errors:
            return f"exported nothing of {self.topic} to {self.destination} (nothing committed)"
        if self.snapshot_id is None:
            return f"{self.topic}: nothing new for {self.destination} (no snapshot)"
        return f"exported {self.topic} to {self.destination} (snapshot {self.snapshot_id})"


def export_iceberg(
    spark,
    job: ExportJob,
    catalog_spec: CatalogSpec,
    states: Mapping[int, MetadataState] | None = None,
    progress: Callable[[str], None] = print,
    redraw: Callable[[str], None] | None = None,
    values: ValueSchema | None = None,
) -> IcebergSummary:
    """Run the job on `spark`: one snapshot appended, or none (nothing new, or a failed
    partition: then nothing is committed). `values`: JSON value columns for a new table
    (value_columns.py); an existing table keeps its own."""
    started = time.monotonic()
    table = load_or_create(open_catalog(catalog_spec), catalog_spec, job.topic, values)
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
    done = add_up(summary, results)
    summary.value_errors = sum(r.value_errors for r in done)
    files = [data_file for r in done for data_file in r.files]
    after = iceberg_offsets.advanced(before, {r.partition: (r.end, r.open) for r in done})
    if not summary.errors and files:
        properties = iceberg_offsets.encode(job.topic, after)
        properties["tierproxy.records"] = str(summary.records)
        try:
            summary.snapshot_id = commit(table, files, properties)
            summary.offsets = after
        except CommitFailedException as exc:  # another run committed since this one began
            summary.errors.append(
                f"{name} changed since this run read its offsets (another run at the same "
                f"time?): nothing committed, run again ({exc})"
            )
    summary.seconds = time.monotonic() - started
    return summary
