"""Reading the records of one v2 batch and writing a batch of some of them back, as
Kafka's cleaner does (MemoryRecords.filterTo): the batch keeps its base offset, its last
offset delta (so its last offset, and its producer's last sequence, stay), its producer
id, epoch and base sequence, its partition leader epoch, its attributes and compression
codec (the records are compressed again with cramjam); each record keeps its offset
delta, timestamp, key, value and headers byte for byte.

Per-record work: for the cleaner (upkeep), never the produce or fetch path.

Pure: no I/O, no asyncio.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass

import cramjam
import crc32c

from proxy.records.batches import (
    ATTRIBUTES_POSITION,
    CRC_POSITION,
    HEADER_SIZE,
    LOG_OVERHEAD,
    BatchHeader,
    Compression,
    CorruptBatchError,
)
from proxy.records.record_walk import decompress, read_varint

_HEADER = struct.Struct(">qiibIhiqqqhii")
_CRC = struct.Struct(">I")
# KIP-534: a batch the cleaner wrote holding tombstones or a marker it may later remove
# carries its delete horizon in the base timestamp, told by attribute bit 6
DELETE_HORIZON_BIT = 0x40
NO_TIMESTAMP = -1


@dataclass(frozen=True, slots=True)
class Record:
    """One record of a batch: what the cleaner decides on, and its bytes from the key's
    length on (key, value, headers), written back as they are."""

    offset_delta: int
    timestamp: int
    key: bytes | None
    has_value: bool
    tail: memoryview


def delete_horizon(header: BatchHeader) -> int | None:
    """The batch's delete horizon (ms), if a cleaner set one."""
    return header.base_timestamp if header.attributes & DELETE_HORIZON_BIT else None


def read_records(header: BatchHeader, batch: memoryview) -> list[Record]:
    """Every record of the batch, in order (CorruptBatchError if they cannot be read)."""
    body = memoryview(decompress(header.codec, batch[HEADER_SIZE:])).cast("B")
    append_time = header.is_log_append_time
    out = []
    pos = 0
    try:
        for _ in range(header.record_count):
            length, pos = read_varint(body, pos)
            end = pos + length
            if length < 0 or end > len(body):
                raise IndexError
            ts_delta, pos = read_varint(body, pos + 1)  # after the record's attributes
            offset_delta, pos = read_varint(body, pos)
            key_size, key_at = read_varint(body, pos)
            key = None if key_size < 0 else bytes(body[key_at : key_at + key_size])
            value_size, _ = read_varint(body, key_at + max(key_size, 0))
            timestamp = header.max_timestamp if append_time else header.base_timestamp + ts_delta
            out.append(Record(offset_delta, timestamp, key, value_size >= 0, body[pos:end]))
            pos = end
    except IndexError:
        raise CorruptBatchError(
            0, f"batch at offset {header.base_offset}: records cut short"
        ) from None
    return out


def write_varint(value: int, out: bytearray) -> None:
    """A zigzag varint (Kafka's record fields)."""
    n = (value << 1) ^ (value >> 63)
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)


def compress(codec: int, data: bytes | bytearray) -> bytes:
    """The records section compressed with the batch's codec (snappy raw, LZ4 framed, as
    Kafka's clients read them)."""
    if codec == Compression.NONE:
        return bytes(data)
    if codec == Compression.GZIP:
        return bytes(cramjam.gzip.compress(data))
    if codec == Compression.SNAPPY:
        return bytes(cramjam.snappy.compress_raw(data))
    if codec == Compression.LZ4:
        return bytes(cramjam.lz4.compress(data))
    if codec == Compression.ZSTD:
        return bytes(cramjam.zstd.compress(data))
    raise CorruptBatchError(0, f"unknown compression codec {codec}")


def rebuild(header: BatchHeader, records: Sequence[Record], horizon: int | None) -> bytes:
    """A batch of `records` (some of the batch's own, in order) with the batch's header
    fields, as Kafka's MemoryRecordsBuilder writes it: the base timestamp is the delete
    horizon when one is set (bit 6), else the first record's timestamp; the max timestamp
    the records' largest (a LogAppendTime batch keeps its own)."""
    if horizon is not None:
        base_ts = horizon
    elif records:
        base_ts = records[0].timestamp
    else:
        base_ts = NO_TIMESTAMP
    if header.is_log_append_time:
        max_ts = header.max_timestamp
    else:
        max_ts = max((r.timestamp for r in records), default=NO_TIMESTAMP)
    body = bytearray()
    record = bytearray()
    for r in records:
        record.clear()
        record.append(0)  # record attributes: unused
        write_varint(r.timestamp - base_ts if not header.is_log_append_time else 0, record)
        write_varint(r.offset_delta, record)
        record += r.tail
        write_varint(len(record), body)
        body += record
    payload = compress(header.codec, body)
    attributes = header.attributes & ~DELETE_HORIZON_BIT
    if horizon is not None:
        attributes |= DELETE_HORIZON_BIT
    return _batch(header, attributes, base_ts, max_ts, len(records), payload)


def empty_batch(header: BatchHeader) -> bytes:
    """The header alone, as Kafka's DefaultRecordBatch.writeEmptyHeader keeps a batch whose
    records all went but whose producer state (last sequence, epoch) must stay: no records,
    no codec, no base timestamp, the batch's offsets, max timestamp and producer fields."""
    attributes = header.attributes & ~(DELETE_HORIZON_BIT | 0x07)
    return _batch(header, attributes, NO_TIMESTAMP, header.max_timestamp, 0, b"")


def _batch(
    header: BatchHeader, attributes: int, base_ts: int, max_ts: int, count: int, payload: bytes
) -> bytes:
    out = bytearray(HEADER_SIZE + len(payload))
    _HEADER.pack_into(
        out,
        0,
        header.base_offset,
        HEADER_SIZE - LOG_OVERHEAD + len(payload),
        header.partition_leader_epoch,
        2,
        0,
        attributes,
        header.last_offset_delta,
        base_ts,
        max_ts,
        header.producer_id,
        header.producer_epoch,
        header.base_sequence,
        count,
    )
    out[HEADER_SIZE:] = payload
    _CRC.pack_into(out, CRC_POSITION, crc32c.crc32c(memoryview(out)[ATTRIBUTES_POSITION:]))
    return bytes(out)
