"""The object format: the contract between the proxy and the Spark offload jobs.

An object is ``[data blocks][index][footer]`` (docs/object-format.md, byte by byte).
A data block is one stream's consecutive Kafka record batches, stored verbatim, so a
block read from S3 is sent to a consumer as it is. The index has one fixed-size entry
per block; the fixed-size footer at the very end says where the index is, so a reader
needs one ranged read of the tail, one of the index (often the same read), and one per
run of blocks. Integers are big-endian. Every part is covered by a CRC-32C: the footer
by its own, the index by one in the footer, each block by one in its index entry.

Version 2 adds each block's max timestamp to its index entry (the object's time index),
so a ListOffsets timestamp lookup reads the index and one block instead of every batch
header; version 1 objects (no max timestamp: `IndexEntry.max_timestamp` is None) are
still read, and still written when a writer is asked for them.

Version 3 is ``[head][index][data blocks][index][footer]``: a copy of the index in front
of the blocks, behind a small head (`parse_head`), so that a reader reading an object
from its start gets the index with its first blocks in one ranged read instead of
reading the tail first; readers that start at the tail read it as before. The copy costs
52 bytes per block (0.005 % of a 1 MiB block).

This module is the layout and its reader (footer, index, blocks, each checked); the
writer that lays objects out is `objects/format_writer.py` (`ObjectWriter`).

Pure: no I/O, no asyncio. The offload jobs run both modules inside Spark tasks.
"""

from __future__ import annotations

import bisect
import struct
from collections.abc import Sequence
from dataclasses import dataclass

import crc32c

from proxy.objects.keys import ObjectKind, object_key, parse_object_key

FORMAT_VERSION = 3  # what writers write
READ_VERSIONS = (1, 2, 3)  # what readers read
HEAD_MAGIC = b"TPOF"
# Version 3's head: magic, version, head size, object id, kind, reserved, block count,
# index size, index CRC, head CRC (of the bytes before it)
FRONT_MAGIC = b"TPOH"
_HEAD = struct.Struct(">4sHHQB3sIIII")
HEAD_SIZE = _HEAD.size  # 36
_HEAD_CRC_COVERS = HEAD_SIZE - 4
TAIL_MAGIC = b"TPOE"
# magic, kind, reserved, object id, index position, index size, block count, index CRC,
# version, footer size, footer CRC, magic
_FOOTER = struct.Struct(">4sB3sQQIIIHHI4s")
FOOTER_SIZE = _FOOTER.size  # 48
# Every version ends with: version u16, footer size u16, footer CRC u32, tail magic.
_FOOTER_TRAILER = struct.Struct(">HHI4s")
_FOOTER_CRC_COVERS = FOOTER_SIZE - 8  # every footer byte before the CRC and the tail magic
# stream id, start offset, end offset delta, record count, position, size, block CRC
_ENTRY_V1 = struct.Struct(">QqQIQII")
# ... and (version 2) the block's max timestamp
_ENTRY_V2 = struct.Struct(">QqQIQIIq")
_ENTRIES = {1: _ENTRY_V1, 2: _ENTRY_V2, 3: _ENTRY_V2}
INDEX_ENTRY_SIZE_V1 = _ENTRY_V1.size  # 44
INDEX_ENTRY_SIZE = _ENTRY_V2.size  # 52, the size writers write
NO_TIMESTAMP = -1  # Kafka's RecordBatch.NO_TIMESTAMP
U32_MAX = (1 << 32) - 1
I64_MAX = (1 << 63) - 1

Buffer = bytes | bytearray | memoryview


def index_entry_size(version: int) -> int:
    """The bytes of one index entry in a version `version` object (ValueError if unknown)."""
    if version not in _ENTRIES:
        raise ValueError(f"object format version {version}: known versions are {READ_VERSIONS}")
    return _ENTRIES[version].size


def layout_bytes(version: int) -> tuple[int, int]:
    """What a version `version` object adds to its blocks' bytes: a fixed part (the
    footer; and the head in version 3) and a part per block (its index entry; twice in
    version 3, the copy in front). Planners size objects exactly with it."""
    entry = index_entry_size(version)
    return (FOOTER_SIZE + HEAD_SIZE, 2 * entry) if version >= 3 else (FOOTER_SIZE, entry)


class ObjectFormatError(ValueError):
    """An object that is corrupt, truncated or not of this format; names the object."""

    def __init__(self, key: str, what: str) -> None:
        super().__init__(f"object {key}: {what}")
        self.key = key
        self.what = what


