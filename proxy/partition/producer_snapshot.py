"""The producer snapshot: a partition's committed producer state as bytes (the metadata
keeps it; a new owner restores from it). Format: docs/sequencer.md, "Snapshot format".

Version 2 (written) adds to version 1 (still read) what transactions need: per producer
the coordinator epoch of its last marker and the first offset of its open transaction,
and per partition the marker position (the next offset of Kafka's log of the partition
the marker follower has to consider). A version 1 snapshot reads as no transaction open,
no coordinator epoch known and no marker position: what a v1 writer, which refused
transactional batches, had.

Version 3 is written only for a snapshot taken below the stream's end whose markers need
it (`PartitionSequencer.snapshot_at`, written with a trim): the offset from which the
stream's markers are still to be met upstream (`markers_end`, past the snapshot's
offset), and the identities of those still to be met that lie below the snapshot's
offset. Every other snapshot is written as version 2, which a release before version 3
reads.

Pure: no I/O, no asyncio.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Sequence
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
SNAPSHOT_VERSION = 3  # the newest read and written; 2 when version 3 adds nothing
_NONE = -1  # an absent offset (no open transaction, no marker position)
_HEADER = struct.Struct(">hI")
_BODY_V1 = struct.Struct(">qi")  # offset covered, producer count
_BODY_V2 = struct.Struct(">qqi")  # offset covered, marker position, producer count
_BODY_V3 = struct.Struct(">qqqi")  # ... markers end, before the producer count
_EXPECTED = struct.Struct(">i")  # count of the identities after the producers
_IDENTITY = struct.Struct(">qhq")  # producer id, producer epoch, timestamp
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
    # the stream's markers from here on are still to be met upstream (at least `offset`)
    markers_end: int = 0
    # identities (producer id, epoch, timestamp) of markers still to be met upstream that
    # lie below `offset`, in stream order
    expected: tuple[tuple[int, int, int], ...] = ()


def encode_snapshot(
    offset: int,
    entries: Iterable[ProducerStateEntry],
    marker_position: int | None = None,
    *,
    markers_end: int | None = None,
    expected: Sequence[tuple[int, int, int]] = (),
) -> bytes:
    """The state of `entries`, which covers every batch below `offset`: version 2, or 3
    when `markers_end` is past `offset` or markers below it are `expected`."""
    entries = sorted(entries, key=lambda entry: entry.producer_id)
    position = _NONE if marker_position is None else marker_position
    end = offset if markers_end is None else markers_end
    if end < offset:
        raise ValueError(f"markers end {end} below the snapshot's offset {offset}")
    v3 = end > offset or bool(expected)
    if v3:
        parts = [_BODY_V3.pack(offset, position, end, len(entries))]
    else:
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
    if v3:
        parts.append(_EXPECTED.pack(len(expected)))
        parts.extend(_IDENTITY.pack(*identity) for identity in expected)
    body = b"".join(parts)
    return _HEADER.pack(3 if v3 else 2, crc32c.crc32c(body)) + body


def decode_snapshot(data: bytes | bytearray | memoryview) -> tuple[int, list[ProducerStateEntry]]:
    """`(offset, entries)` of a snapshot of either version; CorruptSnapshotError otherwise."""
    snapshot = read_snapshot(data)
    return snapshot.offset, snapshot.entries


def read_snapshot(data: bytes | bytearray | memoryview) -> ProducerSnapshot:
    """A snapshot of version 1, 2 or 3; CorruptSnapshotError otherwise."""
    view = memoryview(data).cast("B")
    if len(view) < _HEADER.size + _BODY_V1.size:
        raise CorruptSnapshotError(f"{len(view)} bytes is too short for a producer snapshot")
    version, crc = _HEADER.unpack_from(view)
    if version not in (1, 2, 3):
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
        elif version == 2:
            offset, position, count = _BODY_V2.unpack_from(view, pos)
            pos += _BODY_V2.size
        else:
            offset, position, markers_end, count = _BODY_V3.unpack_from(view, pos)
            pos += _BODY_V3.size
        if version < 3:
            markers_end = offset
        if offset < 0 or position < _NONE or markers_end < offset:
            raise CorruptSnapshotError(
                f"negative offset {offset} or marker position {position}, or markers end "
                f"{markers_end} below it"
            )
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
        expected: list[tuple[int, int, int]] = []
        if version == 3:
            (known,) = _EXPECTED.unpack_from(view, pos)
            pos += _EXPECTED.size
            if known < 0:
                raise CorruptSnapshotError(f"{known} expected markers")
            for _ in range(known):
                expected.append(_IDENTITY.unpack_from(view, pos))
                pos += _IDENTITY.size
    except struct.error:
        raise CorruptSnapshotError("producer snapshot cut short") from None
    if count < 0 or pos != len(view):
        raise CorruptSnapshotError(f"producer count {count} does not match {len(view)} bytes")
    return ProducerSnapshot(
        offset,
        list(entries.values()),
        None if position == _NONE else position,
        markers_end,
        tuple(expected),
    )
