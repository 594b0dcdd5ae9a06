"""Upload planning (proxy/upload/plan.py): WAL entries of interleaved streams become
few objects; big streams get stream objects; objects stay under the size limit; blocks are
cut at batch boundaries; what a crash left committed is skipped. Every planned object is
built and read back with the object format's own reader."""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.metadata.records import OffsetRange
from proxy.objects.format import FOOTER_SIZE, INDEX_ENTRY_SIZE, read_block, read_object
from proxy.objects.keys import ObjectKind
from proxy.records.batches import iter_batches, with_base_offset
from proxy.upload.plan import (
    ObjectIdAllocator,
    PlanLimits,
    UploadPlan,
    build_object,
    plan_upload,
)
from proxy.wal.types import WalEntry, WalPosition
from tests.support.batches import build_batch

ENTRY_HEADER = 25  # a WAL entry's framing (docs/wal.md)
_BATCHES: dict[tuple[int, int], bytes] = {}


def kafka_batch(records: int = 2, value_size: int = 20) -> bytes:
    """A v2 batch as kafka-python's producer writes it (base offset 0)."""
    if (records, value_size) not in _BATCHES:
        _BATCHES[records, value_size] = build_batch([b"v" * value_size] * records)
    return _BATCHES[records, value_size]


class Wal:
    """Entries as `WriteAheadLog.read` returns them, with per-stream offsets assigned."""

    def __init__(self, start: int = 0) -> None:
        self.end = start
        self.next_offset: dict[int, int] = {}
        self.entries: list[WalEntry] = []

    def append(self, stream: int, *batches: bytes) -> WalEntry:
        base = offset = self.next_offset.get(stream, 0)
        run = bytearray()
        for batch in batches or (kafka_batch(),):
            placed = with_base_offset(batch, offset)
            run += placed
            offset = next(iter_batches(placed))[0].next_offset
        self.next_offset[stream] = offset
        size = ENTRY_HEADER + len(run)
        entry = WalEntry(WalPosition(self.end, self.end + size), stream, base, memoryview(run))
        self.end += size
        self.entries.append(entry)
        return entry


def read_back(plan: UploadPlan, first_id: int = 1) -> dict[int, list[tuple[int, bytes]]]:
    """Build every object, read it back: per stream, (object index, block bytes) in the
    order the blocks come, objects in commit order."""
    streams: dict[int, list[tuple[int, bytes]]] = {}
    for n, planned in enumerate(plan.objects):
        built, uploaded = build_object(planned, first_id + n)
        data = built.to_bytes()
        assert len(data) == built.size == planned.size == uploaded.size
        footer, index = read_object(data, built.key)
        assert footer.kind is planned.kind and footer.object_id == first_id + n
        assert [(r.stream_id, r.start_offset, r.end_offset) for r in uploaded.ranges] == [
            (run.stream_id, run.start_offset, run.end_offset) for run in planned.runs
        ]
        assert len(index) == sum(run.blocks for run in planned.runs)
        for entry in index:
            streams.setdefault(entry.stream_id, []).append(
                (n, bytes(read_block(data, entry, built.key)))
            )
    return streams


def stream_bytes(wal: Wal, stream: int) -> bytes:
    return b"".join(bytes(e.batch) for e in wal.entries if e.stream_id == stream)


def test_no_entries_no_objects():
    plan = plan_upload([])
    assert plan.objects == () and plan.wal_end is None and plan.entries == 0


def test_interleaved_streams_make_one_stream_set_object():
    wal = Wal(start=1000)
    for i in range(30):
        wal.append(100 + i % 5)
    plan = plan_upload(wal.entries)
    assert len(plan.objects) == 1
    (only,) = plan.objects
    assert only.kind is ObjectKind.STREAM_SET
    assert [run.stream_id for run in only.runs] == [100, 101, 102, 103, 104]
    assert all((run.start_offset, run.end_offset) == (0, 12) for run in only.runs)
    assert plan.wal_end == wal.end and plan.skipped_entries == 0
    blocks = read_back(plan)
    for stream in range(100, 105):
        assert b"".join(block for _, block in blocks[stream]) == stream_bytes(wal, stream)


