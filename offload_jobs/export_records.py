"""A partition's record batches decoded into Parquet rows, as a read_committed consumer
sees them.

The one place the offload jobs look inside batches: analytics wants records. aiokafka's
batch reader decompresses and decodes (per-record work, acceptable in a batch job, never
on the proxy's path; its package imports asyncio, nothing here uses it). Batches must
come in offset order. Control batches (transaction markers) are not records and are never
rows; a transactional batch's records wait for their producer's marker: a commit makes
them rows, an abort drops them (counted). Records whose transaction has no marker in the
range read (still open, or the marker lies past the end) are not exported either, and are
counted as undecided.

The rows: offset, timestamp (ms, UTC), key, value, headers, timestamp type (0 CreateTime,
1 LogAppendTime: the Iceberg export's column, not the Parquet export's); topic, partition
and the date (UTC, of the timestamp) are the hive-style directories the Parquet export
writes them under.

A decoder may resume where an earlier run stopped (the Iceberg export, `Resume`): the
batches below that run's end are skipped undecoded, but for the transactions it left
open (undecided), whose records are decided now; every other record below the end was
exported then or will never be (aborted).
"""

from __future__ import annotations

import datetime
import struct
from collections import defaultdict
from dataclasses import dataclass, field

import pyarrow as pa
from aiokafka.record.default_records import DefaultRecordBatch

from offload_jobs.sources import SourceBatch
from proxy.records.batches import read_batch_header

ABORT, COMMIT = 0, 1  # a control record's type, after its version, in its key
_CONTROL_KEY = struct.Struct(">hh")

SCHEMA = pa.schema([
    pa.field("offset", pa.int64(), nullable=False),
    pa.field("timestamp", pa.timestamp("ms", tz="UTC"), nullable=False),
    pa.field("key", pa.binary()),
    pa.field("value", pa.binary()),
    pa.field("headers", pa.list_(pa.struct([
        pa.field("key", pa.string(), nullable=False), pa.field("value", pa.binary()),
    ])), nullable=False),
])  # fmt: skip

Row = tuple[int, int, bytes | None, bytes | None, list[dict], int]


@dataclass(frozen=True, slots=True)
class Resume:
    """Where an earlier run of a partition stopped: every record below `end` was decided
    and exported (or aborted), but for the open transactions, producer id -> offset of
    the transaction's first batch, which were not. A run reads from `start`."""

    end: int = 0
    open: dict[int, int] = field(default_factory=dict)

    @property
    def start(self) -> int:
        return min([self.end, *self.open.values()])

    def skips(self, base_offset: int, producer_id: int, transactional: bool) -> bool:
        """A data batch already decided: below the end, and not of an open transaction."""
        if base_offset >= self.end:
            return False
        first = self.open.get(producer_id) if transactional else None
        return first is None or base_offset < first


class ExportDecodeError(ValueError):
    """A batch whose records cannot be decoded; names its offset."""

    def __init__(self, offset: int, what: str) -> None:
        super().__init__(f"offset {offset}: {what}")
        self.offset, self.what = offset, what


@dataclass
class DecodedRows:
    """Rows by date, and what the batches held."""

    by_date: dict[str, list[Row]] = field(default_factory=lambda: defaultdict(list))
    batches: int = 0
    bytes: int = 0
    records: int = 0  # rows
    aborted: int = 0  # records of aborted transactions, left out
    markers: int = 0  # control batches
    undecided: int = 0  # transactional records with no marker in the range
    skipped: int = 0  # batches an earlier run decided (`Resume`), not decoded
    open: dict[int, int] = field(default_factory=dict)  # undecided: producer -> first offset


class RecordDecoder:
    """Feed a partition's batches in offset order with `add`, then `finish`."""

    def __init__(self, resume: Resume | None = None) -> None:
        self.rows = DecodedRows()
        self._open: dict[int, list[Row]] = {}  # producer id -> rows of its open transaction
        self._first: dict[int, int] = {}  # producer id -> its open transaction's first offset
        self._resume = resume or Resume()

    def add(self, batch: SourceBatch) -> None:
        header = read_batch_header(batch.data)
        self.rows.batches += 1
        self.rows.bytes += len(batch.data)
        if not header.is_control and self._resume.skips(
            batch.base_offset, header.producer_id, header.is_transactional
        ):
            self.rows.skipped += 1
            return
        try:
            parsed = DefaultRecordBatch(bytes(batch.data))
            records = list(parsed)
        except Exception as exc:  # aiokafka raises several kinds on a bad batch
            raise ExportDecodeError(batch.base_offset, f"cannot decode the batch: {exc}") from None
        if header.is_control:
            self.rows.markers += 1
            pending = self._open.pop(header.producer_id, [])
            self._first.pop(header.producer_id, None)
            kind = _control_type(records, batch.base_offset)
            if kind == COMMIT:
                self._emit(pending)
            else:
                self.rows.aborted += len(pending)
            return
        kind = parsed.timestamp_type
        rows = [
            (r.offset, r.timestamp, r.key, r.value,
             [{"key": k, "value": v} for k, v in r.headers], kind)
            for r in records
        ]  # fmt: skip
        if header.is_transactional:
            self._first.setdefault(header.producer_id, batch.base_offset)
            self._open.setdefault(header.producer_id, []).extend(rows)
        else:
            self._emit(rows)

    def drain(self, limit: int) -> list[tuple[str, list[Row]]]:
        """(date, rows) of each date holding `limit` rows or more, taken out: write them
        now and memory stays bounded. Rows come in the order they were decided."""
        full = [date for date, rows in self.rows.by_date.items() if len(rows) >= limit]
        return [(date, self.rows.by_date.pop(date)) for date in full]

    def finish(self) -> DecodedRows:
        self.rows.undecided = sum(len(rows) for rows in self._open.values())
        self.rows.open = dict(self._first)
        self._open.clear()
        return self.rows

    def _emit(self, rows: list[Row]) -> None:
        for row in rows:
            self.rows.by_date[utc_date(row[1])].append(row)
        self.rows.records += len(rows)


def _control_type(records, offset: int) -> int:
    if len(records) != 1 or records[0].key is None or len(records[0].key) < _CONTROL_KEY.size:
        raise ExportDecodeError(offset, "a control batch without one control record")
    _version, kind = _CONTROL_KEY.unpack_from(records[0].key)
    if kind not in (ABORT, COMMIT):
        raise ExportDecodeError(offset, f"control record of unknown type {kind}")
    return kind


def utc_date(timestamp_ms: int) -> str:
    return datetime.datetime.fromtimestamp(timestamp_ms / 1000, datetime.UTC).date().isoformat()


def to_table(rows: list[Row]) -> pa.Table:
    """Rows in offset order as a table of SCHEMA (the timestamp type is not a column)."""
    columns = list(zip(*rows, strict=True))[: len(SCHEMA)] if rows else [[]] * len(SCHEMA)
    return pa.Table.from_arrays(
        [pa.array(column, type=f.type) for column, f in zip(columns, SCHEMA, strict=True)],
        schema=SCHEMA,
    )
