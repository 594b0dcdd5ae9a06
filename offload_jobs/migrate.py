"""The migration job: a tiered topic's offsets below its cutover, moved from Kafka into
stream objects and committed, so the proxy serves them from the object store
(docs/offload.md).

The driver reads each cut-over partition's backfill gaps from the metadata topic and
plans one Spark task per gap (cut again where a segment starts). Each task reads its
batches byte-exact (segment files, or a live cluster through `cluster_reader`), cuts them
into objects of about 64 MiB, and creates each under its deterministic key, never
replacing an object there (`object_write.py`). Nothing a task
writes is visible until the driver commits it through the shard's owner, so a task that
fails leaves at most an object no metadata names (a re-run writes the same key again).
A batch that cannot be trusted stops its task's range there, with the file and byte,
reported in the summary (the objects before it are committed); the other ranges go on.

Runs as `tierproxy migrate` (local[*]) or through spark-submit on any cluster
(`python -m offload_jobs.migrate` takes the same arguments; see docs/offload.md).
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from offload_jobs.object_write import write_stream_object
from offload_jobs.progress import TaskProgress
from offload_jobs.segments import SegmentReader, list_segments
from offload_jobs.sources import SourceBatch
from offload_jobs.writer import (
    TARGET_OBJECT_BYTES,
    MissingOffsets,
    OffloadTask,
    build_stream_object,
    cut_objects,
    plan_tasks,
)
from proxy.objects.format import FORMAT_VERSION
from proxy.objects.store import ObjectStoreError


@dataclass(frozen=True, slots=True)
class StoreSpec:
    """The object store as plain values, so it travels to executors: `kind` "local"
    (`directory`) or "s3" (`s3`: the fields of `S3Config`)."""

    kind: str
    directory: str = ""
    s3: dict[str, Any] | None = None

    @classmethod
    def from_settings(cls, settings) -> StoreSpec:  # settings: tiering.ObjectStoreSettings
        s3 = None if settings.s3 is None else dataclasses.asdict(settings.s3)
        return cls(settings.kind, str(settings.directory), s3)

    async def open(self):
        if self.kind == "s3":
            from proxy.objects.s3 import S3Store
            from proxy.objects.s3config import S3Config

            return await S3Store.open(S3Config(**(self.s3 or {})))
        from proxy.objects.local import LocalDirectoryStore

        return LocalDirectoryStore(self.directory)


@dataclass(frozen=True, slots=True)
class MigrateJob:
    topic: str
    bootstrap: str  # the upstream Kafka: the metadata topic, and --from-cluster reads
    metadata_topic: str
    shard_count: int
    store: StoreSpec
    peer: tuple[str, int]  # any proxy's peer listener: commits go through it
    segment_dirs: tuple[str, ...] = ()  # log directories holding <topic>-<partition>/
    from_cluster: bool = False
    target_object_bytes: int = TARGET_OBJECT_BYTES
    cluster_settings: dict[str, Any] = field(default_factory=dict)
    object_format_version: int = FORMAT_VERSION  # tiering.object_format_version

    def partition_dir(self, partition: int) -> Path | None:
        """The first of the log directories holding this partition's segments."""
        for directory in self.segment_dirs:
            candidate = Path(directory) / f"{self.topic}-{partition}"
            if candidate.is_dir():
                return candidate
        return None


@dataclass
class TaskResult:
    task: OffloadTask
    objects: list[tuple[int, int, int, int]] = field(default_factory=list)  # id, size, a, b
    batches: int = 0
    records: int = 0
    record_bytes: int = 0
    object_bytes: int = 0
    error: str | None = None
    torn_tail: str | None = None


@dataclass(frozen=True, slots=True)
class _Source:
    batches: Iterator[SourceBatch]
    where: str
    reader: SegmentReader | None = None
    require_start: bool = False  # see writer.cut_objects
    require_end: bool = False


def _source(job: MigrateJob, task: OffloadTask) -> _Source:
    if job.from_cluster:
        from offload_jobs import cluster_reader  # part of the job only where it exists

        read = cluster_reader.read_batches(
            job.bootstrap,
            job.topic,
            task.partition,
            task.start_offset,
            task.end_offset,
            **job.cluster_settings,
        )
        # the reader itself names offsets the log lacks (compacted ones are no gap)
        return _Source(read, f"{job.topic}-{task.partition} on {job.bootstrap}")
    directory = job.partition_dir(task.partition)
    if directory is None:
        raise FileNotFoundError(
            f"no {job.topic}-{task.partition} directory under {', '.join(job.segment_dirs)}"
        )
    reader = SegmentReader(directory)
    bases = [s.base_offset for s in reader.segments]
    if not bases or task.start_offset < bases[0]:
        first = f"the first starts at {bases[0]}" if bases else "there are none"
        raise MissingOffsets(
            f"{directory}: offset {task.start_offset} is in no segment ({first}): deleted "
            "by retention since the cutover?"
        )
    # Compaction may remove the offsets around a segment boundary, not at the end of the
    # last segment (Kafka never cleans the active segment): a range ending there must
    # reach its end, else the copy is older than the cutover.
    ends_in_last = bases[-1] < task.end_offset
    read = reader.read(task.start_offset, task.end_offset)
    return _Source(read, str(directory), reader, require_end=ends_in_last)


