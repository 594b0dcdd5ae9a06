"""The fault-injection suite's transactional end checks (txnload.check) on made-up reads:
pure, so not marked `faults`: they run with the rest of the suite."""

from __future__ import annotations

from txnload import TXN_RECORDS, TxnLoad, check, txn_value


def test_the_transactional_checks_see_what_they_are_there_for():
    """txnload.check on made-up reads: a committed transaction lost in part, an aborted
    one visible, an unknown one in part, a record twice, the live consumer ahead."""
    load = TxnLoad("unused:9092", "unused", 2, "zone-a")
    load.outcomes = {1: "committed", 2: "aborted", 3: "unknown", 4: "committed"}

    def records(*txns: int) -> dict[tuple[int, int], bytes]:
        values = [txn_value(n, i, 20) for n in txns for i in range(TXN_RECORDS)]
        return {(0, offset): value for offset, value in enumerate(values)}

    good = records(1, 4)
    live = {0: [(offset, value) for (_, offset), value in sorted(good.items())[:3]]}
    clean = check(load, good, records(1, 2, 4), live)
    assert clean["txn_committed"] == 2 and clean["txn_aborted_records_written"] == TXN_RECORDS
    assert [clean[k] for k in ("txn_committed_lost", "txn_aborted_visible")] == [[], []]
    assert [clean[k] for k in ("txn_unknown_partial", "txn_live_differs")] == [[], []]
    assert clean["txn_records_twice"] == clean["txn_live_twice"] == 0

    lost = dict(list(good.items())[:-1])
    assert check(load, lost, good, {})["txn_committed_lost"] == [4]
    assert check(load, records(1, 2, 4), good, {})["txn_aborted_visible"] == [2]
    partial = {**good, (1, 0): txn_value(3, 0, 20)}
    assert check(load, partial, good, {})["txn_unknown_partial"] == [3]
    twice = {**good, (1, 0): good[(0, 0)]}
    assert check(load, twice, good, {})["txn_records_twice"] == 1
    ahead = {0: [(100, txn_value(2, 0, 20))]}
    assert check(load, good, good, ahead)["txn_live_differs"] == [(0, 100)]
