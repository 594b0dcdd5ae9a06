"""The block cache: data blocks of committed objects, shared by every reader of a proxy.

A block (objects/format.py) is the unit, keyed by (object key, block position) and checked
against its CRC once, when it enters the cache. Three parts:

- `BlockLru` holds blocks within a byte bound, evicting the least recently used. Pure,
  in `blockplan.py`.
- `Readahead` and `plan_fetches` decide how far ahead of a reader to fetch and which
  ranged GETs that takes: one per run of adjacent missing blocks. Pure, in `blockplan.py`.
- `BlockCache`, here, is the asyncio side: it issues the GETs, lets concurrent readers of
  a block share one GET (single flight), and keeps the parsed index of each object it
  reads (one tail read per object). A read given the stream's next committed range
  (`NextRange`) reads ahead into it once its window reaches past this object: that
  object's index and first blocks, in the background. Of a stream object, that index
  read takes blocks along (`_read_ahead_into`): after an object of format version 3, a
  read of the next one's first window, which in a version 3 object holds the index's
  copy and the first blocks behind it, one GET; after an earlier version, a read of the
  tail, which holds the index and takes the object's last blocks along when they are
  few (`tail_read`). Either way a sequential reader's index read costs no GET of its
  own.

Memory. A GET of adjacent blocks returns one buffer, and its blocks are cached as
memoryview slices of it, without a copy. A slice keeps the whole buffer alive, so the
cache charges the whole buffer while any block cut from it is cached. When eviction
leaves at most half of a buffer cached, the survivors are copied into buffers of their
own, so that the eviction frees memory rather than waiting on one hot block: a byte is
copied at most once, and only then. Views handed to a reader keep their buffer alive
until the reader drops them; that memory is the reader's, not the cache's.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Callable, Container, Coroutine, Hashable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from proxy.objects.format import (
    HEAD_SIZE,
    Buffer,
    Footer,
    IndexEntry,
    ObjectFormatError,
    as_view,
    find_entries,
    index_in_head,
    index_in_tail,
    parse_footer,
    parse_head,
    parse_index,
    read_block,
)
from proxy.objects.keys import ObjectKind, parse_object_key
from proxy.objects.store import ObjectNotFound, ObjectStore
from proxy.reads.blockplan import (
    BlockKey,
    BlockLru,
    Readahead,
    plan_fetches,
    read_past_run,
    tail_read,
    window_bound,
)

MiB = 1024 * 1024
DEFAULT_CAPACITY_BYTES = 256 * MiB
# a quarter of the cache at most, and a share of it among the readers reading at once
# (window_bound); see docs/benchmarks.md
DEFAULT_MAX_READAHEAD_BYTES = 64 * MiB
ACTIVE_READER_S = 2.0  # a reader that read this recently shares the cache with the others
MAX_COUNTED_READERS = 64  # more than this many active readers: the window is as small
DEFAULT_INDEX_ENTRIES = 1024  # objects whose parsed index is kept
DEFAULT_INDEX_READ_BYTES = 64 * 1024  # the tail read: the footer and, usually, the index
DEFAULT_READERS = 10_000  # readers whose readahead state is kept


@dataclass(frozen=True, slots=True)
class NextRange:
    """The stream's committed range after the one a read is in: where its readahead goes
    on to. `start_offset` is where the read would go on in it."""

    object_key: str
    object_size: int
    stream_id: int
    start_offset: int
    end_offset: int


class BlockCache:
    """Blocks and parsed indexes of the objects in `store`, for all readers of a proxy.

    Counters (plain attributes): `hits` and `misses` of the blocks reads want, `gets` and
    `bytes_fetched` of every GET issued (index reads included), `index_hits`,
    `index_misses` and `index_gets` (the GETs of index reads), `head_blocks` and
    `tail_blocks` (blocks that came with an index read of the object's first bytes or
    of its tail); `bytes` and `evictions` come from the LRU.
    `registry` also exposes them as tierproxy_block_cache_* metrics."""

    def __init__(
        self,
        store: ObjectStore,
        *,
        capacity_bytes: int = DEFAULT_CAPACITY_BYTES,
        max_readahead_bytes: int = DEFAULT_MAX_READAHEAD_BYTES,
        index_entries: int = DEFAULT_INDEX_ENTRIES,
        index_read_bytes: int = DEFAULT_INDEX_READ_BYTES,
        readers: int = DEFAULT_READERS,
        registry: CollectorRegistry | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if min(index_entries, index_read_bytes, readers) < 1 or max_readahead_bytes < 0:
            raise ValueError(
                "block cache: index_entries, index_read_bytes, readers must be "
                "positive and max_readahead_bytes not negative"
            )
        self.store = store
        self._lru = BlockLru(capacity_bytes)
        # one readahead cannot flush the cache
        self.max_readahead_bytes = min(max_readahead_bytes, capacity_bytes // 4)
        self._index_entries = index_entries
        self._index_read_bytes = index_read_bytes
        self._reader_limit = readers
        self._clock = clock
        self.hits = self.misses = self.gets = self.bytes_fetched = 0
        self.index_hits = self.index_misses = self.index_gets = 0
        self.head_blocks = self.tail_blocks = 0
        self._inflight: dict[BlockKey, asyncio.Future[memoryview]] = {}
        self._indexes: OrderedDict[str, tuple[IndexEntry, ...]] = OrderedDict()
        self._index_inflight: dict[str, asyncio.Future[tuple[IndexEntry, ...]]] = {}
        self._readers: OrderedDict[Hashable, Readahead] = OrderedDict()
        self._tasks: set[asyncio.Task[None]] = set()
        self._generation = 0  # moves on at each forget: GETs begun before it cache nothing
        self._registry = registry
        self._collector = _Collector(self)
        if registry is not None:
            registry.register(self._collector)

    @property
    def capacity_bytes(self) -> int:
        return self._lru.capacity

    @property
    def bytes(self) -> int:
        return self._lru.bytes

    @property
    def evictions(self) -> int:
        return self._lru.evictions

    def cached_positions(self, key: str) -> list[int]:
        return self._lru.positions(key)

    def has_index(self, key: str) -> bool:
        return key in self._indexes

    async def index(self, key: str, object_size: int) -> tuple[IndexEntry, ...]:
        """The index of object `key`, whose size (from its commit) is `object_size`."""
        index = self._indexes.get(key)
        if index is not None:
            self._indexes.move_to_end(key)
            self.index_hits += 1
            return index
        self.index_misses += 1
        return await asyncio.shield(self._index_future(key, object_size))

    async def blocks(
        self,
        key: str,
        run: Sequence[IndexEntry],
        wanted: int,
        *,
        reader_id: Hashable,
        after: NextRange | None = None,
    ) -> list[memoryview]:
        """The first `wanted` blocks of `run`, adjacent blocks of one stream in object
        `key` as `find_entries` gives them, and readahead into the rest of `run` for the
        reader `reader_id`. With `after`, `run` goes to the end of the reader's committed
        range and `after` is the stream's next one: readahead goes on into it, and the
        reader counts as catching up (its window does not start from one block)."""
        if not 1 <= wanted <= len(run):
            raise ValueError(f"{wanted} blocks wanted of a run of {len(run)}")
        state = self._readahead(reader_id)
        starts_in = (key, run[0].position)
        for block in state.held:  # blocks the reader has moved past
            if block != starts_in:
                self._lru.passed(block)
        state.held = tuple((key, entry.position) for entry in run[:wanted])
        bound = window_bound(self.max_readahead_bytes, self.capacity_bytes, self._active())
        catching_up = after is not None
        window = state.next_read(run[0], run[wanted - 1], bound=bound, catching_up=catching_up)
        views: list[memoryview | None] = [None] * wanted
        waits: dict[int, asyncio.Future[memoryview]] = {}
        present: list[bool] = []
        for i in range(wanted):
            block = (key, run[i].position)
            view = self._lru.get(block)
            if view is not None:
                self.hits += 1
                views[i] = view  # held from now on, whatever eviction does meanwhile
            else:
                self.misses += 1
                future = self._inflight.get(block)
                if future is not None:
                    waits[i] = future
            present.append(view is not None or i in waits)
        ahead = 0
        for i in range(wanted, len(run)):
            if ahead >= 2 * window:
                break  # beyond what readahead can fetch now
            block = (key, run[i].position)
            present.append(block in self._lru or block in self._inflight)
            ahead += run[i].size
        sizes = [entry.size for entry in run[: len(present)]]
        now, later = plan_fetches(sizes, present, wanted, window)
        for first, end in now:
            futures = self._start_get(key, run[first:end])
            waits.update((first + n, f) for n, f in enumerate(futures) if first + n < wanted)
        if later is not None:
            self._start_get(key, run[later[0] : later[1]])
        if after is not None and len(present) == len(run) and state.spilled != after.object_key:
            spill = read_past_run(sizes, present, wanted, window)
            if spill > 0:
                state.spilled = after.object_key
                current = self._indexes.get(key)  # version 3 has its blocks after a head
                self._read_ahead_into(after, spill, current is None or current[0].position > 0)
        for i, future in sorted(waits.items()):
            views[i] = await asyncio.shield(future)
        return [view for view in views if view is not None]  # all of them, by now

    def forget(self, key: str) -> None:
        """Drop all the cache holds of object `key` (corrupt, missing): its blocks, its
        index, and whatever GETs in flight would have added."""
        self._generation += 1
        self._lru.forget(key)
        self._indexes.pop(key, None)

    async def close(self) -> None:
        """Cancel the GETs in flight (their waiters see CancelledError) and leave the
        metrics registry."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for future in [*self._inflight.values(), *self._index_inflight.values()]:
            future.cancel()  # of a GET cancelled before it began
        self._inflight.clear()
        self._index_inflight.clear()
        if self._registry is not None:
            self._registry.unregister(self._collector)
            self._registry = None

    # -- the GETs ------------------------------------------------------------------------------

    def _readahead(self, reader_id: Hashable) -> Readahead:
        state = self._readers.get(reader_id)
        if state is None:
            state = self._readers[reader_id] = Readahead(self.max_readahead_bytes)
            if len(self._readers) > self._reader_limit:
                self._readers.popitem(last=False)
        else:
            self._readers.move_to_end(reader_id)
        state.read_at = self._clock()
        return state

    def _active(self) -> int:
        """Readers that read within ACTIVE_READER_S (up to MAX_COUNTED_READERS): the most
        recent are last in `_readers`."""
        since, count = self._clock() - ACTIVE_READER_S, 0
        for state in reversed(self._readers.values()):
            if state.read_at < since or count == MAX_COUNTED_READERS:
                break
            count += 1
        return count

    def _read_ahead_into(self, after: NextRange, size: int, headed: bool) -> None:
        """Up to `size` bytes of the first blocks of `after` not at hand yet, once its index
        is: now, or as soon as its index read ends. That is a callback on the index read,
        not a task: it runs before the reader, should the reader get there first and wait
        for the same index, so that it finds the blocks in flight. A failure is left to
        the read that gets there: it meets it itself.

        Of a stream object, the index read takes blocks along (`_load_index`): its first
        window when the object the reader is in has its index in front (`headed`: format
        version 3, as the stream's next object most likely is too), else its last few
        blocks (`tail_read`), as an object of an earlier version has no index in front."""
        index = self._indexes.get(after.object_key)
        if index is not None:
            self._read_ahead_blocks(after, size, index)
            return
        self.index_misses += 1
        head = tail = None
        if _one_stream(after.object_key):
            tail = tail_read(after.object_size, size, self._index_read_bytes)
            if headed:
                head = min(after.object_size, HEAD_SIZE + self._index_read_bytes + size)
        future = self._index_future(after.object_key, after.object_size, head=head, tail=tail)
        future.add_done_callback(lambda done: self._index_read(after, size, done))

    def _index_read(
        self, after: NextRange, size: int, future: asyncio.Future[tuple[IndexEntry, ...]]
    ) -> None:
        if not future.cancelled() and future.exception() is None:
            self._read_ahead_blocks(after, size, future.result())

    def _read_ahead_blocks(self, after: NextRange, size: int, index: Sequence[IndexEntry]) -> None:
        run = find_entries(index, after.stream_id, after.start_offset)
        present, sizes, total = [], [], 0
        for entry in run:
            if entry.start_offset >= after.end_offset or total >= 2 * size:
                break
            block = (after.object_key, entry.position)
            present.append(block in self._lru or block in self._inflight)
            sizes.append(entry.size)
            total += entry.size
        _, ahead = plan_fetches(sizes, present, 0, size)
        if ahead is not None:
            self._start_get(after.object_key, run[ahead[0] : ahead[1]])

    def _index_future(
        self, key: str, object_size: int, *, head: int | None = None, tail: int | None = None
    ) -> asyncio.Future[tuple[IndexEntry, ...]]:
        """The index read of `key` in flight, begun now if none is: by default a read of
        the few bytes of the object's tail that usually hold its index; with `head` a
        read of the object's first `head` bytes, or with `tail` of its last `tail`
        bytes, whose whole blocks it caches (`_load_index`)."""
        future = self._index_inflight.get(key)
        if future is None:
            future = self._index_inflight[key] = asyncio.get_running_loop().create_future()
            load = self._load_index(key, object_size, head, tail, future, self._generation)
            self._spawn(load)
        return future

    def _start_get(self, key: str, entries: Sequence[IndexEntry]) -> list[asyncio.Future]:
        futures = [asyncio.get_running_loop().create_future() for _ in entries]
        self._inflight.update(((key, e.position), f) for e, f in zip(entries, futures, strict=True))
        self._spawn(self._get(key, tuple(entries), futures, self._generation))
        return futures

    def _spawn(self, coroutine: Coroutine[Any, Any, None]) -> None:
        """GETs run as tasks of the cache's own: a reader cancelled while it waits cancels
        nothing that others wait for."""
        task = asyncio.get_running_loop().create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _get(
        self,
        key: str,
        entries: tuple[IndexEntry, ...],
        futures: list[asyncio.Future[memoryview]],
        generation: int,
    ) -> None:
        start = entries[0].position
        try:
            try:
                self.gets += 1
                data = await self.store.get(key, start, entries[-1].end_position)
                self.bytes_fetched += len(data)
                views = [read_block(data, entry, key, start) for entry in entries]
            finally:
                for entry in entries:
                    del self._inflight[key, entry.position]
        except BaseException as error:
            self._failed(key, futures, error)
            if not isinstance(error, Exception):
                raise
            return
        if generation == self._generation:  # else its object was forgotten meanwhile
            self._lru.insert(key, [(e.position, v) for e, v in zip(entries, views, strict=True)])
        for future, view in zip(futures, views, strict=True):
            future.set_result(view)

    async def _load_index(
        self,
        key: str,
        object_size: int,
        head_bytes: int | None,
        tail_bytes: int | None,
        future: asyncio.Future[tuple[IndexEntry, ...]],
        generation: int,
    ) -> None:
        """Read the index of `key`: from a read of the object's first `head_bytes` when
        given, which in a version 3 object holds the index's copy and the first blocks;
        else, or when those bytes hold no sound head and copy (an earlier version, or
        damage: the tail has the index too), from a read of its last `tail_bytes` (by
        default the few that usually hold the index; a second read if the index is
        larger), none when the first read held the whole object. The whole blocks the
        reads of a given size hold are cached."""
        cut: list[tuple[Buffer, int, int]] = []  # (buffer, its position, the counter's)
        try:
            try:
                index = None
                if head_bytes:
                    head = await self._get_counted(key, 0, min(object_size, head_bytes))
                    cut.append((head, 0, 0))
                    index = await self._index_in_head(key, head, object_size)
                if index is None:
                    whole = bool(cut) and len(cut[0][0]) == object_size
                    wanted = min(object_size, tail_bytes or self._index_read_bytes)
                    tail = cut[0][0] if whole else await self._get_tail_counted(key, wanted)
                    footer = parse_footer(tail, object_size, key)
                    data: Buffer | None = index_in_tail(tail, object_size, footer)
                    if data is None:  # the index is larger than the tail read
                        data = await self._get_counted(key, footer.index_position, footer.index_end)
                    index = parse_index(data, footer, key)
                    if tail_bytes and not whole:
                        cut.append((tail, object_size - len(tail), 1))
                blocks: list[tuple[list[tuple[int, memoryview]], Buffer, int]] = []
                taken: set[int] = set()
                for buffer, at, counter in cut:  # a block in both reads: from the first
                    views = self._blocks_in(key, index, buffer, at, taken)
                    taken.update(position for position, _ in views)
                    blocks.append((views, buffer, counter))
            finally:
                del self._index_inflight[key]
        except BaseException as error:
            self._failed(key, [future], error)
            if not isinstance(error, Exception):
                raise
            return
        if generation == self._generation:
            self._indexes[key] = index
            if len(self._indexes) > self._index_entries:
                self._indexes.popitem(last=False)
            for views, buffer, counter in blocks:
                if views and self._lru.insert(key, views, buffer_size=len(buffer)):
                    if counter:
                        self.tail_blocks += len(views)
                    else:
                        self.head_blocks += len(views)
        future.set_result(index)

    async def _index_in_head(
        self, key: str, head: Buffer, object_size: int
    ) -> tuple[IndexEntry, ...] | None:
        """The index of a version 3 object from its first bytes `head` (and the rest of
        its copy, should they end within it); None when they are no sound head and copy,
        for the tail to tell."""
        footer: Footer | None = parse_head(head, object_size, key)
        if footer is None:
            return None
        data: Buffer | None = index_in_head(head, footer)
        if data is None:  # the index's copy goes on past the first read: the rest of it
            rest = await self._get_counted(key, len(head), footer.data_start)
            data = bytes(as_view(head)[HEAD_SIZE:]) + bytes(rest)
        try:
            return parse_index(data, footer, key)
        except ObjectFormatError:
            return None

    async def _get_counted(self, key: str, start: int, end: int) -> Buffer:
        """A GET of the index read, counted."""
        self.gets += 1
        self.index_gets += 1
        data = await self.store.get(key, start, end)
        self.bytes_fetched += len(data)
        return data

    async def _get_tail_counted(self, key: str, size: int) -> Buffer:
        self.gets += 1
        self.index_gets += 1
        data = await self.store.get_tail(key, size)
        self.bytes_fetched += len(data)
        return data

    def _blocks_in(
        self,
        key: str,
        index: Sequence[IndexEntry],
        data: Buffer,
        start: int,
        taken: Container[int] = (),
    ) -> list[tuple[int, memoryview]]:
        """The whole blocks that `data`, the object's bytes from `start` on, holds and the
        cache has not, is not fetching and (`taken` positions) has from another read,
        CRC checked; views of `data`, not copies. A
        corrupt block is left out, not an error of the index read: the read that reaches
        it fetches it and fails there, naming it, and the reads before it do not fail for
        it."""
        end = start + len(data)
        blocks = []
        for entry in index:
            block = (key, entry.position)
            if entry.position < start or entry.end_position > end:
                continue
            if block in self._lru or block in self._inflight or entry.position in taken:
                continue
            try:
                blocks.append((entry.position, read_block(data, entry, key, start)))
            except ObjectFormatError:
                continue
        return blocks

    def _failed(self, key: str, futures: Sequence[asyncio.Future], error: BaseException) -> None:
        """A failed GET fails all its waiters and caches nothing; nothing of a corrupt or
        missing object stays cached. A GET cancelled (the cache closing) cancels them."""
        if isinstance(error, ObjectFormatError | ObjectNotFound):
            self.forget(key)
        for future in futures:
            if isinstance(error, Exception):
                future.set_exception(error)
                future.exception()  # seen: a readahead GET may have no waiter
            else:
                future.cancel()


