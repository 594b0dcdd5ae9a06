"""The block cache's own logic: LRU bound and honest byte accounting, single flight,
failures that cache nothing, readahead that grows on sequential reads and resets on a
random one, corrupt blocks named.

Objects are real (ObjectWriter); the store is a small in-memory one that counts and can
hold or fail its GETs, so the cache's decisions show exactly. The same reads against the
local directory store and MinIO are in tests/integration/tiering/test_stream_reader.py.
"""

from __future__ import annotations

import asyncio

import pytest
from prometheus_client import CollectorRegistry

from proxy.objects.format import IndexEntry, ObjectFormatError
from proxy.objects.format_writer import ObjectWriter
from proxy.objects.keys import ObjectKind
from proxy.objects.store import ObjectNotFound, ObjectStoreError
from proxy.reads.blockcache import BlockCache
from proxy.reads.blockplan import BlockLru, Readahead, plan_fetches

STREAM = 7


class CountingStore:
    """Objects in a dict. Records every GET; `gate` holds GETs until it is set, `fail`
    makes them fail."""

    def __init__(self) -> None:
        self.objects: dict[str, bytes] = {}
        self.gets: list[tuple[str, int | None, int | None]] = []
        self.tails: list[tuple[str, int]] = []
        self.gate: asyncio.Event | None = None
        self.fail: Exception | None = None

    async def get(self, key: str, start: int | None = None, end: int | None = None) -> bytes:
        self.gets.append((key, start, end))
        return (await self._object(key))[start:end]

    async def get_tail(self, key: str, length: int) -> bytes:
        self.tails.append((key, length))
        return (await self._object(key))[-length:]

    async def _object(self, key: str) -> bytes:
        if self.gate is not None:
            await self.gate.wait()
        if self.fail is not None:
            raise self.fail
        if key not in self.objects:
            raise ObjectNotFound(key)
        return self.objects[key]

    def block_gets(self) -> list[int]:
        """The size of each block GET, in order."""
        return [end - start for _, start, end in self.gets]


def put_object(
    store: CountingStore,
    object_id: int,
    sizes: list[int],
    first_offset: int = 0,
    kind: ObjectKind = ObjectKind.STREAM,
    version: int = 1,
) -> tuple[str, tuple]:
    """An object (of `kind`, format `version`) of one stream with blocks of these sizes,
    each of 10 offsets from `first_offset` on; block n's bytes are all n."""
    writer = ObjectWriter(object_id, kind, version=version)  # blocks of filler bytes
    for n, size in enumerate(sizes):
        start = first_offset + 10 * n
        no_timestamp = None if version == 1 else -1  # filler: no batch headers to read
        writer.add_block(
            STREAM, bytes([n % 256]) * size, start, start + 10, 10, max_timestamp=no_timestamp
        )
    built = writer.build()
    store.objects[built.key] = built.to_bytes()
    return built.key, built.index


async def settle() -> None:
    """Let GETs started in the background finish (the store answers at once)."""
    for _ in range(3):
        await asyncio.sleep(0)


@pytest.fixture
def store() -> CountingStore:
    return CountingStore()


@pytest.fixture
async def cache(store):
    cache = BlockCache(store, capacity_bytes=1 << 20, max_readahead_bytes=8000)
    yield cache
    await cache.close()


async def read(cache: BlockCache, key: str, index, first: int, wanted: int = 1, reader="r"):
    return await cache.blocks(key, index[first:], wanted, reader_id=reader)


# -- the pure parts ------------------------------------------------------------------------


def test_plan_fetches_one_get_per_run_of_missing_wanted_blocks():
    sizes = [100] * 8
    present = [False, False, True, False, True, False, False, False]
    assert plan_fetches(sizes, present, wanted=5, window=0) == ([(0, 2), (3, 4)], None)
    # readahead rides on the read's GET when that one ends where readahead starts and
    # is at least as large; else it is a GET of its own, so the read waits for less
    assert plan_fetches(sizes, [False] * 8, wanted=2, window=200) == ([(0, 4)], None)
    assert plan_fetches(sizes, [False] * 8, wanted=2, window=300) == ([(0, 2)], (2, 5))


