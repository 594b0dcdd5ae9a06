"""The WAL entry codec: pure, no I/O, no asyncio (docs/wal.md, "Entry format").

One entry is one Kafka record batch the owner of a stream appended, framed so that a
reader can tell a whole entry from a torn or corrupt one:

    offset  size  field
    0       4     length       u32 BE: bytes after the crc field (version + payload)
    4       4     crc          u32 BE: CRC-32C (Castagnoli) of those `length` bytes
    8       1     version      u8: 1
    9       8     stream_id    i64 BE: the stream (tiered partition) the batch belongs to
    17      8     base_offset  i64 BE: the first offset the sequencer assigned to the batch
    25      n     batch        the record batch, verbatim (n = length - 17)

A version-2 entry also carries an opaque *reference* before the batch: where the whole
batch's bytes are (the owner answering from a notification writes the batch's header
and the S3 location, the bytes follow in another entry with the same reference):

    8       1     version      u8: 2
    9       8     stream_id
    17      8     base_offset
    25      2     ref_length   u16 BE: r
    27      r     reference    opaque to the WAL
    27+r    n     batch        (n = length - 19 - r)

Version 1 stays the default, byte for byte, so WALs written before version 2 replay.

`read_entries` walks a buffer and stops at the first entry that is incomplete (torn),
fails its CRC, announces an impossible length, or carries a version this code does not
know; it never raises on garbage and returns how many leading bytes were whole entries.
`classify_stop` says which of those it was, so that recovery can cut a torn tail but
refuse to cut entries a newer writer left.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from enum import Enum

from crc32c import crc32c

VERSION = 1  # an entry without a reference
VERSION_REFERENCE = 2  # an entry with one
VERSIONS = frozenset((VERSION, VERSION_REFERENCE))

_FRAME = struct.Struct(">II")  # length, crc
_BODY_HEADER = struct.Struct(">Bqq")  # version, stream_id, base_offset
_HEADER = struct.Struct(">IIBqq")
_REFERENCE_LENGTH = struct.Struct(">H")

FRAME_HEADER_SIZE = _FRAME.size  # 8
HEADER_SIZE = _HEADER.size  # 25: everything before the batch (version 1)
REFERENCE_HEADER_SIZE = HEADER_SIZE + _REFERENCE_LENGTH.size  # 27: before the reference (v2)
MIN_LENGTH = _BODY_HEADER.size  # 17: a version-1 body with an empty batch
MIN_REFERENCE_LENGTH = MIN_LENGTH + _REFERENCE_LENGTH.size  # 19: a v2 body with nothing in it
MAX_LENGTH = 0xFFFF_FFFF
MAX_BATCH_SIZE = MAX_LENGTH - MIN_LENGTH
MAX_REFERENCE_SIZE = 0xFFFF

_I64_MIN = -(1 << 63)
_I64_MAX = (1 << 63) - 1

_Bytes = bytes | bytearray | memoryview


@dataclass(frozen=True, slots=True)
class DecodedEntry:
    """One whole entry found in a buffer. `batch` and `reference` are slices of that
    buffer, not copies; `reference` is None for a version-1 entry."""

    offset: int  # where the entry starts in the buffer read
    size: int  # its whole framed size: entry_size(len(batch), len(reference) or None)
    stream_id: int
    base_offset: int
    batch: memoryview
    reference: memoryview | None = None


class Stop(Enum):
    """Why `read_entries` stopped where it did."""

    END = "end"  # the buffer ended exactly after a whole entry
    TORN = "torn"  # the buffer ends inside an entry's header or body
    CORRUPT = "corrupt"  # impossible length or CRC mismatch
    UNKNOWN_VERSION = "unknown_version"  # the CRC holds but the version is not one we read


def entry_size(batch_size: int, reference_size: int | None = None) -> int:
    """The framed size of an entry holding a batch of `batch_size` bytes and, for a
    version-2 entry, a reference of `reference_size` bytes (None: version 1)."""
    if reference_size is None:
        return HEADER_SIZE + batch_size
    return REFERENCE_HEADER_SIZE + reference_size + batch_size


def encode_header(
    stream_id: int,
    base_offset: int,
    batch: _Bytes,
    reference: _Bytes | None = None,
) -> bytes:
    """Everything that goes before `batch` on disk: the 25-byte header of a version-1
    entry, or with `reference` the 27-byte header of a version-2 entry and the reference
    (small: it is copied). The batch itself is written as it is (writev), so it is never
    copied to be framed."""
    if not _I64_MIN <= stream_id <= _I64_MAX:
        raise ValueError(f"stream_id {stream_id} does not fit in an int64")
    if not _I64_MIN <= base_offset <= _I64_MAX:
        raise ValueError(f"base_offset {base_offset} does not fit in an int64")
    size = len(batch)
    if reference is None:
        if size > MAX_BATCH_SIZE:
            raise ValueError(f"a batch of {size} bytes is larger than a WAL entry can hold")
        body_header = _BODY_HEADER.pack(VERSION, stream_id, base_offset)
        crc = crc32c(batch, crc32c(body_header))
        return _FRAME.pack(MIN_LENGTH + size, crc) + body_header
    reference_size = len(reference)
    if reference_size > MAX_REFERENCE_SIZE:
        raise ValueError(
            f"a reference of {reference_size} bytes is longer than a WAL entry can hold "
            f"({MAX_REFERENCE_SIZE})"
        )
    length = MIN_REFERENCE_LENGTH + reference_size + size
    if length > MAX_LENGTH:
        raise ValueError(f"a batch of {size} bytes is larger than a WAL entry can hold")
    body_header = (
        _BODY_HEADER.pack(VERSION_REFERENCE, stream_id, base_offset)
        + _REFERENCE_LENGTH.pack(reference_size)
        + bytes(reference)
    )
    crc = crc32c(batch, crc32c(body_header))
    return _FRAME.pack(length, crc) + body_header


def header_reference(header: bytes) -> memoryview | None:
    """The reference inside a header `encode_header` built (a view of it), or None for a
    version-1 header: what the writer keeps instead of the caller's buffer."""
    if header[FRAME_HEADER_SIZE] != VERSION_REFERENCE:
        return None
    return memoryview(header)[REFERENCE_HEADER_SIZE:]


