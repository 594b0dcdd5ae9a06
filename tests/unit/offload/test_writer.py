"""Offload planning: tasks cut at segment boundaries, objects cut at batch boundaries
near the target size with deterministic ids, missing offsets named, and the stream
object read back with the object format's own reader, batches verbatim."""

from __future__ import annotations

import pytest
from test_segments import batch

from offload_jobs.sources import SourceBatch
from offload_jobs.writer import (
    MissingOffsets,
    OffloadTask,
    build_stream_object,
    cut_objects,
    plan_tasks,
)
from proxy.metadata.streams import OFFLOAD_ID_BIT, offload_object_id
from proxy.objects.format import find_entries, read_block, read_object
from proxy.objects.keys import ObjectKind, parse_object_key
from proxy.records.batches import iter_batches

STREAM = 12345


def source(layout: list[tuple[int, int]], *, compression: int = 0) -> list[SourceBatch]:
    out = []
    for base, count in layout:
        data = batch(base, count, compression=compression, producer=3)
        out.append(SourceBatch(base, base + count - 1, memoryview(data)))
    return out


def test_tasks_are_the_gaps_cut_where_segments_start() -> None:
    tasks = plan_tasks(2, STREAM, [(0, 100), (150, 400)], segment_bases=[0, 60, 100, 300, 500])
    assert tasks == [
        OffloadTask(2, STREAM, 0, 60),
        OffloadTask(2, STREAM, 60, 100),
        OffloadTask(2, STREAM, 150, 300),
        OffloadTask(2, STREAM, 300, 400),
    ]
    assert plan_tasks(0, STREAM, [(5, 9)]) == [OffloadTask(0, STREAM, 5, 9)]
    with pytest.raises(ValueError, match=r"partition 1: gap \[9, 9\)"):
        plan_tasks(1, STREAM, [(9, 9)])


def test_objects_are_cut_at_batch_boundaries_near_the_target() -> None:
    batches = source([(0, 5), (5, 5), (10, 5), (15, 5), (20, 5)])
    size = len(batches[2].data)  # offsets 10 on have the longest values
    plans = list(cut_objects(STREAM, 0, 25, batches, target_bytes=2 * size))
    assert [(p.start_offset, p.end_offset) for p in plans] == [(0, 10), (10, 20), (20, 25)]
    assert [len(p.batches) for p in plans] == [2, 2, 1]
    assert sum(p.record_count for p in plans) == 25
    again = list(cut_objects(STREAM, 0, 25, source([(0, 5), (5, 5), (10, 5), (15, 5), (20, 5)]),
                             target_bytes=2 * size))  # fmt: skip
    assert [p.object_id for p in again] == [p.object_id for p in plans]
    assert all(p.object_id & OFFLOAD_ID_BIT for p in plans)
    assert plans[1].object_id == offload_object_id(STREAM, 10, 20)


def test_a_batch_larger_than_the_target_gets_an_object_of_its_own() -> None:
    plans = list(cut_objects(STREAM, 0, 15, source([(0, 5), (5, 5), (10, 5)]), target_bytes=1))
    assert [(p.start_offset, p.end_offset) for p in plans] == [(0, 5), (5, 10), (10, 15)]


def test_a_range_may_start_inside_a_batch_and_end_inside_one() -> None:
    plans = list(cut_objects(STREAM, 3, 12, source([(0, 5), (5, 5), (10, 5)])))
    assert [(p.start_offset, p.end_offset) for p in plans] == [(3, 12)]
    built = build_stream_object(plans[0])
    _, index = read_object(built.to_bytes(), built.key)
    assert [(e.start_offset, e.end_offset) for e in index] == [(0, 15)]


def test_offsets_the_source_lacks_are_named() -> None:
    with pytest.raises(MissingOffsets, match=r"t-0: offsets \[0, 5\) of stream 12345"):
        list(cut_objects(STREAM, 0, 15, source([(5, 5), (10, 5)]), where="t-0"))
    with pytest.raises(MissingOffsets, match=r"offsets \[10, 20\)"):
        list(cut_objects(STREAM, 0, 20, source([(0, 5), (5, 5)])))
    with pytest.raises(ValueError, match="out of order"):
        list(cut_objects(STREAM, 0, 20, source([(0, 5), (5, 5), (3, 1)])))


def test_the_stream_object_holds_the_batches_verbatim() -> None:
    batches = source([(0, 5), (5, 7), (12, 3)], compression=1)
    [plan] = cut_objects(STREAM, 0, 15, batches)
    built = build_stream_object(plan, max_block_bytes=len(batches[0].data) + 1)
    data = built.to_bytes()
    assert parse_object_key(built.key) == (plan.object_id, ObjectKind.STREAM)
    footer, index = read_object(data, built.key)
    assert footer.object_id == plan.object_id and footer.kind is ObjectKind.STREAM
    assert [(e.start_offset, e.end_offset, e.record_count) for e in index] == [
        (0, 5, 5),
        (5, 12, 7),
        (12, 15, 3),
    ]
    stored = [
        bytes(b)
        for entry in find_entries(index, STREAM, 0)
        for _, b in iter_batches(read_block(data, entry, built.key))
    ]
    assert stored == [bytes(b.data) for b in batches]
    assert built.size == len(data) > plan.size


def test_a_range_starting_before_its_first_batch_starts_the_block_there() -> None:
    # offsets 0..1 compacted away inside a task that starts at a segment's base
    [plan] = cut_objects(STREAM, 2, 10, source([(2, 3), (5, 5)]))
    built = build_stream_object(plan)
    _, index = read_object(built.to_bytes(), built.key)
    assert [(e.start_offset, e.end_offset) for e in index] == [(2, 10)]


def test_offsets_compacted_away_at_a_boundary_stay_inside_the_blocks() -> None:
    # offsets 0..1 and 10..19 removed by the cleaner, around segment boundaries
    batches = source([(2, 3), (5, 5)])
    [plan] = cut_objects(STREAM, 0, 20, batches, require_start=False, require_end=False)
    assert (plan.start_offset, plan.end_offset) == (0, 20)
    built = build_stream_object(plan, max_block_bytes=1)
    _, index = read_object(built.to_bytes(), built.key)
    assert [(e.start_offset, e.end_offset, e.record_count) for e in index] == [
        (0, 5, 3),
        (5, 20, 5),
    ]
    with pytest.raises(MissingOffsets, match=r"offsets \[20, 30\)"):
        list(cut_objects(STREAM, 20, 30, [], require_start=False, require_end=False))


def test_a_corrupt_batch_is_named_by_its_offset_when_building() -> None:
    good, bad = source([(0, 5), (5, 5)])
    broken = bytearray(bad.data)
    broken[-3] ^= 0x01
    [plan] = cut_objects(STREAM, 0, 10, [good, bad._replace(data=memoryview(broken))])
    with pytest.raises(ValueError, match="stream 12345: the batch at offset 5: CRC-32C mismatch"):
        build_stream_object(plan)
