"""Primitive readers and writers of the Kafka encoding, on memoryviews, raising FrameError.

Only what the proxy reads by hand (headers, a few leading fields, tagged-field sections);
whole messages go through kio (see `codec`).
"""

from __future__ import annotations

import struct
import uuid
from collections.abc import Callable

from proxy.kafka.frames import FrameError

INT8 = struct.Struct(">b")
INT16 = struct.Struct(">h")
INT32 = struct.Struct(">i")
INT64 = struct.Struct(">q")


def read_int16(buf: memoryview, offset: int) -> tuple[int, int]:
    """(value, offset after it)."""
    if offset + 2 > len(buf):
        raise FrameError(f"truncated: int16 at byte {offset} of {len(buf)}")
    return INT16.unpack_from(buf, offset)[0], offset + 2


def read_int32(buf: memoryview, offset: int) -> tuple[int, int]:
    if offset + 4 > len(buf):
        raise FrameError(f"truncated: int32 at byte {offset} of {len(buf)}")
    return INT32.unpack_from(buf, offset)[0], offset + 4


def read_int64(buf: memoryview, offset: int) -> tuple[int, int]:
    if offset + 8 > len(buf):
        raise FrameError(f"truncated: int64 at byte {offset} of {len(buf)}")
    return INT64.unpack_from(buf, offset)[0], offset + 8


def read_nullable_bytes(
    buf: memoryview, offset: int, compact: bool
) -> tuple[memoryview | None, int]:
    """(a view of the bytes, no copy, or None if null; offset after them): int32 length,
    or uvarint length + 1 if compact; a negative length is null."""
    length, offset = _read_length(buf, offset, compact, read_int32)
    if length < 0:
        return None, offset
    end = skip(buf, offset, length)
    return buf[offset:end], end


def _read_length(
    buf: memoryview,
    offset: int,
    compact: bool,
    read_fixed: Callable[[memoryview, int], tuple[int, int]],
) -> tuple[int, int]:
    """The length before nullable bytes or a string: uvarint length + 1 if compact, else
    what `read_fixed` reads (an int32 or an int16); negative for null."""
    if compact:
        length, offset = read_uvarint(buf, offset)
        return length - 1, offset
    return read_fixed(buf, offset)


def read_uvarint(buf: memoryview, offset: int) -> tuple[int, int]:
    """An unsigned varint of at most 5 bytes (a uint32), as used for lengths and tags."""
    if offset < len(buf) and buf[offset] < 0x80:  # the usual case: one byte
        return buf[offset], offset + 1
    value = 0
    for shift in range(0, 35, 7):
        if offset >= len(buf):
            raise FrameError(f"truncated: varint at byte {offset} of {len(buf)}")
        byte = buf[offset]
        offset += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, offset
    raise FrameError(f"varint longer than 5 bytes ending at byte {offset}")


def write_uvarint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def skip(buf: memoryview, offset: int, n: int) -> int:
    """The offset n bytes on, checked against the end of buf."""
    end = offset + n
    if end > len(buf):
        raise FrameError(f"truncated: {n} bytes at byte {offset} of {len(buf)}")
    return end


def read_string(buf: memoryview, offset: int, compact: bool) -> tuple[str | None, int]:
    """A nullable string: int16 length (-1 null), or uvarint length + 1 (0 null) if compact."""
    length, offset = _read_length(buf, offset, compact, read_int16)
    if length < 0:
        return None, offset
    end = skip(buf, offset, length)
    return bytes(buf[offset:end]).decode("utf-8", errors="replace"), end


def write_string(value: str, compact: bool) -> bytes:
    encoded = value.encode()
    if compact:
        return write_uvarint(len(encoded) + 1) + encoded
    if len(encoded) > 0x7FFF:
        raise ValueError(f"string of {len(encoded)} bytes does not fit an int16 length")
    return INT16.pack(len(encoded)) + encoded


def read_array_length(buf: memoryview, offset: int, compact: bool) -> tuple[int, int]:
    """An array's item count, -1 for null: int32, or uvarint count + 1 (0 null) if compact."""
    if compact:
        count, offset = read_uvarint(buf, offset)
        return count - 1, offset
    return read_int32(buf, offset)


def write_array_length(count: int, compact: bool) -> bytes:
    return write_uvarint(count + 1) if compact else INT32.pack(count)


def skip_nullable_string(buf: memoryview, offset: int, compact: bool) -> int:
    """Past a (nullable) string: int16 length, or uvarint length + 1 when compact."""
    if compact:
        length, offset = read_uvarint(buf, offset)
        length -= 1
    else:
        length, offset = read_int16(buf, offset)
    return skip(buf, offset, length) if length > 0 else offset


def read_tagged_fields(buf: memoryview, offset: int) -> tuple[list[tuple[int, int, int]], int]:
    """A tagged-field section: ([(tag, value start, value end), ...], offset after it)."""
    count, offset = read_uvarint(buf, offset)
    fields = []
    for _ in range(count):
        tag, offset = read_uvarint(buf, offset)
        size, offset = read_uvarint(buf, offset)
        end = skip(buf, offset, size)
        fields.append((tag, offset, end))
        offset = end
    return fields, offset


def skip_tagged_fields(buf: memoryview, offset: int) -> int:
    if offset < len(buf) and buf[offset] == 0:  # the usual case: no tagged field
        return offset + 1
    count, offset = read_uvarint(buf, offset)
    for _ in range(count):
        _tag, offset = read_uvarint(buf, offset)
        size, offset = read_uvarint(buf, offset)
        offset = skip(buf, offset, size)
    return offset


def read_count(buf: memoryview, offset: int, compact: bool, name: str) -> tuple[int, int]:
    """A non-nullable array's item count; every item takes at least one byte."""
    count, after = read_array_length(buf, offset, compact)
    if count < 0:
        raise FrameError(f"null {name} array at byte {offset}")
    if count > len(buf) - after:
        raise FrameError(f"{name} array of {count} items at byte {offset} of {len(buf)}")
    return count, after


def read_topic_key(
    buf: memoryview, offset: int, by_id: bool, compact: bool
) -> tuple[str | uuid.UUID, int]:
    """A topic named by id (16 bytes, KIP-516) or by a non-null name."""
    if by_id:
        end = skip(buf, offset, 16)
        return uuid.UUID(bytes=bytes(buf[offset:end])), end
    return read_topic_name(buf, offset, compact)


def read_topic_name(buf: memoryview, offset: int, compact: bool) -> tuple[str, int]:
    """A topic's name, never null."""
    name, end = read_string(buf, offset, compact)
    if name is None:
        raise FrameError(f"null topic name at byte {offset}")
    return name, end


def expect_end(buf: memoryview, offset: int) -> None:
    if offset != len(buf):
        raise FrameError(f"{len(buf) - offset} bytes after the end")
