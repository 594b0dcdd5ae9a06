"""The clean job: Kafka's log cleaner over a compacted tiered topic's committed ranges, in
parallel, for a log too large for the proxy's own cleaner (`tiering.log_cleaner_max_bytes`:
a newly tiered or migrated topic of hundreds of GB). docs/offload.md, "Cleaning a
compacted topic".

The rules are the proxy's (proxy/cleaner/), cut into parts by proxy/cleaner/split.py so
that the clean is the one the proxy's cleaner would make of the whole log at once:

1. the driver reads the topic's streams and committed ranges from the metadata topic and
   its cleaner configs from Kafka;
2. one task per range: the batches the header pass needs (`split.scan_entries`) and the
   range's size and max timestamp; the driver runs `scan_log` over them (aborted
   transactions, the first open one, each producer's last batch) and decides how far to
   clean (`cleanable_count`: never an open transaction, nor past min.compaction.lag.ms);
3. one task per range to clean: its part of the offset map, joined per key digest
   (`reduceByKey`, latest offset wins) into one map per stream, broadcast to the tasks:
   no entry limit, only memory (the driver and every executor hold a stream's whole map,
   about 120 bytes a key in CPython);
4. one task per group of ranges (`plan.groups`, about `--object-mib` of input each):
   the group's batches through `LogClean`, carrying on from the transactions' state
   at the group's start (`split.transactions_at`); a group that changed is written as
   one new stream object, created exclusively under a fresh id (top bit set: the
   offload jobs' ids, which the orphan sweep gives the longer grace);
5. the driver sends each stream's new objects to its shard's owner in one
   `CleanCommitRequest`; the owner commits them as its own cleaner does (under the lock
   its cleaner and compactor share, each naming in `replaces` the objects whose ranges it
   takes over), so a reader mid-read and the garbage collector stay right, and an object
   whose ranges a trim, a compaction or a clean changed since step 1 is refused and
   deleted. The rest of the stream commits; run the job again for what was refused.

Nothing a task writes is visible before its commit: a job that dies leaves objects no
metadata names, which the orphan sweep deletes after `tiering.offload_orphan_grace_s`.
Each range is read three times (steps 2, 3, 4): no pass keeps a log in memory.
"""

from __future__ import annotations

import asyncio
import functools
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from offload_jobs.migrate import StoreSpec
from proxy.cleaner.clean import Batches, LogClean, blocks, clean_group
from proxy.cleaner.offset_map import OffsetMap
from proxy.cleaner.plan import CleanerConfig, Segment, cleanable_count, groups, should_clean
from proxy.cleaner.split import ScanEntry, range_map, scan_entries, segment_of, transactions_at
from proxy.cleaner.transactions import LogScan, TransactionsSeen, scan_log
from proxy.metadata.streams import OFFLOAD_ID_BIT, StreamRange
from proxy.objects.format import FORMAT_VERSION
from proxy.objects.format_writer import ObjectWriter
from proxy.objects.index_read import read_blocks, read_index, stream_blocks
from proxy.objects.keys import ObjectKind
from proxy.objects.store import ObjectStoreError
from proxy.peer.messages import CleanCommitRequest, CleanedObject
from proxy.records.batches import iter_batches

MAX_BLOCK_BYTES = 1 << 20  # the proxy's cleaner's
TARGET_OBJECT_BYTES = 64 << 20
# Spark tasks per pass at most: a newly tiered topic may have many small ranges (stream set
# objects not compacted yet); past this a task takes several, one after the other
MAX_SLICES = 4096


def _slices(count: int) -> int:
    return max(1, min(count, MAX_SLICES))


@dataclass(frozen=True, slots=True)
class CleanJob:
    topic: str
    bootstrap: str  # the upstream Kafka: the metadata topic, the topic's configs
    metadata_topic: str
    shard_count: int
    store: StoreSpec
    peer: tuple[str, int]  # any proxy's peer listener: commits go through it
    partitions: tuple[int, ...] = ()  # () for all
    target_object_bytes: int = TARGET_OBJECT_BYTES
    object_format_version: int = FORMAT_VERSION  # tiering.object_format_version


@dataclass(frozen=True, slots=True)
class GroupTask:
    """One group of a stream's ranges, cleaned into one object (if anything changes)."""

    stream: int
    ranges: tuple[StreamRange, ...]
    start: int
    end: int
    seen: TransactionsSeen  # the transactions' state at `start`
    object_id: int
    kafka_below: bool = False  # a backfill gap: Kafka alone holds part of the log below


