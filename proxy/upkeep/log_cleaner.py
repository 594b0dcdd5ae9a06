"""The log cleaner of compacted tiered topics, run by each shard's owner (docs/tiering.md,
"Compacted topics"). The rules are proxy/cleaner/'s; this is the runner.

Every `tiering.log_cleaner_interval_s`, for each stream of each shard owned here whose
topic's `cleanup.policy` holds `compact` (read from Kafka like retention's configs):

1. reads the stream's committed ranges (one ranged GET per range, CRCs checked): never
   the uncommitted tail, which stands for Kafka's active segment;
2. a header pass (`scan_log`) finds aborted transactions, the first open one and each
   producer's last batch; `cleanable_count` and `should_clean` decide how far and
   whether (dirty ratio against where this proxy's last clean of the stream ended,
   unless a migration has filled a backfill gap below it since: `Checkpoint`);
3. builds the offset map from the dirty ranges, rewrites every range from the log start
   to where the map ends, and writes each group of ranges whose batches changed as one
   new stream object;
4. commits the new objects in one transaction through the shard's owner, each naming in
   `replaces` the objects whose ranges it takes over, the rule object compaction's
   commits follow: a reader that planned a read from an old object finishes it (the
   garbage collector deletes it only after the grace), and a commit that raced a trim
   or a compaction is refused and its object deleted.

It runs under the compactor's lock, so the two never rewrite the same ranges at once.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass, field

from aiokafka.errors import KafkaError
from kio.schema.errors import ErrorCode
from prometheus_client.core import CounterMetricFamily, Metric

from proxy.cleaner.clean import LogClean, Piece, blocks, clean_group, index_dirty
from proxy.cleaner.offset_map import OffsetMap
from proxy.cleaner.plan import (
    Checkpoint,
    CleanerConfig,
    Segment,
    cleanable_count,
    first_dirty_index,
    groups,
    should_clean,
)
from proxy.cleaner.split import segment_of
from proxy.cleaner.transactions import scan_log
from proxy.clock import now_ms
from proxy.metadata.records import OffsetRange
from proxy.metadata.rules import Outcome
from proxy.metadata.store import ShardFenced, ShardOwner
from proxy.metadata.streams import OFFLOAD_ID_BIT, StreamInfo, StreamRange, topic_shard
from proxy.objects.format import IndexEntry, ObjectFormatError
from proxy.objects.format_writer import BuiltObject, ObjectWriter
from proxy.objects.index_read import read_blocks, read_index
from proxy.objects.keys import ObjectKind, object_key
from proxy.objects.ratelimit import BandwidthLimiter, Priority
from proxy.objects.store import ObjectExists, ObjectStore, ObjectStoreError
from proxy.peer.messages import CleanCommitRequest
from proxy.records.batches import BatchHeader, CorruptBatchError, iter_batches
from proxy.upkeep.compaction_plan import blocks_for
from proxy.upkeep.object_gc import (
    NewObject,
    discard,
    new_object,
    stream_commits,
    write_through,
)
from proxy.upkeep.ports import CleanerHost
from proxy.upload.plan import ObjectIdAllocator

log = logging.getLogger("tierproxy.cleaner")

TooOld = Callable[[str, str], Awaitable[str | None]]  # (key, what) -> why not to commit it

Batches = list[tuple[BatchHeader, memoryview]]
MAX_BLOCK_BYTES = 1 << 20


@dataclass(slots=True)
class CleanReport:
    """What one pass did: stream -> where its clean ended; the objects written."""

    cleaned: dict[int, int] = field(default_factory=dict)
    objects_written: int = 0
    records_read: int = 0
    records_kept: int = 0


@dataclass(slots=True)
class CleanerStats:
    """Totals since start, read by /metrics."""

    cleans: int = 0  # streams cleaned (one per stream and pass that cleaned it)
    records_read: int = 0
    records_kept: int = 0
    objects_written: int = 0
    bytes_written: int = 0
    failures: int = 0  # commits refused or of unknown outcome, streams that failed


@dataclass(frozen=True, slots=True)
class _Group:
    stream: int
    start: int
    end: int
    replaces: tuple[int, ...]


class LogCleaner:
    """The cleaner task of one proxy (`run`), or one pass of it (`run_once`)."""

    def __init__(
        self,
        service: CleanerHost,
        allocate: ObjectIdAllocator,
        lock: asyncio.Lock | None = None,
        *,
        clock_ms: Callable[[], int] = now_ms,
    ) -> None:
        config = service.config
        self.service, self._allocate = service, allocate
        self.interval_s = config.log_cleaner_interval_s
        self.max_bytes, self.map_keys = config.log_cleaner_max_bytes, config.log_cleaner_map_keys
        self.target_bytes = config.stream_object_bytes
        self.format_version = config.object_format_version
        self._lock = lock or asyncio.Lock()
        self._clock_ms = clock_ms
        # stream -> where this proxy's last clean of it ended (Kafka's cleaner checkpoint);
        # kept in memory: after a restart or a hand-over the whole log is dirty once more
        self._checkpoints: dict[int, Checkpoint] = {}
        self._indexes: dict[int, tuple[IndexEntry, ...]] = {}  # object id -> its index
        bandwidth = service.bandwidth
        self._bandwidth = bandwidth.limiter if bandwidth is not None else BandwidthLimiter(None)
        self.stats = CleanerStats()
        self._registry = service.registry
        self._collector = _Collector(self.stats)
        self._registry.register(self._collector)

    def close(self) -> None:
        """Take the metrics off /metrics (the task is cancelled by its starter)."""
        self._registry.unregister(self._collector)

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                await self.run_once()
            except (KafkaError, ShardFenced, ObjectStoreError, OSError) as exc:
                log.warning("log cleaner: %r; trying again in %s s", exc, self.interval_s)
            except Exception:  # a bug must not stop cleaning for good
                self.stats.failures += 1
                log.exception("log cleaner: pass failed; trying again in %s s", self.interval_s)

    async def run_once(
        self, now_ms: int | None = None, *, refresh_configs: bool = False
    ) -> CleanReport:
        """One pass over the compacted streams of the shards owned here."""
        now = self._clock_ms() if now_ms is None else now_ms
        report = CleanReport()
        async with self._lock:
            live: set[int] = set()
            for owner in self.service.owned_shards().values():
                await self._clean_shard(owner, now, refresh_configs, report)
                live.update(
                    r.object_id
                    for s in owner.state.stream_ids()
                    for r in owner.state.committed_ranges(s)
                )
            for number in set(self._indexes) - live:
                del self._indexes[number]
        return report

    async def _clean_shard(
        self, owner: ShardOwner, now: int, refresh: bool, report: CleanReport
    ) -> None:
        state = owner.state
        streams = [info for s in state.stream_ids() if (info := state.stream(s)) is not None]
        names = {info.stream_id: self._topic_name(info) for info in streams}
        configs = await self.service.topic_configs.cleaner(
            {n for n in names.values() if n}, refresh=refresh
        )
        for info in streams:
            config = configs.get(names[info.stream_id] or "")
            if config is None or not config.compact:
                continue
            try:
                await self._clean_stream(owner, info, config, now, report)
            except (ObjectFormatError, CorruptBatchError, ValueError) as exc:
                self.stats.failures += 1
                log.error("log cleaner: stream %d: %s", info.stream_id, exc)

    def _topic_name(self, info: StreamInfo) -> str | None:
        readers = self.service.readers
        mode = readers[topic_shard(info.topic_id, len(readers))].state.topic(info.topic_id)
        return None if mode is None else mode.topic

    async def _clean_stream(
        self,
        owner: ShardOwner,
        info: StreamInfo,
        config: CleanerConfig,
        now: int,
        report: CleanReport,
    ) -> None:
        stream = info.stream_id
        ranges = list(owner.state.committed_ranges(stream))
        if not ranges:
            return
        entries = [await self._blocks(r) for r in ranges]
        gaps = tuple(owner.state.backfill_gaps(stream))
        checkpoint = self._checkpoints.get(stream)
        dirty = first_dirty_index(
            [Segment(r.start_offset, r.end_offset, 0, -1) for r in ranges],
            None if checkpoint is None else checkpoint.dirty_from(gaps),
        )
        # first from the indexes alone (cached: objects never change), so a pass over a
        # stream with nothing to clean reads no data
        guess = [_segment_of(r, e) for r, e in zip(ranges, entries, strict=True)]
        if not should_clean(guess, dirty, cleanable_count(guess, now, config, None), now, config):
            return
        total = sum(e[-1].end_position - e[0].position for e in entries)
        if total > self.max_bytes:
            log.warning(
                "log cleaner: stream %d (%s-%d) holds %d committed bytes, above "
                "log_cleaner_max_bytes (%d): not cleaned; `tierproxy clean --topic %s` "
                'cleans it with Spark (docs/offload.md, "Cleaning a compacted topic")',
                *(stream, self._topic_name(info), info.partition, total, self.max_bytes),
                self._topic_name(info),
            )
            return
        data = [await self._read(r, e) for r, e in zip(ranges, entries, strict=True)]
        segments = [
            segment_of(r.start_offset, r.end_offset, batches)
            for r, batches in zip(ranges, data, strict=True)
        ]
        scan = scan_log(b for batches in data for b in batches)
        count = cleanable_count(segments, now, config, scan.open_from)
        if not should_clean(segments, dirty, count, now, config):
            return
        omap = OffsetMap(self.map_keys)
        indexed = index_dirty(data[dirty:count], segments[dirty].start, scan, omap)
        if not indexed:
            log.error(
                "log cleaner: stream %d: the range at %d has more keys than "
                "log_cleaner_map_keys (%d)",
                *(stream, segments[dirty].start, self.map_keys),
            )
            return
        end = dirty + indexed
        run = LogClean(
            omap,
            segments[end - 1].end,
            scan,
            now_ms=now,
            delete_retention_ms=config.delete_retention_ms,
            kafka_below=bool(gaps),
        )
        planned: list[tuple[_Group, list[Piece]]] = []
        for i, j in groups(segments, end, self.target_bytes):
            pieces, changed = clean_group(run, data[i:j])
            if changed:
                replaces = tuple(sorted({r.object_id for r in ranges[i:j]}))
                group = _Group(stream, segments[i].start, segments[j - 1].end, replaces)
                planned.append((group, pieces))
        report.records_read += run.stats.records_read
        report.records_kept += run.stats.records_kept
        if planned and not await self._commit(owner, planned, report):
            self.stats.failures += 1
            return
        self.stats.cleans += 1
        self.stats.records_read += run.stats.records_read
        self.stats.records_kept += run.stats.records_kept
        report.cleaned[stream] = segments[end - 1].end
        self._checkpoints[stream] = Checkpoint(segments[end - 1].end, gaps)
        log.info(
            "log cleaner: stream %d cleaned to %d: %d of %d records kept, %d objects written",
            *(stream, segments[end - 1].end, run.stats.records_kept, run.stats.records_read),
            len(planned),
        )

    async def _blocks(self, r: StreamRange) -> tuple[IndexEntry, ...]:
        index = self._indexes.get(r.object_id)
        if index is None:
            index = await read_index(self._require_store(), r.object_key, r.object_size)
            self._indexes[r.object_id] = index
        return blocks_for(index, r)

    async def _read(self, r: StreamRange, entries: tuple[IndexEntry, ...]) -> Batches:
        await self._bandwidth.acquire(
            Priority.COMPACTION, entries[-1].end_position - entries[0].position
        )
        out: Batches = []
        for block in await read_blocks(self._require_store(), r.object_key, entries):
            out += iter_batches(block)
        return out

    def _require_store(self) -> ObjectStore:
        store = self.service.store
        assert store is not None  # the service is started
        return store

    async def _commit(
        self, owner: ShardOwner, planned: list[tuple[_Group, list[Piece]]], report: CleanReport
    ) -> bool:
        """Write the new objects and commit them; False when any commit did not count."""
        store = self._require_store()
        built: list[BuiltObject] = []
        try:
            for group, pieces in planned:
                obj = self._build(group, pieces)
                await self._bandwidth.acquire(Priority.COMPACTION, obj.size)
                while True:
                    try:
                        await store.create(obj.key, obj.pieces)
                        break
                    except ObjectExists:  # another process drew this id writer
                        self._allocate.collided()
                        obj = self._build(group, pieces)
                built.append(obj)
        except BaseException:
            await asyncio.shield(discard(store, [b.key for b in built]))
            raise
        refused = await self._commit_objects(
            owner,
            [
                new_object(obj, OffsetRange(group.stream, group.start, group.end), group.replaces)
                for (group, _), obj in zip(planned, built, strict=True)
            ],
        )
        if refused is None:
            return False
        await self._discard(refused)  # this pass's own new objects
        written = [o for o in built if o.footer.object_id not in refused]
        report.objects_written += len(written)
        self.stats.objects_written += len(written)
        self.stats.bytes_written += sum(o.size for o in written)
        return not refused

    async def _commit_objects(
        self, owner: ShardOwner, objects: list[NewObject]
    ) -> dict[int, str] | None:
        """Commit new objects in one write; those refused, id -> the reason, or None when
        the outcome is not known (the orphan sweep then takes the objects no shard names)."""
        records = stream_commits(owner, objects, self._clock_ms())
        try:
            verdicts = await write_through(owner, records)
        except Exception as exc:
            log.warning("log cleaner: commit failed: %r", exc)
            return None
        refused: dict[int, str] = {}
        for (object_id, _, _, _), verdict in zip(objects, verdicts, strict=True):
            if verdict.outcome is Outcome.REFUSE:
                log.warning("log cleaner: commit refused: %s", verdict.reason)
                refused[object_id] = verdict.reason
        return refused

    async def _discard(self, numbers: Iterable[int]) -> None:
        await discard(self._require_store(), [object_key(n, ObjectKind.STREAM) for n in numbers])

    async def commit_job(
        self, owner: ShardOwner, request: CleanCommitRequest, too_old: TooOld
    ) -> tuple[int, str]:
        """Commit the objects `tierproxy clean` wrote for a stream of a shard owned here
        (docs/offload.md, "Cleaning a compacted topic"), under the lock this cleaner and
        the compactor share, as this cleaner commits its own; (error code, message) as
        the peer protocol answers it. Refused objects are deleted. When all commit and
        the job saw no backfill gap, where its clean ended becomes this cleaner's
        checkpoint, so its next pass finds the log clean rather than cleaning it again
        (or, above `log_cleaner_max_bytes`, warning again)."""
        stream = request.stream_id
        what = f"clean of stream {stream}"
        async with self._lock:
            if owner.state.stream(stream) is None:
                return ErrorCode.unknown_topic_or_partition, f"{what}: the stream is not tiered"
            refused: dict[int, str] = {}
            objects: list[NewObject] = []
            for o in request.objects:
                r = OffsetRange(stream, o.start_offset, o.end_offset)
                reason = await too_old(object_key(o.object_id, ObjectKind.STREAM), what)
                if reason is not None:
                    refused[o.object_id] = reason
                else:
                    objects.append((o.object_id, o.size, r, o.replaces))
            if objects:
                done = await self._commit_objects(owner, objects)
                if done is None:
                    return (
                        ErrorCode.unknown_server_error,
                        f"{what}: the commit's outcome is not known",
                    )
                refused.update(done)
            # the job's objects only: ids of its kind (top bit) no record names (an id a
            # request got wrong may be an object in use)
            state = owner.state
            await self._discard(
                n for n in refused if n & OFFLOAD_ID_BIT and state.object_commit(n) is None
            )
            committed = len(request.objects) - len(refused)
            self.stats.objects_written += committed
            self.stats.bytes_written += sum(
                o.size for o in request.objects if o.object_id not in refused
            )
            if refused:
                self.stats.failures += 1
                reasons = "; ".join(sorted(set(refused.values())))
                return ErrorCode.policy_violation, (
                    f"{what}: {len(refused)} of {len(request.objects)} objects refused "
                    f"(deleted): {reasons}"
                )
            gaps = tuple(owner.state.backfill_gaps(stream))
            if request.clean_end >= 0 and not gaps:
                self._checkpoints[stream] = Checkpoint(request.clean_end, gaps)
            self.stats.cleans += 1
            log.info(
                "log cleaner: stream %d cleaned to %d by a clean job", stream, request.clean_end
            )
            return 0, f"{what}: {committed} objects committed"

    def _build(self, group: _Group, pieces: list[Piece]) -> BuiltObject:
        writer = ObjectWriter(self._allocate(), ObjectKind.STREAM, version=self.format_version)
        for start, end, count, data in blocks(pieces, group.start, group.end, MAX_BLOCK_BYTES):
            writer.add_block(group.stream, data, start, end, count)
        return writer.build()


def _segment_of(r: StreamRange, entries: tuple[IndexEntry, ...]) -> Segment:
    """A range as its object's index tells it: its blocks' bytes and largest max
    timestamp (-1 in a version 1 object, which records none: the guess then counts it as
    old enough, and the batches read decide)."""
    stamps = [e.max_timestamp for e in entries if e.max_timestamp is not None]
    return Segment(
        r.start_offset, r.end_offset, sum(e.size for e in entries), max(stamps, default=-1)
    )


class _Collector:
    """The cleaner's counters, read when scraped (plain integers)."""

    def __init__(self, stats: CleanerStats) -> None:
        self._stats = stats

    def collect(self) -> Iterator[Metric]:
        s = self._stats
        for name, documentation, value in (
            ("log_cleaner_cleans", "Compacted streams cleaned", s.cleans),
            ("log_cleaner_records_read", "Records the log cleaner read", s.records_read),
            ("log_cleaner_records_kept", "Records the log cleaner kept", s.records_kept),
            ("log_cleaner_objects_written", "Stream objects the log cleaner committed",
             s.objects_written),
            ("log_cleaner_bytes_written", "Bytes of the stream objects the log cleaner committed",
             s.bytes_written),
            ("log_cleaner_failures", "Cleans failed or refused", s.failures),
        ):  # fmt: skip
            yield CounterMetricFamily(f"tierproxy_{name}", documentation, value=value)
