"""The tail a rebuild loads into the log cache (`recovered_tail.py`): each stream's WAL
entries from its committed end on, the newest across streams with their bytes within the
budget, the older ones by WAL position only; a suffix of each stream is held."""

from __future__ import annotations

from proxy.partition.recovered_tail import RecoveredTail
from proxy.wal.types import WalPosition

A, B = 1, 2


def add(tail: RecoveredTail, stream: int, base: int, last: int, size: int, at: int) -> None:
    tail.add(stream, base, last, WalPosition(at, at + size + 20), memoryview(bytes(size)))


def test_entries_below_the_committed_end_and_of_other_streams_are_skipped():
    tail = RecoveredTail({A: 10}, 1_000)
    add(tail, A, 0, 9, 50, 0)  # committed
    add(tail, B, 0, 4, 50, 70)  # not rebuilt here
    add(tail, A, 8, 12, 50, 140)  # straddles the committed end: kept whole
    add(tail, A, 8, 12, 50, 210)  # the same offsets again: replayed already
    add(tail, A, 13, 13, 50, 280)
    assert [(e.base_offset, e.last_offset) for e in tail.entries(A)] == [(8, 12), (13, 13)]
    assert tail.entries(B) == []
    assert tail.held_bytes == 100
    assert all(isinstance(e.data, bytes) for e in tail.entries(A))  # copies, not views


def test_the_newest_entries_across_streams_keep_their_bytes_within_the_budget():
    tail = RecoveredTail({A: 0, B: 0}, 250)
    add(tail, A, 0, 0, 100, 0)
    add(tail, B, 0, 0, 100, 120)
    add(tail, A, 1, 1, 100, 240)
    add(tail, B, 1, 1, 40, 360)
    assert [e.data is not None for e in tail.entries(A)] == [False, True]
    assert [e.data is not None for e in tail.entries(B)] == [True, True]
    assert tail.held_bytes == 240
    add(tail, A, 2, 2, 300, 420)  # larger than the budget: everything older goes too
    assert [e.data for e in tail.entries(A) + tail.entries(B)] == [None] * 5
    assert tail.held_bytes == 0
    assert tail.entries(A)[0].position == WalPosition(0, 120)
