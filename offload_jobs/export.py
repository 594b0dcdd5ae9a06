"""The Parquet export: a topic's records for analytics backfills, from Kafka or from the
object layout (docs/offload.md, "Parquet export").

One Spark task per partition reads its batches (the cluster reader, Kafka's log start to
its high watermark; or the objects of every range the fleet's metadata commits; or, the
default, the whole topic: the objects where they are, Kafka's log for the rest), decodes
them (`export_records`: read_committed, markers and aborted records left out) and writes
one Parquet file per day under hive-style directories:

    <destination>/topic=<topic>/partition=<n>/date=<YYYY-MM-DD>/part-<n>-<first offset>.parquet

(a day of more than `rows_per_file` rows gets several files, so a task's memory stays
bounded). File names are deterministic, so a run again overwrites what it wrote before. The
destination is a local path or s3://bucket/prefix (pyarrow's S3 filesystem, pointed at
the configured endpoint). A batch that cannot be read or decoded fails its partition with
the offset, reported in the summary; the other partitions go on.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlparse

from offload_jobs.cluster_reader import ClusterReadError, read_batches
from offload_jobs.export_records import DecodedRows, ExportDecodeError, RecordDecoder, to_table
from offload_jobs.kafka_client import describe_topic, log_offsets
from offload_jobs.migrate import StoreSpec
from offload_jobs.object_source import ObjectReadError, object_batches
from offload_jobs.progress import TaskProgress
from offload_jobs.sources import SourceBatch
from proxy.metadata.state import MetadataState
from proxy.metadata.streams import StreamRange, shard_of, stream_id

SOURCES = ("whole", "kafka", "objects")
COUNTS = ("batches", "bytes", "records", "aborted", "markers", "undecided")  # per partition


@dataclass(frozen=True, slots=True)
class ExportJob:
    topic: str
    bootstrap: str
    destination: str  # a local directory, or s3://bucket/prefix
    source: str = "kafka"  # or "objects": the committed ranges; "whole": both (see plan)
    store: StoreSpec | None = None  # the object store (source "objects")
    s3: dict[str, Any] | None = None  # S3Config fields for an s3:// destination
    metadata_topic: str = "__tierproxy_metadata"
    shard_count: int = 8
    rows_per_file: int = 100_000  # a day with more rows gets several files: bounded memory
    cluster_settings: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.rows_per_file < 1:
            raise ValueError(f"export rows_per_file {self.rows_per_file}: must be at least 1")
        if self.source not in SOURCES:
            raise ValueError(f"export source {self.source!r}: one of {', '.join(SOURCES)}")
        if self.source != "kafka" and self.store is None:
            raise ValueError(f"export source '{self.source}': needs the object store")
        if self.destination.startswith("s3://"):
            if self.s3 is None or not self.s3.get("endpoint_url"):
                raise ValueError(f"export to {self.destination}: needs S3 settings (endpoint)")
            if not urlparse(self.destination).netloc:
                raise ValueError(f"export to {self.destination}: no bucket named")


@dataclass(frozen=True, slots=True)
class PartitionExport:
    """One task: a partition, and where its batches come from: Kafka's [start, end) and
    the `ranges` of the stream's objects (source "whole": Kafka's `gaps` and the objects,
    read in offset order)."""

    partition: int
    start: int = 0  # Kafka: [start, end)
    end: int = 0
    stream_id: int = 0  # objects: these ranges of this stream
    ranges: tuple[StreamRange, ...] = ()
    gaps: tuple[tuple[int, int], ...] = ()  # whole: Kafka's offsets no object holds


def kafka_gaps(
    start: int, end: int, ranges: tuple[StreamRange, ...]
) -> tuple[tuple[int, int], ...]:
    """The offsets of Kafka's [start, end) that no committed range holds, as ranges: what
    a whole-topic export reads from Kafka (the objects hold the rest). Ranges start and
    end at batch boundaries, so neither source repeats a batch of the other."""
    gaps, at = [], start
    for r in ranges:
        if r.start_offset > at:
            gaps.append((at, min(r.start_offset, end)))
        at = max(at, r.end_offset)
        if at >= end:
            break
    if at < end:
        gaps.append((at, end))
    return tuple((a, b) for a, b in gaps if a < b)


@dataclass
class PartitionResult:
    partition: int
    batches: int = 0
    bytes: int = 0
    records: int = 0
    aborted: int = 0
    markers: int = 0
    undecided: int = 0
    files: list[str] = field(default_factory=list)
    error: str | None = None


def _filesystem(job: ExportJob):
    """(pyarrow filesystem, root path in it)."""
    from pyarrow import fs

    if not job.destination.startswith("s3://"):
        return fs.LocalFileSystem(), job.destination.rstrip("/")
    s3 = job.s3 or {}
    endpoint = urlparse(s3["endpoint_url"])
    filesystem = fs.S3FileSystem(
        access_key=s3.get("access_key_id"),
        secret_key=s3.get("secret_access_key"),
        region=s3.get("region") or "us-east-1",
        endpoint_override=endpoint.netloc or endpoint.path,
        scheme=endpoint.scheme or "https",
        force_virtual_addressing=not s3.get("path_style", True),
    )
    target = urlparse(job.destination)
    return filesystem, f"{target.netloc}/{target.path.strip('/')}".rstrip("/")


def task_batches(job: ExportJob, task: PartitionExport) -> Iterator[SourceBatch]:
    if job.source == "kafka":
        yield from _kafka(job, task.partition, task.start, task.end)
        return
    assert job.store is not None
    # one object in memory at a time: a range's batches are views of its object
    loop = asyncio.new_event_loop()
    store = loop.run_until_complete(job.store.open())
    pieces: list[tuple[int, StreamRange | tuple[int, int]]] = [
        (r.start_offset, r) for r in task.ranges
    ]
    pieces += [(gap[0], gap) for gap in task.gaps]
    try:
        for _, piece in sorted(pieces, key=lambda p: p[0]):  # offset order: one log
            if isinstance(piece, tuple):
                yield from _kafka(job, task.partition, *piece)
                continue

            async def collect(r=piece) -> list[SourceBatch]:
                return [b async for b in object_batches(store, task.stream_id, (r,))]

            yield from loop.run_until_complete(collect())
    finally:
        loop.run_until_complete(store.close())
        loop.close()


def _kafka(job: ExportJob, partition: int, start: int, end: int) -> Iterator[SourceBatch]:
    yield from read_batches(
        job.bootstrap, job.topic, partition, start, end, allow_gaps=True, **job.cluster_settings
    )


def export_partition(job: ExportJob, task: PartitionExport) -> PartitionResult:
    """One task, on an executor: read, decode, write a file per day (or per
    `rows_per_file` rows of a day), each in offset order."""
    import pyarrow.parquet as pq

    result = PartitionResult(task.partition)

    def writer() -> Callable[[str, list], None]:
        filesystem, root = _filesystem(job)

        def write(date: str, rows) -> None:
            directory = f"{root}/topic={job.topic}/partition={task.partition}/date={date}"
            filesystem.create_dir(directory, recursive=True)
            path = f"{directory}/part-{task.partition}-{rows[0][0]}.parquet"
            pq.write_table(to_table(rows), path, filesystem=filesystem)
            result.files.append(path)

        return write

    run_task(job, task, RecordDecoder(), result, writer, job.destination)
    return result


def run_task(
    job: ExportJob, task: PartitionExport, decoder: RecordDecoder, result: PartitionResult,
    writer: Callable[[], Callable[[str, list], None]], destination: str,
) -> DecodedRows | None:  # fmt: skip
    """A task's work, whatever it writes: read its batches, decode them, hand each day's
    rows in offset order to the writer (`writer()` makes it) as they reach
    `rows_per_file`, and the rest at the end. The counts go into `result`, or the error
    that stopped the partition (None is returned then)."""
    where = f"{job.topic}-{task.partition}"

    def sorted_rows(rows: list) -> list:
        rows.sort(key=lambda row: row[0])  # committed transactions come at their marker
        return rows

    try:
        write = writer()
        for batch in task_batches(job, task):
            decoder.add(batch)
            for date, rows in decoder.drain(job.rows_per_file):
                write(date, sorted_rows(rows))
        decoded = decoder.finish()
        for date, rows in sorted(decoded.by_date.items()):
            write(date, sorted_rows(rows))
    except ClusterReadError as exc:  # names the partition itself
        result.error = str(exc)
        return None
    except (ExportDecodeError, ObjectReadError) as exc:
        result.error = f"{where} at {exc}"
        return None
    except OSError as exc:  # pyarrow's for a destination it cannot write
        result.error = f"{where}: writing to {destination}: {exc}"
        return None
    for name in COUNTS:
        setattr(result, name, getattr(decoded, name))
    return decoded


@dataclass
class ExportSummary:
    topic: str
    destination: str
    partitions: int = 0
    batches: int = 0
    bytes: int = 0
    records: int = 0
    aborted: int = 0
    markers: int = 0
    undecided: int = 0
    files: int = 0
    seconds: float = 0.0
    errors: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.errors

    def head(self) -> str:
        return f"exported {self.topic} to {self.destination}"

    def line(self) -> str:
        text = (
            f"{self.head()}: {self.bytes / (1 << 20):.1f} MiB, "
            f"{self.batches} batches, {self.records} records ({self.aborted} aborted and "
            f"{self.undecided} undecided left out, {self.markers} transaction markers), "
            f"{self.files} files in {self.seconds:.1f} s"
            f" ({self.bytes / (1 << 20) / self.seconds if self.seconds > 0 else 0.0:.1f} MiB/s)"
        )
        return text + "".join(f"\n  FAILED: {error}" for error in self.errors)


def tiered_partitions(
    topic_id, partitions: int, states: Mapping[int, MetadataState], shard_count: int
) -> list[tuple[int, int, int, int]]:
    """(partition, cutover, first, end) of each tiered partition: its cutover offset and
    the offsets [first, end) its committed objects span (0, 0 without objects)."""
    found = []
    for partition in range(partitions):
        stream = stream_id(topic_id, partition)
        state = states[shard_of(stream, shard_count)]
        info = state.stream(stream)
        if info is None:
            continue
        ranges = state.committed_ranges(stream)
        first, end = (ranges[0].start_offset, ranges[-1].end_offset) if ranges else (0, 0)
        found.append((partition, info.cutover_offset, first, end))
    return found


def plan(
    job: ExportJob, topic_id, partitions: int, states: Mapping[int, MetadataState] | None
) -> list[PartitionExport]:
    tasks = []
    for partition in range(partitions):
        if job.source == "kafka":
            start, end = log_offsets(job.bootstrap, job.topic, partition, **job.cluster_settings)
            tasks.append(PartitionExport(partition, start, end))
            continue
        assert states is not None
        stream = stream_id(topic_id, partition)
        state = states[shard_of(stream, job.shard_count)]
        ranges = state.committed_ranges(stream)
        if job.source == "objects":
            if ranges:
                tasks.append(PartitionExport(partition, stream_id=stream, ranges=ranges))
            continue
        # whole: Kafka's log up to the cutover (all of it when not tiered; Kafka has
        # nothing of a tiered partition past it), the objects wherever they hold offsets
        start, end = log_offsets(job.bootstrap, job.topic, partition, **job.cluster_settings)
        info = state.stream(stream)
        if info is not None:
            end = min(end, info.cutover_offset)
        gaps = kafka_gaps(start, end, ranges)
        tasks.append(PartitionExport(partition, stream_id=stream, ranges=ranges, gaps=gaps))
    return tasks


def whole_topic_note(topic: str, tiered: list[tuple[int, int, int, int]]) -> str:
    """What a whole-topic export of a tiered topic reads where, and what it cannot have:
    records written since the last upload are still only in the owners' WALs."""
    parts = "; ".join(
        f"partition {p}: cutover {cut}, objects to {end}" for p, cut, _, end in tiered
    )
    return (
        f"{topic} is tiered ({parts}): the objects are read where they hold offsets, "
        "Kafka's log for the rest; records not uploaded yet (past each partition's "
        "objects) are left out: export again later to have them"
    )