def test_stream_over_the_threshold_gets_its_own_stream_object_committed_first():
    wal = Wal()
    for i in range(40):
        wal.append(7)  # 40 entries, far over the threshold
        if i % 10 == 0:
            wal.append(3 + i // 10)  # four small streams, interleaved
    threshold = sum(len(e.batch) for e in wal.entries if e.stream_id == 7) - 1
    plan = plan_upload(wal.entries, PlanLimits(1 << 20, threshold))
    kinds = [(p.kind, [r.stream_id for r in p.runs]) for p in plan.objects]
    assert kinds == [(ObjectKind.STREAM, [7]), (ObjectKind.STREAM_SET, [3, 4, 5, 6])]
    blocks = read_back(plan)
    assert {n for n, _ in blocks[7]} == {0}
    assert b"".join(b for _, b in blocks[7]) == stream_bytes(wal, 7)


def test_a_stream_larger_than_an_object_is_split_in_offset_order():
    wal = Wal()
    for _ in range(50):
        wal.append(9, kafka_batch(3, 40))
    wal.append(1)
    entry = len(wal.entries[0].batch)
    limits = PlanLimits(max_object_bytes=4096, stream_object_threshold=1000, max_block_bytes=1024)
    plan = plan_upload(wal.entries, limits)
    stream_objects = [p for p in plan.objects if p.kind is ObjectKind.STREAM]
    assert len(stream_objects) >= 2
    ranges = [
        (r.start_offset, r.end_offset) for p in plan.objects for r in p.runs if r.stream_id == 9
    ]
    assert ranges[0][0] == 0 and ranges[-1][1] == 150
    assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:], strict=False))
    for p in plan.objects:
        assert p.size <= 4096
    for p in stream_objects[:-1]:  # full: the next entry did not fit
        assert p.size > 4096 - entry - INDEX_ENTRY_SIZE
    blocks = read_back(plan)
    assert b"".join(b for _, b in blocks[9]) == stream_bytes(wal, 9)


def test_last_piece_of_a_big_stream_joins_the_stream_set_object():
    wal = Wal()
    for _ in range(10):
        wal.append(9, kafka_batch(3, 40))
    wal.append(1)
    entry = len(wal.entries[0].batch)
    # 10 entries; objects hold 4, so the stream makes 4 + 4 + 2 and the 2 join stream 1
    limits = PlanLimits(FOOTER_SIZE + 4 * (entry + INDEX_ENTRY_SIZE), 3 * entry)
    plan = plan_upload(wal.entries, limits)
    shape = [(p.kind, [(r.stream_id, len(r.entries)) for r in p.runs]) for p in plan.objects]
    assert shape == [
        (ObjectKind.STREAM, [(9, 4)]),
        (ObjectKind.STREAM, [(9, 4)]),
        (ObjectKind.STREAM_SET, [(1, 1), (9, 2)]),
    ]
    read_back(plan)


def test_many_streams_fill_stream_set_objects_up_to_the_limit():
    wal = Wal()
    for i in range(400):
        wal.append(1000 + i % 97)
    max_object = 8192
    plan = plan_upload(wal.entries, PlanLimits(max_object, max_object, 1024))
    assert all(p.kind is ObjectKind.STREAM_SET for p in plan.objects)
    assert all(p.size <= max_object for p in plan.objects)
    assert len(plan.objects) > 3
    # next fit with splitting: every object but the last is full, whatever the stream count
    largest = max(len(e.batch) for e in wal.entries) + INDEX_ENTRY_SIZE
    assert all(p.size > max_object - largest for p in plan.objects[:-1])
    blocks = read_back(plan)
    for stream in range(1000, 1097):
        assert b"".join(b for _, b in blocks[stream]) == stream_bytes(wal, stream)
        objects = [n for n, _ in blocks[stream]]
        assert objects == sorted(objects)  # a split run goes on in the next object


def test_blocks_are_cut_at_batch_boundaries():
    wal = Wal()
    small, big = kafka_batch(1, 30), kafka_batch(4, 200)
    wal.append(5, small, small, big)  # one entry of three batches
    wal.append(5, big)
    wal.append(5, small)
    (planned,) = plan_upload(wal.entries, PlanLimits(max_block_bytes=len(big) + 10)).objects
    built, _ = build_object(planned, 1)
    sizes = [h.size for e in wal.entries for h, _ in iter_batches(e.batch)]
    footer, index = read_object(built.to_bytes(), built.key)
    batch_starts = {footer.data_start + sum(sizes[:n]) for n in range(len(sizes) + 1)}
    assert len(index) == planned.runs[0].blocks == 4
    for entry in index:
        assert entry.position in batch_starts and entry.end_position in batch_starts
        assert entry.size <= len(big) + 10
    assert [(e.start_offset, e.end_offset) for e in index] == [(0, 2), (2, 6), (6, 10), (10, 11)]