@dataclass
class GroupResult:
    task: GroupTask
    changed: bool = False
    size: int = 0
    records_read: int = 0
    records_kept: int = 0
    bytes_read: int = 0
    bytes_kept: int = 0
    error: str | None = None


@dataclass
class StreamPlan:
    """A stream as step 2 leaves it: how far to clean and what the clean needs."""

    stream: int
    partition: int
    ranges: list[StreamRange]
    segments: list[Segment]
    entries: list[ScanEntry]
    gaps: bool  # backfill gaps when planned: the owner keeps no checkpoint then
    scan: LogScan = field(default_factory=LogScan)
    count: int = 0  # ranges to clean, from the first


@dataclass
class Summary:
    topic: str
    streams: int = 0
    ranges: int = 0
    input_bytes: int = 0  # bytes of batches in the ranges cleaned
    output_bytes: int = 0
    records_read: int = 0
    records_kept: int = 0
    keys: int = 0
    objects: int = 0
    store_read: int = 0  # bytes the tasks were given by the store (every pass)
    store_written: int = 0  # bytes of the objects written (committed or not)
    committed_streams: int = 0
    clean_already: int = 0  # streams the clean left as they were
    seconds: float = 0.0
    refused: list[str] = field(default_factory=list)  # races: run again
    errors: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """Refusals are races with a trim, a compaction or the proxy's cleaner: the
        objects are deleted and nothing is wrong; a re-run cleans what they held."""
        return not self.errors

    def line(self) -> str:
        mib = self.input_bytes / (1 << 20)
        text = (
            f"cleaned {self.topic}: {self.streams} partitions, {self.ranges} ranges, "
            f"{mib:.1f} MiB read, {self.output_bytes / (1 << 20):.1f} MiB written, "
            f"{self.records_kept} of {self.records_read} records kept, {self.keys} keys, "
            f"{self.objects} objects ({self.committed_streams} partitions committed, "
            f"{self.clean_already} clean already) in {self.seconds:.1f} s"
        )
        for reason in self.refused:
            text += f"\n  refused (raced; run again): {reason}"
        for error in self.errors:
            text += f"\n  FAILED: {error}"
        return text


class _Counted:
    """The store as the reads use it, counting the bytes it is asked for."""

    def __init__(self, store) -> None:
        self.store, self.read = store, 0

    async def get(self, key: str, start: int | None = None, end: int | None = None) -> bytes:
        data = await self.store.get(key, start, end)
        self.read += len(data)
        return data

    async def get_tail(self, key: str, size: int) -> bytes:
        data = await self.store.get_tail(key, size)
        self.read += len(data)
        return data


def _read(job: CleanJob, r: StreamRange, counter=None) -> Batches:
    """The range's batches, on an executor: its object's index (a tail GET), then its
    blocks (one ranged GET, each block's CRC checked), as the proxy's cleaner reads a
    range. `counter` (a Spark accumulator) adds the bytes read from the store."""

    async def read() -> Batches:
        store = _Counted(await job.store.open())
        try:
            index = await read_index(store, r.object_key, r.object_size)  # type: ignore[arg-type]
            key = r.object_key
            entries = stream_blocks(index, r.stream_id, r.start_offset, r.end_offset, key)
            blocks = await read_blocks(store, key, entries)  # type: ignore[arg-type]
        finally:
            await store.store.close()
        if counter is not None:
            counter.add(store.read)
        return [b for block in blocks for b in iter_batches(block)]

    return asyncio.run(read())


_RANGE_ERRORS = (ValueError, ObjectStoreError, OSError)  # ObjectFormatError: a ValueError


def scan_task(job: CleanJob, counter, r: StreamRange) -> tuple[Segment, list[ScanEntry]] | str:
    """Step 2, one range: its segment and scan entries, or what went wrong."""
    try:
        batches = _read(job, r, counter)
    except _RANGE_ERRORS as exc:
        return f"stream {r.stream_id} [{r.start_offset}, {r.end_offset}): {exc}"
    return segment_of(r.start_offset, r.end_offset, batches), scan_entries(batches)


def map_task(job: CleanJob, counter, first_dirty: int, aborted: set[int], r: StreamRange):
    """Step 3, one range: ((stream, key digest), latest offset) pairs."""
    batches = _read(job, r, counter)
    return [((r.stream_id, d), o) for d, o in range_map(batches, first_dirty, aborted).items()]


