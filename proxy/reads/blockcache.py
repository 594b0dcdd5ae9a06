"""The block cache: data blocks of committed objects, shared by every reader of a proxy.

A block (objectformat.py) is the unit, keyed by (object key, block position) and checked
against its CRC once, when it enters the cache. Three parts:

- `BlockLru` holds blocks within a byte bound, evicting the least recently used. Pure.
- `Readahead` and `plan_fetches` decide how far ahead of a reader to fetch and which
  ranged GETs that takes: one per run of adjacent missing blocks. Pure.
- `BlockCache` is the asyncio side: it issues the GETs, lets concurrent readers of a block
  share one GET (single flight), and keeps the parsed index of each object it reads (one
  tail read per object).

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
from collections import OrderedDict
from collections.abc import Coroutine, Hashable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from proxy.objects.format import (
    IndexEntry,
    ObjectFormatError,
    index_in_tail,
    parse_footer,
    parse_index,
    read_block,
)
from proxy.objects.store import ObjectNotFound, ObjectStore

MiB = 1024 * 1024
DEFAULT_CAPACITY_BYTES = 256 * MiB
DEFAULT_MAX_READAHEAD_BYTES = 16 * MiB  # a quarter of the cache at most; see docs/benchmarks.md
DEFAULT_INDEX_ENTRIES = 1024  # objects whose parsed index is kept
DEFAULT_INDEX_READ_BYTES = 64 * 1024  # the tail read: the footer and, usually, the index
DEFAULT_READERS = 10_000  # readers whose readahead state is kept

BlockKey = tuple[str, int]  # (object key, block position)


class _Buffer:
    """The bytes of one GET, charged while any block cut from it is cached."""

    __slots__ = ("size", "live", "blocks")

    def __init__(self, size: int) -> None:
        self.size = size
        self.live = 0  # bytes of its blocks still cached
        self.blocks: set[BlockKey] = set()


class BlockLru:
    """Blocks within `capacity` bytes, least recently used evicted first. `bytes` is what
    the cached blocks keep alive: their buffers, counted whole (see the module's doc)."""

    def __init__(self, capacity: int) -> None:
        if capacity < 0:
            raise ValueError(f"block cache capacity {capacity} is negative")
        self.capacity = capacity
        self.bytes = 0
        self.evictions = 0
        self._blocks: OrderedDict[BlockKey, tuple[memoryview, _Buffer]] = OrderedDict()

    def __contains__(self, block: BlockKey) -> bool:
        return block in self._blocks

    def get(self, block: BlockKey) -> memoryview | None:
        slot = self._blocks.get(block)
        if slot is None:
            return None
        self._blocks.move_to_end(block)
        return slot[0]

    def insert(self, key: str, blocks: Sequence[tuple[int, memoryview]]) -> bool:
        """Cache `(position, view)` blocks of object `key` cut from one buffer that holds
        exactly them (one GET), then evict down to the capacity. The new blocks are the
        most recently used, so eviction reaches them only after everything else, which
        leaves room for them. A buffer larger than the capacity is not cached: False."""
        size = sum(len(view) for _, view in blocks)
        if size > self.capacity:
            return False
        buffer = _Buffer(size)
        for position, view in blocks:
            block = (key, position)
            if block in self._blocks:
                self._remove(block, compact=False)
            self._blocks[block] = (view, buffer)
            buffer.blocks.add(block)
            buffer.live += len(view)
        self.bytes += size
        while self.bytes > self.capacity:
            block = next(iter(self._blocks))
            self._remove(block, compact=True)
            self.evictions += 1
        return True

    def forget(self, key: str) -> int:
        """Drop every block of object `key` (not counted as evictions); returns how many."""
        dropped = [block for block in self._blocks if block[0] == key]
        for block in dropped:
            self._remove(block, compact=False)
        return len(dropped)

    def positions(self, key: str) -> list[int]:
        """Positions of the cached blocks of object `key`, in order (tests, operations)."""
        return sorted(position for k, position in self._blocks if k == key)

    def _remove(self, block: BlockKey, *, compact: bool) -> None:
        view, buffer = self._blocks.pop(block)
        buffer.blocks.discard(block)
        buffer.live -= len(view)
        if not buffer.blocks:
            self.bytes -= buffer.size
        elif compact and buffer.live * 2 <= buffer.size:
            self._copy_out(buffer)

    def _copy_out(self, buffer: _Buffer) -> None:
        """Give each block still cached from `buffer` a copy of its own, so the buffer's
        memory goes once readers drop it; the blocks keep their places in the LRU order."""
        for block in buffer.blocks:
            view = self._blocks[block][0]
            own = _Buffer(len(view))
            own.blocks.add(block)
            own.live = own.size
            self._blocks[block] = (memoryview(bytes(view)), own)
        self.bytes -= buffer.size - buffer.live
        buffer.blocks.clear()


@dataclass(slots=True)
class Readahead:
    """One reader's readahead window, in bytes. A read that moves on from the previous one
    (it starts after that one's first block, at most at the block after its last) is
    sequential and doubles the window, from one block up to `max_bytes`; one that starts
    in the same block again (a fetch ended inside it) keeps it; any other resets it."""

    max_bytes: int
    window: int = 0
    last: tuple[int, int, int] | None = None  # the last read's stream, first and end offset

    def next_read(self, first: IndexEntry, last: IndexEntry) -> int:
        """The window for a read of the blocks `first` to `last` of one stream."""
        previous = self.last
        self.last = (first.stream_id, first.start_offset, last.end_offset)
        if previous is not None and previous[0] == first.stream_id:
            if previous[1] < first.start_offset <= previous[2]:
                self.window = min(self.max_bytes, max(2 * self.window, first.size))
                return self.window
            if first.start_offset == previous[1]:
                return self.window
        self.window = 0
        return 0


def plan_fetches(
    sizes: Sequence[int], present: Sequence[bool], wanted: int, window: int
) -> tuple[list[tuple[int, int]], tuple[int, int] | None]:
    """The GETs for a read of blocks [0, wanted) of a run of adjacent blocks, as [first,
    end) index ranges. `present[i]` says block i is cached or being fetched already.

    Returns the GETs the read waits for, one per run of missing wanted blocks, and at most
    one readahead GET to start in the background. Readahead starts once fewer than half a
    window of bytes after the wanted blocks are at hand, and fetches up to a window (at
    least one block) of the missing blocks from the first one missing. It rides on the
    read's own GET when that one ends where readahead begins and is no larger than it, so
    a read never waits for more than twice the bytes it asked for."""
    now: list[tuple[int, int]] = []
    for i in range(wanted):
        if present[i]:
            continue
        if now and now[-1][1] == i:
            now[-1] = (now[-1][0], i + 1)
        else:
            now.append((i, i + 1))
    ahead, gap = 0, wanted
    while gap < len(sizes) and present[gap]:
        ahead += sizes[gap]
        gap += 1
    if window <= 0 or gap == len(sizes) or 2 * ahead >= window:
        return now, None
    end, fetched = gap, 0
    while end < len(sizes) and not present[end] and (end == gap or fetched + sizes[end] <= window):
        fetched += sizes[end]
        end += 1
    if now and now[-1][1] == gap and fetched <= sum(sizes[now[-1][0] : gap]):
        now[-1] = (now[-1][0], end)
        return now, None
    return now, (gap, end)


class BlockCache:
    """Blocks and parsed indexes of the objects in `store`, for all readers of a proxy.

    Counters (plain attributes): `hits` and `misses` of the blocks reads want, `gets` and
    `bytes_fetched` of every GET issued (index reads included), `index_hits` and
    `index_misses`; `bytes` and `evictions` come from the LRU. `registry` also exposes
    them as tierproxy_block_cache_* metrics."""

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
        self.hits = self.misses = self.gets = self.bytes_fetched = 0
        self.index_hits = self.index_misses = 0
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
        future = self._index_inflight.get(key)
        if future is None:
            future = self._index_inflight[key] = asyncio.get_running_loop().create_future()
            self._spawn(self._load_index(key, object_size, future, self._generation))
        return await asyncio.shield(future)

    async def blocks(
        self, key: str, run: Sequence[IndexEntry], wanted: int, *, reader_id: Hashable
    ) -> list[memoryview]:
        """The first `wanted` blocks of `run`, adjacent blocks of one stream in object
        `key` as `find_entries` gives them, and readahead into the rest of `run` for the
        reader `reader_id`."""
        if not 1 <= wanted <= len(run):
            raise ValueError(f"{wanted} blocks wanted of a run of {len(run)}")
        window = self._readahead(reader_id).next_read(run[0], run[wanted - 1])
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
        return state

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
        future: asyncio.Future[tuple[IndexEntry, ...]],
        generation: int,
    ) -> None:
        try:
            try:
                self.gets += 1
                tail = await self.store.get_tail(key, min(object_size, self._index_read_bytes))
                self.bytes_fetched += len(tail)
                footer = parse_footer(tail, object_size, key)
                data: bytes | memoryview | None = index_in_tail(tail, object_size, footer)
                if data is None:  # the index is larger than the tail read
                    self.gets += 1
                    data = await self.store.get(key, footer.index_position, footer.index_end)
                    self.bytes_fetched += len(data)
                index = parse_index(data, footer, key)
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
        future.set_result(index)

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
            (CounterMetricFamily, "index_misses", "Indexes read", c.index_misses),
            (GaugeMetricFamily, "bytes", "Bytes the cached blocks keep alive", c.bytes),
            (GaugeMetricFamily, "capacity_bytes", "The cache's bound", c.capacity_bytes),
        ):
            yield family(f"tierproxy_block_cache_{name}", documentation, value=value)