@dataclass(frozen=True, slots=True)
class Footer:
    object_id: int
    kind: ObjectKind
    index_position: int
    index_size: int
    block_count: int
    index_crc: int
    version: int = FORMAT_VERSION

    @property
    def entry_size(self) -> int:
        return _ENTRIES[self.version].size

    @property
    def index_end(self) -> int:
        return self.index_position + self.index_size

    @property
    def object_size(self) -> int:
        return self.index_position + self.index_size + FOOTER_SIZE

    @property
    def data_start(self) -> int:
        """Where the first block begins: after the head and the index's copy in version 3,
        at the object's first byte before."""
        return HEAD_SIZE + self.index_size if self.version >= 3 else 0


@dataclass(frozen=True, slots=True)
class IndexEntry:
    """One data block: offsets [start_offset, end_offset) of a stream, at bytes
    [position, position + size) of the object. `max_timestamp` is the largest max
    timestamp of the block's batches (Kafka's NO_TIMESTAMP, -1, when none has one); None
    in a version 1 object, which does not record it."""

    stream_id: int
    start_offset: int
    end_offset: int
    record_count: int
    position: int
    size: int
    crc: int
    max_timestamp: int | None = None

    @property
    def end_position(self) -> int:
        return self.position + self.size


def as_view(data: Buffer) -> memoryview:
    """A flat byte view of `data`, no copy."""
    return memoryview(data).cast("B")


def pack_index(entries: Sequence[IndexEntry], version: int) -> bytes:
    """The index of a version `version` object holding these blocks, in their order."""
    layout = _ENTRIES[version]
    index = bytearray()
    for e in entries:
        delta = e.end_offset - e.start_offset
        fields = (e.stream_id, e.start_offset, delta, e.record_count, e.position, e.size, e.crc)
        index += layout.pack(*fields, *(() if e.max_timestamp is None else (e.max_timestamp,)))
    return bytes(index)


def pack_footer(footer: Footer) -> bytes:
    """The footer's bytes (`parse_footer` reads them back)."""
    packed = _FOOTER.pack(
        HEAD_MAGIC,
        footer.kind,
        bytes(3),
        footer.object_id,
        footer.index_position,
        footer.index_size,
        footer.block_count,
        footer.index_crc,
        footer.version,
        FOOTER_SIZE,
        0,
        TAIL_MAGIC,
    )
    covered = packed[:_FOOTER_CRC_COVERS]
    return covered + crc32c.crc32c(covered).to_bytes(4, "big") + TAIL_MAGIC


def pack_head(footer: Footer) -> bytes:
    """A version 3 object's head (`parse_head` reads it back); the index follows it."""
    covered = _HEAD.pack(
        FRONT_MAGIC,
        footer.version,
        HEAD_SIZE,
        footer.object_id,
        footer.kind,
        bytes(3),
        footer.block_count,
        footer.index_size,
        footer.index_crc,
        0,
    )[:_HEAD_CRC_COVERS]
    return covered + crc32c.crc32c(covered).to_bytes(4, "big")


def parse_head(head: Buffer, object_size: int, key: str) -> Footer | None:
    """What the head of a version 3 object says, from the object's first bytes (at least
    HEAD_SIZE of them): a `Footer` equal to the one at its end, whose `data_start` is
    where its index's copy ends. None when these bytes are not a sound head of this
    object: an object of an earlier version (it starts with a block), or a damaged head,
    which costs its reader the tail read that finds the index at the end instead. The
    index's copy is checked by `parse_index` against the CRC the head gives."""
    view = as_view(head)
    if len(view) < HEAD_SIZE or bytes(view[:4]) != FRONT_MAGIC:
        return None
    fields = _HEAD.unpack_from(view)
    _, version, head_size, object_id, kind, reserved, blocks, index_size, index_crc, crc = fields
    if crc != crc32c.crc32c(view[:_HEAD_CRC_COVERS]) or head_size != HEAD_SIZE:
        return None
    if version != 3 or kind not in set(ObjectKind) or reserved != bytes(3):
        return None
    index_position = object_size - FOOTER_SIZE - index_size
    if blocks < 1 or blocks * _ENTRIES[version].size != index_size:
        return None
    if index_position < HEAD_SIZE + index_size + blocks:  # a block holds a byte at least
        return None
    try:
        if parse_object_key(key) != (object_id, ObjectKind(kind)):
            return None
    except ValueError:
        return None
    return Footer(
        object_id, ObjectKind(kind), index_position, index_size, blocks, index_crc, version
    )


