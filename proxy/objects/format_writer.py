"""The object writer: collects a stream's record batches as data blocks and lays out the
object (docs/object-format.md; the layout and its reader are `objects/format.py`).

Record bytes are never copied: a built object is a list of pieces (the callers' blocks,
then the index and the footer) that the uploader writes one after another.

Pure: no I/O, no asyncio. The offload jobs run this module inside Spark tasks.
"""

from __future__ import annotations

from dataclasses import dataclass

import crc32c

from proxy.objects.format import (
    FORMAT_VERSION,
    HEAD_SIZE,
    I64_MAX,
    NO_TIMESTAMP,
    READ_VERSIONS,
    U32_MAX,
    Buffer,
    Footer,
    IndexEntry,
    as_view,
    index_entry_size,
    pack_footer,
    pack_head,
    pack_index,
)
from proxy.objects.keys import U64_MAX, ObjectKind, object_key
from proxy.records.batches import iter_batches, validate_batch

DEFAULT_MAX_BLOCK_BYTES = 1 << 20


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
        view = as_view(data)
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
        view = as_view(records)
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
        """Lay out the object: blocks, index, footer; in version 3 behind a head and a
        copy of the index."""
        if not self._streams:
            raise ValueError(f"{self.key}: an object holds at least one block")
        pieces: list[memoryview] = []
        entries = []
        blocks = sum(len(run) for run in self._streams.values())
        front = HEAD_SIZE + blocks * index_entry_size(self.version) if self.version >= 3 else 0
        position = front
        for stream_id in sorted(self._streams):
            for start, end, count, view, crc, max_ts in self._streams[stream_id]:
                entries.append(
                    IndexEntry(stream_id, start, end, count, position, len(view), crc, max_ts)
                )
                pieces.append(view)
                position += len(view)
        index = pack_index(entries, self.version)
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
        if front:
            pieces[:0] = [memoryview(pack_head(footer)), memoryview(index)]
        pieces.append(memoryview(index))
        pieces.append(memoryview(pack_footer(footer)))
        return BuiltObject(self.key, footer, tuple(entries), tuple(pieces), footer.object_size)


def max_timestamp_of(block: Buffer) -> int:
    """The largest max timestamp of a block's batches, read off their headers (-1, Kafka's
    NO_TIMESTAMP, when none has one). CorruptBatchError if they are not record batches."""
    return max((h.max_timestamp for h, _ in iter_batches(as_view(block))), default=NO_TIMESTAMP)
