"""StreamReader through the block cache on real stores: the local directory store and MinIO.

Objects are laid out by ObjectWriter from batches kafka-python's producer code writes, and
committed to a real `MetadataState` (the rules every metadata reader applies): three
streams over stream set objects and stream objects, with offsets compaction left empty
inside blocks and between objects. Every offset reads back exactly the batches Kafka would
return; sequential reads cost few GETs per GiB; a corrupt object fails with its key and
leaves nothing cached; a deleted one raises ObjectNotFound.
"""

from __future__ import annotations

import random
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
from uuid import UUID

import pytest

from proxy.metadata.codec import encode
from proxy.metadata.records import ObjectCommit, OffsetRange, ShardClaim, StreamCutover
from proxy.metadata.state import MetadataState
from proxy.metadata.streams import stream_id
from proxy.objects.format import ObjectFormatError
from proxy.objects.format_writer import BuiltObject, ObjectWriter
from proxy.objects.keys import ObjectKind
from proxy.objects.local import LocalDirectoryStore
from proxy.objects.store import ObjectNotFound
from proxy.reads.blockcache import DEFAULT_INDEX_READ_BYTES, BlockCache
from proxy.reads.stream_reader import ReadResult, StreamReader
from proxy.records.batches import read_batch_header, with_base_offset
from tests.support.batches import build_batch
from tests.support.stores import PrefixedStore

TOPIC = UUID("0b6f3c52-8e1d-4f7a-a2c9-5d4e3f2a1b0c")
S1, S2, S3 = (stream_id(TOPIC, p) for p in range(3))
NOW_MS = 1_700_000_000_000
MiB = 1024 * 1024
GiB = 1024 * MiB


def kafka_batch(records: int, value_size: int, tag: int) -> bytes:
    """A v2 batch as kafka-python's producer writes it (base offset 0)."""
    return build_batch([(f"{tag}:{i}:".encode() * value_size)[:value_size] for i in range(records)])


@dataclass
class Batch:
    base: int
    next: int
    data: bytes


@dataclass
class Layout:
    """Objects, their commits applied to a metadata state, and each stream's batches."""

    state: MetadataState = field(default_factory=lambda: MetadataState(0, 1))
    objects: list[BuiltObject] = field(default_factory=list)
    batches: dict[int, list[Batch]] = field(default_factory=dict)
    ends: dict[int, int] = field(default_factory=dict)
    _next_id: int = 1

    def __post_init__(self) -> None:
        self.write(ShardClaim(0, 1, "proxy-a", NOW_MS))

    def write(self, record: object) -> None:
        key, value = encode(record)
        verdict = self.state.apply(key, value, self.state.next_offset)
        assert verdict.accepted, verdict.reason

    def tier(self, partitions: Iterable[int]) -> None:
        for partition in partitions:
            stream = stream_id(TOPIC, partition)
            self.write(StreamCutover(0, stream, 1, 1, TOPIC, partition, 0, 0, 0, NOW_MS))
            self.batches[stream], self.ends[stream] = [], 0

    def commit(self, kind: ObjectKind, runs: dict[int, list[Batch]], block_bytes: int) -> None:
        """One object holding, per stream, a run of batches continuing the stream."""
        writer = ObjectWriter(self._next_id, kind)
        self._next_id += 1
        ranges = []
        for stream in sorted(runs):
            run = runs[stream]
            start = self.ends[stream]  # below the first batch when compaction left a gap
            records = b"".join(b.data for b in run)
            writer.add_batches(stream, records, start_offset=start, max_block_bytes=block_bytes)
            self.batches[stream] += run
            self.ends[stream] = run[-1].next
            ranges.append(OffsetRange(stream, start, run[-1].next))
        built = writer.build()
        self.objects.append(built)
        self.write(ObjectCommit(0, built.footer.object_id, kind, built.size, 1, NOW_MS, ranges))

    def expected(self, stream: int, offset: int, max_bytes: int) -> tuple[list[bytes], int]:
        """What Kafka returns: from the batch holding `offset`, while the total stays
        within `max_bytes`, the first batch whole whatever its size."""
        found: list[Batch] = []
        size = 0
        for batch in self.batches[stream]:
            if batch.next <= offset:
                continue
            if found and size + len(batch.data) > max_bytes:
                break
            found.append(batch)
            size += len(batch.data)
        return [b.data for b in found], found[-1].next if found else offset


