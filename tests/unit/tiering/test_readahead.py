"""Readahead across a stream's objects and within the cache's bound: the pure decisions
(`window_bound`, `Readahead` catching up, `read_past_run`, the last blocks of a run taken
along, `tail_read`, a block's first read not making it recently used) and the cache
reading ahead into the next committed range's index and first blocks. That index read
of a stream object takes blocks along: when the reader's object is of format version 3,
a read of the next object's first window, which in a version 3 object holds the index's
copy too (one GET; a damaged head, or an index copy longer than the read, costs one more
GET, not the read; an earlier version is read from the tail next); else a read of its
tail, which takes its last few blocks along (`put_object` writes version 1 unless told).
A corrupt block either read holds is left to the read that reaches it.

The store is test_blockcache's in-memory one, which records every GET.
"""

from __future__ import annotations

import asyncio

import pytest

from proxy.objects.format import ObjectFormatError
from proxy.objects.keys import ObjectKind
from proxy.reads.blockcache import BlockCache, NextRange
from proxy.reads.blockplan import (
    BlockLru,
    Readahead,
    plan_fetches,
    read_past_run,
    tail_read,
    window_bound,
)
from tests.unit.tiering.test_blockcache import (
    STREAM,
    CountingStore,
    entry,
    put_object,
    settle,
    view,
)

MiB = 1024 * 1024


# -- the pure parts ------------------------------------------------------------------------


def test_the_window_bound_shares_the_cache_among_the_readers_reading_at_once():
    cache = 256 * MiB
    assert window_bound(64 * MiB, cache, 1) == 64 * MiB  # a quarter of the cache
    assert window_bound(16 * MiB, cache, 1) == 16 * MiB  # the configured maximum
    # six readers: 1.5 windows unread each stays within three quarters of the cache
    six = window_bound(64 * MiB, cache, 6)
    assert six == cache // 12 and 6 * 1.5 * six <= 0.75 * cache
    assert window_bound(64 * MiB, cache, 0) == 64 * MiB  # nobody else reads
    assert window_bound(0, cache, 1) == 0  # readahead off


def test_a_reader_catching_up_starts_at_a_quarter_of_the_bound_not_from_one_block():
    blocks = [entry(1, 10 * n, 10 * n + 10) for n in range(8)]
    policy = Readahead(max_bytes=16_000)
    assert policy.next_read(blocks[0], blocks[0], bound=8000, catching_up=True) == 2000
    assert policy.next_read(blocks[1], blocks[1], bound=8000) == 4000
    assert policy.next_read(blocks[2], blocks[2], bound=8000) == 8000
    # more readers: the bound shrinks and so does the window, at once
    assert policy.next_read(blocks[3], blocks[3], bound=3000) == 3000
    assert policy.next_read(blocks[3], blocks[3], bound=2000) == 2000  # the same block
    # a random read resets it; not catching up, to nothing
    assert policy.next_read(blocks[0], blocks[0], bound=8000) == 0
    # a quarter of the bound is at least a block
    assert Readahead(16_000).next_read(blocks[0], blocks[0], bound=2000, catching_up=True) == 1000


def test_the_window_carries_on_from_one_object_into_the_next_of_the_stream():
    policy = Readahead(max_bytes=8000)
    first_object = [entry(1, 10 * n, 10 * n + 10) for n in range(3)]
    next_object = [entry(1, 30 + 10 * n, 40 + 10 * n) for n in range(3)]  # positions restart
    windows = [policy.next_read(b, b) for b in first_object + next_object]
    assert windows == [0, 1000, 2000, 4000, 8000, 8000]


def test_readahead_goes_past_the_run_a_whole_window_once_less_than_half_is_left_in_it():
    sizes = [100] * 6
    # 200 bytes left after the wanted block, a window of 1000: a window of the next object
    assert read_past_run(sizes, [True] * 6, wanted=4, window=1000) == 1000
    assert read_past_run(sizes, [False] * 6, wanted=4, window=1000) == 1000
    assert read_past_run(sizes, [True] * 6, wanted=6, window=1000) == 1000  # at its end
    # half a window at hand: readahead is not due yet
    assert read_past_run(sizes, [True] * 6, wanted=1, window=1000) == 0
    # half a window or more left in this object, or no window
    assert read_past_run(sizes, [False] * 6, wanted=1, window=1000) == 0
    assert read_past_run(sizes, [False] * 6, wanted=1, window=400) == 0
    assert read_past_run(sizes, [True] * 6, wanted=5, window=0) == 0


