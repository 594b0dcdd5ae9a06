"""Kafka log segments read as whole v2 record batches, byte-exact (docs/offload.md).

A partition's log directory (`<topic>-<partition>/`, or a copy of it) holds segments
named by their base offset: `00000000000000001234.log` with its `.index` (relative offset
i32, byte position i32 per entry, every ~4 KiB of batches) and `.timeindex`. A `.log` is
record batches back to back. This module lists the segments, uses the `.index` to start
reading near an offset instead of at the file's first byte, and yields each batch as a
memoryview of the memory-mapped file: nothing is decompressed or copied.

Every batch is checked (magic, length, codec, CRC-32C). Only the last segment may end
inside a batch: Kafka's active segment is being appended to, and a copy taken while it
was may cut its last batch. That torn tail is left out and reported (`torn_tail`).
Anything else that cannot be trusted raises `CorruptSegment` naming the file and the
byte. `.timeindex` is not read: a migration is by offset ranges, which `.index` serves.

Pure: no asyncio; runs inside Spark tasks.
"""

from __future__ import annotations

import mmap
import re
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from offload_jobs.sources import SourceBatch
from proxy.records.batches import (
    LOG_OVERHEAD,
    MAGIC_POSITION,
    MIN_BATCH_LENGTH,
    CorruptBatchError,
    TruncatedBatchError,
    validate_batch,
)

_SEGMENT = re.compile(r"(\d{20})\.log")
_INDEX_ENTRY = struct.Struct(">ii")  # offset relative to the segment's base, byte position
_HEADER_PEEK = MAGIC_POSITION + 1  # up to the magic: enough to size a batch
_LENGTH = struct.Struct(">qi")


class CorruptSegment(ValueError):
    """A segment file that cannot be trusted at `position` (a byte of `path`)."""

    def __init__(self, path: Path | str, position: int, reason: str) -> None:
        super().__init__(f"{path}: byte {position}: {reason}")
        self.path = str(path)
        self.position = position
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Segment:
    base_offset: int
    path: Path  # the .log file

    @property
    def index_path(self) -> Path:
        return self.path.with_suffix(".index")


@dataclass(frozen=True, slots=True)
class TornTail:
    """The last segment ends inside a batch: `size` bytes from `position` left out."""

    path: str
    position: int
    size: int
    reason: str


def list_segments(partition_dir: Path | str) -> list[Segment]:
    """The `.log` segments of a partition directory in base-offset order (files Kafka
    is deleting or cleaning, `.log.deleted`, `.log.cleaned`, `.log.swap`, are not logs)."""
    directory = Path(partition_dir)
    if not directory.is_dir():
        raise FileNotFoundError(f"{directory}: not a partition log directory")
    found = []
    for path in directory.iterdir():
        match = _SEGMENT.fullmatch(path.name)
        if match is not None:
            found.append(Segment(int(match.group(1)), path))
    return sorted(found, key=lambda s: s.base_offset)


def index_position(segment: Segment, offset: int, log_size: int) -> int:
    """A byte of the `.log` where a batch starts at or before `offset`, from its `.index`
    (0 without one). The active segment's index is preallocated with zeros: its entries
    end where offsets or positions stop increasing."""
    try:
        data = segment.index_path.read_bytes()
    except FileNotFoundError:
        return 0
    best, last_relative, last_position = 0, 0, -1
    for at in range(0, len(data) - _INDEX_ENTRY.size + 1, _INDEX_ENTRY.size):
        relative, position = _INDEX_ENTRY.unpack_from(data, at)
        increasing = (at == 0 or relative > last_relative) and position > last_position
        if not increasing or position >= log_size:
            break
        if segment.base_offset + relative > offset:
            break
        best, last_relative, last_position = position, relative, position
    return best


def _map(path: Path) -> memoryview:
    with open(path, "rb") as file:
        size = file.seek(0, 2)
        if size == 0:
            return memoryview(b"")
        # the mapping outlives the file object; it is unmapped once no view refers to it
        return memoryview(mmap.mmap(file.fileno(), size, access=mmap.ACCESS_READ))


class SegmentReader:
    """Reads a partition directory's batches by offset range. After a read, `torn_tail`
    says whether the last segment's tail was cut (and left out)."""

    def __init__(self, partition_dir: Path | str) -> None:
        self.partition_dir = Path(partition_dir)
        self.segments = list_segments(self.partition_dir)
        self.torn_tail: TornTail | None = None

    def read(self, start: int, end: int) -> Iterator[SourceBatch]:
        """Every batch holding an offset in [start, end), in offset order, checked.

        Raises CorruptSegment at the first batch that cannot be trusted."""
        segments = self.segments
        for i, segment in enumerate(segments):
            following = segments[i + 1].base_offset if i + 1 < len(segments) else None
            if following is not None and following <= start:
                continue
            if segment.base_offset >= end:
                return
            yield from self._read_segment(segment, start, end, last=following is None)

    def _read_segment(
        self, segment: Segment, start: int, end: int, *, last: bool
    ) -> Iterator[SourceBatch]:
        view = _map(segment.path)
        size = len(view)
        pos = index_position(segment, start, size) if start > segment.base_offset else 0
        if pos and not self._starts_batch(view, pos, start):
            pos = 0  # an index that does not point at a batch: read from the start
        while pos < size:
            try:
                batch_size = self._batch_size(view, pos)
                header = validate_batch(view[pos : pos + batch_size], pos)
            except TruncatedBatchError as exc:
                if not last:
                    what = f"not the last segment: {exc.what}"
                    raise CorruptSegment(segment.path, pos, what) from None
                self.torn_tail = TornTail(str(segment.path), pos, size - pos, exc.what)
                return
            except CorruptBatchError as exc:
                raise CorruptSegment(segment.path, exc.position, exc.what) from None
            if header.base_offset >= end:
                return
            if header.last_offset >= start:
                data = view[pos : pos + header.size]
                yield SourceBatch(header.base_offset, header.last_offset, data)
            pos += header.size

    @staticmethod
    def _batch_size(view: memoryview, pos: int) -> int:
        """The batch's size from its length field; TruncatedBatchError if the file ends
        first (validate_batch checks everything else)."""
        if len(view) - pos < _HEADER_PEEK:
            raise TruncatedBatchError(pos, f"{len(view) - pos} bytes left, a header needs 61")
        _, length = _LENGTH.unpack_from(view, pos)
        if view[pos + MAGIC_POSITION] != 2:
            magic = view[pos + MAGIC_POSITION]
            raise CorruptBatchError(pos, f"magic is {magic}, only magic 2 batches are supported")
        if length < MIN_BATCH_LENGTH:
            raise CorruptBatchError(pos, f"batch length {length} is below {MIN_BATCH_LENGTH}")
        if pos + LOG_OVERHEAD + length > len(view):
            raise TruncatedBatchError(
                pos, f"{len(view) - pos} bytes left, the batch length says {LOG_OVERHEAD + length}"
            )
        return LOG_OVERHEAD + length

    @staticmethod
    def _starts_batch(view: memoryview, pos: int, offset: int) -> bool:
        if len(view) - pos < _HEADER_PEEK or view[pos + MAGIC_POSITION] != 2:
            return False
        base, _ = _LENGTH.unpack_from(view, pos)
        return base <= offset


def read_batches(partition_dir: Path | str, start: int, end: int) -> Iterator[SourceBatch]:
    """The checked batches of a partition directory holding offsets in [start, end)."""
    return SegmentReader(partition_dir).read(start, end)
