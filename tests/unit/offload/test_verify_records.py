"""verify's record-by-record comparison of a compacted partition (offload_jobs/verify_records.py).

One side is a log built with aiokafka's codec; the other the same log cleaned by the
proxy's cleaner (proxy/cleaner/, Kafka's rules), or changed on purpose: what a cleaner
may remove is no mismatch, what it may not change is one.
"""

from __future__ import annotations

from offload_jobs.verify_records import SideSummary, compare_compacted
from proxy.records.batches import iter_batches
from proxy.records.transactions import ABORT, COMMIT
from tests.support.batches import NOW_MS, build_batch, control_batch, with_base_offset
from tests.unit.tiering.test_log_cleaner import clean

PID = 7


def log_of(*batches: bytes) -> bytes:
    return bytes(with_base_offset(b"".join(batches), 0))


def side(log: bytes, start: int = 0, end: int = 1 << 40) -> SideSummary:
    out = SideSummary(start, end)
    for _, batch in iter_batches(log):
        out.add(batch)
    return out


def verdict(kafka: bytes, objects: bytes, start: int = 0, end: int = 1 << 40):
    return compare_compacted("t", 0, side(kafka, start, end), side(objects, start, end))


def workload(last: bytes = b"c2") -> bytes:
    """Updates of three keys, a tombstone, a committed and an aborted transaction."""
    return log_of(
        build_batch([b"a1", b"b1", b"a2"], keys=[b"a", b"b", b"a"], codec=1),
        build_batch([b"c1", None], keys=[b"c", b"b"], codec=4),  # b's tombstone
        build_batch([b"a-txn"], keys=[b"a"], producer_id=PID, producer_epoch=0, transactional=True),
        control_batch(PID, 0, COMMIT),
        build_batch(
            [b"c-aborted"], keys=[b"c"], producer_id=PID, producer_epoch=0, transactional=True
        ),  # fmt: skip
        control_batch(PID, 0, ABORT),
        build_batch([last], keys=[b"c"], timestamps=[NOW_MS + 50]),
    )


def test_the_same_log_is_the_same() -> None:
    log = workload()
    report = verdict(log, log)
    assert report.ok, report
    assert report.kafka_records == report.object_records == 8


def test_a_cleaned_copy_against_an_uncleaned_one_is_the_same() -> None:
    log = workload()
    cleaned, stats = clean(log)
    assert stats.records_kept < stats.records_read  # the clean removed records
    assert verdict(log, cleaned).ok
    assert verdict(cleaned, log).ok


def test_a_cleaned_copy_whose_tombstones_went_is_the_same() -> None:
    log = workload()
    once, _ = clean(log)
    later, _ = clean(once, NOW_MS + 10_000)  # past the horizon the first clean set
    assert side(once).latest != side(later).latest  # b's tombstone is gone
    assert verdict(log, later).ok


def test_a_latest_value_that_differs_is_a_mismatch() -> None:
    log = workload()
    other = workload(b"c3")  # c's latest, not c2
    report = verdict(log, clean(other)[0])
    assert not report.ok
    assert [m.offset for m in report.mismatches] == [9]  # c's latest, the same offset
    assert "differs between Kafka and the objects" in report.mismatches[0].what


def test_a_record_both_hold_that_differs_is_a_mismatch() -> None:
    log = log_of(build_batch([b"x1", b"x2"], keys=[b"x", b"x"]))
    other = log_of(build_batch([b"X1", b"x2"], keys=[b"x", b"x"]))  # an older value changed
    report = verdict(log, other)
    assert [m.offset for m in report.mismatches] == [0]
    assert "differs" in report.mismatches[0].what


def test_a_latest_record_missing_from_one_copy_is_a_mismatch() -> None:
    log = log_of(build_batch([b"x1", b"y1", b"x2"], keys=[b"x", b"y", b"x"]))
    lost = log_of(build_batch([b"x1"], keys=[b"x"]))  # y1 and x2 never made it
    report = verdict(log, lost)
    assert sorted(m.offset for m in report.mismatches) == [0, 1]
    assert any("the objects no live value" in m.what for m in report.mismatches)


def test_an_aborted_record_is_no_latest_and_an_open_transaction_not_yet() -> None:
    log = log_of(
        build_batch([b"k1"], keys=[b"k"]),
        build_batch(
            [b"aborted"], keys=[b"k"], producer_id=PID, producer_epoch=0, transactional=True
        ),  # fmt: skip
        control_batch(PID, 0, ABORT),
        build_batch(
            [b"open"], keys=[b"k"], producer_id=PID + 1, producer_epoch=0, transactional=True
        ),  # fmt: skip
    )
    summary = side(log)
    [(offset, _)] = summary.live().values()
    assert offset == 0
    without = log_of(build_batch([b"k1"], keys=[b"k"]))  # a cleaner removed the aborted one
    assert verdict(log, without).ok


def test_only_the_range_compared_counts() -> None:
    log = log_of(build_batch([b"x1", b"x2", b"x3"], keys=[b"x", b"x", b"x"]))
    shorter = log_of(build_batch([b"x1", b"x2"], keys=[b"x", b"x"]))
    assert verdict(log, shorter, 0, 2).ok
    assert not verdict(log, shorter, 0, 3).ok


def test_a_key_written_again_past_the_range_may_have_lost_its_value_below_it() -> None:
    """Kafka's copy ends at the cutover; the objects' cleaner saw the stream past it."""
    kafka = log_of(build_batch([b"x1", b"y1"], keys=[b"x", b"y"]))
    stream = log_of(build_batch([b"x1", b"y1", b"x2"], keys=[b"x", b"y", b"x"]))
    objects, _ = clean(stream)  # x1 goes: x2, past the cutover at 2, supersedes it
    assert verdict(kafka, objects, 0, 2).ok
    lost_y = log_of(build_batch([b"x1", b"y0", b"x2"], keys=[b"x", b"z", b"x"]))
    assert not verdict(kafka, clean(lost_y)[0], 0, 2).ok  # y's value is still checked