def _one_stream(key: str) -> bool:
    """Whether object `key` is a stream object: its last blocks are the stream's that a
    reader reading on into it will read (a stream set object's are other streams')."""
    try:
        return parse_object_key(key)[1] == ObjectKind.STREAM
    except ValueError:
        return False


class _Collector:
    """The cache's counters as tierproxy_block_cache_* metrics, read when scraped."""

    def __init__(self, cache: BlockCache) -> None:
        self._cache = cache

    def collect(self) -> Iterator[Metric]:
        c = self._cache
        for family, name, documentation, value in (
            (CounterMetricFamily, "hits", "Blocks reads wanted that were cached", c.hits),
            (CounterMetricFamily, "misses", "Blocks reads wanted not cached", c.misses),
            (CounterMetricFamily, "gets", "GETs issued (blocks and indexes)", c.gets),
            (CounterMetricFamily, "fetched_bytes", "Bytes the GETs read", c.bytes_fetched),
            (CounterMetricFamily, "evictions", "Blocks evicted to fit", c.evictions),
            (CounterMetricFamily, "index_hits", "Indexes found in the cache", c.index_hits),
            (CounterMetricFamily, "index_misses", "Indexes not in the cache", c.index_misses),
            (CounterMetricFamily, "index_gets", "GETs of index reads", c.index_gets),
            (
                CounterMetricFamily,
                "head_blocks",
                "Blocks that came with an index read of an object's first bytes",
                c.head_blocks,
            ),
            (
                CounterMetricFamily,
                "tail_blocks",
                "Blocks that came with an index read of an object's tail",
                c.tail_blocks,
            ),
            (GaugeMetricFamily, "bytes", "Bytes the cached blocks keep alive", c.bytes),
            (GaugeMetricFamily, "capacity_bytes", "The cache's bound", c.capacity_bytes),
        ):
            yield family(f"tierproxy_block_cache_{name}", documentation, value=value)
