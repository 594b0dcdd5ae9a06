"""Compaction on a proxy: for each shard it owns, small stream set objects become stream
objects, and objects no range uses any more leave the store (docs/tiering.md,
"Compaction"). What to rewrite is planned in proxy/upkeep/compaction_plan.py; the deletes are
proxy/upkeep/object_gc.py's.

One task runs passes one at a time, every `interval_s` per shard, or sooner when a shard
holds `trigger_objects` objects. A pass over a shard:

1. plans from the owner's state (`pick_sources`, `plan_compaction`), reading the source
   objects' indexes;
2. per new object, reads the source blocks with one ranged GET per source range, checks
   their CRCs, lays them out with `ObjectWriter`, the bytes as they were (adjacent small
   blocks joined; no batch is parsed), and PUTs it;
3. commits all the new objects in one transaction through the shard's owner, each
   ObjectCommit naming in `replaces` the objects whose ranges it takes over. A refused
   commit's object is deleted at once. When the write fails (fenced, or any other way)
   its outcome is not known here: after the grace period, the new objects the shard's
   records do not name are deleted.

Every tick (at most 5 s, and half the grace period) it also deletes what is due.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from proxy.clock import now_ms
from proxy.metadata.records import ObjectCommit, OffsetRange
from proxy.metadata.rules import Outcome
from proxy.metadata.state import MetadataState
from proxy.metadata.store import ShardOwner
from proxy.metadata.streams import StreamRange
from proxy.objects.format import IndexEntry, read_block
from proxy.objects.format_writer import BuiltObject, ObjectWriter
from proxy.objects.index_read import read_index
from proxy.objects.keys import ObjectKind
from proxy.objects.ratelimit import BandwidthLimiter, Priority
from proxy.objects.store import ObjectExists, ObjectStore, ObjectStoreError
from proxy.upkeep.compaction_plan import (
    CompactionPlan,
    CompactionSettings,
    NewObject,
    add_blocks,
    blocks_for,
    object_stats,
    pick_sources,
    plan_compaction,
)
from proxy.upkeep.object_gc import (
    GarbageCollector,
    discard,
    new_object,
    stream_commits,
    write_through,
)
from proxy.upkeep.orphan_plan import commit_age_limit
from proxy.upkeep.ports import UpkeepHost
from proxy.upload.plan import ObjectIdAllocator

log = logging.getLogger("tierproxy.compaction")

MAX_TICK_S = 5.0
CONCURRENT_GETS = 8

Index = tuple[IndexEntry, ...]


@dataclass(frozen=True, slots=True)
class CompactionResult:
    """One shard's pass: the stream objects committed, the objects it left with no range
    of the shard, the bytes committed, and the new objects whose commit failed."""

    shard: int
    written: tuple[int, ...]
    replaced: tuple[int, ...]
    bytes_written: int
    failed: int = 0


@dataclass(slots=True)
class CompactorStats:
    compactions: int = 0  # passes that committed new objects (one per shard and pass)
    objects_written: int = 0
    bytes_written: int = 0
    failures: int = 0  # passes that failed, commits refused or of unknown outcome
    id_collisions: int = 0  # creates that met another process's object: new ids drawn
    shard_objects: dict[int, tuple[int, float]] = field(default_factory=dict)  # count, avg


class Compactor:
    """`start()` runs passes on a schedule; `run_once()` and `collect_garbage()` run one
    now. `close()` stops, letting a commit in flight finish."""

    def __init__(
        self,
        store: ObjectStore,
        shard_count: int,
        *,
        owner_of: Callable[[int], ShardOwner | None],
        state_of: Callable[[int], MetadataState],
        read_to_end: Callable[[int], Awaitable[object]],
        allocate: ObjectIdAllocator,
        settings: CompactionSettings | None = None,
        interval_s: float = 300.0,
        grace_s: float = 60.0,
        enabled: bool = True,
        max_commit_age_s: float = float("inf"),
        forget: Callable[[str], None] | None = None,
        registry: CollectorRegistry | None = None,
        bandwidth: BandwidthLimiter | None = None,
        clock: Callable[[], float] = time.monotonic,
        clock_ms: Callable[[], int] = now_ms,
    ) -> None:
        self.settings = settings or CompactionSettings()
        self._bandwidth = bandwidth or BandwidthLimiter(None)  # reads and writes wait here
        self.interval_s, self.enabled = interval_s, enabled
        self.max_commit_age_s = max_commit_age_s  # past it the orphan sweep may take an object
        self.stats = CompactorStats()
        self.gc = GarbageCollector(
            store,
            shard_count,
            state_of=state_of,
            read_to_end=read_to_end,
            grace_s=grace_s,
            forget=forget,
            clock=clock,
            clock_ms=clock_ms,
        )
        self._store, self._shard_count = store, shard_count
        self._owner_of, self._allocate = owner_of, allocate
        self._clock, self._clock_ms = clock, clock_ms
        self._lock = asyncio.Lock()  # one pass at a time
        self._gets = asyncio.Semaphore(CONCURRENT_GETS)
        self._started = clock()
        self._last_pass: dict[int, float] = {}
        self._count_at_pass: dict[int, int] = {}  # object count after a pass with no plan
        self._task: asyncio.Task[None] | None = None
        self._registry = registry
        self._collector = _Collector(self)
        if registry is not None:
            registry.register(self._collector)

    @classmethod
    def for_service(cls, service: UpkeepHost, allocate: ObjectIdAllocator) -> Compactor:
        """The compactor of a started TieringService, configured from its TieringConfig."""
        config = service.config
        cache = service.block_cache
        assert service.store is not None  # the service is started
        return cls(
            service.store,
            config.shard_count,
            owner_of=service.shard_owner,
            state_of=lambda k: service.readers[k].state,
            read_to_end=lambda k: service.readers[k].read_to_end(),
            allocate=allocate,
            settings=CompactionSettings(
                small_object_bytes=config.compaction_small_object_bytes,
                stream_object_bytes=config.stream_object_bytes,
                min_objects=config.compaction_min_objects,
                trigger_objects=config.compaction_trigger_objects,
                max_pass_bytes=config.compaction_max_bytes,
                format_version=config.object_format_version,
            ),
            interval_s=config.compaction_interval_s,
            grace_s=config.object_delete_grace_s,
            enabled=config.compaction_enabled,
            max_commit_age_s=commit_age_limit(config.orphan_grace_s),
            forget=cache.forget if cache is not None else None,
            registry=service.registry,
            bandwidth=service.bandwidth.limiter if service.bandwidth is not None else None,
        )

    # -- lifecycle -----------------------------------------------------------------------

    def start(self) -> None:
        """Run the schedule: compaction passes when `enabled`, deletes of what no range
        uses any more always (retention and untier leave garbage too)."""
        if self._task is None:
            self._started = self._clock()
            self._task = asyncio.create_task(self._run(), name="compactor")

    async def close(self) -> None:
        """Stop the task. A pass stops at its next step, but an owner's write in flight
        goes on and is waited for (cancelling it would cost the owner its shard)."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        if self._registry is not None:
            self._registry.unregister(self._collector)
            self._registry = None

    async def _run(self) -> None:
        tick = max(0.05, min(MAX_TICK_S, self.gc.grace_s / 2, self.interval_s))
        while True:
            await asyncio.sleep(tick)
            try:
                async with self._lock:
                    for shard in self._owned() if self.enabled else ():
                        if self._due(shard):
                            await self._compact(shard)
                    await self._collect()
            except Exception as exc:
                self.stats.failures += 1
                if isinstance(exc, ObjectStoreError) and exc.retryable:
                    # the store down, throttling or unreachable after its retries: the
                    # next tick tries again; a traceback would say "bug"
                    log.warning("compaction pass failed, tried again next tick: %s", exc)
                else:
                    log.exception("compaction pass failed")

    # -- what callers see ----------------------------------------------------------------

    @property
    def lock(self) -> asyncio.Lock:
        """Held by a pass; the log cleaner takes it too, so the two never rewrite the same
        ranges at once (either would be refused, its objects written for nothing)."""
        return self._lock

    async def run_once(self) -> list[CompactionResult]:
        """Compact every shard owned here now, whatever the schedule."""
        async with self._lock:
            results = [await self._compact(shard) for shard in self._owned()]
        return [r for r in results if r is not None]

    async def collect_garbage(self) -> list[int]:
        """Delete what is due now; the objects whose ObjectDelete was written."""
        async with self._lock:
            return await self._collect()

    def _owned(self) -> list[int]:
        return [k for k in range(self._shard_count) if self._owner_of(k) is not None]

    def _due(self, shard: int) -> bool:
        if self._clock() - self._last_pass.get(shard, self._started) >= self.interval_s:
            return True
        count, _ = self.stats.shard_objects.get(shard, (0, 0.0))
        grown = count >= self._count_at_pass.get(shard, 0) + self.settings.min_objects
        return count >= self.settings.trigger_objects and grown

    async def _collect(self) -> list[int]:
        deleted: list[int] = []
        counts = {}
        for shard in self._owned():
            owner = self._owner_of(shard)
            if owner is not None and owner.owning:
                deleted += await self.gc.collect(shard, owner)
                counts[shard] = object_stats(owner.state)
        self.stats.shard_objects = counts  # replaced whole: the metrics thread reads it
        await self.gc.settle_unsure()
        return deleted

    # -- a pass --------------------------------------------------------------------------

    async def _compact(self, shard: int) -> CompactionResult | None:
        owner = self._owner_of(shard)
        if owner is None or not owner.owning:
            return None
        state = owner.state
        self._last_pass[shard] = self._clock()
        sources = pick_sources(state, self.settings)
        commits = [state.object_commit(number) for number in sources]
        indexes: dict[int, Index] = dict(
            zip(sources, await asyncio.gather(*map(self._index, commits)), strict=True)
        )
        sizes: dict[tuple[int, int], int] = {}  # data bytes per (source, stream)
        for number, index in indexes.items():
            for e in index:
                sizes[number, e.stream_id] = sizes.get((number, e.stream_id), 0) + e.size
        plan = plan_compaction(
            state, self.settings, sources, lambda r: sizes[r.object_id, r.stream_id]
        )
        if plan is None:
            self._count_at_pass[shard] = object_stats(state)[0]
            return None
        self._count_at_pass.pop(shard, None)
        first_put = self._clock()
        built = await self._write_objects(plan, indexes)
        if self._clock() - first_put > self.max_commit_age_s:
            # the orphan sweep may judge them orphans before the commit is read: the next
            # pass writes them again
            log.warning("shard %d: compaction's objects too old to commit, dropped", shard)
            self.stats.failures += 1
            await discard(self._store, [b.key for b in built])
            return None
        return await self._commit(shard, owner, plan, built)

    async def _index(self, commit: ObjectCommit | StreamRange | None) -> Index:
        assert commit is not None
        if isinstance(commit, StreamRange):
            key, size, number = commit.object_key, commit.object_size, commit.object_id
        else:
            key, size, number = commit.key, commit.size, commit.object_id
        async with self._gets:
            index = await read_index(self._store, key, size)
        self.gc.remember(number, index)
        return index

    async def _write_objects(
        self, plan: CompactionPlan, indexes: dict[int, Index]
    ) -> list[BuiltObject]:
        built: list[BuiltObject] = []
        try:
            for new in plan.objects:
                fetched = await asyncio.gather(*(self._read(r, indexes) for r in new.sources))
                obj = await asyncio.to_thread(self._assemble, new, self._allocate(), fetched)
                await self._bandwidth.acquire(Priority.COMPACTION, obj.size)
                while not await self._created(obj):  # the key was another process's
                    obj = await asyncio.to_thread(self._assemble, new, self._allocate(), fetched)
                built.append(obj)
        except BaseException:
            await asyncio.shield(discard(self._store, [b.key for b in built]))  # unnamed
            raise
        return built

    async def _created(self, obj: BuiltObject) -> bool:
        """Create the object exclusively; False if its key names an object already
        (another process drew this object id writer): a new writer is drawn, and the
        object met is left alone (docs/object-store.md, "Exclusive creates")."""
        try:
            await self._store.create(obj.key, obj.pieces)
        except ObjectExists:
            self._allocate.collided()
            self.stats.id_collisions += 1
            log.warning(
                "compactor: %s exists (another process drew this object id writer): "
                "writing again under writer %d",
                obj.key,
                self._allocate.writer,
            )
            return False
        return True

    async def _read(self, r: StreamRange, indexes: dict[int, Index]) -> tuple[Index, bytes]:
        index = indexes.get(r.object_id)
        if index is None:  # a small stream object taken in
            index = indexes[r.object_id] = await self._index(r)
        entries = blocks_for(index, r)
        await self._bandwidth.acquire(
            Priority.COMPACTION, entries[-1].end_position - entries[0].position
        )
        async with self._gets:
            data = await self._store.get(
                r.object_key, entries[0].position, entries[-1].end_position
            )
        return entries, data

    def _assemble(
        self, new: NewObject, object_id: int, fetched: Sequence[tuple[Index, bytes]]
    ) -> BuiltObject:
        """Check every block's CRC and lay the new object out (off the event loop)."""
        blocks = []
        for (entries, data), r in zip(fetched, new.sources, strict=True):
            for e in entries:
                view = read_block(data, e, r.object_key, entries[0].position)
                blocks.append((e.start_offset, e.end_offset, e.record_count, view))
        writer = ObjectWriter(object_id, ObjectKind.STREAM, version=self.settings.format_version)
        add_blocks(writer, new.stream_id, blocks, self.settings.max_block_bytes)
        return writer.build()

    async def _commit(
        self, shard: int, owner: ShardOwner, plan: CompactionPlan, built: list[BuiltObject]
    ) -> CompactionResult:
        state = owner.state
        records = stream_commits(
            owner,
            [
                new_object(
                    obj, OffsetRange(new.stream_id, new.start_offset, new.end_offset), new.replaces
                )
                for new, obj in zip(plan.objects, built, strict=True)
            ],
            self._clock_ms(),
        )
        try:
            verdicts = await write_through(owner, records)
        except Exception as exc:
            self.stats.failures += 1
            log.warning("shard %d: compaction commit failed, checked later: %r", shard, exc)
            self.gc.unsure(shard, [(o.footer.object_id, o.key) for o in built])
            return CompactionResult(shard, (), (), 0, failed=len(built))
        kept, refused = [], []
        for obj, verdict in zip(built, verdicts, strict=True):
            if verdict.outcome is Outcome.REFUSE:
                log.warning("shard %d: compaction commit refused: %s", shard, verdict.reason)
                refused.append(obj.key)
            else:
                kept.append(obj)
        if refused:
            self.stats.failures += 1
            await discard(self._store, refused)
        written = sum(o.size for o in kept)
        if kept:
            self.stats.compactions += 1
            self.stats.objects_written += len(kept)
            self.stats.bytes_written += written
        replaced = tuple(n for n in plan.replaces if not state.object_ranges(n))
        log.info(
            "shard %d: %d objects' ranges rewritten into %d stream objects (%d bytes)",
            *(shard, len(replaced), len(kept), written),
        )
        ids = tuple(o.footer.object_id for o in kept)
        return CompactionResult(shard, ids, replaced, written, len(refused))


