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

Pure: no I/O, no asyncio. The offload jobs run this module inside Spark tasks.
"""

from __future__ import annotations

import bisect
import struct
from collections.abc import Sequence
from dataclasses import dataclass

import crc32c

from proxy.objects.keys import U64_MAX, ObjectKind, object_key, parse_object_key
from proxy.records.batches import iter_batches, validate_batch

FORMAT_VERSION = 2  # what writers write
READ_VERSIONS = (1, 2)  # what readers read
HEAD_MAGIC = b"TPOF"
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
_ENTRIES = {1: _ENTRY_V1, 2: _ENTRY_V2}
INDEX_ENTRY_SIZE_V1 = _ENTRY_V1.size  # 44
INDEX_ENTRY_SIZE = _ENTRY_V2.size  # 52, the size writers write
NO_TIMESTAMP = -1  # Kafka's RecordBatch.NO_TIMESTAMP
U32_MAX = (1 << 32) - 1
I64_MAX = (1 << 63) - 1
DEFAULT_MAX_BLOCK_BYTES = 1 << 20

Buffer = bytes | bytearray | memoryview


def index_entry_size(version: int) -> int:
    """The bytes of one index entry in a version `version` object (ValueError if unknown)."""
    if version not in _ENTRIES:
        raise ValueError(f"object format version {version}: known versions are {READ_VERSIONS}")
    return _ENTRIES[version].size


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


@dataclass(frozen=True, slots=True)
class BuiltObject:
    """An object ready to upload: `pieces` written one after another are its `size` bytes."""

    key: str
    footer: Footer
    index: tuple[IndexEntry, ...]
    pieces: tuple[memoryview, ...]
    size: int

    def to_bytes(self) -> bytes:
        return b"".join(self.pieces)


def _view(data: Buffer) -> memoryview:
    return memoryview(data).cast("B")


class ObjectWriter:
    """Collects blocks, then `build()` lays out the object. Record bytes are not copied:
    the buffers given must not change until the built pieces are written.

    Blocks of a stream must be added in offset order, each starting where the previous
    ended. `build()` orders blocks by (stream id, start offset), so a stream's blocks sit
    side by side and one ranged read fetches a run of them.
    """

    def __init__(self, object_id: int, kind: ObjectKind, *, version: int = FORMAT_VERSION) -> None:
        if version not in READ_VERSIONS:
            raise ValueError(f"object format version {version}: writers write {READ_VERSIONS}")
        self.object_id = object_id
        self.kind = ObjectKind(kind)
        self.key = object_key(object_id, self.kind)
        self.version = version
        # per stream: (start, end, record count, bytes, crc, max timestamp) of each block,
        # in offset order
        self._streams: dict[int, list[tuple[int, int, int, memoryview, int, int | None]]] = {}

    def stream_end(self, stream_id: int) -> int | None:
        """Where the stream's last block added so far ends, or None if it has none."""
        blocks = self._streams.get(stream_id)
        return blocks[-1][1] if blocks else None

    def add_block(
        self,
        stream_id: int,
        data: Buffer,
        start_offset: int,
        end_offset: int,
        record_count: int,
        *,
        max_timestamp: int | None = None,
    ) -> None:
        """Add one block: `data` holds the stream's offsets [start_offset, end_offset).
        Version 2 records the block's max timestamp: `max_timestamp` when given, else read
        off the batch headers (CorruptBatchError if `data` is not record batches)."""
        view = _view(data)
        where = f"{self.key}: stream {stream_id} block [{start_offset}, {end_offset})"
        if not 0 <= stream_id <= U64_MAX:
            raise ValueError(f"{where}: stream id is not an unsigned 64-bit integer")
        if not 0 <= start_offset < end_offset <= I64_MAX:
            raise ValueError(f"{where}: needs 0 <= start offset < end offset < 2**63")
        if not 0 <= record_count <= min(end_offset - start_offset, U32_MAX):
            raise ValueError(f"{where}: {record_count} records cannot fit the offset range")
        if not 1 <= len(view) <= U32_MAX:
            raise ValueError(f"{where}: {len(view)} bytes; a block holds 1 to 2**32-1 bytes")
        if self.kind is ObjectKind.STREAM and self._streams and stream_id not in self._streams:
            raise ValueError(f"{where}: a stream object holds one stream, it has another")
        end = self.stream_end(stream_id)
        if end is not None and start_offset != end:
            problem = "overlaps" if start_offset < end else "leaves a gap after"
            raise ValueError(f"{where} {problem} the stream's previous block, ending at {end}")
        if self.version == 1:
            max_timestamp = None
        elif max_timestamp is None:
            max_timestamp = max_timestamp_of(view)
        entry = (start_offset, end_offset, record_count, view, crc32c.crc32c(view), max_timestamp)
        self._streams.setdefault(stream_id, []).append(entry)

    def add_batches(
        self,
        stream_id: int,
        records: Buffer,
        *,
        start_offset: int | None = None,
        max_block_bytes: int = DEFAULT_MAX_BLOCK_BYTES,
        validate: bool = True,
    ) -> None:
        """Add a run of Kafka v2 record batches as one or more blocks of at most
        `max_block_bytes` (a larger batch gets a block of its own).

        Offsets and record counts come from the batch headers. The range starts at the
        first batch's base offset, or at `start_offset` when the stream's range starts
        before it (offsets removed by compaction). Offsets must increase from batch to
        batch; gaps between batches stay inside a block. `validate` checks each batch's
        magic and CRC first (CorruptBatchError).
        """
        if not 1 <= max_block_bytes <= U32_MAX:
            raise ValueError(f"max_block_bytes {max_block_bytes} is not in 1..2**32-1")
        view = _view(records)
        planned = []  # (first byte, end byte, start offset, end offset, records, max ts)
        block_pos, block_start, next_offset, count, pos = 0, start_offset, start_offset, 0, 0
        max_ts = NO_TIMESTAMP
        for header, batch in iter_batches(view):
            if validate:
                validate_batch(batch, pos)
            if next_offset is not None and header.base_offset < next_offset:
                raise ValueError(
                    f"{self.key}: stream {stream_id}: batch at byte {pos} has base offset "
                    f"{header.base_offset}, below {next_offset} where the run had got to"
                )
            if block_start is None:
                block_start = header.base_offset
            elif pos > block_pos and pos + header.size - block_pos > max_block_bytes:
                planned.append((block_pos, pos, block_start, next_offset, count, max_ts))
                block_pos, block_start, count, max_ts = pos, next_offset, 0, NO_TIMESTAMP
            next_offset = header.next_offset
            count += header.record_count
            max_ts = max(max_ts, header.max_timestamp)
            pos += header.size
        if pos == 0:
            raise ValueError(f"{self.key}: stream {stream_id}: no record batches to add")
        planned.append((block_pos, pos, block_start, next_offset, count, max_ts))
        before = len(self._streams.get(stream_id, ()))
        try:
            for first, end, start, end_offset, records_in_block, block_max in planned:
                self.add_block(
                    stream_id,
                    view[first:end],
                    start,
                    end_offset,
                    records_in_block,
                    max_timestamp=block_max,
                )
        except ValueError:
            # a run is added whole or not at all
            if before:
                del self._streams[stream_id][before:]
            else:
                self._streams.pop(stream_id, None)
            raise

    def build(self) -> BuiltObject:
        """Lay out the object: blocks, index, footer."""
        if not self._streams:
            raise ValueError(f"{self.key}: an object holds at least one block")
        pieces: list[memoryview] = []
        index = bytearray()
        entries = []
        position = 0
        layout = _ENTRIES[self.version]
        for stream_id in sorted(self._streams):
            for start, end, count, view, crc, max_ts in self._streams[stream_id]:
                entry = IndexEntry(stream_id, start, end, count, position, len(view), crc, max_ts)
                fields = (stream_id, start, end - start, count, position, len(view), crc)
                index += layout.pack(*fields, *(() if max_ts is None else (max_ts,)))
                entries.append(entry)
                pieces.append(view)
                position += len(view)
        if len(index) > U32_MAX:
            raise ValueError(f"{self.key}: {len(entries)} blocks are too many for one index")
        footer = Footer(
            self.object_id,
            self.kind,
            position,
            len(index),
            len(entries),
            crc32c.crc32c(index),
            self.version,
        )
        pieces.append(memoryview(bytes(index)))
        pieces.append(memoryview(_pack_footer(footer)))
        return BuiltObject(self.key, footer, tuple(entries), tuple(pieces), footer.object_size)


def _pack_footer(footer: Footer) -> bytes:
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


def parse_footer(tail: Buffer, object_size: int, key: str) -> Footer:
    """The footer, from the last bytes of the object (at least FOOTER_SIZE of them; more
    is fine, see `index_in_tail`). `object_size` is the whole object's size and `key` the
    key it was read from, which must name the object id and kind the footer holds."""
    view = _view(tail)
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
    view = _view(tail)
    start = footer.index_position - (object_size - len(view))
    if start < 0:
        return None
    return view[start : start + footer.index_size]


def parse_index(index: Buffer, footer: Footer, key: str) -> tuple[IndexEntry, ...]:
    """The index entries, checked against the index CRC and for a sound layout: sorted by
    (stream id, start offset), each stream's blocks consecutive, blocks filling the bytes
    before the index with no gap or overlap."""
    view = _view(index)
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
    position = 0
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
    view = _view(data)
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
    view = _view(data)
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


def max_timestamp_of(block: Buffer) -> int:
    """The largest max timestamp of a block's batches, read off their headers (-1, Kafka's
    NO_TIMESTAMP, when none has one). CorruptBatchError if they are not record batches."""
    return max((h.max_timestamp for h, _ in iter_batches(_view(block))), default=NO_TIMESTAMP)