def test_readahead_takes_the_runs_last_blocks_along_rather_than_leave_them_a_get():
    sizes = [100] * 10
    # a window of 500 from block 1 would leave 400 (not less than a quarter of it): cut
    assert plan_fetches(sizes, [True] + [False] * 9, wanted=1, window=500)[1] == (1, 6)
    # from block 3 it would leave 200, less than a quarter of 1000: to the end
    assert plan_fetches(sizes, [True] * 3 + [False] * 7, wanted=3, window=1000)[1] == (3, 10)
    assert plan_fetches([100] * 13, [True] * 3 + [False] * 10, 3, window=800)[1] == (3, 11)
    # not past a block at hand
    sizes = [100] * 12
    present = [True] * 3 + [False] * 8 + [True]
    assert plan_fetches(sizes, present, wanted=3, window=800)[1] == (3, 11)


def test_the_tail_read_of_an_object_read_ahead_into_takes_its_few_last_blocks_along():
    index = 1000  # the bytes of tail that usually hold the index
    # at most a window (and the index): the whole object
    assert tail_read(4000, window=4000, index_bytes=index) == 4000
    assert tail_read(4999, window=4000, index_bytes=index) == 4999
    # two windows and a bit of at most a quarter of one: the bit with the index
    assert tail_read(9000, window=4000, index_bytes=index) == 1000
    assert tail_read(10_000, window=4000, index_bytes=index) == 2000
    # ... and not a larger bit: the index alone
    assert tail_read(10_001, window=4000, index_bytes=index) == index
    assert tail_read(12_000, window=4000, index_bytes=index) == index
    # no window (no readahead) and objects smaller than the index read
    assert tail_read(50_000, window=0, index_bytes=index) == index
    assert tail_read(600, window=4000, index_bytes=index) == 600


def test_a_block_its_reader_moved_past_goes_before_blocks_not_read_yet():
    lru = BlockLru(3000)
    for position in (0, 1000, 2000):
        lru.insert("k", [(position, view(1000))])
    assert lru.get(("k", 0)) is not None  # read: recently used
    lru.passed(("k", 0))  # and its reader moved on
    lru.insert("k", [(3000, view(1000))])
    assert lru.positions("k") == [1000, 2000, 3000]  # block 0 went first
    lru.passed(("k", 1000))
    assert lru.get(("k", 1000)) is not None  # read again (another reader): in use
    lru.insert("k", [(4000, view(1000))])
    assert lru.positions("k") == [1000, 3000, 4000]  # 2000, least recently used, went


async def test_the_blocks_a_reader_moved_past_go_first_not_those_it_reads_again(store):
    """A fetch that ends inside a block starts the next one in it again: that block is not
    passed; the blocks before it are."""
    cache = BlockCache(store, capacity_bytes=4000, max_readahead_bytes=0)
    key, index = put_object(store, 1, [1000] * 8)
    try:
        await cache.index(key, len(store.objects[key]))
        await cache.blocks(key, index, 2, reader_id="r")  # blocks 0, 1
        await cache.blocks(key, index[1:], 2, reader_id="r")  # 1 again, 2: 0 passed
        await cache.blocks(key, index[4:], 1, reader_id="x")  # 4
        await cache.blocks(key, index[5:], 1, reader_id="y")  # 5: evicts 0, not 1 or 4
        assert cache.cached_positions(key) == [
            e.position for e in (index[1], index[2], index[4], index[5])
        ]
    finally:
        await cache.close()


# -- the cache -----------------------------------------------------------------------------


@pytest.fixture
def store() -> CountingStore:
    return CountingStore()


def next_range(store: CountingStore, key: str, index, start: int = 0) -> NextRange:
    return NextRange(key, len(store.objects[key]), STREAM, start, index[-1].end_offset)


