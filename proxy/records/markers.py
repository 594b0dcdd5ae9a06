"""Transaction markers: the control batches Kafka's coordinator writes to end a transaction.

When a transaction ends (EndTxn, a coordinator timeout, fencing by InitProducerId),
Kafka's coordinator sends WriteTxnMarkers to the leader of every partition in it, which
appends one control batch to its log. For a tiered partition that log lies past the
cutover; the partition's owner follows it and appends each marker to the stream
(docs/sequencer.md, "Transactions"). This module reads one such batch into a `Marker`
and builds the batch the stream holds, byte for byte the one Kafka wrote except for the
base offset (the stream's next offset) and the partition leader epoch (-1, as every
tiered batch; neither is under the CRC).

A marker batch as Kafka writes it (MemoryRecords.withEndTransactionMarker):

    header      61 bytes, attributes = transactional | control (0x30), last offset delta 0,
                base and max timestamp = the marker's, base sequence -1, record count 1
    record      length, attributes 0, timestamp delta 0, offset delta 0,
                key (4 bytes): version i16 = 0, type i16 (ABORT 0, COMMIT 1)
                value (6 bytes): version i16 = 0, coordinator epoch i32
                header count 0

On a LogAppendTime topic Kafka's leader also sets the timestamp-type bit and stamps the
max timestamp with its append time: `Marker.timestamp` is that max timestamp, and the
sequencer stamps the stream's copy the same way (so the identity below still matches).

Pure: no I/O, no asyncio. Per batch: the header and the one control record.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import crc32c

from proxy.records.batches import (
    ATTRIBUTES_POSITION,
    CRC_POSITION,
    HEADER_SIZE,
    LOG_OVERHEAD,
    CorruptBatchError,
    validate_batch,
)
from proxy.records.record_walk import read_varint

__all__ = ["ABORT", "COMMIT", "Marker", "MarkerError", "marker_batch", "read_marker"]

ABORT, COMMIT = 0, 1  # the control record's type (ControlRecordType)
NO_PARTITION_LEADER_EPOCH = -1
NO_SEQUENCE = -1
_ATTRIBUTES = 0x30  # transactional | control, no codec, CreateTime
_HEADER = struct.Struct(">qiibIhiqqqhii")
_KEY = struct.Struct(">hh")  # version, type
_VALUE = struct.Struct(">hi")  # version, coordinator epoch
# the record: attributes, timestamp delta 0, offset delta 0, key length 4 (zigzag 8),
# key, value length 6 (zigzag 12), value, header count 0
_RECORD = struct.Struct(">bbbb4sb6sb")
_RECORD_LENGTH = _RECORD.size  # 16, written as the zigzag varint 32


class MarkerError(ValueError):
    """A batch that is not one transaction marker (or a damaged one)."""


@dataclass(frozen=True, slots=True)
class Marker:
    """One transaction marker, as Kafka wrote it to its log of the partition."""

    producer_id: int
    producer_epoch: int
    coordinator_epoch: int
    commit: bool  # COMMIT (True) or ABORT
    timestamp: int  # the control batch's (max) timestamp as Kafka wrote it
    upstream_offset: int  # its offset in Kafka's log of the partition (>= the cutover)

    @property
    def identity(self) -> tuple[int, int, int]:
        """(producer id, epoch, timestamp): what the stream's copy shows of the marker in
        its batch header alone, to recognise it after a restart (the resume rule)."""
        return (self.producer_id, self.producer_epoch, self.timestamp)


def read_marker(batch: memoryview | bytes | bytearray) -> Marker:
    """The marker in one whole control batch as Kafka's Fetch returns it. MarkerError
    if it is not one (a data batch, an empty control batch the cleaner left, a control
    record of another type) or fails `validate_batch` (CRC, length)."""
    try:
        header = validate_batch(batch)
    except CorruptBatchError as exc:
        raise MarkerError(str(exc)) from None
    if not (header.is_control and header.is_transactional):
        raise MarkerError(f"batch at offset {header.base_offset} is not a transaction marker")
    if header.record_count != 1 or header.codec != 0:
        raise MarkerError(
            f"control batch at offset {header.base_offset} holds {header.record_count} "
            f"records (codec {header.codec}): a marker holds one, uncompressed"
        )
    kind, coordinator_epoch = _control_record(memoryview(batch).cast("B"), header.base_offset)
    return Marker(
        header.producer_id,
        header.producer_epoch,
        coordinator_epoch,
        kind == COMMIT,
        header.max_timestamp,
        header.base_offset,
    )


def marker_batch(marker: Marker, base_offset: int) -> bytearray:
    """The control batch of `marker` at `base_offset`, as Kafka writes it (module
    docstring), with partition leader epoch -1."""
    key = _KEY.pack(0, COMMIT if marker.commit else ABORT)
    value = _VALUE.pack(0, marker.coordinator_epoch)
    record = _RECORD.pack(0, 0, 0, 8, key, 12, value, 0)
    length = bytes([_RECORD_LENGTH << 1])  # a zigzag varint of one byte
    batch_length = HEADER_SIZE - LOG_OVERHEAD + len(length) + len(record)
    out = bytearray(_HEADER.size + len(length) + len(record))
    _HEADER.pack_into(
        out,
        0,
        base_offset,
        batch_length,
        NO_PARTITION_LEADER_EPOCH,
        2,
        0,  # the CRC, below
        _ATTRIBUTES,
        0,
        marker.timestamp,
        marker.timestamp,
        marker.producer_id,
        marker.producer_epoch,
        NO_SEQUENCE,
        1,
    )
    out[HEADER_SIZE:] = length + record
    struct.pack_into(">I", out, CRC_POSITION, crc32c.crc32c(out[ATTRIBUTES_POSITION:]))
    return out


def _control_record(view: memoryview, offset: int) -> tuple[int, int]:
    """(type, coordinator epoch) of the one record of a control batch, read as Kafka's
    EndTransactionMarker.deserialize does: a later value version is read as version 0."""
    try:
        _length, pos = read_varint(view, HEADER_SIZE)
        pos += 1  # attributes
        _timestamp_delta, pos = read_varint(view, pos)
        _offset_delta, pos = read_varint(view, pos)
        key_length, pos = read_varint(view, pos)
        if key_length < _KEY.size:
            raise MarkerError(f"control record at offset {offset}: key of {key_length} bytes")
        _version, kind = _KEY.unpack_from(view, pos)
        pos += key_length
        value_length, pos = read_varint(view, pos)
        if value_length < _VALUE.size:
            raise MarkerError(f"marker at offset {offset}: value of {value_length} bytes")
        value_version, coordinator_epoch = _VALUE.unpack_from(view, pos)
    except (IndexError, struct.error):
        raise MarkerError(f"control record at offset {offset} runs past its batch") from None
    if kind not in (ABORT, COMMIT):
        raise MarkerError(f"control record at offset {offset} is of type {kind}, not a marker")
    if value_version < 0:
        raise MarkerError(f"marker at offset {offset}: value version {value_version}")
    return kind, coordinator_epoch
