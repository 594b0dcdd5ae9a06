"""S3WalReader: one GET per S3-WAL object, shared by the reads of its locations and kept
for a short while, each read still checked on its own range.

Objects are real (WalObjectBuilder, or S3WalWriter for the last test); the store is a small
in-memory one that counts its GETs and can hold or fail them, and time is a fake clock, so
the reader's decisions show exactly. The last test writes and reads a LocalDirectoryStore.
"""

from __future__ import annotations

import asyncio
import struct

import crc32c
import pytest

from proxy.handoff.objects import (
    S3WalCorruptError,
    S3WalLocation,
    WalObjectBuilder,
    check_range,
    summarize_append,
)
from proxy.handoff.reader import WalObjectCache
from proxy.handoff.writer import S3WalReader, S3WalWriter
from proxy.objects.local import LocalDirectoryStore
from proxy.objects.store import ObjectNotFound, ObjectStoreError

HEADER = 61
WRITER = "test-proxy-1700000000000-0badcafe"


def batch_of_size(size: int, fill: int) -> bytes:
    """A v2 record batch as a producer sends it, `size` bytes long, payload all `fill`."""
    ts = 1_700_000_000_000
    body = struct.pack(">hiqqqhii", 0, 0, ts, ts, 7, 0, -1, 1) + bytes([fill]) * (size - HEADER)
    return struct.pack(">qiibI", 0, 9 + len(body), 0, 2, crc32c.crc32c(body)) + body


class CountingStore:
    """Objects in a dict. Records every GET; `gate` holds GETs until it is set, `fail`
    makes them fail."""

    def __init__(self) -> None:
        self.objects: dict[str, bytes] = {}
        self.gets: list[tuple[str, int | None, int | None]] = []
        self.gate: asyncio.Event | None = None
        self.fail: Exception | None = None
        self.got = asyncio.Event()  # set at each GET

    async def get(self, key: str, start: int | None = None, end: int | None = None) -> bytes:
        self.gets.append((key, start, end))
        self.got.set()
        if self.gate is not None:
            await self.gate.wait()
        if self.fail is not None:
            raise self.fail
        if key not in self.objects:
            raise ObjectNotFound(key)
        return self.objects[key][start:end]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def put_object(
    store: CountingStore, sequence: int, appends: list[tuple[int, bytes]]
) -> tuple[str, list[S3WalLocation]]:
    """An object of these (stream, batch) appends, stored; its key and their locations."""
    builder = WalObjectBuilder(WRITER, sequence)
    for stream, batch in appends:
        builder.add(stream, batch, summarize_append(batch))
    built = builder.build(created_ms=1_700_000_000_000)
    store.objects[built.key] = b"".join(built.pieces)
    return built.key, list(built.locations)


def appends_of(count: int, size: int = 300, streams: int = 5) -> list[tuple[int, bytes]]:
    return [(i % streams, batch_of_size(size + i, i)) for i in range(count)]


async def until_gets(store: CountingStore, count: int) -> None:
    async with asyncio.timeout(5):
        while len(store.gets) < count:
            store.got.clear()
            await store.got.wait()


async def test_concurrent_reads_of_one_object_share_one_whole_object_get():
    store = CountingStore()
    first = appends_of(20)
    key, locations = put_object(store, 0, first)
    other_key, other_locations = put_object(store, 1, appends_of(3, size=500))
    reader = S3WalReader(store)
    store.gate = asyncio.Event()
    reads = [asyncio.ensure_future(reader.read(loc)) for loc in locations + other_locations]
    await until_gets(store, 2)
    await asyncio.sleep(0.01)  # every read has had its turn: none started another GET
    assert sorted(store.gets) == sorted([(key, None, None), (other_key, None, None)])
    store.gate.set()
    results = await asyncio.gather(*reads)
    assert [bytes(r) for r in results[:20]] == [batch for _, batch in first]
    assert (reader.gets, reader.hits) == (2, 21)
    assert reader.bytes_fetched == len(store.objects[key]) + len(store.objects[other_key])
    # zero-copy: read-only slices of the one buffer the GET returned
    assert all(r.readonly and r.obj is results[0].obj for r in results[:20])
    assert results[20].obj is not results[0].obj


