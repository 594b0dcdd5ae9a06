"""What the partition sequencer answers (`sequencer.py`), and Kafka's checks of a
client's batch header. Pure: no I/O, no asyncio."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from kio.schema.errors import ErrorCode

from proxy.partition.producer_state import ProducerStateEntry
from proxy.partition.sequence_holes import SequenceGap
from proxy.records.batches import BatchHeader
from proxy.records.markers import Marker

__all__ = [
    "AppendResult",
    "CompletedTxn",
    "Duplicate",
    "PendingAppend",
    "Rejected",
    "refuse_batch",
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
