"""A clean cut into parts (proxy/cleaner/split.py, the clean job's) is the clean of the
whole log at once (the proxy's runner): same offset map, same scan, same batches out of
every group, whatever the ranges and groups."""

from __future__ import annotations

import pytest

from proxy.cleaner.clean import LogClean, clean_group, index_dirty
from proxy.cleaner.offset_map import OffsetMap
from proxy.cleaner.plan import groups
from proxy.cleaner.split import (
    merge_maps,
    range_map,
    scan_entries,
    segment_of,
    transactions_at,
)
from proxy.cleaner.transactions import scan_log
from proxy.records.batches import iter_batches
from proxy.records.transactions import ABORT, COMMIT
from tests.support.batches import NOW_MS, build_batch, control_batch, with_base_offset

RETENTION = 1000
PID, TXN_PID, ABORTED_PID = 11, 21, 31


def _log() -> list:
    """Keyed updates, tombstones, an idempotent producer, a committed transaction whose
    marker comes batches after its data, an aborted one, in batches of one to three."""

    def txn(pid: int, values: list[bytes], keys: list[bytes]) -> bytes:
        return build_batch(values, keys=keys, producer_id=pid, producer_epoch=0, transactional=True)

    batches = [
        build_batch([b"a1", b"b1"], keys=[b"a", b"b"]),
        build_batch([b"c1"], keys=[b"c"], producer_id=PID, producer_epoch=1, base_sequence=0),
        txn(TXN_PID, [b"t-a"], [b"a"]),
        build_batch([None, b"d1"], keys=[b"b", b"d"], codec=1),
        txn(ABORTED_PID, [b"x-a", b"x-c"], [b"a", b"c"]),
        build_batch([b"c2"], keys=[b"c"], producer_id=PID, producer_epoch=1, base_sequence=1),
        control_batch(TXN_PID, 0, COMMIT),
        control_batch(ABORTED_PID, 0, ABORT),
        build_batch([b"d2", b"e1", None], keys=[b"d", b"e", b"c"], codec=4),
        build_batch([b"a3"], keys=[b"a"]),
    ]
    log = bytes(with_base_offset(b"".join(batches), 0))
    return list(iter_batches(log))


def _ranges(batches: list, cuts: list[int]) -> list[list]:
    edges = [0, *cuts, len(batches)]
    return [batches[a:b] for a, b in zip(edges, edges[1:], strict=False) if a < b]


def _whole(ranges: list[list], target: int, now: int):
    """The runner's clean: one scan, one map, one LogClean fed every group in order."""
    scan = scan_log(b for r in ranges for b in r)
    segments = [segment_of(r[0][0].base_offset, r[-1][0].next_offset, r) for r in ranges]
    omap = OffsetMap(1000)
    assert index_dirty(ranges, 0, scan, omap) == len(ranges)
    run = LogClean(omap, segments[-1].end, scan, now_ms=now, delete_retention_ms=RETENTION)
    out = [clean_group(run, ranges[i:j]) for i, j in groups(segments, len(ranges), target)]
    return scan, omap.digests(), out


def _split(ranges: list[list], target: int, now: int):
    """The job's: per-range entries and maps joined, each group cleaned alone."""
    entries = [e for r in ranges for e in scan_entries(r)]
    scan = scan_log((h, memoryview(b)) for h, b in entries)
    digests = merge_maps(range_map(r, 0, scan.aborted) for r in ranges)
    segments = [segment_of(r[0][0].base_offset, r[-1][0].next_offset, r) for r in ranges]
    cuts = groups(segments, len(ranges), target)
    seen = transactions_at(entries, scan.aborted, [segments[i].start for i, _ in cuts])
    out = []
    for (i, j), state in zip(cuts, seen, strict=True):
        run = LogClean(
            OffsetMap.of(dict(digests)),
            segments[-1].end,
            scan,
            now_ms=now,
            delete_retention_ms=RETENTION,
            seen=state,
        )
        out.append(clean_group(run, ranges[i:j]))
    return scan, digests, out


def _bytes(out) -> list:
    return [
        ([(a, b, n, bytes(data)) for a, b, n, data in pieces], changed) for pieces, changed in out
    ]


@pytest.mark.parametrize("cuts", [[], [3], [2, 6], [1, 4, 7], list(range(1, 10))])
@pytest.mark.parametrize("target", [1, 150, 400, 1 << 20])
@pytest.mark.parametrize("now", [NOW_MS, NOW_MS + RETENTION * 10])
def test_a_split_clean_is_the_whole_logs_clean(cuts, target, now) -> None:
    ranges = _ranges(_log(), cuts)
    scan, digests, whole = _whole(ranges, target, now)
    split_scan, split_digests, split = _split(ranges, target, now)
    assert (split_scan.aborted, split_scan.open_from) == (scan.aborted, scan.open_from)
    assert split_scan.producers == scan.producers
    assert split_digests == digests
    assert _bytes(split) == _bytes(whole)


def test_a_marker_whose_data_is_in_an_earlier_group_stays_as_it_is() -> None:
    """Each batch its own group: the COMMIT marker's transaction is four groups back. A
    batch of it is still in the log (its producer's last, kept as an empty header), so
    the marker stays as it is; a group cleaned without the state before it would take
    the marker for one whose transaction is gone and stamp it a delete horizon."""
    ranges = _ranges(_log(), list(range(1, 10)))
    entries = [e for r in ranges for e in scan_entries(r)]
    scan = scan_log((h, memoryview(b)) for h, b in entries)
    [state] = transactions_at(entries, scan.aborted, [9])
    assert TXN_PID in state[0]
    [(header, marker)] = ranges[6]
    assert header.is_control and header.base_offset == 9
    omap = OffsetMap.of(merge_maps(range_map(r, 0, scan.aborted) for r in ranges))
    for seen, same in ((state, True), (((), ()), False)):
        run = LogClean(omap, 15, scan, now_ms=NOW_MS, delete_retention_ms=RETENTION, seen=seen)
        [(_, _, _, out)], _ = clean_group(run, ranges[6:7])
        assert (bytes(out) == bytes(marker)) is same


def test_scan_entries_keep_what_the_scan_needs() -> None:
    batches = _log()
    entries = scan_entries(batches)
    assert all(b == b"" for h, b in entries if not h.is_control)
    assert all(b for h, b in entries if h.is_control)
    # neither the batches of no producer, nor an idempotent producer's earlier ones
    assert [h.base_offset for h, _ in entries] == [3, 6, 8, 9, 10]


def test_merge_maps_keeps_the_latest_offset() -> None:
    assert merge_maps([{b"k": 3, b"j": 9}, {b"k": 7}, {b"k": 5}]) == {b"k": 7, b"j": 9}


@pytest.mark.parametrize("target", [1, 1 << 20])
def test_a_second_clean_at_the_same_time_changes_nothing(target) -> None:
    """So a clean run again (the job's re-run, the proxy's next pass) writes nothing: an
    empty header a clean left, at a group's end or a producer's last, stays as it is."""
    _, _, out = _whole(_ranges(_log(), list(range(1, 10))), target, NOW_MS)
    assert any(changed for _, changed in out)
    cleaned = [list(iter_batches(b"".join(bytes(p[3]) for p in pieces))) for pieces, _ in out]
    assert any(h.record_count == 0 for r in cleaned for h, _ in r)
    _, _, again = _whole(cleaned, target, NOW_MS)
    assert not any(changed for _, changed in again)
    assert _bytes(again) == [([(a, b, n, d) for a, b, n, d in p], False) for p, _ in _bytes(out)]