async def test_later_reads_hit_memory_until_the_object_expires():
    store, clock = CountingStore(), Clock()
    key, locations = put_object(store, 0, appends_of(4))
    reader = S3WalReader(store, cache_max_age_s=5.0, clock=clock)
    assert (
        bytes(await reader.read(locations[0]))
        == store.objects[key][locations[0].start : locations[0].end]
    )
    clock.now += 4.9
    await reader.read(locations[1])
    assert (reader.gets, reader.hits, len(store.gets)) == (1, 1, 1)
    clock.now += 0.1  # 5 s after the GET ended
    assert reader.cache.get(key, clock.now) is None and reader.cache.bytes == 0
    await reader.read(locations[2])
    assert (reader.gets, reader.hits, len(store.gets)) == (2, 1, 2)
    await reader.read(locations[3])
    assert (reader.gets, reader.hits) == (2, 2)


async def test_expired_objects_are_dropped_without_another_read():
    store = CountingStore()
    key, locations = put_object(store, 0, appends_of(2))
    reader = S3WalReader(store, cache_max_age_s=0.05)
    await reader.read(locations[0])
    assert key in reader.cache
    await asyncio.sleep(0.2)  # the loop runs the expiry's timer (due at 0.05 s) first
    assert len(reader.cache) == 0 and reader.cache.bytes == 0