def stream_batches(
    rng: random.Random, count: int, first: int, tag: int, big_at: int | None = None
) -> list[Batch]:
    """`count` batches of 1-4 records from offset `first`, some offsets left empty (as
    compaction leaves them) before every ninth batch; batch `big_at` is a 6 KB one."""
    batches = []
    offset = first
    for n in range(count):
        if n % 9 == 4:
            offset += 3
        records = 1 if n == big_at else 1 + n % 4
        value_size = 6000 if n == big_at else rng.choice([20, 150, 600])
        data = with_base_offset(kafka_batch(records, value_size, tag * 1000 + n), offset)
        batches.append(Batch(offset, offset + records, bytes(data)))
        offset += records
    return batches


def three_streams() -> Layout:
    """Three streams over five objects: stream set objects 1, 2 and 5, stream objects 3
    (of S1, holding a batch larger than a block and than a read) and 4 (of S3)."""
    rng = random.Random(7)
    layout = Layout()
    layout.tier([0, 1, 2])
    set_kind, stream_kind = ObjectKind.STREAM_SET, ObjectKind.STREAM

    def more(stream: int, count: int, big_at: int | None = None) -> list[Batch]:
        start = layout.ends[stream] + (2 if layout.ends[stream] else 0)  # a gap between objects
        return stream_batches(rng, count, start, stream % 97, big_at)

    layout.commit(set_kind, {S1: more(S1, 30), S2: more(S2, 25), S3: more(S3, 20)}, 2048)
    layout.commit(set_kind, {S1: more(S1, 30), S2: more(S2, 25)}, 2048)
    layout.commit(stream_kind, {S1: more(S1, 20, big_at=9)}, 2048)
    layout.commit(stream_kind, {S3: more(S3, 25)}, 1500)
    layout.commit(set_kind, {S1: more(S1, 20), S2: more(S2, 20), S3: more(S3, 20)}, 4096)
    return layout


class CountingStore(PrefixedStore):
    """The store under test under this test's own key prefix (the MinIO bucket is shared)."""

    def s3_gets(self) -> float | None:
        """GetObject requests S3 counted (None for the local store)."""
        metrics = getattr(self.inner, "metrics", None)
        return None if metrics is None else metrics.count("GetObject")


@pytest.fixture(params=["local", pytest.param("s3", marks=pytest.mark.minio)])
async def store(request, tmp_path, key_prefix, make_s3_store) -> AsyncIterator[CountingStore]:
    if request.param == "local":
        async with LocalDirectoryStore(tmp_path / "objects") as local:
            yield CountingStore(local, key_prefix)
    else:
        yield CountingStore(await make_s3_store(request.getfixturevalue("s3_server")), key_prefix)


async def put_all(store: CountingStore, layout: Layout) -> None:
    for built in layout.objects:
        await store.put(built.key, built.pieces)


@pytest.fixture
async def cache(store) -> AsyncIterator[BlockCache]:
    cache = BlockCache(store, capacity_bytes=64 * MiB)
    yield cache
    await cache.close()