def group_task(
    job: CleanJob, counter, now_ms: int, config: CleanerConfig, scans, maps, task: GroupTask
) -> GroupResult:
    """Step 4, one group: clean it and write its object if anything changed."""
    result = GroupResult(task)
    scan, map_end = scans.value[task.stream]
    try:
        data = [_read(job, r, counter) for r in task.ranges]
        run = LogClean(
            OffsetMap.of(maps[task.stream].value),
            map_end,
            scan,
            now_ms=now_ms,
            delete_retention_ms=config.delete_retention_ms,
            seen=task.seen,
            kafka_below=task.kafka_below,
        )
        pieces, result.changed = clean_group(run, data)
        stats = run.stats
        result.records_read, result.records_kept = stats.records_read, stats.records_kept
        result.bytes_read, result.bytes_kept = stats.bytes_read, stats.bytes_kept
        if not result.changed:
            return result
        writer = ObjectWriter(task.object_id, ObjectKind.STREAM, version=job.object_format_version)
        for start, end, count, piece in blocks(pieces, task.start, task.end, MAX_BLOCK_BYTES):
            writer.add_block(task.stream, piece, start, end, count)
        built = writer.build()

        async def write() -> None:
            store = await job.store.open()
            try:  # a fresh id: a key taken (ObjectExists) fails the group, nothing replaced
                await store.create(built.key, built.pieces)
            finally:
                await store.close()

        asyncio.run(write())
        result.size = built.size
    except _RANGE_ERRORS as exc:
        result.changed = False
        result.error = f"stream {task.stream} [{task.start}, {task.end}): {exc}"
    return result


def _plans(job: CleanJob, summary: Summary, progress: Callable[[str], None]) -> list[StreamPlan]:
    from offload_jobs.fleet import read_states, topic_streams

    kafka = {"bootstrap_servers": job.bootstrap}
    states = asyncio.run(read_states(kafka, job.metadata_topic, job.shard_count))
    _, streams = topic_streams(states, job.metadata_topic, job.topic)
    plans = []
    for state, info in streams:
        if job.partitions and info.partition not in job.partitions:
            continue
        ranges = list(state.committed_ranges(info.stream_id))
        if ranges:
            gaps = bool(state.backfill_gaps(info.stream_id))
            plans.append(StreamPlan(info.stream_id, info.partition, ranges, [], [], gaps))
    missing = set(job.partitions) - {p.partition for p in plans}
    if missing:
        summary.errors.append(
            f"partitions {sorted(missing)}: not tiered, or no committed range to clean"
        )
    progress(f"{job.topic}: {len(plans)} partitions, {sum(len(p.ranges) for p in plans)} ranges")
    return plans


def clean(spark, job: CleanJob, progress: Callable[[str], None] = print) -> Summary:
    """Run the job on `spark` and commit what it wrote."""
    from offload_jobs.fleet import commit_cleaned, topic_configs
    from proxy.cleaner.plan import CONFIG_KEYS, cleaner_config

    started = time.monotonic()
    summary = Summary(job.topic)
    kafka = {"bootstrap_servers": job.bootstrap}
    config = cleaner_config(asyncio.run(topic_configs(kafka, job.topic, CONFIG_KEYS)))
    if not config.compact:
        summary.errors.append(f"topic {job.topic}: cleanup.policy holds no compact")
        return summary
    plans = _plans(job, summary, progress)
    now = int(time.time() * 1000)  # one clock for the whole clean, as one pass has
    sc = spark.sparkContext
    counter = sc.accumulator(0)
    every = [r for p in plans for r in p.ranges]
    task = functools.partial(scan_task, job, counter)
    scanned = sc.parallelize(every, _slices(len(every))).map(task).collect()
    at = 0
    todo: list[StreamPlan] = []
    for p in plans:
        mine, at = scanned[at : at + len(p.ranges)], at + len(p.ranges)
        failed = [m for m in mine if isinstance(m, str)]
        if failed:
            summary.errors.extend(failed)
            continue
        p.segments = [m[0] for m in mine if not isinstance(m, str)]
        p.entries = [e for m in mine if not isinstance(m, str) for e in m[1]]
        p.scan = scan_log((h, memoryview(b)) for h, b in p.entries)
        p.count = cleanable_count(p.segments, now, config, p.scan.open_from)
        if should_clean(p.segments, 0, p.count, now, config):
            todo.append(p)
        else:
            summary.clean_already += 1
    progress(f"{job.topic}: headers read, {len(todo)} partitions to clean")
    if not todo:
        summary.store_read = counter.value
        summary.seconds = time.monotonic() - started
        return summary
    maps = _offset_maps(sc, job, counter, todo)
    summary.keys = sum(len(m) for m in maps.values())
    progress(f"{job.topic}: offset maps built, {summary.keys} keys")
    results = _clean_groups(sc, job, counter, now, config, todo, maps)
    summary.store_read = counter.value
    summary.store_written = sum(r.size for r in results)
    requests = _requests(todo, results, summary)
    for stream, code, message in asyncio.run(commit_cleaned(job.peer, requests)):
        if code == 0:
            summary.committed_streams += 1
        elif code == 44:  # POLICY_VIOLATION: refused by the metadata rules, a race
            summary.refused.append(message)
        else:
            summary.errors.append(f"stream {stream}: commit not made ({code}): {message}")
    summary.seconds = time.monotonic() - started
    return summary