async def test_readahead_reads_the_next_objects_index_and_first_blocks_once(store):
    # a tail read of 1000 bytes: the next object's last window (its blocks 4-7) is too
    # large to take along with its index (tail_read)
    cache = BlockCache(
        store, capacity_bytes=1 << 20, max_readahead_bytes=4000, index_read_bytes=1000
    )
    first, first_index = put_object(store, 1, [1000] * 4)
    second, second_index = put_object(store, 2, [1000] * 8, first_offset=40)
    after = next_range(store, second, second_index, start=40)
    try:
        await cache.index(first, len(store.objects[first]))
        for n in range(4):
            await cache.blocks(first, first_index[n:], 1, reader_id="r", after=after)
            await settle()
        await settle()
        # within the first object: two blocks (the read's and a quarter of 4000 riding on
        # it), then two (the window doubled); at its third block less than half the window
        # (4000) is left in it: a window of the next object
        assert store.gets == [(first, 0, 2000), (first, 2000, 4000), (second, 0, 4000)]
        assert [key for key, _ in store.tails] == [first, second]
        assert cache.cached_positions(second) == [e.position for e in second_index[:4]]
        gets = len(store.gets)
        blocks = await cache.blocks(second, second_index, 1, reader_id="r")
        assert blocks[0] == bytes([0]) * 1000
        await cache.blocks(second, second_index[1:], 1, reader_id="r")
        assert len(store.gets) == gets  # half the window (4000) at hand
        # the window goes on: with less than half of it at hand, the next window
        await cache.blocks(second, second_index[2:], 1, reader_id="r")
        await settle()
        assert store.gets[gets:] == [(second, 4000, 8000)]
        assert cache.hits >= 5 and cache.index_gets == 2
    finally:
        await cache.close()


async def read_first_object(cache: BlockCache, first: str, first_index, after: NextRange):
    """A reader reads the first object block by block, with readahead into `after`."""
    await cache.index(first, len(cache.store.objects[first]))
    for n in range(len(first_index)):
        await cache.blocks(first, first_index[n:], 1, reader_id="r", after=after)
        await settle()
    await settle()


async def read_object(cache: BlockCache, key: str, index) -> list[bytes]:
    blocks = []
    for n in range(len(index)):
        blocks += await cache.blocks(key, index[n:], 1, reader_id="r")
        await settle()
    return [bytes(b) for b in blocks]


async def test_the_index_read_ahead_takes_an_object_of_at_most_a_window_whole(store):
    cache = BlockCache(store, capacity_bytes=1 << 20, max_readahead_bytes=4000)
    first, first_index = put_object(store, 1, [1000] * 4)
    second, second_index = put_object(store, 2, [1000] * 3, first_offset=40)
    try:
        await read_first_object(
            cache, first, first_index, next_range(store, second, second_index, 40)
        )
        # one GET of the second object, its tail read: the whole of it
        assert store.tails[-1] == (second, len(store.objects[second]))
        assert [g for g in store.gets if g[0] == second] == []
        assert cache.tail_blocks == 3
        assert await read_object(cache, second, second_index) == [
            bytes([n]) * 1000 for n in range(3)
        ]
        assert [g for g in store.gets if g[0] == second] == [] and cache.index_gets == 2
    finally:
        await cache.close()


async def test_the_index_read_ahead_takes_the_few_last_blocks_along_and_saves_a_get(store):
    cache = BlockCache(
        store, capacity_bytes=1 << 20, max_readahead_bytes=4000, index_read_bytes=1000
    )
    first, first_index = put_object(store, 1, [1000] * 4)
    # 9 blocks: two windows of 4000 and one block; the tail read takes that block along
    second, second_index = put_object(store, 2, [1000] * 9, first_offset=40)
    try:
        await read_first_object(
            cache, first, first_index, next_range(store, second, second_index, 40)
        )
        size = len(store.objects[second])
        assert store.tails[-1] == (second, size - 8000)
        assert cache.cached_positions(second)[-1] == second_index[-1].position
        blocks = await read_object(cache, second, second_index)
        assert blocks == [bytes([n]) * 1000 for n in range(9)]
        # two window GETs: without the tail's block, a third for it (a quarter of the
        # window is not more than it)
        assert [g for g in store.gets if g[0] == second] == [
            (second, 0, 4000),
            (second, 4000, 8000),
        ]
        assert cache.tail_blocks == 1
    finally:
        await cache.close()


async def test_the_index_read_ahead_of_a_stream_set_object_takes_no_blocks_along(store):
    cache = BlockCache(store, capacity_bytes=1 << 20, max_readahead_bytes=4000)
    first, first_index = put_object(store, 1, [1000] * 4)
    second, second_index = put_object(store, 2, [1000] * 3, 40, kind=ObjectKind.STREAM_SET)
    try:
        await read_first_object(
            cache, first, first_index, next_range(store, second, second_index, 40)
        )
        # the usual tail read (the whole object here, it is that small), and the blocks
        # fetched by a GET of their own: a stream set object's last blocks may be any
        # stream's
        assert cache.tail_blocks == 0
        assert [g for g in store.gets if g[0] == second] == [(second, 0, 3000)]
    finally:
        await cache.close()