def index_in_head(head: Buffer, footer: Footer) -> memoryview | None:
    """The index's copy in a version 3 object's first bytes, when they reach far enough."""
    view = as_view(head)
    if len(view) < footer.data_start:
        return None
    return view[HEAD_SIZE : footer.data_start]


def parse_footer(tail: Buffer, object_size: int, key: str) -> Footer:
    """The footer, from the last bytes of the object (at least FOOTER_SIZE of them; more
    is fine, see `index_in_tail`). `object_size` is the whole object's size and `key` the
    key it was read from, which must name the object id and kind the footer holds."""
    view = as_view(tail)
    if object_size < FOOTER_SIZE:
        raise ObjectFormatError(
            key, f"{object_size} bytes, less than a {FOOTER_SIZE}-byte footer: truncated"
        )
    if not FOOTER_SIZE <= len(view) <= object_size:
        raise ObjectFormatError(
            key, f"{len(view)} tail bytes given, need {FOOTER_SIZE} to {object_size}"
        )
    view = view[len(view) - FOOTER_SIZE :]
    version, footer_size, stored_crc, tail_magic = _FOOTER_TRAILER.unpack_from(
        view, FOOTER_SIZE - _FOOTER_TRAILER.size
    )
    if tail_magic != TAIL_MAGIC:
        raise ObjectFormatError(
            key, f"bad tail magic {tail_magic!r}, expected {TAIL_MAGIC!r}: truncated or foreign"
        )
    if footer_size == FOOTER_SIZE:
        # checked before the version, so a damaged version byte reads as damage
        computed = crc32c.crc32c(view[:_FOOTER_CRC_COVERS])
        if computed != stored_crc:
            raise ObjectFormatError(
                key, f"footer CRC mismatch: stored {stored_crc:#010x}, computed {computed:#010x}"
            )
    if version not in READ_VERSIONS:
        readable = " and ".join(map(str, READ_VERSIONS))
        raise ObjectFormatError(
            key, f"unsupported format version {version}; this reader reads {readable}"
        )
    if footer_size != FOOTER_SIZE:
        raise ObjectFormatError(
            key, f"footer size {footer_size}, version {version} footers are {FOOTER_SIZE}"
        )
    head_magic, kind, reserved, object_id, index_position, index_size, block_count, index_crc = (
        _FOOTER.unpack_from(view)[:8]
    )
    if head_magic != HEAD_MAGIC:
        raise ObjectFormatError(key, f"bad footer magic {head_magic!r}, expected {HEAD_MAGIC!r}")
    if kind not in set(ObjectKind) or reserved != bytes(3):
        raise ObjectFormatError(key, f"unknown object kind {kind} or flags {reserved.hex()}")
    if block_count < 1 or block_count * _ENTRIES[version].size != index_size:
        raise ObjectFormatError(
            key, f"index of {index_size} bytes cannot hold {block_count} blocks (>= 1)"
        )
    footer = Footer(
        object_id, ObjectKind(kind), index_position, index_size, block_count, index_crc, version
    )
    if footer.object_size != object_size:
        raise ObjectFormatError(
            key,
            f"footer describes a {footer.object_size}-byte object (index at {index_position}, "
            f"{index_size} bytes), the object is {object_size} bytes: truncated or extended",
        )
    if parse_object_key(key) != (object_id, footer.kind):
        raise ObjectFormatError(
            key, f"footer names {object_key(object_id, footer.kind)}, another object"
        )
    return footer


def index_in_tail(tail: Buffer, object_size: int, footer: Footer) -> memoryview | None:
    """The index bytes, when the tail read for the footer reached back far enough."""
    view = as_view(tail)
    start = footer.index_position - (object_size - len(view))
    if start < 0:
        return None
    return view[start : start + footer.index_size]


