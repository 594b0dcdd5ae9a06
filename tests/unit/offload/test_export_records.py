"""The export's decoding with batches built here: plain records become rows with every
field; a transaction's records become rows at its commit marker and are dropped at its
abort; markers are never rows; a transaction with no marker is undecided; rows are
grouped by their UTC date; a batch that cannot be decoded names its offset."""

from __future__ import annotations

import struct

import crc32c
import pytest

from offload_jobs.export_records import (
    ABORT,
    COMMIT,
    ExportDecodeError,
    RecordDecoder,
    Resume,
    to_table,
    utc_date,
)
from offload_jobs.sources import SourceBatch
from proxy.records.batches import (
    ATTRIBUTES_POSITION,
    CRC_POSITION,
    read_batch_header,
)
from tests.support.batches import build_batch

DAY_MS = 86_400_000
T0 = 1_700_000_000_000  # 2023-11-14 22:13:20 UTC


def batch(
    base: int, rows: list[tuple], *, producer: int = -1, transactional=False, codec: int = 1
) -> SourceBatch:
    """A v2 batch as aiokafka's producer writes it; gzip unless told."""
    epoch = sequence = 0 if producer >= 0 else -1
    data = build_batch(
        [value for _, _, value, _ in rows], keys=[key for _, key, _, _ in rows],
        timestamps=[timestamp for timestamp, _, _, _ in rows],
        record_headers=[headers for _, _, _, headers in rows], codec=codec, producer_id=producer,
        producer_epoch=epoch, base_sequence=sequence, transactional=transactional, base_offset=base,
    )  # fmt: skip
    return SourceBatch(base, base + len(rows) - 1, memoryview(data))


def marker(offset: int, producer: int, kind: int) -> SourceBatch:
    """A control batch as a transaction coordinator writes it (control bit, one record)."""
    made = batch(offset, [(T0, struct.pack(">hh", 0, kind), b"\0\0\0\0\0\0", [])],
                 producer=producer, transactional=True, codec=0)  # fmt: skip
    data = bytearray(made.data)
    attributes = struct.unpack_from(">h", data, ATTRIBUTES_POSITION)[0] | 0x20
    struct.pack_into(">h", data, ATTRIBUTES_POSITION, attributes)
    struct.pack_into(">I", data, CRC_POSITION, crc32c.crc32c(data[ATTRIBUTES_POSITION:]))
    assert read_batch_header(data).is_control
    return SourceBatch(offset, offset, memoryview(bytes(data)))


def test_plain_records_become_rows_with_every_field():
    decoder = RecordDecoder()
    decoder.add(batch(0, [(T0, b"k", b"v", [("h", b"1"), ("h", None)]), (T0 + 1, None, None, [])]))
    rows = decoder.finish()
    assert rows.records == 2 and rows.batches == 1 and rows.bytes > 0
    assert rows.by_date == {
        "2023-11-14": [
            (0, T0, b"k", b"v", [{"key": "h", "value": b"1"}, {"key": "h", "value": None}], 0),
            (1, T0 + 1, None, None, [], 0),
        ]
    }


def test_transactions_commit_abort_and_undecided():
    decoder = RecordDecoder()
    decoder.add(batch(0, [(T0, None, b"a", [])] * 2, producer=7, transactional=True))
    decoder.add(batch(2, [(T0, None, b"b", [])], producer=8, transactional=True))
    decoder.add(batch(3, [(T0, None, b"plain", [])]))
    decoder.add(marker(4, 8, ABORT))
    decoder.add(marker(5, 7, COMMIT))
    decoder.add(batch(6, [(T0, None, b"open", [])] * 3, producer=8, transactional=True))
    rows = decoder.finish()
    day = rows.by_date[utc_date(T0)]
    assert [(r[0], r[3]) for r in day] == [(3, b"plain"), (0, b"a"), (1, b"a")]
    assert (rows.records, rows.aborted, rows.markers, rows.undecided) == (3, 1, 2, 3)
    table = to_table(sorted(day))
    assert table.column("offset").to_pylist() == [0, 1, 3]


def test_rows_are_grouped_by_utc_date():
    decoder = RecordDecoder()
    decoder.add(batch(0, [(T0, None, b"x", []), (T0 + DAY_MS, None, b"y", [])]))
    assert sorted(decoder.finish().by_date) == ["2023-11-14", "2023-11-15"]


def test_full_days_are_drained_and_the_rest_left():
    decoder = RecordDecoder()
    decoder.add(batch(0, [(T0, None, b"x", [])] * 3))
    decoder.add(batch(3, [(T0 + DAY_MS, None, b"y", [])]))
    drained = decoder.drain(3)
    assert [(date, [r[0] for r in rows]) for date, rows in drained] == [("2023-11-14", [0, 1, 2])]
    assert decoder.drain(3) == []
    rows = decoder.finish()
    assert list(rows.by_date) == ["2023-11-15"] and rows.records == 4


def test_a_batch_that_cannot_be_decoded_names_its_offset():
    good = batch(40, [(T0, None, b"x" * 50, [])])
    data = bytearray(good.data)
    data[-10:] = b"\xff" * 10  # the compressed records no longer decompress
    with pytest.raises(ExportDecodeError, match="offset 40: cannot decode the batch"):
        RecordDecoder().add(SourceBatch(40, 40, memoryview(bytes(data))))


def log() -> list[SourceBatch]:
    """Producer 7's transaction [0, 2) commits at 5; producer 8's [2, 3) is still open
    at 6 (a run ending there leaves it undecided) and commits at 8; plain records at 3,
    4 (after 8's transaction began) and 7."""
    return [
        batch(0, [(T0, None, b"a", [])] * 2, producer=7, transactional=True),
        batch(2, [(T0, None, b"b", [])], producer=8, transactional=True),
        batch(3, [(T0, None, b"plain", [])] * 2),
        marker(5, 7, COMMIT),
        batch(6, [(T0, None, b"b2", [])], producer=8, transactional=True),
        batch(7, [(T0, None, b"late", [])]),
        marker(8, 8, COMMIT),
    ]


def test_a_run_resumed_where_one_stopped_decides_the_open_transaction_only():
    """Two runs split at offset 6 export what one run over the whole log does, each
    record once: the second starts at the open transaction's first batch (2) and skips
    what the first decided there (7's transaction, the plain records)."""
    whole = RecordDecoder()
    for b in log():
        whole.add(b)
    everything = sorted(whole.finish().by_date[utc_date(T0)])

    first = RecordDecoder()
    for b in log()[:4]:  # up to offset 6
        first.add(b)
    one = first.finish()
    assert one.open == {8: 2} and one.undecided == 1
    resume = Resume(6, one.open)
    assert resume.start == 2
    second = RecordDecoder(resume)
    for b in log():
        if b.last_offset >= resume.start:
            second.add(b)
    two = second.finish()
    assert two.skipped == 1 and two.open == {} and two.undecided == 0
    rows = one.by_date[utc_date(T0)] + two.by_date[utc_date(T0)]
    assert sorted(rows) == everything and len(everything) == 7
    assert [r[0] for r in sorted(two.by_date[utc_date(T0)])] == [2, 6, 7]


def test_resume_skips_only_what_was_decided():
    resume = Resume(10, {8: 4})
    assert resume.start == 4 and Resume(10).start == 10
    assert resume.skips(3, 8, True)  # 8's earlier transaction, decided
    assert not resume.skips(4, 8, True) and not resume.skips(10, 9, False)
    assert resume.skips(5, 9, True) and resume.skips(5, 8, False)
