"""The producer snapshot: a partition's committed producer state as bytes (the metadata
keeps it; a new owner restores from it). Format: docs/sequencer.md, "Snapshot format".

Version 2 (written) adds to version 1 (still read) what transactions need: per producer
the coordinator epoch of its last marker and the first offset of its open transaction,
and per partition the marker position (the next offset of Kafka's log of the partition
the marker follower has to consider). A version 1 snapshot reads as no transaction open,
no coordinator epoch known and no marker position: what a v1 writer, which refused
transactional batches, had.

Pure: no I/O, no asyncio.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from dataclasses import dataclass

import crc32c

from proxy.partition.producer_state import (
    NO_COORDINATOR_EPOCH,
    NUM_BATCHES_TO_RETAIN,
    BatchMetadata,
    ProducerStateEntry,
)

__all__ = [
    "SNAPSHOT_VERSION",
    "CorruptSnapshotError",
    "ProducerSnapshot",
    "decode_snapshot",
    "encode_snapshot",
    "read_snapshot",
]

# big-endian; Kafka's snapshot header (version, CRC-32C of every byte after it)
SNAPSHOT_VERSION = 2
_NONE = -1  # an absent offset (no open transaction, no marker position)
_HEADER = struct.Struct(">hI")
_BODY_V1 = struct.Struct(">qi")  # offset covered, producer count
_BODY_V2 = struct.Struct(">qqi")  # offset covered, marker position, producer count
_PRODUCER_V1 = struct.Struct(">qhqb")  # id, epoch, last timestamp, batch count
_PRODUCER_V2 = struct.Struct(">qhqiqb")  # ... coordinator epoch, txn first offset, batch count
_BATCH = struct.Struct(">iqiq")  # last seq, last offset, offset delta, timestamp


class CorruptSnapshotError(ValueError):
    """Snapshot bytes that cannot be trusted: damaged, cut short, or of an unknown version."""


@dataclass(frozen=True, slots=True)
class ProducerSnapshot:
    offset: int  # the state covers every batch below this offset
    entries: list[ProducerStateEntry]
    marker_position: int | None = None


def encode_snapshot(
    offset: int, entries: Iterable[ProducerStateEntry], marker_position: int | None = None
) -> bytes:
    """The state of `entries`, which covers every batch below `offset` (version 2)."""
    entries = sorted(entries, key=lambda entry: entry.producer_id)
    position = _NONE if marker_position is None else marker_position
    parts = [_BODY_V2.pack(offset, position, len(entries))]
    for entry in entries:
        first = entry.current_txn_first_offset
        parts.append(
            _PRODUCER_V2.pack(
                entry.producer_id,
                entry.producer_epoch,
                entry.last_timestamp,
                entry.coordinator_epoch,
                _NONE if first is None else first,
                len(entry.batches),
            )
        )
        parts.extend(
            _BATCH.pack(b.last_seq, b.last_offset, b.offset_delta, b.timestamp)
            for b in entry.batches
        )
    body = b"".join(parts)
    return _HEADER.pack(SNAPSHOT_VERSION, crc32c.crc32c(body)) + body


def decode_snapshot(data: bytes | bytearray | memoryview) -> tuple[int, list[ProducerStateEntry]]:
    """`(offset, entries)` of a snapshot of either version; CorruptSnapshotError otherwise."""
    snapshot = read_snapshot(data)
    return snapshot.offset, snapshot.entries


def read_snapshot(data: bytes | bytearray | memoryview) -> ProducerSnapshot:
    """A snapshot of version 1 or 2; CorruptSnapshotError otherwise."""
    view = memoryview(data).cast("B")
    if len(view) < _HEADER.size + _BODY_V1.size:
        raise CorruptSnapshotError(f"{len(view)} bytes is too short for a producer snapshot")
    version, crc = _HEADER.unpack_from(view)
    if version not in (1, 2):
        raise CorruptSnapshotError(f"producer snapshot version {version} is not known")
    computed = crc32c.crc32c(view[_HEADER.size :])
    if computed != crc:
        raise CorruptSnapshotError(
            f"CRC-32C mismatch: stored {crc:#010x}, computed {computed:#010x}"
        )
    pos = _HEADER.size
    try:
        if version == 1:
            offset, count = _BODY_V1.unpack_from(view, pos)
            position = _NONE
            pos += _BODY_V1.size
        else:
            offset, position, count = _BODY_V2.unpack_from(view, pos)
            pos += _BODY_V2.size
        if offset < 0 or position < _NONE:
            raise CorruptSnapshotError(f"negative offset {offset} or marker position {position}")
        entries: dict[int, ProducerStateEntry] = {}
        for _ in range(count):
            if version == 1:
                pid, epoch, used, batch_count = _PRODUCER_V1.unpack_from(view, pos)
                coordinator, first = NO_COORDINATOR_EPOCH, _NONE
                pos += _PRODUCER_V1.size
            else:
                pid, epoch, used, coordinator, first, batch_count = _PRODUCER_V2.unpack_from(
                    view, pos
                )
                pos += _PRODUCER_V2.size
            if not 0 <= batch_count <= NUM_BATCHES_TO_RETAIN or pid in entries or first < _NONE:
                raise CorruptSnapshotError(f"producer {pid}: bad or repeated entry")
            batches = []
            for _ in range(batch_count):
                batches.append(BatchMetadata(*_BATCH.unpack_from(view, pos)))
                pos += _BATCH.size
            entries[pid] = ProducerStateEntry(
                pid, epoch, used, tuple(batches), coordinator, None if first == _NONE else first
            )
    except struct.error:
        raise CorruptSnapshotError("producer snapshot cut short") from None
    if count < 0 or pos != len(view):
        raise CorruptSnapshotError(f"producer count {count} does not match {len(view)} bytes")
    return ProducerSnapshot(offset, list(entries.values()), None if position == _NONE else position)