class _Collector:
    """The compactor's counters and the owned shards' object gauges, read when scraped,
    from the metrics server's thread: plain values only, the shard table replaced whole."""

    def __init__(self, compactor: Compactor) -> None:
        self._compactor = compactor

    def collect(self) -> Iterator[Metric]:
        s, deleted = self._compactor.stats, self._compactor.gc.deleted
        for name, documentation, value in (
            ("compactions", "Compaction commits, one per shard and pass", s.compactions),
            ("compaction_objects_written", "Stream objects compaction committed",
             s.objects_written),
            ("compaction_bytes_written", "Bytes of the stream objects compaction committed",
             s.bytes_written),
            ("compaction_objects_deleted", "Objects deleted once no range used them", deleted),
            ("compaction_failures", "Compaction passes failed, commits refused or unsure",
             s.failures),
        ):  # fmt: skip
            yield CounterMetricFamily(f"tierproxy_{name}", documentation, value=value)
        count = GaugeMetricFamily(
            "tierproxy_shard_objects",
            "Objects holding ranges of a shard owned here",
            labels=["shard"],
        )
        size = GaugeMetricFamily(
            "tierproxy_shard_object_bytes_avg",
            "Average size of the objects holding ranges of a shard owned here",
            labels=["shard"],
        )
        for shard, (objects, average) in sorted(s.shard_objects.items()):
            count.add_metric([str(shard)], objects)
            size.add_metric([str(shard)], average)
        yield count
        yield size