def parse_index(index: Buffer, footer: Footer, key: str) -> tuple[IndexEntry, ...]:
    """The index entries, checked against the index CRC and for a sound layout: sorted by
    (stream id, start offset), each stream's blocks consecutive, blocks filling the bytes
    between `footer.data_start` and the index with no gap or overlap. Either copy of a
    version 3 object's index reads the same."""
    view = as_view(index)
    if len(view) != footer.index_size:
        raise ObjectFormatError(
            key, f"index is {len(view)} bytes, the footer says {footer.index_size}: truncated"
        )
    if footer.block_count < 1 or footer.block_count * footer.entry_size != len(view):
        raise ObjectFormatError(
            key, f"index of {len(view)} bytes cannot hold {footer.block_count} blocks (>= 1)"
        )
    computed = crc32c.crc32c(view)
    if computed != footer.index_crc:
        raise ObjectFormatError(
            key,
            f"index CRC mismatch: stored {footer.index_crc:#010x}, computed {computed:#010x}",
        )
    entries: list[IndexEntry] = []
    position = footer.data_start
    previous: IndexEntry | None = None
    for number, fields in enumerate(_ENTRIES[footer.version].iter_unpack(view)):
        stream_id, start, delta, count, block_position, size, crc, *max_ts = fields
        entry = IndexEntry(
            stream_id, start, start + delta, count, block_position, size, crc, *max_ts
        )
        what = f"index entry {number} (stream {stream_id}, offsets [{start}, {start + delta}))"
        if not (0 <= start and 1 <= delta <= I64_MAX - start and count <= delta and size >= 1):
            raise ObjectFormatError(key, f"{what}: impossible offsets, count {count} or size")
        if block_position != position or entry.end_position > footer.index_position:
            raise ObjectFormatError(
                key,
                f"{what}: block at bytes [{block_position}, {entry.end_position}) out of "
                f"bounds, expected to start at {position} and end by {footer.index_position}",
            )
        if previous is not None:
            if footer.kind is ObjectKind.STREAM and stream_id != previous.stream_id:
                raise ObjectFormatError(key, f"{what}: a stream object with a second stream")
            if stream_id < previous.stream_id:
                raise ObjectFormatError(key, f"{what}: entries not sorted by stream id")
            if stream_id == previous.stream_id and start != previous.end_offset:
                problem = "overlapping ranges" if start < previous.end_offset else "offset gap"
                raise ObjectFormatError(
                    key, f"{what}: {problem}, the block before ends at {previous.end_offset}"
                )
        entries.append(entry)
        position = entry.end_position
        previous = entry
    if position != footer.index_position:
        raise ObjectFormatError(
            key, f"blocks end at byte {position}, the index starts at {footer.index_position}"
        )
    return tuple(entries)


def read_block(data: Buffer, entry: IndexEntry, key: str, data_position: int = 0) -> memoryview:
    """The block's bytes, checked against its CRC. `data` holds the object's bytes from
    `data_position` on: the whole object (0), one ranged read of exactly this block
    (`entry.position`), or of a run of blocks."""
    view = as_view(data)
    start = entry.position - data_position
    if start < 0 or start + entry.size > len(view):
        raise ObjectFormatError(
            key,
            f"block of stream {entry.stream_id} at bytes [{entry.position}, "
            f"{entry.end_position}) is not within the {len(view)} bytes read from "
            f"{data_position}: truncated",
        )
    block = view[start : start + entry.size]
    computed = crc32c.crc32c(block)
    if computed != entry.crc:
        raise ObjectFormatError(
            key,
            f"block CRC mismatch for stream {entry.stream_id} offsets [{entry.start_offset}, "
            f"{entry.end_offset}) at bytes [{entry.position}, {entry.end_position}): "
            f"stored {entry.crc:#010x}, computed {computed:#010x}",
        )
    return block


def read_object(data: Buffer, key: str) -> tuple[Footer, tuple[IndexEntry, ...]]:
    """Footer and index of a whole object held in memory (offload jobs, tests)."""
    view = as_view(data)
    footer = parse_footer(view[max(0, len(view) - FOOTER_SIZE) :], len(view), key)
    return footer, parse_index(view[footer.index_position : footer.index_end], footer, key)


def find_entries(index: Sequence[IndexEntry], stream_id: int, offset: int) -> Sequence[IndexEntry]:
    """The stream's blocks from the one holding `offset` to the stream's last in this
    object; empty when no block of the stream holds that offset."""
    at = bisect.bisect_right(index, (stream_id, offset), key=_entry_key) - 1
    if at < 0 or index[at].stream_id != stream_id or index[at].end_offset <= offset:
        return ()
    end = bisect.bisect_right(index, (stream_id, I64_MAX), key=_entry_key)
    return index[at:end]


def _entry_key(entry: IndexEntry) -> tuple[int, int]:
    return (entry.stream_id, entry.start_offset)
