"""The block cache's pure decisions: which blocks it keeps, and which ranged GETs a read
takes (`blockcache.py` is the asyncio side that issues them).

- `BlockLru` holds blocks within a byte bound, evicting the least recently used, and
  charges each GET's buffer whole while any block cut from it is cached (`blockcache.py`,
  "Memory"). A block its reader has moved past (`passed`) is the first to go: the
  blocks catch-up readers have read must go before those readahead fetched for readers
  that have not read them yet, however long those wait (readers move at different
  speeds); read again, by anyone, it is recently used again.
- `Readahead` and `plan_fetches` decide how far ahead of a reader to fetch and which
  ranged GETs that takes: one per run of adjacent missing blocks. `window_bound` keeps the
  readers' windows together within the cache; `read_past_run` says how far readahead goes
  on into the stream's next object once it reaches the end of this one's blocks, and
  `tail_read` how much of that object's tail its index read takes along.

Pure: no I/O, no asyncio.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from proxy.objects.format import IndexEntry

BlockKey = tuple[str, int]  # (object key, block position)


class _Buffer:
    """The bytes of one GET, charged while any block cut from it is cached."""

    __slots__ = ("size", "live", "blocks")

    def __init__(self, size: int) -> None:
        self.size = size
        self.live = 0  # bytes of its blocks still cached
        self.blocks: set[BlockKey] = set()


class BlockLru:
    """Blocks within `capacity` bytes: those passed evicted first, then the least recently
    used (see the module's doc). `bytes` is what the cached blocks keep alive: their
    buffers, counted whole."""

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

    def passed(self, block: BlockKey) -> None:
        """Its reader has moved past the block: it goes first, unless read again."""
        if block in self._blocks:
            self._blocks.move_to_end(block, last=False)

    def insert(
        self, key: str, blocks: Sequence[tuple[int, memoryview]], buffer_size: int | None = None
    ) -> bool:
        """Cache `(position, view)` blocks of object `key` cut from one buffer (one GET) of
        `buffer_size` bytes (by default: exactly them), then evict down to the capacity.
        The new blocks are the most recently used, so eviction reaches them only after
        everything else, which leaves room for them. A buffer larger than the capacity is
        not cached: False."""
        size = sum(len(view) for _, view in blocks) if buffer_size is None else buffer_size
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


def window_bound(max_bytes: int, capacity: int, active_readers: int) -> int:
    """The most one reader may read ahead: `max_bytes`, at most a quarter of the cache, and
    a share of it small enough that the unread readahead of `active_readers` reading at
    once fits in it with room to spare. A reader holds up to one and a half windows unread
    (`plan_fetches` fetches a window once less than half of one is left), so a window of
    capacity / (2 x readers) keeps all of theirs within three quarters of the cache: larger
    windows had six readers evict each other's blocks before they were read."""
    return max(0, min(max_bytes, capacity // 4, capacity // (2 * max(1, active_readers))))


@dataclass(slots=True)
class Readahead:
    """One reader's readahead window, in bytes. A read that moves on from the previous one
    (it starts after that one's first block, at most at the block after its last) is
    sequential and doubles the window, from one block up to `max_bytes` (or the `bound`
    given); one that starts in the same block again (a fetch ended inside it) keeps it; any
    other resets it: to nothing, or, for a reader catching up (a whole committed range
    after the one it reads), to a quarter of the bound, so that it does not ramp up from
    one block. Offsets, not objects, make a read sequential: the window carries on from
    one object of the stream into the next. `spilled` is the next object readahead went
    on into already; `read_at` when the reader last read (its owner's clock); `held` the
    blocks its last read returned."""

    max_bytes: int
    window: int = 0
    last: tuple[int, int, int] | None = None  # the last read's stream, first and end offset
    spilled: str | None = None
    read_at: float = 0.0
    held: tuple[BlockKey, ...] = ()

    def next_read(
        self,
        first: IndexEntry,
        last: IndexEntry,
        *,
        bound: int | None = None,
        catching_up: bool = False,
    ) -> int:
        """The window for a read of the blocks `first` to `last` of one stream."""
        cap = self.max_bytes if bound is None else min(self.max_bytes, bound)
        previous = self.last
        self.last = (first.stream_id, first.start_offset, last.end_offset)
        if previous is not None and previous[0] == first.stream_id:
            if previous[1] < first.start_offset <= previous[2]:
                self.window = min(cap, max(2 * self.window, first.size))
                return self.window
            if first.start_offset == previous[1]:
                self.window = min(cap, self.window)
                return self.window
        self.window = min(cap, max(cap // 4, first.size)) if catching_up and cap > 0 else 0
        return self.window


def read_past_run(sizes: Sequence[int], present: Sequence[bool], wanted: int, window: int) -> int:
    """Bytes of the stream's next object to read ahead now, for a read of blocks [0,
    `wanted`) of the last run of blocks of the stream in this object (`sizes` and `present`
    to its end, as `plan_fetches` takes them): a whole window, once readahead is due (less
    than half a window at hand after the wanted blocks, as `plan_fetches` decides) and less
    than half a window is left in this object. The reader then neither waits for the next
    object's index and first block nor ramps up again there, and its windows there start
    at the object's start: an object of up to n windows costs n GETs, where windows carried
    over object ends would cut one more GET at each end. What it holds unread stays within
    one and a half windows, as within an object. 0: not now."""
    if window <= 0:
        return 0
    ahead, _ = _at_hand(sizes, present, wanted)
    if 2 * ahead >= window or 2 * sum(sizes[wanted:]) >= window:
        return 0
    return window


def _at_hand(sizes: Sequence[int], present: Sequence[bool], wanted: int) -> tuple[int, int]:
    """The bytes of the blocks present right after the wanted ones, and the first missing."""
    ahead, gap = 0, wanted
    while gap < len(sizes) and present[gap]:
        ahead += sizes[gap]
        gap += 1
    return ahead, gap


def plan_fetches(
    sizes: Sequence[int], present: Sequence[bool], wanted: int, window: int
) -> tuple[list[tuple[int, int]], tuple[int, int] | None]:
    """The GETs for a read of blocks [0, wanted) of a run of adjacent blocks, as [first,
    end) index ranges. `present[i]` says block i is cached or being fetched already.

    Returns the GETs the read waits for, one per run of missing wanted blocks, and at most
    one readahead GET to start in the background. Readahead starts once fewer than half a
    window of bytes after the wanted blocks are at hand, and fetches up to a window (at
    least one block) of the missing blocks from the first one missing, and the missing
    blocks after them with them when less than a quarter of a window of those would be
    left before the run's end or a block at hand (a GET of its own for the few last
    blocks of an object, or the few before its tail that `tail_read` fetched, is not
    worth it). It rides on the
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
    ahead, gap = _at_hand(sizes, present, wanted)
    if window <= 0 or gap == len(sizes) or 2 * ahead >= window:
        return now, None
    end, fetched = gap, 0
    while end < len(sizes) and not present[end] and (end == gap or fetched + sizes[end] <= window):
        fetched += sizes[end]
        end += 1
    stop = end  # the missing blocks right after: to the run's end or a block at hand
    while stop < len(sizes) and not present[stop]:
        stop += 1
    rest = sum(sizes[end:stop])
    if 0 < 4 * rest < window:
        end, fetched = stop, fetched + rest
    if now and now[-1][1] == gap and fetched <= sum(sizes[now[-1][0] : gap]):
        now[-1] = (now[-1][0], end)
        return now, None
    return now, (gap, end)


def tail_read(object_size: int, window: int, index_bytes: int) -> int:
    """The bytes of a stream object's tail to read for its index when readahead goes on
    into it (`read_past_run`) with windows of `window` bytes, given that `index_bytes` of
    tail usually hold the footer and the index.

    Windows cut a sequential reader's reads of the object from its first byte: an object
    of n windows and a bit costs its index read, n window GETs and the bit (taken along
    with the last window when it is less than a quarter of one, `plan_fetches`). The
    tail read takes what the last window would read instead when that is little: the
    bit, when it is at most a quarter of a window (so that a reader holds at most a
    quarter of a window more than it would), or the whole object when the object is at
    most a window (the reader would read it whole at once anyway). The index read then
    costs no GET of its own. Otherwise only `index_bytes`: the last window is too large
    to hold from the object's first read on. The cut is a guess from sizes alone (the
    index's own size is not known before it is read): `plan_fetches` takes the few
    blocks a guess too late leaves along with the window before them."""
    plain = min(object_size, index_bytes)
    if window <= 0:
        return plain
    windows = max(0, object_size - index_bytes) // window
    if windows == 0:
        return object_size
    tail = object_size - windows * window
    return tail if 4 * (tail - index_bytes) <= window else plain