@pytest.mark.parametrize("version", [1, 3])
async def test_a_corrupt_block_in_the_index_read_fails_only_the_read_that_reaches_it(
    store, version
):
    cache = BlockCache(store, capacity_bytes=1 << 20, max_readahead_bytes=4000)
    first, first_index = put_object(store, 1, [1000] * 4, version=version)
    second, second_index = put_object(store, 2, [1000] * 3, first_offset=40, version=version)
    data = bytearray(store.objects[second])
    data[second_index[2].position] ^= 0xFF  # the last block
    store.objects[second] = bytes(data)
    after = next_range(store, second, second_index, 40)
    try:
        await cache.index(first, len(store.objects[first]))
        for n in range(2):
            await cache.blocks(first, first_index[n:], 1, reader_id="r", after=after)
            await settle()
        store.gate = asyncio.Event()  # the index read of the second object waits
        await cache.blocks(first, first_index[2:], 1, reader_id="r", after=after)
        await settle()
        if version == 3:  # the first window's read: all of the object
            assert store.gets[-1] == (second, 0, len(store.objects[second]))
        else:  # the tail read: all of the object too
            assert store.tails[-1] == (second, len(store.objects[second]))
        # the reader gets to the second object while its index read is in flight
        index = asyncio.create_task(cache.index(second, len(store.objects[second])))
        await settle()
        store.gate.set()
        assert await index == second_index  # the corrupt block fails no index read
        came_along = cache.head_blocks if version == 3 else cache.tail_blocks
        assert came_along == 2  # the two sound blocks
        blocks = await read_object(cache, second, second_index[:2])
        assert blocks == [bytes([0]) * 1000, bytes([1]) * 1000]
        with pytest.raises(ObjectFormatError, match=second):
            await cache.blocks(second, second_index[2:], 1, reader_id="r")
    finally:
        await cache.close()


async def test_no_readahead_into_the_next_object_for_a_window_within_this_one(store):
    cache = BlockCache(store, capacity_bytes=1 << 20, max_readahead_bytes=2000)
    first, first_index = put_object(store, 1, [1000] * 8)
    second, second_index = put_object(store, 2, [1000] * 4)
    try:
        await cache.index(first, len(store.objects[first]))
        for n in range(4):
            after = next_range(store, second, second_index)
            await cache.blocks(first, first_index[n:], 1, reader_id="r", after=after)
            await settle()
        assert {g[0] for g in store.gets} == {first} and not cache.has_index(second)
    finally:
        await cache.close()


async def test_the_window_shrinks_while_more_readers_read_at_once(store):
    now = [0.0]
    cache = BlockCache(
        store, capacity_bytes=80_000, max_readahead_bytes=20_000, clock=lambda: now[0]
    )
    key, index = put_object(store, 1, [1000] * 200)
    at = 0

    async def next_get() -> int:
        """Reader a reads on until it starts a GET: that GET's size."""
        nonlocal at
        gets = len(store.gets)
        while len(store.gets) == gets:
            await cache.blocks(key, index[at:], 1, reader_id="a")
            await settle()
            at += 1
        return store.block_gets()[-1]

    try:
        await cache.index(key, len(store.objects[key]))
        # one reader: the window doubles up to a quarter of the cache
        assert [await next_get() for _ in range(6)][-2:] == [16_000, 20_000]
        for reader in "bcd":  # four readers at once: 80_000 / (2 x 4)
            await cache.blocks(key, index[150:], 1, reader_id=reader)
        assert await next_get() == 10_000
        now[0] += 10  # the others stopped reading
        assert await next_get() == 20_000
    finally:
        await cache.close()


# -- version 3: the index in front ---------------------------------------------------------


def version_3_reader(store: CountingStore) -> tuple[BlockCache, tuple[str, tuple]]:
    """A cache with windows of 4000 bytes and tail reads of 1000, and a first object (of
    4 blocks of 1000) that a reader reads on from into the next."""
    cache = BlockCache(
        store, capacity_bytes=1 << 20, max_readahead_bytes=4000, index_read_bytes=1000
    )
    return cache, put_object(store, 1, [1000] * 4, version=3)


