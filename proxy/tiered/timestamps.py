"""The tiered stream's part of ListOffsets by timestamp and MAX_TIMESTAMP: Kafka's rules
(`proxy/records/timestamp_search.py`) run over the stream's committed objects, through
the block cache, then over the tail no object holds yet (the owner's log cache, here or
over the peer protocol).

A timestamp lookup reads each committed range's index (cached) and only the blocks whose
max timestamp (the objects' time index) reaches the target: nearly always one block.
Blocks of version 1 objects have no max timestamp and are read to learn it. Answers at
or past the high watermark are not answers (Kafka's `lastFetchableOffset` rule).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

from proxy.objects.format import IndexEntry, find_entries
from proxy.records.batches import iter_batches
from proxy.records.timestamp_search import (
    Found,
    candidate_blocks,
    in_batches,
    max_timestamp_in,
    offset_of_max,
)
from proxy.tiered.ports import ReadHandlers

TAIL_READ_BYTES = 1 << 20


class OwnerAway(Exception):
    """The stream's tail is held by an owner that does not answer: no answer is sure."""


@dataclass(frozen=True, slots=True)
class _Span:
    """A run of batches that may hold the answer: a committed block or a tail piece."""

    start: int  # only offsets from here on count
    end: int | None  # only batches starting below it count
    max_timestamp: int | None  # exact for the span, or None when it must be read
    load: Callable[[], Awaitable[memoryview]]


class StreamSearch:
    """One stream's lookups; `tiering` is the service (state, block cache, log cache)."""

    def __init__(self, tiering: ReadHandlers, stream: int) -> None:
        self.tiering = tiering
        self.stream = stream
        self.state = tiering.state(stream)
        self.cache = tiering.reads.reader.cache
        self.reader_id = ("timestamp search", stream)

    async def first_at_or_after(self, target: int, start: int) -> Found | None:
        """Kafka's answer to timestamp `target` in the stream from offset `start` on."""
        position = start
        while found := self.state.objects_for(self.stream, position, limit=1):
            committed = found[0]
            for entry in candidate_blocks(await self._blocks(committed, position), target):
                block = await self._block(committed.object_key, entry)
                hit = in_batches(block, target, position, committed.end_offset)
                if hit is not None:
                    return await self._below_high_watermark(hit)
            position = max(position, committed.end_offset)
        async for piece, high_watermark in self._tail(position):
            hit = in_batches(piece, target, position)
            if hit is not None:
                return hit if hit.offset < high_watermark else None
        return None

    async def max_timestamp(self, start: int) -> Found | None:
        """Kafka's MAX_TIMESTAMP answer over the stream's batches holding offsets from
        `start` on (a batch straddling `start` counts whole, as Kafka counts the segment
        holding its log start whole)."""
        spans: list[_Span] = []
        position = start
        while found := self.state.objects_for(self.stream, position, limit=1):
            committed = found[0]
            for entry in await self._blocks(committed, position):
                exact = entry.start_offset >= position and entry.end_offset <= committed.end_offset
                known = entry.max_timestamp if exact else None
                spans.append(
                    _Span(position, committed.end_offset, known, self._loader(committed, entry))
                )
            position = max(position, committed.end_offset)
        high_watermark: int | None = None
        async for piece, tail_high_watermark in self._tail(position):
            high_watermark = tail_high_watermark
            spans.append(_Span(position, None, max_timestamp_in(piece, position), _ready(piece)))
        for at, span in enumerate(spans):
            if span.max_timestamp is None:
                block = await span.load()
                largest = max_timestamp_in(block, span.start, span.end)
                spans[at] = _Span(span.start, span.end, largest, span.load)
        best = max((s.max_timestamp for s in spans), default=-1)
        if best < 0:
            return None
        for span in spans:
            if span.max_timestamp == best:
                hit = offset_of_max(await span.load(), best, span.start, span.end)
                if hit is not None:
                    if high_watermark is not None and hit.offset >= high_watermark:
                        return None
                    return await self._below_high_watermark(hit)
        return None

    async def batch_holding(self, offset: int) -> int:
        """The base offset of the stream's batch holding `offset`: below it when the batch
        began before it, `offset` itself when a batch begins there or none holds it yet
        (the log end). For the LSO past a DeleteRecords (TieredPartition.note_start_batch)."""
        found = self.state.objects_for(self.stream, offset, limit=1)
        if found:
            committed = found[0]
            for entry in (await self._blocks(committed, offset))[:1]:
                block = await self._block(committed.object_key, entry)
                return _base_holding(block, offset)
            return offset
        async for piece, _ in self._tail(offset):
            return _base_holding(piece, offset)
        return offset

    # -- reads ------------------------------------------------------------------------

    async def _blocks(self, committed, position: int) -> list[IndexEntry]:
        """The committed range's blocks from the one holding `position` on."""
        index = await self.cache.index(committed.object_key, committed.object_size)
        run = find_entries(index, self.stream, position)
        return [e for e in run if e.start_offset < committed.end_offset]

    async def _block(self, key: str, entry: IndexEntry) -> memoryview:
        (block,) = await self.cache.blocks(key, (entry,), 1, reader_id=self.reader_id)
        return block

    def _loader(self, committed, entry: IndexEntry) -> Callable[[], Awaitable[memoryview]]:
        key = committed.object_key
        return lambda: self._block(key, entry)

    async def _tail(self, position: int) -> AsyncIterator[tuple[memoryview, int]]:
        """(batches, high watermark) of the stream past its committed objects, from
        `position` on: the owner's log cache, here or asked of the owner."""
        reads = self.tiering.reads
        while True:
            got = await reads.tail_records(self.stream, position, TAIL_READ_BYTES)
            if got is None:
                raise OwnerAway(self.stream)
            pieces, high_watermark = got
            pieces = [p for p in pieces if len(p)]
            if not pieces or position >= high_watermark:
                return
            for piece in pieces:
                yield memoryview(piece), high_watermark
            last = max_next_offset(pieces)
            if last <= position:
                return
            position = last

    async def _below_high_watermark(self, hit: Found) -> Found | None:
        """A committed answer is below every high watermark, except on an owner that
        restarted and has not acknowledged it yet."""
        partitions = self.tiering.partitions
        partition = None if partitions is None else partitions.get(self.stream)
        if partition is not None and hit.offset >= partition.high_watermark:
            return None
        return hit


def _ready(piece: memoryview) -> Callable[[], Awaitable[memoryview]]:
    async def load() -> memoryview:
        return piece

    return load


def _base_holding(batches: memoryview, offset: int) -> int:
    """The base offset of the first batch of `batches` ending past `offset`, at most `offset`."""
    for header, _ in iter_batches(batches):
        if header.next_offset > offset:
            return min(header.base_offset, offset)
    return offset


def max_next_offset(pieces) -> int:
    """The offset after the last batch of the pieces (whole batches, in offset order)."""
    last = -1
    for piece in pieces:
        for header, _ in iter_batches(memoryview(piece)):
            last = max(last, header.next_offset)
    return last
