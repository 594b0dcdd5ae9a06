"""read_committed answers of stored batches (proxy/records/transactions.py): the aborted
transactions they name and where they stop, on batches built by kafka-python's writer
as producers and coordinators write them."""

from __future__ import annotations

import struct

import pytest

from proxy.records.batches import iter_batches, read_batch_header, with_base_offset
from proxy.records.transactions import (
    ABORT,
    COMMIT,
    CommittedAnswer,
    CommittedView,
    ControlRecordError,
    committed_answer,
    committed_view,
    marker_type,
)
from tests.support.batches import build_batch, control_batch

T = 1_700_000_000_000


def data(producer: int = -1, records: int = 2, transactional: bool = False) -> bytes:
    idempotent = 0 if producer >= 0 else -1
    return build_batch(
        [b"v%d" % i for i in range(records)], timestamps=[T] * records, producer_id=producer,
        producer_epoch=idempotent, base_sequence=idempotent, transactional=transactional,
    )  # fmt: skip


def marker(producer: int, kind: int, key: bytes | None = None) -> bytes:
    """A transaction marker as a coordinator writes it: control bit, one record."""
    return control_batch(producer, 0, kind, coordinator_epoch=1, key=key, timestamp=T)


def log(*batches: bytes) -> list[memoryview]:
    """The batches with consecutive offsets from 100, as separate views."""
    run = with_base_offset(b"".join(batches), 100)
    return [view for _, view in iter_batches(memoryview(run))]


def offsets(batches) -> list[int]:
    return [struct.unpack_from(">q", b)[0] for b in batches]


def test_marker_types():
    assert marker_type(marker(7, ABORT)) == ABORT
    assert marker_type(marker(7, COMMIT)) == COMMIT
    with pytest.raises(ControlRecordError, match="unknown type 5"):
        marker_type(marker(7, 5))
    with pytest.raises(ControlRecordError, match="key of 1 bytes"):
        marker_type(marker(7, ABORT, key=b"\x00"))


def test_batches_without_transactions_are_all_answered():
    batches = log(data(), data(producer=5), data())
    assert committed_view(batches) == CommittedView(3, ())


def test_an_aborted_transaction_is_named_by_its_first_batch_in_the_answer():
    seven, eight = data(7, transactional=True), data(8, transactional=True)
    batches = log(data(), seven, eight, seven, marker(7, ABORT), marker(8, COMMIT), data())
    at = offsets(batches)
    assert committed_view(batches) == CommittedView(7, ((7, at[1]),))


def test_the_answer_stops_before_a_transaction_whose_marker_is_not_in_it():
    batches = log(data(9, transactional=True), marker(9, ABORT), data(),
                  data(7, transactional=True), data(), data(8, transactional=True),
                  marker(8, ABORT))  # fmt: skip
    at = offsets(batches)
    # 7 is undecided: stop before its first batch; 8's abort lies beyond the stop
    assert committed_view(batches) == CommittedView(3, ((9, at[0]),), undecided_at=at[3])
    # an undecided transaction first: nothing can be answered without reading further
    first_open = log(data(7, transactional=True), data(), marker(8, COMMIT))
    assert committed_view(first_open) == CommittedView(0, (), offsets(first_open)[0])


def test_a_transaction_started_before_the_answer_is_decided_by_its_marker():
    # its first batches came in an earlier answer, which stopped before them; here the
    # transaction goes on, then aborts: its first batch here names it
    batches = log(data(7, transactional=True), marker(7, ABORT), data(7, transactional=True),
                  marker(7, COMMIT))  # fmt: skip
    at = offsets(batches)
    assert committed_view(batches) == CommittedView(4, ((7, at[0]),))


# -- committed_answer: the last stable offset and the run ---------------------------------


def ends(batches) -> list[int]:
    return [read_batch_header(b).next_offset for b in batches]


def test_known_lso_stops_the_answer_and_a_marker_past_it_still_decides():
    # 8 opens at 101 and aborts at 104, past the LSO 103 where 9's open transaction starts
    batches = log(data(), data(8, transactional=True), data(), data(9, transactional=True),
                  marker(8, ABORT))  # fmt: skip
    at = offsets(batches)
    answer = committed_answer(batches, 100, 1 << 20, last_stable=at[3], end=200, exhausted=False)
    assert answer == CommittedAnswer(3, ((8, at[1]),), at[3])


def test_known_lso_at_the_first_batch_answers_nothing_and_reads_no_further():
    batches = log(data(9, transactional=True), data())
    answer = committed_answer(batches, 100, 1 << 20, last_stable=100, end=200, exhausted=False)
    assert answer == CommittedAnswer(0, (), 100, read_more=False)


def test_a_first_batch_below_the_lso_without_its_marker_asks_for_a_longer_run():
    batches = log(data(8, transactional=True), data())
    answer = committed_answer(batches, 100, 1 << 20, last_stable=150, end=200, exhausted=False)
    assert answer == CommittedAnswer(0, (), 150, read_more=True)
    # a run that reaches the high watermark holds every marker: nothing more to read
    done = committed_answer(batches, 100, 1 << 20, last_stable=150, end=200, exhausted=True)
    assert done.read_more is False


def test_unknown_lso_is_what_the_batches_decide():
    decided = log(data(), data(8, transactional=True), marker(8, COMMIT))
    answer = committed_answer(decided, 100, 1 << 20, last_stable=None, end=500, exhausted=False)
    assert answer == CommittedAnswer(3, (), ends(decided)[-1])
    at_end = committed_answer(decided, 100, 1 << 20, last_stable=None, end=500, exhausted=True)
    assert at_end.last_stable_offset == 500
    undecided = log(data(), data(8, transactional=True), data())
    at = offsets(undecided)
    answer = committed_answer(undecided, 100, 1 << 20, last_stable=None, end=500, exhausted=True)
    assert answer == CommittedAnswer(1, (), at[1])
    first = log(data(8, transactional=True), data())
    more = committed_answer(first, 100, 1 << 20, last_stable=None, end=500, exhausted=False)
    assert more == CommittedAnswer(0, (), 100, read_more=True)
    stuck = committed_answer(first, 100, 1 << 20, last_stable=None, end=500, exhausted=True)
    assert stuck == CommittedAnswer(0, (), 100)
    assert committed_answer([], 120, 1 << 20, last_stable=None, end=500, exhausted=False) == (
        CommittedAnswer(0, (), 120)
    )


def test_the_answer_keeps_max_bytes_after_deciding_with_a_longer_run():
    batches = log(data(8, transactional=True), data(), data(), marker(8, ABORT), data())
    at = offsets(batches)
    size = len(batches[0])
    answer = committed_answer(batches, 100, size, last_stable=500, end=500, exhausted=True)
    assert answer == CommittedAnswer(1, ((8, at[0]),), 500)
    # an aborted transaction starting past the answer is not named
    later = log(data(), data(8, transactional=True), marker(8, ABORT))
    answer = committed_answer(later, 100, 1, last_stable=500, end=500, exhausted=True)
    assert answer == CommittedAnswer(1, (), 500)


def test_the_lso_is_never_past_the_high_watermark():
    batches = log(data(), data())
    answer = committed_answer(
        batches, 100, 1 << 20, last_stable=900, end=ends(batches)[0], exhausted=False
    )
    assert answer.last_stable_offset == ends(batches)[0]
    assert answer.count == 1