def test_plan_fetches_reads_ahead_in_the_background_when_less_than_half_a_window_is_left():
    sizes = [100] * 10
    present = [True, True, True, False, False, False, False, False, True, False]
    # block 7, less than a quarter of a window before a block at hand, comes along
    assert plan_fetches(sizes, present, wanted=1, window=401) == ([], (3, 8))
    # two blocks (200) before the block at hand are not less than a quarter of 401: cut
    present_later = [True] * 3 + [False] * 6 + [True]
    assert plan_fetches(sizes, present_later, wanted=1, window=401) == ([], (3, 7))
    assert plan_fetches(sizes, present, wanted=1, window=400) == ([], None)  # 200 ahead
    # a block in flight or cached ends the readahead GET; a block larger than the window
    # is fetched alone
    assert plan_fetches(sizes, present, wanted=2, window=1000) == ([], (3, 8))
    assert plan_fetches([100, 5000, 300], [True, False, False], 1, 1000) == ([], (1, 2))
    assert plan_fetches(sizes, [True] * 10, wanted=1, window=10_000) == ([], None)  # run end


def entry(stream: int, start: int, end: int, size: int = 1000) -> IndexEntry:
    return IndexEntry(stream, start, end, end - start, 0, size, 0)


def test_readahead_doubles_on_sequential_reads_and_resets_on_a_random_one():
    policy = Readahead(max_bytes=4000)
    blocks = [entry(1, 10 * n, 10 * n + 10) for n in range(8)]
    assert policy.next_read(blocks[0], blocks[0]) == 0  # nothing read before: random
    assert [policy.next_read(b, b) for b in blocks[1:6]] == [1000, 2000, 4000, 4000, 4000]
    assert policy.next_read(blocks[5], blocks[5]) == 4000  # the same block again
    assert policy.next_read(blocks[2], blocks[2]) == 0  # backwards
    assert policy.next_read(blocks[3], blocks[4]) == 1000  # a read of two blocks
    assert policy.next_read(blocks[4], blocks[6]) == 2000  # on from inside the last one
    assert policy.next_read(blocks[7], blocks[7]) == 4000
    assert policy.next_read(entry(2, 60, 70), entry(2, 60, 70)) == 0  # another stream


def view(size: int, fill: int = 0) -> memoryview:
    return memoryview(bytes([fill]) * size)


def test_the_lru_stays_within_its_bound_and_evicts_the_least_recently_used():
    lru = BlockLru(3000)
    for n in range(10):
        assert lru.insert("k", [(n * 1000, view(1000))])
        assert lru.get(("k", 0)) is not None  # block 0 is used all the time
        assert lru.bytes <= 3000
    assert lru.positions("k") == [0, 8000, 9000]
    assert (lru.bytes, lru.evictions) == (3000, 7)
    assert not lru.insert("k", [(20_000, view(3001))])  # larger than the cache: not cached
    assert lru.positions("k") == [0, 8000, 9000]


def test_a_get_buffer_is_charged_whole_until_eviction_leaves_half_of_it_then_copied_out():
    lru = BlockLru(5000)
    buffer = bytes(4000)
    run = memoryview(buffer)
    lru.insert("a", [(n * 1000, run[n * 1000 : n * 1000 + 1000]) for n in range(4)])
    lru.insert("b", [(0, view(1000))])
    assert lru.bytes == 5000
    lru.get(("a", 3000))  # a hot block of the run
    lru.insert("c", [(0, view(1000))])
    # evicting block 0 frees nothing (the buffer lives on in blocks 1-3); evicting block
    # 1 leaves half of it cached, so blocks 2 and 3 get copies and the buffer is let go
    assert lru.positions("a") == [2000, 3000] and lru.evictions == 2
    assert lru.bytes == 2000 + 1000 + 1000
    for position in (2000, 3000):
        copy = lru.get(("a", position))
        assert copy is not None and copy.obj is not buffer and copy == run[position:][:1000]
    lru.insert("d", [(0, view(2000))])  # evicts b
    lru.insert("e", [(0, view(1000))])  # evicts c
    lru.insert("f", [(0, view(1000))])  # evicts a copied block, which frees its own bytes
    assert lru.positions("a") == [3000] and lru.evictions == 5
    assert lru.bytes == 1000 + 2000 + 1000 + 1000
    assert lru.forget("a") == 1 and lru.bytes == 4000 and lru.evictions == 5


# -- the cache -------------------------------------------------------------------------------


async def test_concurrent_readers_of_a_block_share_one_get(store, cache):
    key, index = put_object(store, 1, [1000] * 4)
    await cache.index(key, len(store.objects[key]))
    store.gate = asyncio.Event()
    readers = [asyncio.create_task(read(cache, key, index, 2, reader=n)) for n in range(20)]
    await settle()
    store.gate.set()
    results = await asyncio.gather(*readers)
    assert store.block_gets() == [1000]
    assert all(r[0] == bytes([2]) * 1000 and r[0].obj is results[0][0].obj for r in results)
    assert (cache.misses, cache.hits, cache.gets) == (20, 0, 2)  # one index read, one block
    assert await read(cache, key, index, 2, reader="late") == results[0]
    assert cache.hits == 1 and len(store.gets) == 1


