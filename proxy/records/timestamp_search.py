"""Kafka's answers to ListOffsets by timestamp and MAX_TIMESTAMP, over record batches.

Kafka's rules, read off its source (apache/kafka):
- a timestamp T (`FileRecords.searchForTimestamp`, called by `LogSegment.findOffsetByTimestamp`
  with the log start offset): walk the batches in offset order; in each batch whose max
  timestamp is >= T, the first record whose timestamp is >= T and whose offset is >= the
  log start is the answer, with the batch's partition leader epoch (-1 when negative). A
  batch whose only such records lie below the log start is passed over. With timestamps
  out of order, the answer is that first record, not the record closest to T;
- MAX_TIMESTAMP (UnifiedLog.fetchOffsetByTimestamp, KIP-734): the first batch whose max
  timestamp is the log's largest, and in it the first record with that timestamp
  (`RecordBatch.offsetOfMaxTimestamp`);
- a record of a LOG_APPEND_TIME batch has the batch's max timestamp as its timestamp
  (`DefaultRecordBatch`), so every record of it has the same one.

The one batch found is decompressed (cramjam, every codec Kafka has) and its records'
offset and timestamp deltas read: one batch per lookup, never the partition's records.
Which blocks hold candidates comes from the objects' time index (objectformat.py: each
block's max timestamp), so the caller reads the index and, nearly always, one block.

Pure: no I/O, no asyncio.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import cramjam

from proxy.objects.format import IndexEntry
from proxy.records.batches import (
    HEADER_SIZE,
    BatchHeader,
    Compression,
    CorruptBatchError,
    iter_batches,
)

_XERIAL_MAGIC = b"\x82SNAPPY\x00"  # the Java client's snappy framing (xerial snappy-java)
_XERIAL_HEADER = 16  # magic, version, compatible version
_CHUNK_SIZE = struct.Struct(">i")


@dataclass(frozen=True, slots=True)
class Found:
    """A record answering a lookup: Kafka's TimestampAndOffset."""

    timestamp: int
    offset: int
    leader_epoch: int  # the batch's partition leader epoch, -1 when it has none


def decompress(codec: int, data: memoryview) -> bytes | memoryview:
    """The records section of a batch, uncompressed. CorruptBatchError if it does not
    decompress."""
    try:
        if codec == Compression.NONE:
            return data
        if codec == Compression.GZIP:
            return bytes(cramjam.gzip.decompress(data))
        if codec == Compression.SNAPPY:
            return _snappy(data)
        if codec == Compression.LZ4:
            return bytes(cramjam.lz4.decompress(data))
        if codec == Compression.ZSTD:
            return bytes(cramjam.zstd.decompress(data))
    except cramjam.DecompressionError as exc:
        raise CorruptBatchError(0, f"{Compression(codec).name} records: {exc}") from None
    raise CorruptBatchError(0, f"unknown compression codec {codec}")


def _snappy(data: memoryview) -> bytes:
    """Raw snappy (librdkafka), or xerial's framing of raw snappy chunks (the Java client)."""
    if bytes(data[: len(_XERIAL_MAGIC)]) != _XERIAL_MAGIC:
        return bytes(cramjam.snappy.decompress_raw(data))
    out, pos = [], _XERIAL_HEADER
    while pos < len(data):
        if pos + _CHUNK_SIZE.size > len(data):
            raise CorruptBatchError(0, "SNAPPY records: a xerial chunk cut short")
        (size,) = _CHUNK_SIZE.unpack_from(data, pos)
        pos += _CHUNK_SIZE.size
        if size < 0 or pos + size > len(data):
            raise CorruptBatchError(0, f"SNAPPY records: a xerial chunk of {size} bytes")
        out.append(bytes(cramjam.snappy.decompress_raw(data[pos : pos + size])))
        pos += size
    return b"".join(out)


def records_of(header: BatchHeader, batch: memoryview) -> Iterator[tuple[int, int]]:
    """(offset, timestamp) of each record of the batch, in order, as Kafka's record
    iterator gives them. CorruptBatchError if the records cannot be read."""
    body = memoryview(decompress(header.codec, batch[HEADER_SIZE:])).cast("B")
    append_time = header.is_log_append_time
    pos = 0
    try:
        for _ in range(header.record_count):
            length, pos = read_varint(body, pos)
            end = pos + length
            ts_delta, pos = read_varint(body, pos + 1)  # after the record's attributes
            offset_delta, pos = read_varint(body, pos)
            if end > len(body) or length < 0:
                raise IndexError
            timestamp = header.max_timestamp if append_time else header.base_timestamp + ts_delta
            yield header.base_offset + offset_delta, timestamp
            pos = end
    except IndexError:
        raise CorruptBatchError(
            0, f"batch at offset {header.base_offset}: records cut short"
        ) from None


def read_varint(buf: memoryview, pos: int) -> tuple[int, int]:
    """A zigzag varint (Kafka's record fields); IndexError past the end."""
    shift = value = 0
    while True:
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return (value >> 1) ^ -(value & 1), pos
        shift += 7
        if shift > 63:
            raise IndexError


def _epoch(header: BatchHeader) -> int:
    return header.partition_leader_epoch if header.partition_leader_epoch >= 0 else -1


def in_batch(header: BatchHeader, batch: memoryview, target: int, start: int) -> Found | None:
    """Kafka's answer inside one batch: its first record at or after `target` whose offset
    is at least `start`; None when it has none."""
    if header.max_timestamp < target or header.next_offset <= start:
        return None
    for offset, timestamp in records_of(header, batch):
        if timestamp >= target and offset >= start:
            return Found(timestamp, offset, _epoch(header))
    return None


def in_batches(
    records: memoryview, target: int, start: int, end: int | None = None
) -> Found | None:
    """Kafka's answer among a run of whole batches (a block, a log cache entry): only the
    batches past `start` and, when `end` is given, starting below it are looked at; the
    others are skipped by their headers."""
    for header, batch in iter_batches(records):
        if end is not None and header.base_offset >= end:
            return None
        found = in_batch(header, batch, target, start)
        if found is not None:
            return found
    return None


def candidate_blocks(entries: Sequence[IndexEntry], target: int) -> list[IndexEntry]:
    """The blocks that may hold the answer to `target`: those whose max timestamp (the
    objects' time index) reaches it, and those with none known (a version 1 object's
    blocks, read to learn it). The others are skipped unread."""
    return [e for e in entries if e.max_timestamp is None or e.max_timestamp >= target]


def max_timestamp_in(records: memoryview, start: int, end: int | None = None) -> int:
    """The largest max timestamp of the batches of a run holding offsets from `start` on
    (below `end` when given); -1 when none has one."""
    best = -1
    for header, _ in iter_batches(records):
        if end is not None and header.base_offset >= end:
            break
        if header.next_offset > start:
            best = max(best, header.max_timestamp)
    return best


def offset_of_max(records: memoryview, max_timestamp: int, start: int, end: int | None = None):
    """Kafka's MAX_TIMESTAMP answer in a run: the first batch (past `start`, below `end`)
    whose max timestamp is `max_timestamp`, and its first record with that timestamp."""
    for header, batch in iter_batches(records):
        if end is not None and header.base_offset >= end:
            return None
        if header.next_offset <= start or header.max_timestamp != max_timestamp:
            continue
        for offset, timestamp in records_of(header, batch):
            if timestamp == max_timestamp:
                return Found(timestamp, offset, _epoch(header))
    return None