def run_task(job: MigrateJob, task: OffloadTask) -> TaskResult:
    """One task, on an executor: read, cut, build and PUT its objects (not committed)."""
    result = TaskResult(task)

    async def write() -> None:
        source = _source(job, task)
        store = await job.store.open()
        try:
            plans = cut_objects(
                task.stream_id,
                task.start_offset,
                task.end_offset,
                source.batches,
                target_bytes=job.target_object_bytes,
                where=source.where,
                require_start=source.require_start,
                require_end=source.require_end,
            )
            for plan in plans:
                built = build_stream_object(plan, version=job.object_format_version)
                size = await write_stream_object(store, built)  # never replaces one
                result.objects.append((plan.object_id, size, plan.start_offset, plan.end_offset))
                result.batches += len(plan.batches)
                result.records += plan.record_count
                result.record_bytes += plan.size
                result.object_bytes += size
        finally:
            await store.close()
            if source.reader is not None and source.reader.torn_tail is not None:
                t = source.reader.torn_tail
                result.torn_tail = f"{t.path}: {t.size} bytes from byte {t.position} ({t.reason})"

    # Corrupt, missing or unreadable data, or a store that kept failing after its own
    # retries: this range fails alone (reported, not committed), the others go on.
    range_errors: tuple[type[Exception], ...] = (ValueError, FileNotFoundError, ObjectStoreError)
    if job.from_cluster:
        from offload_jobs.cluster_reader import ClusterReadError

        range_errors += (ClusterReadError,)
    try:
        asyncio.run(write())
    except range_errors as exc:
        where = f"{job.topic}-{task.partition} [{task.start_offset}, {task.end_offset})"
        result.error = f"{where}: {exc}"
    return result


@dataclass
class Summary:
    topic: str
    tasks: int = 0
    objects: int = 0
    committed: int = 0
    already: int = 0
    batches: int = 0
    records: int = 0
    record_bytes: int = 0
    object_bytes: int = 0
    seconds: float = 0.0
    errors: list[str] = field(default_factory=list)
    torn_tails: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.errors

    def line(self) -> str:
        mib = self.record_bytes / (1 << 20)
        text = (
            f"migrated {self.topic}: {mib:.1f} MiB, {self.batches} batches, "
            f"{self.records} records, {self.objects} objects ({self.committed} committed, "
            f"{self.already} committed already) in {self.seconds:.1f} s"
            f" ({mib / self.seconds if self.seconds > 0 else 0.0:.1f} MiB/s)"
        )
        for tail in self.torn_tails:
            text += f"\n  torn tail left out: {tail}"
        for error in self.errors:
            text += f"\n  FAILED: {error}"
        return text


def plan(job: MigrateJob, gaps) -> list[OffloadTask]:  # gaps: fleet.TopicGaps
    tasks = []
    for p in gaps.partitions:
        bases: list[int] = []
        directory = None if job.from_cluster else job.partition_dir(p.partition)
        if directory is not None:
            bases = [s.base_offset for s in list_segments(directory)]
        tasks.extend(plan_tasks(p.partition, p.stream_id, p.gaps, bases))
    return tasks


def migrate(
    spark,
    job: MigrateJob,
    progress: Callable[[str], None] = print,
    redraw: Callable[[str], None] | None = None,
) -> Summary:
    """Run the job on `spark` and commit what it wrote; the summary says what moved and
    what failed (a failed range is not committed, the others are). `redraw`: a terminal's
    progress bar (`progress.Console`)."""
    from offload_jobs.fleet import ObjectToCommit, commit_objects, is_compacted, read_gaps

    started = time.monotonic()
    kafka = {"bootstrap_servers": job.bootstrap}
    if job.from_cluster and asyncio.run(is_compacted(kafka, job.topic)):
        # the holes Kafka's cleaner left are no gap (segments hold them the same way)
        settings = {**job.cluster_settings, "allow_gaps": True}
        job = dataclasses.replace(job, cluster_settings=settings)
    gaps = asyncio.run(read_gaps(kafka, job.metadata_topic, job.shard_count, job.topic))
    tasks = plan(job, gaps)
    summary = Summary(job.topic, tasks=len(tasks))
    progress(f"{job.topic}: {len(gaps.partitions)} tiered partitions, {len(tasks)} ranges to move")
    results: list[TaskResult] = []
    if tasks:
        rdd = spark.sparkContext.parallelize(tasks, len(tasks))
        watcher = TaskProgress(spark, len(tasks), "ranges written", progress, redraw)
        try:
            task = watcher.counting(functools.partial(run_task, job), lambda r: r.record_bytes)
            results = rdd.map(task).collect()
            watcher.finished()
        finally:
            watcher.stop()
    to_commit = []
    for r in results:
        if r.torn_tail:
            summary.torn_tails.append(r.torn_tail)
        if r.error:  # the objects written before the range failed are good: commit them
            summary.errors.append(r.error)
        summary.objects += len(r.objects)
        summary.batches += r.batches
        summary.records += r.records
        summary.record_bytes += r.record_bytes
        summary.object_bytes += r.object_bytes
        for object_id, size, start, end in r.objects:
            to_commit.append(ObjectToCommit(object_id, size, r.task.stream_id, start, end))
    if to_commit:
        outcome = asyncio.run(commit_objects(job.peer, to_commit))
        summary.committed, summary.already = outcome.committed, outcome.already
        summary.errors.extend(f"commit refused: {reason}" for reason in outcome.refused)
    summary.seconds = time.monotonic() - started
    return summary