async def test_every_offset_reads_exactly_the_batches_kafka_would_return(store, cache):
    layout = three_streams()
    await put_all(store, layout)
    reader = StreamReader(cache)
    for stream in (S1, S2, S3):
        end = layout.ends[stream]
        assert layout.state.stream_end(stream) == end
        for max_bytes in (0, 1000, 3000, MiB):
            for offset in range(end + 2):
                got = await reader.read(
                    layout.state, stream, offset, max_bytes, reader_id=(stream, max_bytes)
                )
                batches, next_offset = layout.expected(stream, offset, max_bytes)
                where = f"stream {stream} offset {offset} max bytes {max_bytes}"
                assert [bytes(b) for b in got.batches] == batches, where
                assert (got.next_offset, got.size) == (next_offset, sum(map(len, batches)))
    # Everything fits in the cache: each object's index was read once (the whole object,
    # as they are smaller than a tail read) and each block once, most of them in runs.
    # The stream objects were read ahead into: their index read is a read of their first
    # window (version 3: the head and the index's copy in front), the whole object here;
    # their blocks came with it, one buffer, charged whole (head, indexes and footer too).
    blocks = [entry for built in layout.objects for entry in built.index]
    assert all(built.size <= DEFAULT_INDEX_READ_BYTES for built in layout.objects)
    whole = [built for built in layout.objects if built.footer.kind == ObjectKind.STREAM]
    assert all(built.footer.version == 3 for built in layout.objects)
    assert cache.head_blocks == sum(len(built.index) for built in whole)
    overhead = sum(built.size - sum(e.size for e in built.index) for built in whole)
    assert cache.evictions == 0 and cache.bytes == sum(e.size for e in blocks) + overhead
    block_gets = cache.bytes - sum(built.size for built in whole)  # the other blocks
    assert cache.bytes_fetched == sum(o.size for o in layout.objects) + block_gets
    assert cache.gets < len(layout.objects) + len(blocks) / 2
    if store.s3_gets() is not None:
        assert store.s3_gets() == cache.gets


async def test_the_first_batch_is_whole_and_the_rest_stay_within_max_bytes(store, cache):
    layout = three_streams()
    await put_all(store, layout)
    reader = StreamReader(cache)
    big = max(layout.batches[S1], key=lambda b: len(b.data))
    assert len(big.data) > 6000
    got = await reader.read(layout.state, S1, big.base, 100, reader_id="a")
    assert [bytes(b) for b in got.batches] == [big.data] and got.next_offset == big.next
    at = layout.batches[S2].index(next(b for b in layout.batches[S2] if b.base >= 60))
    run = layout.batches[S2][at:]
    fits, sixth = sum(len(b.data) for b in run[:5]), len(run[5].data)
    for max_bytes, count in ((fits, 5), (fits - 1, 4), (fits + sixth - 1, 5), (fits + sixth, 6)):
        got = await reader.read(layout.state, S2, run[0].base, max_bytes, reader_id="b")
        assert [bytes(b) for b in got.batches] == [b.data for b in run[:count]]
        assert got.size <= max_bytes and got.next_offset == run[count - 1].next
    # no object holds the stream's end (the owner's tail does), nor any offset of a
    # stream that is not tiered
    end = layout.ends[S2]
    assert await reader.read(layout.state, S2, end, MiB, reader_id="c") == ReadResult((), end, 0)
    assert await reader.read(layout.state, 12345, 0, MiB, reader_id="c") == ReadResult((), 0, 0)


async def test_sequential_reads_take_few_gets_per_gib(store):
    """One stream in two 16 MiB stream objects of 1 MiB blocks, read as a consumer does
    with max.partition.fetch.bytes at its default of 1 MiB."""
    layout = Layout()
    stream = stream_id(TOPIC, 9)
    layout.tier([9])
    template = kafka_batch(1, 16_000, 9)
    for first in (0, 1024):
        offsets = range(first, first + 1024)
        run = [Batch(o, o + 1, bytes(with_base_offset(template, o))) for o in offsets]
        layout.commit(ObjectKind.STREAM, {stream: run}, 1 * MiB)
    await put_all(store, layout)
    everything = b"".join(b.data for b in layout.batches[stream])

    async def read_all(cache: BlockCache) -> int:
        reader = StreamReader(cache)
        offset, parts = 0, []
        while got := await reader.read(layout.state, stream, offset, MiB, reader_id="consumer"):
            assert got.size <= MiB
            parts += got.batches
            offset = got.next_offset
        assert offset == 2048 and b"".join(parts) == everything
        return cache.gets

    with_readahead = BlockCache(store, capacity_bytes=64 * MiB)
    without = BlockCache(store, capacity_bytes=64 * MiB, max_readahead_bytes=0)
    try:
        gets = await read_all(with_readahead)
        gets_without = await read_all(without)
    finally:
        await with_readahead.close()
        await without.close()
    per_gib = gets * GiB / len(everything)
    per_gib_without = gets_without * GiB / len(everything)
    print(f"GETs per GiB: {per_gib:.0f} with readahead, {per_gib_without:.0f} without")
    assert per_gib <= 400 and per_gib * 3 <= per_gib_without
    assert with_readahead.hits > 4 * with_readahead.misses
    if store.s3_gets() is not None:
        assert store.s3_gets() == gets + gets_without


