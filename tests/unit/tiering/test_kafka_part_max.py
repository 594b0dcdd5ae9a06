"""Kafka's part's largest timestamp below the cutover, found by Kafka's timestamp lookups
(tiered/kafka_part.py), and how offsets.py uses it.

The lookup here is a twin of Kafka's (`UnifiedLog.fetchOffsetByTimestamp` for a target
timestamp: the first segment whose largest timestamp reaches it, and in it the first
record at or above the log start that does), over segments of (offset, timestamp)
records, records below the log start still counted in their segment's largest. Pure
logic; the real Kafka answers in tests/conformance/test_conformance_pinned.py.
"""

from __future__ import annotations

import asyncio
import math

from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.apis.api02_list_offsets import MAX_TIMESTAMP, OffsetsResult
from proxy.records.timestamp_search import Found
from proxy.tiered.kafka_part import largest_below
from proxy.tiered.offsets import StreamPart, combine

Segment = list[tuple[int, int]]  # (offset, timestamp), in offset order


class KafkaTwin:
    def __init__(self, segments: list[Segment], log_start: int) -> None:
        # Kafka deletes the segments wholly below its log start (a segment whose next
        # one starts at or below it); the one holding the log start counts whole
        self.segments = [s for s in segments if s and s[-1][0] >= log_start]
        self.log_start = log_start
        self.asked: list[int] = []

    async def lookup(self, target: int) -> Found | None:
        self.asked.append(target)
        for segment in self.segments:
            if max(ts for _, ts in segment) >= target:
                for offset, ts in segment:
                    if ts >= target and offset >= self.log_start:
                        return Found(ts, offset, 0)
                return None  # Kafka looks in that segment only
        return None

    def live_below(self, cutover: int, start: int | None = None) -> list[tuple[int, int]]:
        start = self.log_start if start is None else start
        return [(o, ts) for s in self.segments for o, ts in s if start <= o < cutover]

    def largest_before(self, start: int) -> int:
        """The largest timestamp of a record Kafka still counts below `start`: its
        first segment's deleted ones, and its live ones below the partition's start."""
        return max((ts for s in self.segments for o, ts in s if o < start), default=-1)

    def ceiling(self) -> int:
        return max(ts for s in self.segments for _, ts in s)


def run(twin: KafkaTwin, cutover: int, floor: int, start: int | None = None) -> Found | None:
    start = twin.log_start if start is None else start
    return asyncio.run(largest_below(cutover, twin.lookup, floor, twin.ceiling(), start))


def segmented(timestamps: list[int], cuts: list[int]) -> list[Segment]:
    records = list(enumerate(timestamps))
    edges = sorted({c % (len(records) + 1) for c in cuts} | {0, len(records)})
    return [records[a:b] for a, b in zip(edges, edges[1:], strict=False)]


def test_one_lookup_when_kafkas_part_does_not_reach_the_streams_largest():
    # the hour-old records below the cutover 7, strays past it "now"
    twin = KafkaTwin([[(n, 1000 + n) for n in range(7)] + [(7, 9000), (8, 9001)]], 0)
    assert run(twin, 7, floor=5000) is None
    assert twin.asked == [5000]


def test_the_largest_below_the_cutover_first_in_offset_order_on_a_tie():
    twin = KafkaTwin([[(0, 10), (1, 50), (2, 20)], [(3, 50), (4, 9000)]], 0)
    assert run(twin, 4, floor=0) == Found(50, 1, 0)
    assert len(twin.asked) <= 2 + math.ceil(math.log2(9000))
    assert run(KafkaTwin(twin.segments, 0), 4, floor=50) == Found(50, 1, 0)  # a tie: Kafka's
    assert run(KafkaTwin(twin.segments, 0), 4, floor=51) is None


def test_deleted_records_of_the_first_segment_do_not_hide_a_larger_one_after_them():
    # Kafka's lookup of 10..80 answers none (the first segment's largest, 80, is a deleted
    # record and no live one there reaches it); the search goes on above them
    twin = KafkaTwin([[(0, 80), (1, 5), (2, 6)], [(3, 90), (4, 7)], [(5, 10**6)]], log_start=1)
    assert run(twin, 5, floor=0) == Found(90, 3, 0)


