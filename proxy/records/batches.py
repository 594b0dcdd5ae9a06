"""Kafka v2 record batches (magic 2), read and rewritten per batch, never per record.

A Produce request's or a Fetch answer's `records` field is a run of record batches::

    base offset      i64   the offset of the first record; the only field the CRC skips
    batch length     i32   bytes after this field, to the end of the batch
    leader epoch     i32
    magic            i8    2
    crc              u32   CRC-32C from the attributes field to the end of the batch
    attributes       i16   codec (bits 0-2), log-append time (3), transactional (4), control (5)
    last offset delta i32
    base timestamp   i64
    max timestamp    i64
    producer id      i64
    producer epoch   i16
    base sequence    i32
    record count     i32
    records ...            possibly compressed; never looked at here

Pure: no I/O, no asyncio. The offload jobs run this module inside Spark tasks.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass
from enum import IntEnum

import crc32c

_HEADER = struct.Struct(">qiibIhiqqqhii")
_BASE_OFFSET = struct.Struct(">q")

HEADER_SIZE = _HEADER.size  # 61
LOG_OVERHEAD = 12  # base offset and batch length: the bytes batch_length does not count
MIN_BATCH_LENGTH = HEADER_SIZE - LOG_OVERHEAD  # 49: a batch with no records
MAGIC_POSITION = 16
CRC_POSITION = 17
ATTRIBUTES_POSITION = 21  # the CRC covers from here to the end of the batch

_CODEC_MASK = 0x07
_LOG_APPEND_TIME_BIT = 0x08
_TRANSACTIONAL_BIT = 0x10
_CONTROL_BIT = 0x20


class Compression(IntEnum):
    NONE = 0
    GZIP = 1
    SNAPPY = 2
    LZ4 = 3
    ZSTD = 4


class CorruptBatchError(ValueError):
    """A record batch that cannot be trusted; `position` is its first byte in the buffer."""

    def __init__(self, position: int, what: str) -> None:
        super().__init__(f"record batch at byte {position}: {what}")
        self.position = position
        self.what = what


class TruncatedBatchError(CorruptBatchError):
    """The buffer ends inside a batch. Normal at the end of a Fetch answer, an error elsewhere."""


@dataclass(frozen=True, slots=True)
class BatchHeader:
    base_offset: int
    batch_length: int
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    record_count: int

    @property
    def size(self) -> int:
        """The whole batch in bytes, base offset and length fields included."""
        return self.batch_length + LOG_OVERHEAD

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def next_offset(self) -> int:
        return self.base_offset + self.last_offset_delta + 1

    @property
    def codec(self) -> int:
        """The compression codec bits; `validate_batch` refuses values Kafka does not know."""
        return self.attributes & _CODEC_MASK

    @property
    def compression(self) -> Compression:
        return Compression(self.codec)

    @property
    def is_log_append_time(self) -> bool:
        return bool(self.attributes & _LOG_APPEND_TIME_BIT)

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & _TRANSACTIONAL_BIT)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & _CONTROL_BIT)


def read_batch_header(buf: bytes | bytearray | memoryview, pos: int = 0) -> BatchHeader:
    """The header of the batch starting at `pos`.

    Raises TruncatedBatchError when `buf` ends before the header or the batch does, and
    CorruptBatchError when the magic is not 2 or the length is too small for a header.
    """
    available = len(buf) - pos
    if available <= MAGIC_POSITION:
        raise TruncatedBatchError(pos, f"{available} bytes left, the header needs {HEADER_SIZE}")
    magic = buf[pos + MAGIC_POSITION]
    if magic != 2:
        raise CorruptBatchError(pos, f"magic is {magic}, only magic 2 batches are supported")
    if available < HEADER_SIZE:
        raise TruncatedBatchError(pos, f"{available} bytes left, the header needs {HEADER_SIZE}")
    header = BatchHeader(*_HEADER.unpack_from(buf, pos))
    if header.batch_length < MIN_BATCH_LENGTH:
        raise CorruptBatchError(
            pos, f"batch length {header.batch_length} is below the minimum {MIN_BATCH_LENGTH}"
        )
    if available < header.size:
        raise TruncatedBatchError(
            pos, f"{available} bytes left, the batch length says {header.size}"
        )
    return header


def iter_batches(
    records: bytes | bytearray | memoryview,
) -> Iterator[tuple[BatchHeader, memoryview]]:
    """Each batch of a `records` field with a view of its bytes (no copy).

    Raises TruncatedBatchError at a batch the buffer cuts short; see `whole_batches` for
    Fetch answers, which may legitimately end that way. CRCs are not checked here.
    """
    view = memoryview(records).cast("B")
    pos = 0
    while pos < len(view):
        header = read_batch_header(view, pos)
        yield header, view[pos : pos + header.size]
        pos += header.size


def whole_batches(
    records: bytes | bytearray | memoryview,
) -> tuple[list[tuple[BatchHeader, memoryview]], int]:
    """The whole batches of a Fetch answer's `records`, and the byte where they end.

    A broker may cut the last batch of a Fetch answer short (it fills `max_bytes`); that
    partial batch is left out and `end` tells the caller where it starts. Anything else
    wrong (bad magic, impossible length) still raises CorruptBatchError.
    """
    view = memoryview(records).cast("B")
    batches: list[tuple[BatchHeader, memoryview]] = []
    pos = 0
    while pos < len(view):
        try:
            header = read_batch_header(view, pos)
        except TruncatedBatchError:
            break
        batches.append((header, view[pos : pos + header.size]))
        pos += header.size
    return batches, pos


def validate_batch(batch: bytes | bytearray | memoryview, position: int = 0) -> BatchHeader:
    """Check one whole batch (as `iter_batches` yields it) and return its header.

    Checks the magic, that the length matches the bytes given, the codec, the offset delta
    and record count, and the CRC-32C. `position` is where the batch starts in the caller's
    buffer, so that the error names a byte the caller can find.
    """
    view = memoryview(batch).cast("B")
    try:
        header = read_batch_header(view)
    except CorruptBatchError as exc:
        raise type(exc)(position, exc.what) from None
    if header.size != len(view):
        raise CorruptBatchError(
            position, f"batch length says {header.size} bytes, {len(view)} were given"
        )
    _check_header_fields(header, position)
    computed = crc32c.crc32c(view[ATTRIBUTES_POSITION:])
    if computed != header.crc:
        raise CorruptBatchError(
            position,
            f"CRC-32C mismatch: stored {header.crc:#010x}, computed {computed:#010x} over "
            f"bytes {position + ATTRIBUTES_POSITION}..{position + len(view)}",
        )
    return header


def validate_header(header_bytes: bytes | bytearray | memoryview) -> BatchHeader:
    """The checks of `validate_batch` that the first HEADER_SIZE bytes of a batch allow
    (magic, length, codec, offset delta, record count), for a batch whose bytes are
    elsewhere: an owner ordering a batch from its header (docs/wal.md, "The owner
    answering from the notification"), whose sender checked the whole batch (its CRC)."""
    view = memoryview(header_bytes).cast("B")
    if len(view) != HEADER_SIZE:
        raise CorruptBatchError(0, f"a batch header is {HEADER_SIZE} bytes, not {len(view)}")
    magic = view[MAGIC_POSITION]
    if magic != 2:
        raise CorruptBatchError(0, f"magic is {magic}, only magic 2 batches are supported")
    header = BatchHeader(*_HEADER.unpack_from(view, 0))
    if header.batch_length < MIN_BATCH_LENGTH:
        raise CorruptBatchError(
            0, f"batch length {header.batch_length} is below the minimum {MIN_BATCH_LENGTH}"
        )
    _check_header_fields(header, 0)
    return header


def _check_header_fields(header: BatchHeader, position: int) -> None:
    if header.codec > max(Compression):
        raise CorruptBatchError(position, f"unknown compression codec {header.codec}")
    if header.last_offset_delta < 0:
        raise CorruptBatchError(position, f"negative last offset delta {header.last_offset_delta}")
    if header.record_count < 0:
        raise CorruptBatchError(position, f"negative record count {header.record_count}")


def set_base_offset(buffer: bytearray | memoryview, pos: int, base_offset: int) -> None:
    """Rewrite the base offset of the batch at `pos` in place. The CRC stays valid: it
    does not cover the base offset, and records hold offset deltas."""
    _BASE_OFFSET.pack_into(buffer, pos, base_offset)


_MAX_TIMESTAMP_POSITION = 35
_ATTRIBUTES = struct.Struct(">h")
_TIMESTAMP = struct.Struct(">q")
_CRC = struct.Struct(">I")


def set_log_append_time(
    buffer: bytearray | memoryview, pos: int, header: BatchHeader, now_ms: int
) -> None:
    """Stamp the batch at `pos` in place as Kafka does on a LogAppendTime topic: the
    timestamp-type bit and the max timestamp. Both are under the CRC, so it is
    recomputed: one pass over the batch, never per record."""
    with memoryview(buffer) as view:
        attributes = header.attributes | _LOG_APPEND_TIME_BIT
        _ATTRIBUTES.pack_into(view, pos + ATTRIBUTES_POSITION, attributes)
        _TIMESTAMP.pack_into(view, pos + _MAX_TIMESTAMP_POSITION, now_ms)
        crc = crc32c.crc32c(view[pos + ATTRIBUTES_POSITION : pos + header.size])
        _CRC.pack_into(view, pos + CRC_POSITION, crc)


def assign_offsets(buffer: bytearray | memoryview, base_offset: int) -> int:
    """Give the run of batches in `buffer` consecutive offsets from `base_offset`, in place,
    as a partition's sequencer does; returns the next offset to assign."""
    view = memoryview(buffer).cast("B")
    next_offset = base_offset
    for header, batch in iter_batches(view):
        _BASE_OFFSET.pack_into(batch, 0, next_offset)
        next_offset += header.last_offset_delta + 1
    return next_offset


def with_base_offset(records: bytes | bytearray | memoryview, base_offset: int) -> bytearray:
    """A copy of a run of batches (one copy for the whole run) with offsets from `base_offset`."""
    copy = bytearray(records)
    assign_offsets(copy, base_offset)
    return copy
