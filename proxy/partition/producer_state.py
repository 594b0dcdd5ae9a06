"""Idempotent-producer state of one partition, kept as Kafka's broker keeps it.

Modelled on Kafka's ProducerStateEntry, BatchMetadata and ProducerAppendInfo
(storage/internals/log); see docs/sequencer.md. Per producer id: its epoch, when it was
last used, and the metadata of its last 5 batches (KIP-98), enough to answer a retry of
any batch a producer can have in flight (max.in.flight.requests.per.connection <= 5).

Entries are immutable: an append makes new entries, which the sequencer applies only
when the append is committed. Also here: the snapshot codec (format in docs/sequencer.md).

Pure: no I/O, no asyncio.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from dataclasses import dataclass
from enum import IntEnum

import crc32c

NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
NO_SEQUENCE = -1
NO_TIMESTAMP = -1
NUM_BATCHES_TO_RETAIN = 5
INT32_MAX = (1 << 31) - 1
DEFAULT_PRODUCER_ID_EXPIRATION_MS = 86_400_000  # Kafka's producer.id.expiration.ms


class ErrorCode(IntEnum):
    """The Kafka error codes the sequencer answers with (Kafka's Errors names)."""

    NONE = 0
    CORRUPT_MESSAGE = 2  # bad magic, CRC, length or codec
    INVALID_REQUEST = 42  # transactional produce: not supported on tiered topics
    OUT_OF_ORDER_SEQUENCE_NUMBER = 45
    INVALID_PRODUCER_EPOCH = 47
    KAFKA_STORAGE_ERROR = 56  # the sequencer was fenced after a failed write
    INVALID_RECORD = 87  # well-formed but refused: control batch, bad count or sequence


def increment_sequence(sequence: int, increment: int) -> int:
    """`sequence + increment` in Kafka's sequence space, which wraps from INT32_MAX to 0."""
    return (sequence + increment) % (INT32_MAX + 1)


def decrement_sequence(sequence: int, decrement: int) -> int:
    return (sequence - decrement) % (INT32_MAX + 1)


def in_sequence(last_seq: int, next_seq: int) -> bool:
    return next_seq == last_seq + 1 or (next_seq == 0 and last_seq == INT32_MAX)


@dataclass(frozen=True, slots=True)
class BatchMetadata:
    """One appended batch of a producer, as Kafka's BatchMetadata."""

    last_seq: int
    last_offset: int
    offset_delta: int  # last offset - first offset
    timestamp: int  # the batch's max timestamp as written (the append time on LogAppendTime)

    @property
    def first_seq(self) -> int:
        return decrement_sequence(self.last_seq, self.offset_delta)

    @property
    def first_offset(self) -> int:
        return self.last_offset - self.offset_delta


@dataclass(frozen=True, slots=True)
class ProducerStateEntry:
    """What a partition knows of one producer id. `batches` is oldest first, at most 5,
    all of `producer_epoch`. `last_timestamp` is when it was last used (for expiration)."""

    producer_id: int
    producer_epoch: int
    last_timestamp: int
    batches: tuple[BatchMetadata, ...] = ()

    @property
    def last_seq(self) -> int:
        return self.batches[-1].last_seq if self.batches else NO_SEQUENCE

    def find_duplicate(
        self, producer_epoch: int, first_seq: int, last_seq: int
    ) -> BatchMetadata | None:
        """The retained batch with exactly this epoch and sequence range: a retry."""
        if producer_epoch != self.producer_epoch:
            return None
        for batch in self.batches:
            if batch.last_seq == last_seq and batch.first_seq == first_seq:
                return batch
        return None

    def with_batch(
        self, producer_epoch: int, batch: BatchMetadata, now_ms: int
    ) -> ProducerStateEntry:
        """This entry after `batch`: a new epoch forgets the old epoch's batches."""
        kept = self.batches if producer_epoch == self.producer_epoch else ()
        return ProducerStateEntry(
            self.producer_id, producer_epoch, now_ms, (*kept, batch)[-NUM_BATCHES_TO_RETAIN:]
        )

    def with_epoch(self, producer_epoch: int, now_ms: int) -> ProducerStateEntry:
        """This entry after a control batch of `producer_epoch` (seen in replay only)."""
        kept = self.batches if producer_epoch == self.producer_epoch else ()
        return ProducerStateEntry(self.producer_id, producer_epoch, now_ms, kept)


def empty_entry(producer_id: int) -> ProducerStateEntry:
    """A producer id the partition has no state for (Kafka's ProducerStateEntry.empty)."""
    return ProducerStateEntry(producer_id, NO_PRODUCER_EPOCH, NO_TIMESTAMP)


def check_append(
    entry: ProducerStateEntry, producer_epoch: int, first_seq: int
) -> tuple[ErrorCode, str] | None:
    """Kafka's checkProducerEpoch and checkSequence for a client batch that is not a
    duplicate: None if it may be appended, else the error code and why.

    A producer id with no state (`empty_entry`) is accepted at any sequence, as Kafka has
    done since 2.5 (KIP-360, KAFKA-8710): its state may have expired or been lost.
    """
    pid = entry.producer_id
    if producer_epoch < entry.producer_epoch:
        return ErrorCode.INVALID_PRODUCER_EPOCH, (
            f"epoch {producer_epoch} of producer {pid} is smaller than the last seen "
            f"epoch {entry.producer_epoch}"
        )
    if producer_epoch != entry.producer_epoch:
        if first_seq != 0 and entry.producer_epoch != NO_PRODUCER_EPOCH:
            return ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER, (
                f"invalid sequence number for new epoch {producer_epoch} of producer {pid}: "
                f"{first_seq} (a new epoch starts at 0), {entry.producer_epoch} (current epoch)"
            )
        return None
    if entry.producer_epoch == NO_PRODUCER_EPOCH or in_sequence(entry.last_seq, first_seq):
        return None
    return ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER, (
        f"out of order sequence number for producer {pid}: {first_seq} (incoming seq. "
        f"number), {entry.last_seq} (current end sequence number)"
    )


# The snapshot (docs/sequencer.md): big-endian, Kafka's snapshot header (version, CRC-32C).
SNAPSHOT_VERSION = 1
_SNAPSHOT_HEADER = struct.Struct(">hI")  # version, CRC-32C of every byte after it
_SNAPSHOT_BODY = struct.Struct(">qi")  # offset covered, producer count
_SNAPSHOT_PRODUCER = struct.Struct(">qhqb")  # id, epoch, last timestamp, batch count
_SNAPSHOT_BATCH = struct.Struct(">iqiq")  # last seq, last offset, offset delta, timestamp


class CorruptSnapshotError(ValueError):
    """Snapshot bytes that cannot be trusted: damaged, cut short, or of an unknown version."""


def encode_snapshot(offset: int, entries: Iterable[ProducerStateEntry]) -> bytes:
    """The state of `entries`, which covers every batch below `offset`."""
    entries = sorted(entries, key=lambda entry: entry.producer_id)
    parts = [_SNAPSHOT_BODY.pack(offset, len(entries))]
    for entry in entries:
        parts.append(
            _SNAPSHOT_PRODUCER.pack(
                entry.producer_id, entry.producer_epoch, entry.last_timestamp, len(entry.batches)
            )
        )
        parts.extend(
            _SNAPSHOT_BATCH.pack(b.last_seq, b.last_offset, b.offset_delta, b.timestamp)
            for b in entry.batches
        )
    body = b"".join(parts)
    return _SNAPSHOT_HEADER.pack(SNAPSHOT_VERSION, crc32c.crc32c(body)) + body


def decode_snapshot(data: bytes | bytearray | memoryview) -> tuple[int, list[ProducerStateEntry]]:
    """`(offset, entries)` from `encode_snapshot`'s bytes; CorruptSnapshotError otherwise."""
    view = memoryview(data).cast("B")
    if len(view) < _SNAPSHOT_HEADER.size + _SNAPSHOT_BODY.size:
        raise CorruptSnapshotError(f"{len(view)} bytes is too short for a producer snapshot")
    version, crc = _SNAPSHOT_HEADER.unpack_from(view)
    if version != SNAPSHOT_VERSION:
        raise CorruptSnapshotError(f"producer snapshot version {version} is not known")
    computed = crc32c.crc32c(view[_SNAPSHOT_HEADER.size :])
    if computed != crc:
        raise CorruptSnapshotError(
            f"CRC-32C mismatch: stored {crc:#010x}, computed {computed:#010x}"
        )
    pos = _SNAPSHOT_HEADER.size
    offset, count = _SNAPSHOT_BODY.unpack_from(view, pos)
    pos += _SNAPSHOT_BODY.size
    if offset < 0:
        raise CorruptSnapshotError(f"negative offset {offset}")
    entries: dict[int, ProducerStateEntry] = {}
    try:
        for _ in range(count):
            pid, epoch, last_timestamp, batch_count = _SNAPSHOT_PRODUCER.unpack_from(view, pos)
            pos += _SNAPSHOT_PRODUCER.size
            if not 0 <= batch_count <= NUM_BATCHES_TO_RETAIN or pid in entries:
                raise CorruptSnapshotError(f"producer {pid}: bad or repeated entry")
            batches = []
            for _ in range(batch_count):
                batches.append(BatchMetadata(*_SNAPSHOT_BATCH.unpack_from(view, pos)))
                pos += _SNAPSHOT_BATCH.size
            entries[pid] = ProducerStateEntry(pid, epoch, last_timestamp, tuple(batches))
    except struct.error:
        raise CorruptSnapshotError("producer snapshot cut short") from None
    if count < 0 or pos != len(view):
        raise CorruptSnapshotError(f"producer count {count} does not match {len(view)} bytes")
    return offset, list(entries.values())