def export(
    spark,
    job: ExportJob,
    states: Mapping[int, MetadataState] | None = None,
    progress: Callable[[str], None] = print,
    redraw: Callable[[str], None] | None = None,
) -> ExportSummary:
    """Run the job on `spark`. `states` (source "objects"): each shard's metadata, read
    from the metadata topic when not given. `redraw`: a terminal's progress bar
    (`progress.Console`)."""
    started = time.monotonic()
    topic_id, partitions = describe_topic(job.bootstrap, job.topic, **job.cluster_settings)
    if job.source != "kafka" and states is None:
        from offload_jobs.verify import read_states

        states = asyncio.run(read_states(job.bootstrap, job.metadata_topic, job.shard_count))
    tasks = plan(job, topic_id, partitions, states)
    sources = "Kafka and the objects" if job.source == "whole" else job.source
    progress(f"{job.topic}: exporting {len(tasks)} partitions from {sources}")
    if job.source == "whole" and states is not None:
        tiered = tiered_partitions(topic_id, partitions, states, job.shard_count)
        if tiered:
            progress(whole_topic_note(job.topic, tiered))
    results: list[PartitionResult] = []
    if tasks:
        watcher = TaskProgress(spark, len(tasks), "partitions exported", progress, redraw)
        try:
            rdd = spark.sparkContext.parallelize(tasks, len(tasks))
            task = watcher.counting(functools.partial(export_partition, job), lambda r: r.bytes)
            results = rdd.map(task).collect()
            watcher.finished()
        finally:
            watcher.stop()
    summary = ExportSummary(job.topic, job.destination, partitions=len(tasks))
    add_up(summary, results)
    summary.seconds = time.monotonic() - started
    return summary


def add_up(summary: ExportSummary, results: list) -> list:
    """The partitions' counts and errors into the summary; the results that succeeded."""
    done = []
    for r in sorted(results, key=lambda r: r.partition):
        if r.error:
            summary.errors.append(r.error)
            continue
        for name in COUNTS:
            setattr(summary, name, getattr(summary, name) + getattr(r, name))
        summary.files += len(r.files)
        done.append(r)
    return done
