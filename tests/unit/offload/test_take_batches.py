"""The cluster reader's pure step: what one Fetch answer's records give a read at a
position, with records built by hand: a batch cut short at the end is left for the next
Fetch, batches already read are skipped, gaps, overlaps and bad CRCs are named."""

from __future__ import annotations

import pytest
from aiokafka.record.default_records import DefaultRecordBatchBuilder

from offload_jobs.cluster_reader import ClusterReadError, take_batches
from proxy.records.batches import CRC_POSITION, with_base_offset


def batch(base: int, records: int) -> bytes:
    builder = DefaultRecordBatchBuilder(2, 0, False, -1, -1, -1, 1 << 20)
    for i in range(records):
        builder.append(i, timestamp=1_700_000_000_000 + i, key=None, value=b"v%d" % i, headers=[])
    return bytes(with_base_offset(bytes(builder.build()), base))


RUN = [batch(10, 3), batch(13, 2), batch(15, 4)]  # offsets 10..18
RECORDS = b"".join(RUN)


def take(records: bytes, position: int, end: int = 100, *, first: bool = False, gaps=False):
    return take_batches("t", 3, memoryview(records), position, end, first=first, allow_gaps=gaps)


def test_whole_answer_is_taken_in_order():
    taken = take(RECORDS, 10, first=True)
    assert [(b.base_offset, b.last_offset) for b in taken.batches] == [(10, 12), (13, 14), (15, 18)]
    assert [bytes(b.data) for b in taken.batches] == RUN
    assert (taken.next_offset, taken.done, taken.partial) == (19, False, False)


def test_a_batch_cut_short_at_the_end_is_left_for_the_next_fetch():
    cut = RECORDS[: len(RUN[0]) + len(RUN[1]) + 20]
    taken = take(cut, 10, first=True)
    assert [b.base_offset for b in taken.batches] == [10, 13]
    assert taken.next_offset == 15 and not taken.partial
    only_a_piece = take(RUN[2][:30], 15)
    assert only_a_piece.batches == [] and only_a_piece.partial and only_a_piece.next_offset == 15


def test_the_first_batch_may_hold_the_start_inside_it():
    taken = take(RECORDS, 11, first=True)
    assert taken.batches[0].base_offset == 10


def test_batches_already_read_are_skipped():
    taken = take(RECORDS, 15)  # Kafka answers from the batch holding the fetch offset
    assert [b.base_offset for b in taken.batches] == [15]


def test_the_end_stops_the_read():
    taken = take(RECORDS, 10, 13, first=True)
    assert [b.base_offset for b in taken.batches] == [10] and taken.done
    assert taken.next_offset == 13


def test_a_gap_is_named_unless_allowed():
    records = RUN[0] + RUN[2]  # 13..14 missing
    with pytest.raises(ClusterReadError, match="t-3 at offset 13: gap: the next batch .* 15"):
        take(records, 10, first=True)
    assert [b.base_offset for b in take(records, 10, first=True, gaps=True).batches] == [10, 15]


def test_an_overlap_is_named():
    records = RUN[0] + batch(12, 2)
    with pytest.raises(ClusterReadError, match="t-3 at offset 13: batch \\[12, 13\\] overlaps"):
        take(records, 10, first=True)


def test_a_corrupt_batch_names_its_offset_and_byte():
    damaged = bytearray(RECORDS)
    damaged[len(RUN[0]) + len(RUN[1]) - 1] ^= 0xFF  # the last byte of batch 13
    with pytest.raises(ClusterReadError, match=f"t-3 at offset 13: .*byte {len(RUN[0])}: CRC"):
        take(bytes(damaged), 10, first=True)
    damaged = bytearray(RECORDS)
    damaged[CRC_POSITION] ^= 0x01
    with pytest.raises(ClusterReadError, match="t-3 at offset 10: corrupt batch"):
        take(bytes(damaged), 10, first=True)