def test_entries_below_the_committed_end_are_skipped():
    wal = Wal()
    for i in range(12):
        wal.append(1 + i % 3)  # streams 1, 2, 3: offsets 0, 2, 4, 6 each
    committed = {1: 4, 2: 8, 3: None}
    plan = plan_upload(wal.entries, committed_end=committed.get)
    assert plan.skipped_entries == 2 + 4 and plan.entries == 12 and plan.wal_end == wal.end
    runs = {r.stream_id: (r.start_offset, r.end_offset) for p in plan.objects for r in p.runs}
    assert runs == {1: (4, 8), 3: (0, 8)}
    everything = plan_upload(wal.entries, committed_end={1: 8, 2: 8, 3: 8}.get)
    assert everything.objects == () and everything.wal_end == wal.end


def test_entries_a_stream_cannot_hold_are_refused():
    wal = Wal()
    wal.append(1)
    wal.next_offset[1] = 10  # a gap
    wal.append(1)
    with pytest.raises(
        ValueError, match="starts at offset 10, the stream's previous entry ends at 2"
    ):
        plan_upload(wal.entries)
    e = wal.entries[0]
    lying = WalEntry(e.position, 1, 5, e.batch)
    with pytest.raises(ValueError, match="says base offset 5, its batch 0"):
        plan_upload([lying])


def test_object_ids_of_the_upload_path():
    allocate = ObjectIdAllocator(writer=3, first=7)
    assert [allocate(), allocate()] == [(3 << 32) | 7, (3 << 32) | 8]
    with pytest.raises(ValueError, match="writer"):
        ObjectIdAllocator(1 << 31)
    last = ObjectIdAllocator((1 << 31) - 1, (1 << 32) - 1)
    assert last() == (1 << 63) - 1
    with pytest.raises(ValueError, match="exhausted"):
        last()
    wal = Wal()
    wal.append(1)
    (planned,) = plan_upload(wal.entries).objects
    with pytest.raises(ValueError, match="upload path ids"):
        build_object(planned, 1 << 63)


def test_a_collision_draws_another_writer_and_counts_from_zero():
    allocate = ObjectIdAllocator(writer=3, first=7, rng=random.Random(1))
    allocate()
    allocate.collided()
    assert allocate.writer != 3 and allocate.collisions == 1
    assert [allocate(), allocate()] == [allocate.writer << 32, allocate.writer << 32 | 1]
    drawn = [ObjectIdAllocator.drawn(random.Random(seed)).writer for seed in range(50)]
    assert all(0 <= w < 1 << 31 for w in drawn) and len(set(drawn)) == 50


def test_ranges_by_shard():
    wal = Wal()
    for stream in (4, 5, 6, 8):
        wal.append(stream)
    (planned,) = plan_upload(wal.entries).objects
    _, uploaded = build_object(planned, 1)
    assert uploaded.ranges_by_shard(2) == {
        0: (OffsetRange(4, 0, 2), OffsetRange(6, 0, 2), OffsetRange(8, 0, 2)),
        1: (OffsetRange(5, 0, 2),),
    }


def test_limits_are_checked():
    with pytest.raises(ValueError, match="max_object_bytes"):
        PlanLimits(max_object_bytes=0)
    with pytest.raises(ValueError, match="max_block_bytes"):
        PlanLimits(max_block_bytes=1 << 32)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    appends=st.lists(
        st.tuples(st.integers(1, 6), st.integers(1, 3), st.integers(1, 300)),
        min_size=1,
        max_size=60,
    ),
    max_object=st.integers(600, 5000),
    threshold=st.integers(1, 6000),
    committed=st.dictionaries(st.integers(1, 6), st.integers(0, 40)),
)
def test_any_plan_holds_every_batch_once_in_order(appends, max_object, threshold, committed):
    wal = Wal()
    for stream, records, value in appends:
        wal.append(stream, kafka_batch(records, value))
    plan = plan_upload(wal.entries, PlanLimits(max_object, threshold, 256), committed.get)
    blocks = read_back(plan)
    for stream in {s for s, _, _ in appends}:
        kept = [e for e in wal.entries if e.stream_id == stream]
        kept = [e for e in kept if e.base_offset >= committed.get(stream, 0)]
        assert b"".join(b for _, b in blocks.get(stream, [])) == b"".join(
            bytes(e.batch) for e in kept
        )
    for p in plan.objects:
        assert p.size <= max_object or sum(len(r.entries) for r in p.runs) == 1
        if p.kind is ObjectKind.STREAM:
            assert len(p.runs) == 1
    assert plan.wal_end == wal.end
