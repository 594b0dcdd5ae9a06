"""read_committed answers of stored batches (proxy/records/transactions.py): the aborted
transactions they name and where they stop, on batches built by kafka-python's writer
as producers and coordinators write them."""

from __future__ import annotations

import struct
import warnings

import crc32c
import pytest

from proxy.records.batches import iter_batches, with_base_offset
from proxy.records.transactions import (
    ABORT,
    COMMIT,
    CommittedView,
    ControlRecordError,
    committed_view,
    marker_type,
)

with warnings.catch_warnings():
    warnings.filterwarnings("ignore", "(read_text|open_text) is deprecated", DeprecationWarning)
    from kafka.record.default_records import DefaultRecordBatchBuilder

T = 1_700_000_000_000


def data(producer: int = -1, records: int = 2, transactional: bool = False) -> bytes:
    builder = DefaultRecordBatchBuilder(2, 0, transactional, producer, 0 if producer >= 0 else -1,
                                        0 if producer >= 0 else -1, 1 << 20)  # fmt: skip
    for i in range(records):
        builder.append(i, timestamp=T, key=None, value=b"v%d" % i, headers=[])
    return bytes(builder.build())


def marker(producer: int, kind: int, key: bytes | None = None) -> bytes:
    """A transaction marker as a coordinator writes it: control bit, one record."""
    builder = DefaultRecordBatchBuilder(2, 0, True, producer, 0, -1, 1 << 20)
    key = struct.pack(">hh", 0, kind) if key is None else key
    builder.append(0, timestamp=T, key=key, value=struct.pack(">hi", 0, 1), headers=[])
    out = bytearray(builder.build())
    struct.pack_into(">h", out, 21, 0x30)  # transactional + control
    struct.pack_into(">I", out, 17, crc32c.crc32c(out[21:]))
    return bytes(out)


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
