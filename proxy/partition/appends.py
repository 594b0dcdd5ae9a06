"""What the partition sequencer answers (`sequencer.py`), Kafka's checks of a client's
batch headers, and the sequencer's per-request helpers. Pure: no I/O, no asyncio."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from itertools import pairwise

from kio.schema.errors import ErrorCode

from proxy.partition.producer_state import (
    NO_TIMESTAMP,
    BatchMetadata,
    ProducerStateEntry,
    increment_sequence,
)
from proxy.partition.sequence_holes import SequenceGap
from proxy.records.batches import (
    BatchHeader,
    CorruptBatchError,
    iter_batches,
    set_log_append_time,
    validate_batch,
    validate_header,
)
from proxy.records.markers import Marker

__all__ = [
    "AppendResult",
    "CompletedTxn",
    "Duplicate",
    "PendingAppend",
    "Rejected",
    "duplicate_answer",
    "refuse_batch",
    "sequence_gap",
    "stamp_log_append_time",
    "validate_records",
    "validate_referenced",
]


@dataclass(frozen=True, slots=True)
class CompletedTxn:
    """A transaction a marker ended in this partition (Kafka's CompletedTxn): its first
    offset here, the marker's offset, and whether it was aborted."""

    producer_id: int
    first_offset: int
    last_offset: int
    aborted: bool


@dataclass(frozen=True, slots=True, eq=False)
class PendingAppend:
    """Batches with offsets assigned, to be written to the WAL, then committed or aborted.
    For a marker's control batch, `marker` is the marker and `completed` the transaction
    it ends here (None: the producer had no transaction open in this partition)."""

    records: bytearray
    base_offset: int
    last_offset: int
    log_append_time_ms: int  # -1 unless the topic uses LogAppendTime
    producer_states: Mapping[int, ProducerStateEntry]  # applied by commit
    marker: Marker | None = None
    completed: CompletedTxn | None = None

    @property
    def next_offset(self) -> int:
        return self.last_offset + 1


@dataclass(frozen=True, slots=True)
class Duplicate:
    """A retry of batches already appended: answer with their offsets, write nothing.
    If `awaiting` is set, the original is not durable yet: answer once it is committed."""

    base_offset: int
    last_offset: int
    log_append_time_ms: int
    awaiting: PendingAppend | None = None


@dataclass(frozen=True, slots=True)
class Rejected:
    """The partition's answer is `error_code`; `message` says why (Produce v8+ error_message).
    For a marker: Kafka's leader would refuse it, so it is skipped."""

    error_code: ErrorCode
    message: str
    # OUT_OF_ORDER_SEQUENCE_NUMBER: which sequences are missing, to tell a gap the proxy
    # made (a batch it dropped) from one the client made (sequence_holes.py)
    gap: SequenceGap | None = None


AppendResult = PendingAppend | Duplicate | Rejected


def refuse_batch(header: BatchHeader) -> Rejected | None:
    """Kafka's LogValidator checks of a client's batch header."""
    if header.record_count <= 0 or header.record_count != header.last_offset_delta + 1:
        return Rejected(
            ErrorCode.invalid_record,
            f"record count {header.record_count} does not match the last offset delta "
            f"{header.last_offset_delta}",
        )
    if header.is_control:
        return Rejected(
            ErrorCode.invalid_record, "clients are not allowed to write control records"
        )
    if header.producer_id >= 0 and header.base_sequence < 0:
        return Rejected(
            ErrorCode.invalid_record,
            f"invalid sequence number {header.base_sequence} in a batch of producer "
            f"{header.producer_id}",
        )
    return None


def validate_records(records: bytes | bytearray | memoryview) -> list[BatchHeader] | Rejected:
    """The headers of a partition's records, each batch validated (CRC, length, codec)
    and checked as Kafka's LogValidator checks a client's batch."""
    headers: list[BatchHeader] = []
    position = 0
    try:
        for _, batch in iter_batches(records):
            headers.append(validate_batch(batch, position))
            position += len(batch)
    except CorruptBatchError as exc:
        return Rejected(ErrorCode.corrupt_message, str(exc))
    if not headers:
        return Rejected(ErrorCode.invalid_record, "a partition's records hold no record batch")
    for header in headers:
        refusal = refuse_batch(header)
        if refusal is not None:
            return refusal
    return headers


def validate_referenced(header: bytes | bytearray | memoryview) -> list[BatchHeader] | Rejected:
    """`validate_records` for one batch known by its header only (its bytes are in an
    S3-WAL object, their CRC checked by the proxy that PUT them): the same checks, but
    the CRC's."""
    try:
        checked = validate_header(header)
    except CorruptBatchError as exc:
        return Rejected(ErrorCode.corrupt_message, str(exc))
    refusal = refuse_batch(checked)
    return [checked] if refusal is None else refusal


def duplicate_answer(
    duplicates: list[BatchMetadata],
    batch_count: int,
    pending: Iterable[PendingAppend],
    high_watermark: int,
    log_append_time: bool,
) -> Duplicate | Rejected:
    """The answer to a request whose batches are retries (`duplicates`, of `batch_count`).
    One answer (a base offset) must describe the whole request: a mix of retried and new
    batches cannot be answered, nor retries whose originals are not adjacent. (Kafka
    refuses any produce v3+ with more than one batch per partition.)"""
    if len(duplicates) != batch_count or any(
        later.first_offset != earlier.last_offset + 1 for earlier, later in pairwise(duplicates)
    ):
        return Rejected(
            ErrorCode.invalid_record,
            "a partition's records mix retried batches with new or non-adjacent ones",
        )
    first, last = duplicates[0], duplicates[-1]
    awaiting = None
    if last.last_offset >= high_watermark:
        awaiting = next(p for p in pending if p.base_offset <= last.last_offset <= p.last_offset)
    append_time = first.timestamp if log_append_time else NO_TIMESTAMP
    return Duplicate(first.first_offset, last.last_offset, append_time, awaiting)


def sequence_gap(
    entry: ProducerStateEntry, epoch: int, first_seq: int, code: ErrorCode
) -> SequenceGap | None:
    """The gap an OUT_OF_ORDER_SEQUENCE_NUMBER refusal names (sequence_holes.py)."""
    if code != ErrorCode.out_of_order_sequence_number:
        return None
    expected = increment_sequence(entry.last_seq, 1) if epoch == entry.producer_epoch else 0
    return SequenceGap(entry.producer_id, epoch, expected, first_seq)


def stamp_log_append_time(out: bytearray, headers: list[BatchHeader], now_ms: int) -> None:
    """Stamp every batch of the run in `out` with the append time (LogAppendTime topic)."""
    position = 0
    for header in headers:
        set_log_append_time(out, position, header, now_ms)
        position += header.size