def test_a_record_below_the_partitions_log_start_is_not_the_answer():
    # the stream's retention moved the partition's log start to 2, past [0, 2) that Kafka
    # alone holds (its own log starts at 0): Kafka's lookups of 31..100 answer offset 0
    twin = KafkaTwin([[(0, 100), (1, 10), (2, 20)], [(3, 30), (4, 9000)]], log_start=0)
    assert run(twin, 4, floor=0, start=0) == Found(100, 0, 0)
    assert run(KafkaTwin(twin.segments, 0), 4, floor=0, start=2) is None  # Found(100, 0) without
    twin = KafkaTwin([[(0, 100), (1, 10), (2, 20)], [(3, 130), (4, 9000)]], log_start=0)
    assert run(twin, 4, floor=0, start=2) == Found(130, 3, 0)  # above what is below the start


@settings(max_examples=300, deadline=None)
@given(
    timestamps=st.lists(st.integers(0, 200), min_size=1, max_size=30),
    cuts=st.lists(st.integers(0, 30), max_size=5),
    log_start=st.integers(0, 30),
    moved=st.integers(0, 6),
    cutover=st.integers(0, 31),
    floor=st.integers(0, 220),
)
def test_the_search_is_kafkas_largest_below_the_cutover(
    timestamps, cuts, log_start, moved, cutover, floor
):
    """`moved`: how far the stream's retention moved the partition's log start past
    Kafka's (0: DeleteRecords keeps them equal)."""
    twin = KafkaTwin(segmented(timestamps + [300], cuts), min(log_start, len(timestamps)))
    start = min(twin.log_start + moved, len(timestamps))
    cutover = min(cutover, len(timestamps))  # the stray (300) is past it
    live = twin.live_below(cutover, start)
    found = run(twin, cutover, floor, start)
    assert len(twin.asked) <= 3 + math.ceil(math.log2(301 - floor + 1))
    largest = max((ts for _, ts in live), default=-1)
    if largest > twin.largest_before(start) or largest < 0:  # nothing below hides it
        expected = None
        if largest >= floor and live:
            expected = Found(largest, next(o for o, ts in live if ts == largest), 0)
        assert found == expected
    else:  # Kafka's own answer would be a deleted record: any live one, or none
        assert found is None or (found.offset, found.timestamp) in live


def test_combine_takes_kafkas_part_where_kafka_answered_past_the_cutover():
    past = OffsetsResult(0, 9000, 107, 4)  # a stray record past the cutover 100
    hidden = Found(1060, 60, 2)
    part = StreamPart(0, cutover=100, log_start=40, current_epoch=4, kafka_alone=True)
    assert part.needs_kafka_part(MAX_TIMESTAMP, past)
    assert combine(MAX_TIMESTAMP, past, part) == OffsetsResult(0, -1, -1, -1)  # not learned
    learned = StreamPart(0, cutover=100, log_start=40, kafka_alone=True, kafka_below=hidden)
    assert combine(MAX_TIMESTAMP, past, learned) == OffsetsResult(0, 1060, 60, 2)
    tie = StreamPart(0, 100, 40, Found(1060, 130, -1), kafka_alone=True, kafka_below=hidden)
    assert combine(MAX_TIMESTAMP, past, tie) == OffsetsResult(0, 1060, 60, 2)  # Kafka's first
    newer = StreamPart(0, 100, 40, Found(1061, 130, -1), 4, kafka_alone=True, kafka_below=hidden)
    assert combine(MAX_TIMESTAMP, past, newer).offset == 130


def test_kafkas_part_is_asked_only_where_its_answer_could_hide_the_answer():
    past, below = OffsetsResult(0, 9000, 107, 4), OffsetsResult(0, 900, 60, 4)
    alone = StreamPart(0, cutover=100, log_start=40, kafka_alone=True)
    assert alone.needs_kafka_part(MAX_TIMESTAMP, past)
    assert not alone.needs_kafka_part(MAX_TIMESTAMP, below)  # Kafka's answer is its part's
    assert not alone.needs_kafka_part(500, past)  # a timestamp: the first, never hidden
    assert not alone.needs_kafka_part(MAX_TIMESTAMP, OffsetsResult(6))
    migrated = StreamPart(0, cutover=100, log_start=40)  # the objects hold [40, 100)
    assert not migrated.needs_kafka_part(MAX_TIMESTAMP, past)
    newer = StreamPart(0, 100, 40, Found(9001, 130, -1), kafka_alone=True)
    assert not newer.needs_kafka_part(MAX_TIMESTAMP, past)  # beats all of Kafka's log
    tie = StreamPart(0, 100, 40, Found(9000, 130, -1), kafka_alone=True)
    assert tie.needs_kafka_part(MAX_TIMESTAMP, past)  # Kafka's part could tie it