def encode_entry(
    stream_id: int, base_offset: int, batch: _Bytes, reference: _Bytes | None = None
) -> bytes:
    """A whole entry as one bytes object (tests and tools; the WAL writes header and batch
    as two buffers)."""
    return encode_header(stream_id, base_offset, batch, reference) + bytes(batch)


def announced_size(buf: _Bytes) -> int | None:
    """The framed size the entry at the start of `buf` announces, or None when fewer than
    4 bytes are there. It is only a claim: the entry may still be corrupt."""
    if len(buf) < 4:
        return None
    (length,) = struct.unpack_from(">I", buf, 0)
    return FRAME_HEADER_SIZE + length


def read_entries(buf: _Bytes) -> tuple[list[DecodedEntry], int]:
    """The whole, valid entries at the start of `buf`, in order, and the number of bytes
    they take. Never raises on content: the walk ends at the first entry that is torn,
    corrupt or of an unknown version (see `classify_stop`)."""
    view = memoryview(buf).cast("B")
    entries: list[DecodedEntry] = []
    pos = 0
    end = len(view)
    while True:
        whole = _whole_entry(view, pos, end)
        if whole is None:
            return entries, pos
        size, batch_start = whole
        version, stream_id, base_offset = _BODY_HEADER.unpack_from(view, pos + FRAME_HEADER_SIZE)
        reference = (
            view[pos + REFERENCE_HEADER_SIZE : pos + batch_start]
            if version == VERSION_REFERENCE
            else None
        )
        entries.append(
            DecodedEntry(
                offset=pos,
                size=size,
                stream_id=stream_id,
                base_offset=base_offset,
                batch=view[pos + batch_start : pos + size],
                reference=reference,
            )
        )
        pos += size


def classify_stop(buf: _Bytes, valid: int) -> Stop:
    """Why a walk of `buf` that found `valid` good bytes stopped there."""
    view = memoryview(buf).cast("B")
    end = len(view)
    if valid >= end:
        return Stop.END
    if end - valid < FRAME_HEADER_SIZE:
        return Stop.TORN
    length, crc = _FRAME.unpack_from(view, valid)
    if length < 1:
        return Stop.CORRUPT
    body_end = valid + FRAME_HEADER_SIZE + length
    if body_end > end:
        # Too short to check the CRC. A length that could never be a valid entry is
        # corruption, not a tear (it cannot be fixed by reading further).
        return Stop.TORN if length >= MIN_LENGTH else Stop.CORRUPT
    if crc32c(view[valid + FRAME_HEADER_SIZE : body_end]) != crc:
        return Stop.CORRUPT
    if view[valid + FRAME_HEADER_SIZE] not in VERSIONS:
        return Stop.UNKNOWN_VERSION
    # A body of a known version that is too short for its own header or reference.
    return Stop.CORRUPT


def _whole_entry(view: memoryview, pos: int, end: int) -> tuple[int, int] | None:
    """The framed size of the valid entry at `pos` and where its batch starts in it
    (after the header, and the reference of a version-2 entry), or None."""
    if end - pos < HEADER_SIZE:
        return None
    length, crc = _FRAME.unpack_from(view, pos)
    if length < MIN_LENGTH:
        return None
    body_end = pos + FRAME_HEADER_SIZE + length
    if body_end > end:
        return None
    version = view[pos + FRAME_HEADER_SIZE]
    if version == VERSION:
        batch_start = HEADER_SIZE
    elif version == VERSION_REFERENCE:
        if length < MIN_REFERENCE_LENGTH:
            return None
        (reference_size,) = _REFERENCE_LENGTH.unpack_from(view, pos + HEADER_SIZE)
        batch_start = REFERENCE_HEADER_SIZE + reference_size
        if batch_start > FRAME_HEADER_SIZE + length:
            return None
    else:
        return None
    if crc32c(view[pos + FRAME_HEADER_SIZE : body_end]) != crc:
        return None
    return FRAME_HEADER_SIZE + length, batch_start