def flip(data: bytes, position: int) -> bytes:
    return data[:position] + bytes([data[position] ^ 0x40]) + data[position + 1 :]


async def test_a_corrupt_object_fails_naming_it_and_nothing_of_it_is_cached(store, cache):
    layout = three_streams()
    await put_all(store, layout)
    reader = StreamReader(cache)
    second, fourth = layout.objects[1], layout.objects[3]
    entry = next(e for e in second.index if e.stream_id == S2)
    good = second.to_bytes()
    await store.put(second.key, flip(good, entry.position + 30))
    assert await reader.read(layout.state, S1, 0, MiB, reader_id="s1")  # reads objects 1, 2
    with pytest.raises(ObjectFormatError, match="block CRC mismatch") as raised:
        await reader.read(layout.state, S2, entry.start_offset, 1000, reader_id="s2")
    assert raised.value.key == second.key and second.key in str(raised.value)
    assert cache.cached_positions(second.key) == [] and not cache.has_index(second.key)
    # a damaged index: the object's first read fails, naming it
    data = fourth.to_bytes()
    await store.put(fourth.key, flip(data, fourth.footer.index_position + 5))
    with pytest.raises(ObjectFormatError, match="index CRC mismatch") as raised:
        await reader.read(layout.state, S3, layout.batches[S3][25].base, MiB, reader_id="s3")
    assert raised.value.key == fourth.key and cache.cached_positions(fourth.key) == []
    # mended, both read again
    await store.put(second.key, good)
    await store.put(fourth.key, data)
    for stream in (S2, S3):
        got = await reader.read(layout.state, stream, 0, 10 * MiB, reader_id=stream)
        assert [bytes(b) for b in got.batches] == [b.data for b in layout.batches[stream]]


async def test_a_deleted_object_raises_object_not_found(store, cache):
    layout = three_streams()
    await put_all(store, layout)
    reader = StreamReader(cache)
    last = layout.objects[4]
    await store.delete([last.key])
    start = layout.state.committed_ranges(S3)[-1].start_offset
    with pytest.raises(ObjectNotFound):
        await reader.read(layout.state, S3, start, MiB, reader_id="a")
    with pytest.raises(ObjectNotFound):  # a read that runs into it fails as a whole
        await reader.read(layout.state, S1, 0, 10 * MiB, reader_id="b")
    assert not cache.has_index(last.key) and cache.cached_positions(last.key) == []
    got = await reader.read(layout.state, S1, 0, 1000, reader_id="c")  # objects before it
    assert [bytes(b) for b in got.batches] == layout.expected(S1, 0, 1000)[0]


class CompactsOnFirstBlockRead(CountingStore):
    """The store, and a compaction committed to `layout.state` while a read is between two
    objects: right after the first GET of a block of `first_key` (an index read is a tail
    read, not counted)."""

    def __init__(self, inner: CountingStore, layout: Layout, first_key: str, compaction) -> None:
        super().__init__(inner.inner, inner.prefix)
        self.layout, self.first_key, self.compaction = layout, first_key, compaction
        self.swapped = False

    async def get(self, key: str, start: int | None = None, end: int | None = None) -> bytes:
        data = await super().get(key, start, end)
        if key == self.first_key and not self.swapped:
            self.swapped = True
            self.layout.write(self.compaction)
        return data


