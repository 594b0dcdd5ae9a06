"""Walking the records of one record batch: decompressing it (cramjam, every codec Kafka
has) and reading each record's fields up to the ones a caller needs.

Per-record work, so never on the hot path of every batch: a ListOffsets timestamp lookup
walks the one batch that holds its answer (`timestamp_search.py`), and a produce walks a
batch only to name the records Kafka would refuse (`partition/produce_rules.py`).

Pure: no I/O, no asyncio.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator

import cramjam

from proxy.records.batches import HEADER_SIZE, BatchHeader, Compression, CorruptBatchError

_XERIAL_MAGIC = b"\x82SNAPPY\x00"  # the Java client's snappy framing (xerial snappy-java)
_XERIAL_HEADER = 16  # magic, version, compatible version
_CHUNK_SIZE = struct.Struct(">i")


def walk_records(
    header: BatchHeader, batch: memoryview, *, sizes: bool = False
) -> Iterator[tuple[int, int, int, int]]:
    """(offset delta, timestamp, key size, value size) of each record of the batch, in
    order, as Kafka's record iterator gives them: a record of a LOG_APPEND_TIME batch has
    the batch's max timestamp. The key and value sizes (-1: null) are read only when
    `sizes` asks for them, else both are -1: a timestamp lookup reads no more of a record
    than it needs. CorruptBatchError if the records cannot be read."""
    body = memoryview(decompress(header.codec, batch[HEADER_SIZE:])).cast("B")
    append_time = header.is_log_append_time
    pos = 0
    key_size = value_size = -1
    try:
        for _ in range(header.record_count):
            length, pos = read_varint(body, pos)
            end = pos + length
            ts_delta, pos = read_varint(body, pos + 1)  # after the record's attributes
            offset_delta, pos = read_varint(body, pos)
            if sizes:
                key_size, pos = read_varint(body, pos)
                value_size, _ = read_varint(body, pos + max(key_size, 0))
            if length < 0 or end > len(body):
                raise IndexError
            timestamp = header.max_timestamp if append_time else header.base_timestamp + ts_delta
            yield offset_delta, timestamp, key_size, value_size
            pos = end
    except IndexError:
        raise CorruptBatchError(
            0, f"batch at offset {header.base_offset}: records cut short"
        ) from None


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