async def test_the_cache_keeps_at_most_max_bytes_oldest_out_first():
    store, clock = CountingStore(), Clock()
    objects = [put_object(store, n, appends_of(3, size=1000)) for n in range(3)]
    size = len(store.objects[objects[0][0]])
    assert all(len(store.objects[key]) == size for key, _ in objects)
    reader = S3WalReader(store, cache_max_bytes=2 * size + size // 2, clock=clock)
    (a, a_locs), (b, b_locs), (c, c_locs) = objects
    for locations in (a_locs, b_locs, c_locs):
        await reader.read(locations[0])
        clock.now += 0.1
    assert a not in reader.cache and b in reader.cache and c in reader.cache
    assert reader.cache.bytes == 2 * size <= reader.cache.max_bytes
    assert reader.cache.evictions == 1
    await reader.read(b_locs[1])
    await reader.read(c_locs[1])
    assert (reader.gets, reader.hits) == (3, 2)
    await reader.read(a_locs[1])  # read again: evicts b, the oldest
    assert (reader.gets, reader.cache.evictions) == (4, 2)
    assert b not in reader.cache and c in reader.cache and a in reader.cache
    # an object larger than the bound is read, shared, never kept
    small = S3WalReader(store, cache_max_bytes=size - 1, clock=clock)
    assert [bytes(r) for r in await asyncio.gather(*map(small.read, a_locs))] == [
        store.objects[a][loc.start : loc.end] for loc in a_locs
    ]
    await small.read(a_locs[0])
    assert (small.gets, small.hits, small.cache.bytes) == (2, 2, 0)


def test_the_object_cache_expires_by_age_and_bounds_bytes():
    cache = WalObjectCache(max_bytes=100, max_age_s=5.0)
    assert cache.insert("x", memoryview(bytes(40)), now=0.0)
    assert cache.insert("y", memoryview(bytes(40)), now=1.0)
    assert cache.next_expiry() == 5.0
    assert cache.insert("z", memoryview(bytes(40)), now=2.0)  # x goes for room
    assert "x" not in cache and cache.bytes == 80 and cache.evictions == 1
    assert not cache.insert("big", memoryview(bytes(101)), now=2.0)
    assert cache.get("y", now=5.99) is not None and cache.get("y", now=6.0) is None
    assert len(cache) == 1 and cache.bytes == 40 and cache.next_expiry() == 7.0
    cache.expire(now=7.0)
    assert len(cache) == 0 and cache.bytes == 0 and cache.next_expiry() is None
    off = WalObjectCache(max_bytes=100, max_age_s=0)
    assert not off.insert("x", memoryview(bytes(1)), now=0.0) and len(off) == 0
    with pytest.raises(ValueError, match="cache_max_bytes=-1"):
        S3WalReader(CountingStore(), cache_max_bytes=-1)


async def test_a_failed_get_fails_every_waiting_read_and_is_not_cached():
    store = CountingStore()
    key, locations = put_object(store, 0, appends_of(5))
    reader = S3WalReader(store)
    store.gate = asyncio.Event()
    error = ObjectStoreError(key, "get", "injected outage", attempts=3, retryable=True)
    store.fail = error
    reads = [asyncio.ensure_future(reader.read(loc)) for loc in locations]
    await until_gets(store, 1)
    store.gate.set()
    results = await asyncio.gather(*reads, return_exceptions=True)
    assert all(result is error for result in results), results
    assert (reader.gets, reader.hits, reader.bytes_fetched, len(reader.cache)) == (1, 4, 0, 0)
    store.fail = None
    assert bytes(await reader.read(locations[2])) == appends_of(5)[2][1]
    assert reader.gets == 2 and len(store.gets) == 2
    # a missing object: the store's error as is, and nothing remembered
    missing = S3WalLocation("wal/0000/other-writer/0000000000000000", 0, 10, 1, 0)
    for _ in range(2):
        with pytest.raises(ObjectNotFound):
            await reader.read(missing)
    assert reader.gets == 4


async def test_a_cancelled_read_leaves_the_get_to_the_others():
    store = CountingStore()
    key, locations = put_object(store, 0, appends_of(2))
    reader = S3WalReader(store)
    store.gate = asyncio.Event()
    first = asyncio.ensure_future(reader.read(locations[0]))  # it starts the GET
    await until_gets(store, 1)
    second = asyncio.ensure_future(reader.read(locations[1]))
    await asyncio.sleep(0)
    first.cancel()
    await asyncio.sleep(0)
    store.gate.set()
    assert bytes(await second) == appends_of(2)[1][1]
    assert first.cancelled() and reader.gets == 1 and key in reader.cache


@pytest.mark.parametrize("cut", [False, True])
async def test_a_bad_range_fails_only_its_read_with_the_error_a_ranged_get_gave(cut):
    store = CountingStore()
    key, locations = put_object(store, 0, appends_of(3))
    original = store.objects[key]
    bad = locations[1]
    if cut:  # the object ends inside the second append
        damaged = original[: bad.end - 10]
    else:  # a byte of its base offset, outside Kafka's CRC: the location's CRC sees it
        damaged = bytearray(original)
        damaged[bad.start + 3] ^= 0x10
        damaged = bytes(damaged)
    store.objects[key] = damaged
    reader = S3WalReader(store)
    results = await asyncio.gather(*map(reader.read, locations), return_exceptions=True)
    assert reader.gets == 1
    assert bytes(results[0]) == original[locations[0].start : locations[0].end]
    error = results[1]
    assert isinstance(error, S3WalCorruptError)
    assert (error.key, error.start, error.end) == (key, bad.start, bad.end)
    with pytest.raises(S3WalCorruptError) as ranged:  # what a GET of just the range gave
        check_range(damaged[bad.start : bad.end], bad)
    assert str(error) == str(ranged.value)
    assert ("truncated" if cut else "CRC-32C mismatch") in str(error)
    last = results[2]
    if cut:  # past the end: nothing read, as a ranged GET past the end reads nothing
        assert isinstance(last, S3WalCorruptError) and "read 0 bytes" in str(last)
    else:
        assert bytes(last) == original[locations[2].start : locations[2].end]


async def test_every_location_the_writer_put_reads_back_from_a_local_directory_store(tmp_path):
    batches = [(i % 12, batch_of_size(200 + 37 * i, i)) for i in range(60)]
    async with LocalDirectoryStore(tmp_path) as store:
        writer = S3WalWriter(store, WRITER, max_bytes=8 * 1024, max_delay_s=0.05)
        async with writer:
            locations = await asyncio.gather(*(writer.append(s, b) for s, b in batches))
        keys = {loc.object_key for loc in locations}
        assert len(keys) >= 10  # 77,490 bytes of batches in objects of at most 8 KiB
        reader = S3WalReader(store)
        read = await asyncio.gather(*map(reader.read, locations))
        assert [bytes(r) for r in read] == [batch for _, batch in batches]
        assert (reader.gets, reader.hits) == (len(keys), len(locations) - len(keys))
        assert reader.bytes_fetched == sum(
            tmp_path.joinpath(*key.split("/")).stat().st_size for key in keys
        )
        for location in locations:  # again, one by one: all from memory
            await reader.read(location)
        assert reader.gets == len(keys)
        # a range no append has: refused as before, without a GET
        first = locations[0]
        with pytest.raises(S3WalCorruptError, match="not a range an append can have"):
            await reader.read(S3WalLocation(first.object_key, 5, 5, 0, 0))
        with pytest.raises(ValueError, match="range start -1 is negative"):
            await reader.read(S3WalLocation(first.object_key, -1, 5, 0, 0))
        assert reader.gets == len(keys)