async def test_a_compaction_between_two_objects_of_a_read_repeats_no_batch(store):
    """A read moves from one object to the next while the compactor swaps both for one
    stream object holding the whole run: the read goes on in the new object, from where it
    was, and no batch is returned twice (a consumer took the repeats as new records)."""
    rng = random.Random(11)
    layout = Layout()
    layout.tier([0])
    first = stream_batches(rng, 12, 0, 1)
    second = stream_batches(rng, 12, first[-1].next, 2)
    layout.commit(ObjectKind.STREAM, {S1: first}, 2048)
    layout.commit(ObjectKind.STREAM, {S1: second}, 2048)
    merged = ObjectWriter(3, ObjectKind.STREAM)
    merged.add_batches(
        S1, b"".join(b.data for b in first + second), start_offset=0, max_block_bytes=1 << 20
    )  # one block: the block holding where the read is starts at the run's first batch
    built = merged.build()
    await put_all(store, layout)
    await store.put(built.key, built.pieces)
    ranges = (OffsetRange(S1, 0, second[-1].next),)
    compaction = ObjectCommit(0, 3, ObjectKind.STREAM, built.size, 1, NOW_MS, ranges, (1, 2))
    swapping = CompactsOnFirstBlockRead(store, layout, layout.objects[0].key, compaction)
    cache = BlockCache(swapping, capacity_bytes=64 * MiB)
    try:
        got = await StreamReader(cache).read(layout.state, S1, 0, MiB, reader_id="r")
    finally:
        await cache.close()
    assert swapping.swapped
    assert [bytes(b) for b in got.batches] == [b.data for b in first + second]
    assert got.next_offset == second[-1].next


async def test_a_catch_up_read_over_several_stream_objects_reads_ahead_across_them(store):
    """A consumer catching up one stream from offset 0 over five 8 MiB stream objects of
    1 MiB blocks (64 MiB objects scaled down 8x), through a 32 MiB cache (an 8 MiB window,
    a quarter of it): every batch comes back exactly once, in order, and the GETs stay
    within the bound below; readahead goes on from each object into the next."""
    layout = Layout()
    stream = stream_id(TOPIC, 11)
    layout.tier([11])
    template = kafka_batch(1, 16_000, 11)
    per_object, objects = 512, 5  # batches of ~16 KB: 8 MiB per object
    for first in range(0, per_object * objects, per_object):
        offsets = range(first, first + per_object)
        run = [Batch(o, o + 1, bytes(with_base_offset(template, o))) for o in offsets]
        layout.commit(ObjectKind.STREAM, {stream: run}, 1 * MiB)
    await put_all(store, layout)
    cache = BlockCache(store, capacity_bytes=32 * MiB)
    reader = StreamReader(cache)
    offset, bases = 0, []
    try:
        while got := await reader.read(layout.state, stream, offset, MiB, reader_id="consumer"):
            for batch in got.batches:
                bases.append(read_batch_header(batch, 0).base_offset)
                assert bytes(batch) == layout.batches[stream][bases[-1]].data
            offset = got.next_offset
    finally:
        await cache.close()
    assert bases == list(range(per_object * objects))  # each batch once, in order
    assert cache.max_readahead_bytes == 8 * MiB  # one reader: a quarter of the cache
    # Each object after the first (8 MiB: at most a window) costs one GET, its index read,
    # which readahead made whole while the reader was in the object before (a read of
    # its first window, the whole object);
    # the first object its index read and the reads' own GETs (the first one's blocks and
    # a quarter window with them: a reader catching up does not ramp up from one block).
    # Without readahead across objects it was 17: the read waited at each object's start
    # for its index and its first block, a GET of its own; with the index read apart from
    # the blocks, 11 at most.
    print(f"GETs: {cache.gets} ({cache.index_gets} index reads)")
    assert cache.index_gets == objects and cache.head_blocks == (objects - 1) * 8
    assert cache.gets <= objects + 2
    if store.s3_gets() is not None:
        assert store.s3_gets() == cache.gets