def _offset_maps(sc, job: CleanJob, counter, todo: list[StreamPlan]) -> dict[int, dict[bytes, int]]:
    parts = []
    for p in todo:
        first_dirty = p.segments[0].start
        task = functools.partial(map_task, job, counter, first_dirty, p.scan.aborted)
        ranges = p.ranges[: p.count]
        parts.append(sc.parallelize(ranges, _slices(len(ranges))).flatMap(task))
    pairs = sc.union(parts).reduceByKey(max).collect()
    maps: dict[int, dict[bytes, int]] = {p.stream: {} for p in todo}
    for (stream, d), offset in pairs:
        maps[stream][d] = offset
    return maps


def group_tasks(p: StreamPlan, target_bytes: int, bits: Callable[[int], int]) -> list[GroupTask]:
    """The stream's cleanable ranges cut into groups of about `target_bytes` of input, each
    with the transactions' state at its start and a fresh object id: the offload jobs'
    kind (top bit set), `bits(63)` random bits below it. Fresh because the clean's bytes
    depend on its clock (delete horizons): a re-run cannot reuse an earlier run's key."""
    cuts = groups(p.segments, p.count, target_bytes)
    seen = transactions_at(p.entries, p.scan.aborted, [p.segments[i].start for i, _ in cuts])
    return [
        GroupTask(
            p.stream,
            tuple(p.ranges[i:j]),
            p.segments[i].start,
            p.segments[j - 1].end,
            state,
            OFFLOAD_ID_BIT | bits(63),
            p.gaps,
        )
        for (i, j), state in zip(cuts, seen, strict=True)
    ]


def _clean_groups(
    sc, job: CleanJob, counter, now: int, config: CleanerConfig, todo: list[StreamPlan], maps
) -> list[GroupResult]:
    ids = random.SystemRandom()
    tasks = [t for p in todo for t in group_tasks(p, job.target_object_bytes, ids.getrandbits)]
    scans = {p.stream: (p.scan, p.segments[p.count - 1].end) for p in todo}
    shared = {stream: sc.broadcast(m) for stream, m in maps.items()}
    shared_scans = sc.broadcast(scans)
    try:
        task = functools.partial(group_task, job, counter, now, config, shared_scans, shared)
        return sc.parallelize(tasks, _slices(len(tasks))).map(task).collect()
    finally:
        for b in (*shared.values(), shared_scans):
            b.unpersist()


def _requests(
    todo: list[StreamPlan], results: list[GroupResult], summary: Summary
) -> list[CleanCommitRequest]:
    requests = []
    for p in todo:
        mine = [r for r in results if r.task.stream == p.stream]
        summary.streams += 1
        summary.ranges += p.count
        summary.input_bytes += sum(s.size for s in p.segments[: p.count])
        objects = []
        failed = False
        for r in mine:
            summary.records_read += r.records_read
            summary.records_kept += r.records_kept
            summary.output_bytes += r.bytes_kept
            if r.error:
                summary.errors.append(r.error)
                failed = True
            elif r.changed:
                t = r.task
                replaces = tuple(sorted({x.object_id for x in t.ranges}))
                objects.append(CleanedObject(t.object_id, r.size, t.start, t.end, replaces))
        summary.objects += len(objects)
        if not objects:
            if not failed:
                summary.clean_already += 1
            continue
        clean_end = -1 if failed or p.gaps else p.segments[p.count - 1].end
        requests.append(CleanCommitRequest(0, p.stream, clean_end, tuple(objects)))
    return requests
