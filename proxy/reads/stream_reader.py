"""Reads of a stream's committed offsets, from its objects through the block cache.

Any proxy serves the offsets committed to objects, so consumers read in their own zone;
what no object holds yet (the owner's uncommitted tail, offsets below the cutover not
offloaded yet) the caller answers from elsewhere. A read returns the stream's record
batches as they are stored, memoryview slices of cached blocks: no batch is copied or
decoded, and the work is per batch (its header), never per record. Each read names the
stream's next committed range to the cache, so that readahead goes on into it.
"""

from __future__ import annotations

import bisect
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

from proxy.metadata.state import MetadataState
from proxy.metadata.streams import StreamRange
from proxy.objects.format import IndexEntry, ObjectFormatError, find_entries
from proxy.objects.store import ObjectNotFound
from proxy.reads.blockcache import BlockCache, NextRange
from proxy.records.batches import HEADER_SIZE, CorruptBatchError, read_batch_header


@dataclass(frozen=True, slots=True)
class ReadResult:
    """Record batches of one stream, in offset order, and the offset to read next: after
    the last batch, or, with no batch, where the objects read end (the offset asked for
    when no object holds it)."""

    batches: tuple[memoryview, ...]
    next_offset: int
    size: int

    def __bool__(self) -> bool:
        return bool(self.batches)


class _Fill:
    """The batches of one read so far, within Kafka's size rule: a batch goes in while the
    total stays within `max_bytes`, except the first, which goes in whole whatever its size
    (KIP-74), so a consumer always makes progress."""

    __slots__ = ("max_bytes", "batches", "size", "next_offset", "full")

    def __init__(self, offset: int, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.batches: list[memoryview] = []
        self.size = 0
        self.next_offset = offset
        self.full = False

    @property
    def room(self) -> int:
        return self.max_bytes - self.size

    def take(self, batch: memoryview, next_offset: int) -> bool:
        """Add the batch; False (and full) when it does not fit."""
        if self.batches and len(batch) > self.room:
            self.full = True
            return False
        self.batches.append(batch)
        self.size += len(batch)
        self.next_offset = next_offset
        # no batch is smaller than its header
        self.full = self.room < HEADER_SIZE
        return True


class StreamReader:
    """Reads committed offsets of streams through `cache`, which holds the object store."""

    def __init__(self, cache: BlockCache) -> None:
        self.cache = cache

    async def read(
        self,
        state: MetadataState,
        stream: int,
        offset: int,
        max_bytes: int,
        *,
        reader_id: Hashable,
    ) -> ReadResult:
        """The stream's batches from the one holding `offset` on, from the objects
        `state` commits, filling at most `max_bytes` except that the first batch is
        returned whole. Empty when no object holds `offset`. `reader_id` names the reader
        (a consumer connection's fetch of this stream) whose readahead this read is.

        A missing object raises ObjectNotFound, a corrupt one ObjectFormatError naming it;
        the cache then holds nothing of that object."""
        if offset < 0 or max_bytes < 0:
            raise ValueError(f"read of offset {offset}, max bytes {max_bytes}: both are >= 0")
        fill = _Fill(offset, max_bytes)
        position = offset
        while not fill.full:
            found = state.objects_for(stream, position, limit=2)
            if not found:
                break
            committed = found[0]
            after = _next_range(committed, found[1]) if len(found) > 1 else None
            try:
                await self._read_range(committed, position, fill, reader_id, after)
            except (ObjectFormatError, ObjectNotFound):
                self.cache.forget(committed.object_key)
                raise
            position = committed.end_offset
        next_offset = fill.next_offset if fill.batches else position
        return ReadResult(tuple(fill.batches), next_offset, fill.size)

    async def _read_range(
        self,
        committed: StreamRange,
        position: int,
        fill: _Fill,
        reader_id: Hashable,
        after: NextRange | None,
    ) -> None:
        """Batches of the committed range from `position` on, until the range ends or
        `fill` is full."""
        key = committed.object_key
        index = await self.cache.index(key, committed.object_size)
        run = _blocks_of(index, committed, position)
        done = 0
        while done < len(run) and not fill.full:
            wanted = _blocks_wanted(run, done, fill.room)
            blocks = await self.cache.blocks(
                key, run[done:], wanted, reader_id=reader_id, after=after
            )
            for entry, block in zip(run[done : done + wanted], blocks, strict=True):
                if not _take_batches(key, entry, block, committed.end_offset, fill):
                    return
            done += wanted


def _next_range(committed: StreamRange, following: StreamRange) -> NextRange:
    start = max(following.start_offset, committed.end_offset)
    return NextRange(
        following.object_key,
        following.object_size,
        following.stream_id,
        start,
        following.end_offset,
    )


def _blocks_of(
    index: Sequence[IndexEntry], committed: StreamRange, position: int
) -> Sequence[IndexEntry]:
    """The object's blocks of the range from the one holding `position`; the object must
    hold the whole range that its commit names."""
    stream = committed.stream_id
    run = find_entries(index, stream, position)
    run = run[: bisect.bisect_left(run, committed.end_offset, key=_start_offset)]
    if not run or run[-1].end_offset < committed.end_offset:
        held = f"[{run[0].start_offset}, {run[-1].end_offset})" if run else "none"
        raise ObjectFormatError(
            committed.object_key,
            f"committed to hold offsets [{position}, {committed.end_offset}) of stream "
            f"{stream}, its blocks hold {held} of them",
        )
    return run


def _start_offset(entry: IndexEntry) -> int:
    return entry.start_offset


def _blocks_wanted(run: Sequence[IndexEntry], first: int, room: int) -> int:
    """How many blocks from `first` on it takes to fill `room` bytes (at least one)."""
    size = 0
    for at in range(first, len(run)):
        size += run[at].size
        if size >= room:
            return at - first + 1
    return len(run) - first


def _take_batches(key: str, entry: IndexEntry, block: memoryview, end: int, fill: _Fill) -> bool:
    """Put the block's batches from `fill.next_offset` on and before `end` into `fill`, reading
    their headers only; False when the range or the read is done."""
    position = 0
    while position < len(block):
        try:
            header = read_batch_header(block, position)
        except CorruptBatchError as error:
            raise ObjectFormatError(key, f"{_where(entry)}: {error}") from error
        if header.base_offset < entry.start_offset or header.next_offset > entry.end_offset:
            raise ObjectFormatError(
                key,
                f"{_where(entry)}: the batch at byte {position} of the block holds offsets "
                f"[{header.base_offset}, {header.next_offset}), outside the block's",
            )
        if header.base_offset >= end:
            return False
        # past what the read took already, not only past where it started: after a
        # compaction swapped the objects mid-read, the next range may start below it
        if header.next_offset > fill.next_offset:
            batch = block[position : position + header.size]
            if not fill.take(batch, header.next_offset) or fill.full:
                return False
        position += header.size
    return True


def _where(entry: IndexEntry) -> str:
    return (
        f"block of stream {entry.stream_id} offsets [{entry.start_offset}, "
        f"{entry.end_offset}) at bytes [{entry.position}, {entry.end_position})"
    )