async def test_concurrent_readers_of_an_object_share_one_index_read(store, cache):
    key, index = put_object(store, 1, [1000] * 4)
    store.gate = asyncio.Event()
    loads = [asyncio.create_task(cache.index(key, len(store.objects[key]))) for _ in range(10)]
    await settle()
    store.gate.set()
    assert all(i == index for i in await asyncio.gather(*loads))
    assert await cache.index(key, len(store.objects[key])) == index
    assert len(store.tails) == 1 and (cache.index_misses, cache.index_hits) == (10, 1)


async def test_a_failed_get_fails_all_its_waiters_and_caches_nothing(store, cache):
    key, index = put_object(store, 1, [1000] * 4)
    await cache.index(key, len(store.objects[key]))
    store.gate = asyncio.Event()
    readers = [asyncio.create_task(read(cache, key, index, 0, 2, reader=n)) for n in range(5)]
    await settle()
    store.fail = ObjectStoreError(key, "get", "injected", retryable=True)
    store.gate.set()
    results = await asyncio.gather(*readers, return_exceptions=True)
    assert all(r is store.fail for r in results) and len(store.gets) == 1
    assert cache.cached_positions(key) == [] and cache.bytes == 0
    assert cache.has_index(key)  # a store error says nothing about the object
    store.fail = None
    assert [bytes(b) for b in await read(cache, key, index, 0, 2)] == [bytes(1000), b"\1" * 1000]
    assert len(store.gets) == 2 and cache.cached_positions(key) == [0, 1000]


async def test_a_reader_cancelled_while_waiting_does_not_cancel_the_get(store, cache):
    key, index = put_object(store, 1, [1000] * 2)
    await cache.index(key, len(store.objects[key]))
    store.gate = asyncio.Event()
    first = asyncio.create_task(read(cache, key, index, 1, reader="a"))
    second = asyncio.create_task(read(cache, key, index, 1, reader="b"))
    await settle()
    first.cancel()
    store.gate.set()
    assert (await second)[0] == b"\1" * 1000
    with pytest.raises(asyncio.CancelledError):
        await first
    assert cache.cached_positions(key) == [1000] and len(store.gets) == 1


async def test_blocks_a_read_holds_stay_its_own_whatever_readahead_evicts(store):
    cache = BlockCache(store, capacity_bytes=4000)
    first, index = put_object(store, 1, [1000] * 2)
    other, other_index = put_object(store, 2, [1000] * 4)
    await read(cache, first, index, 0)
    store.gate = asyncio.Event()
    reading = asyncio.create_task(read(cache, first, index, 0, 2, reader="a"))
    await settle()  # block 0 is taken from the cache, block 1 is on its way
    filling = asyncio.create_task(read(cache, other, other_index, 0, 4, reader="b"))
    await settle()
    store.gate.set()
    assert [bytes(b) for b in await reading] == [b"\0" * 1000, b"\1" * 1000]
    await filling
    assert cache.cached_positions(first) == [] and cache.bytes == 4000
    await cache.close()


async def test_closing_cancels_the_gets_in_flight_and_their_waiters(store):
    cache = BlockCache(store)
    key, index = put_object(store, 1, [1000] * 2)
    store.gate = asyncio.Event()
    waiting = asyncio.create_task(read(cache, key, index, 0))
    await settle()
    await cache.close()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert cache.cached_positions(key) == []


async def test_adjacent_wanted_blocks_come_in_one_get_cut_without_copies(store, cache):
    key, index = put_object(store, 1, [1000, 2000, 3000, 500])
    await cache.index(key, len(store.objects[key]))
    blocks = await read(cache, key, index, 1, 3)
    assert store.block_gets() == [5500]
    assert [len(b) for b in blocks] == [2000, 3000, 500]
    assert blocks[0].obj is blocks[2].obj  # slices of the one GET buffer
    # the object is smaller than the tail read, so that one read it whole
    assert cache.bytes == 5500 and cache.bytes_fetched == len(store.objects[key]) + 5500