async def test_a_version_3_objects_index_comes_with_its_first_window_in_one_get(store):
    cache, (first, first_index) = version_3_reader(store)
    second, second_index = put_object(store, 2, [1000] * 8, first_offset=40, version=3)
    data_start = second_index[0].position
    assert data_start == 36 + 8 * 52  # the head and the index's copy
    try:
        await read_first_object(
            cache, first, first_index, next_range(store, second, second_index, 40)
        )
        # the index read: the head, 1000 bytes for the index's copy, a window; no tail
        assert [g for g in store.gets if g[0] == second] == [(second, 0, 36 + 1000 + 4000)]
        assert [t for t in store.tails if t[0] == second] == []
        assert cache.head_blocks == 4  # the whole blocks in it
        blocks = await read_object(cache, second, second_index)
        assert blocks == [bytes([n]) * 1000 for n in range(8)]
        # eight blocks, two windows: two GETs, the index read one of them
        assert [g for g in store.gets if g[0] == second] == [
            (second, 0, 5036),
            (second, data_start + 4000, data_start + 8000),
        ]
        assert cache.index_gets == 2  # the first object's tail read, the second's head
    finally:
        await cache.close()


@pytest.mark.parametrize("damaged", [10, 40], ids=["head", "index-copy"])
async def test_a_damaged_head_costs_a_tail_read_not_the_read(store, damaged):
    cache, (first, first_index) = version_3_reader(store)
    second, second_index = put_object(store, 2, [1000] * 8, first_offset=40, version=3)
    data = bytearray(store.objects[second])
    data[damaged] ^= 0xFF
    store.objects[second] = bytes(data)
    try:
        await read_first_object(
            cache, first, first_index, next_range(store, second, second_index, 40)
        )
        assert [t for t in store.tails if t[0] == second] == [(second, 1000)]
        assert await cache.index(second, len(data)) == second_index  # from the tail
        blocks = await read_object(cache, second, second_index)
        assert blocks == [bytes([n]) * 1000 for n in range(8)]
        assert cache.head_blocks == 4  # the first read's blocks are no less sound
    finally:
        await cache.close()


async def test_an_index_copy_longer_than_the_first_read_takes_one_more_get(store):
    cache, (first, first_index) = version_3_reader(store)
    # 100 blocks of 10 bytes: an index of 5200 bytes, longer than the first read
    second, second_index = put_object(store, 2, [10] * 100, first_offset=40, version=3)
    data_start = second_index[0].position
    try:
        await read_first_object(
            cache, first, first_index, next_range(store, second, second_index, 40)
        )
        assert [g for g in store.gets if g[0] == second][:2] == [
            (second, 0, 5036),
            (second, 5036, data_start),  # the rest of the copy
        ]
        assert cache.has_index(second) and cache.head_blocks == 0
        blocks = await read_object(cache, second, second_index)
        assert blocks == [bytes([n]) * 10 for n in range(100)]
    finally:
        await cache.close()


@pytest.mark.parametrize(("before", "after"), [(1, 3), (3, 1)])
async def test_the_index_read_ahead_follows_the_version_of_the_object_read_before(
    store, before, after
):
    """Readahead reads the first window with the index when the object the reader is in
    has its index in front (as the stream's next one most likely has too), else the
    tail; a guess that is wrong costs no more GETs than the other way."""
    cache = BlockCache(
        store, capacity_bytes=1 << 20, max_readahead_bytes=4000, index_read_bytes=1000
    )
    first, first_index = put_object(store, 1, [1000] * 4, version=before)
    second, second_index = put_object(store, 2, [1000] * 8, first_offset=40, version=after)
    start = second_index[0].position
    try:
        await read_first_object(
            cache, first, first_index, next_range(store, second, second_index, 40)
        )
        if before == 1:  # the tail read, then the first window
            assert [t for t in store.tails if t[0] == second] == [(second, 1000)]
            assert [g for g in store.gets if g[0] == second] == [(second, start, start + 4000)]
        else:  # the first window, no index in it: then the tail read
            assert [g for g in store.gets if g[0] == second] == [(second, 0, 5036)]
            assert [t for t in store.tails if t[0] == second] == [(second, 1000)]
            assert cache.head_blocks == 5
        blocks = await read_object(cache, second, second_index)
        assert blocks == [bytes([n]) * 1000 for n in range(8)]
        assert len([g for g in store.gets if g[0] == second]) == 2  # and the tail read
    finally:
        await cache.close()