async def test_readahead_grows_on_sequential_reads_and_resets_on_a_random_one(store, cache):
    key, index = put_object(store, 1, [1000] * 64)
    await cache.index(key, len(store.objects[key]))
    for n in range(32):
        assert (await read(cache, key, index, n))[0] == bytes([n]) * 1000
        await settle()
    # one block, then the window doubles to its maximum (8000) and stays ahead
    assert store.block_gets()[:5] == [1000, 2000, 2000, 4000, 8000]
    assert set(store.block_gets()[5:]) == {8000} and len(store.gets) == 8
    assert (cache.misses, cache.hits) == (2, 30)
    fetched = len(store.gets)
    await read(cache, key, index, 50)  # far ahead of the window: random
    await read(cache, key, index, 51)
    assert store.block_gets()[fetched:] == [1000, 2000]


async def test_readers_have_windows_of_their_own(store, cache):
    key, index = put_object(store, 1, [1000] * 32)
    await cache.index(key, len(store.objects[key]))
    for n in range(4):
        await read(cache, key, index, n, reader="a")
        await read(cache, key, index, 16 + n, reader="b")
        await settle()
    assert store.block_gets() == [1000, 1000, 2000, 2000, 2000, 2000, 4000, 4000]


async def test_the_window_is_at_most_a_quarter_of_the_capacity(store):
    cache = BlockCache(store, capacity_bytes=16_000, max_readahead_bytes=1 << 20)
    assert cache.max_readahead_bytes == 4000
    await cache.close()


async def test_a_corrupt_block_is_named_and_nothing_of_its_object_stays_cached(store, cache):
    key, index = put_object(store, 1, [1000] * 4)
    good = store.objects[key]
    await cache.index(key, len(good))
    await read(cache, key, index, 0, reader="first")
    store.objects[key] = good[:2500] + b"\xff" + good[2501:]
    with pytest.raises(ObjectFormatError) as raised:
        await read(cache, key, index, 2)
    assert raised.value.key == key and "block CRC mismatch" in str(raised.value)
    assert str(raised.value).startswith(f"object {key}: ")
    assert cache.cached_positions(key) == [] and not cache.has_index(key) and cache.bytes == 0
    store.objects[key] = good
    assert (await read(cache, key, index, 2))[0] == b"\2" * 1000


async def test_a_corrupt_block_read_ahead_fails_no_one_and_is_not_cached(store, cache):
    key, index = put_object(store, 1, [1000] * 8)
    good = store.objects[key]
    store.objects[key] = good[:3500] + b"\xff" + good[3501:]
    await cache.index(key, len(good))
    for n in range(3):  # block 3 is read ahead, in the background, and fails there
        await read(cache, key, index, n)
        await settle()
    assert not cache.has_index(key) and cache.cached_positions(key) == []
    with pytest.raises(ObjectFormatError, match="block CRC mismatch"):
        await read(cache, key, index, 3)


async def test_a_missing_or_truncated_object_fails_its_index_read(store, cache):
    with pytest.raises(ObjectNotFound):
        await cache.index("0100/stream/0000000000000001", 500)
    key, _ = put_object(store, 1, [1000] * 2)
    with pytest.raises(ObjectFormatError, match="truncated"):
        await cache.index(key, len(store.objects[key]) + 1)
    assert not cache.has_index(key)


async def test_an_index_larger_than_the_tail_read_takes_one_more_get(store):
    cache = BlockCache(store, index_read_bytes=100, index_entries=2)
    keys = [put_object(store, n, [10] * 3)[0] for n in (1, 2, 3)]
    for key in keys:
        await cache.index(key, len(store.objects[key]))
    assert len(store.tails) == 3 and len(store.gets) == 3 and cache.gets == 6
    assert [cache.has_index(key) for key in keys] == [False, True, True]  # bounded
    await cache.close()


async def test_the_counters_are_metrics_on_the_registry_given(store):
    registry = CollectorRegistry(auto_describe=True)
    cache = BlockCache(store, registry=registry)
    key, index = put_object(store, 1, [1000] * 2)
    await cache.index(key, len(store.objects[key]))
    await read(cache, key, index, 0)
    await read(cache, key, index, 0)

    def sample(name: str) -> float | None:
        return registry.get_sample_value(f"tierproxy_block_cache_{name}")

    assert (sample("hits_total"), sample("misses_total"), sample("gets_total")) == (1, 1, 2)
    assert sample("fetched_bytes_total") == cache.bytes_fetched
    assert (sample("bytes"), sample("capacity_bytes")) == (1000, 256 << 20)
    assert (sample("evictions_total"), sample("index_misses_total")) == (0, 1)
    await cache.close()
    assert sample("hits_total") is None
