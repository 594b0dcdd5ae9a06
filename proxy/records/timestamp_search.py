"""Kafka's answers to ListOffsets by timestamp and MAX_TIMESTAMP, over record batches.

Kafka's rules, read off its source (apache/kafka):
- a timestamp T (`FileRecords.searchForTimestamp`, called by `LogSegment.findOffsetByTimestamp`
  with the log start offset): walk the batches in offset order; in each batch whose max
  timestamp is >= T, the first record whose timestamp is >= T and whose offset is >= the
  log start is the answer, with the batch's partition leader epoch (-1 when negative). A
  batch whose only such records lie below the log start is passed over. With timestamps
  out of order, the answer is that first record, not the record closest to T;
- MAX_TIMESTAMP (UnifiedLog.fetchOffsetByTimestamp, KIP-734): the first batch whose max
  timestamp is the log's largest, and in it the first record with that timestamp
  (`RecordBatch.offsetOfMaxTimestamp`);
- a record of a LOG_APPEND_TIME batch has the batch's max timestamp as its timestamp
  (`DefaultRecordBatch`), so every record of it has the same one.

The one batch found is decompressed and its records' offset and timestamp deltas read
(`record_walk.py`): one batch per lookup, never the partition's records.
Which blocks hold candidates comes from the objects' time index (objects/format.py: each
block's max timestamp), so the caller reads the index and, nearly always, one block; a
block is anything with a `max_timestamp`, so this module needs no object layout.

Pure: no I/O, no asyncio.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

from proxy.records.batches import (
    BatchHeader,
    iter_batches,
)
from proxy.records.record_walk import walk_records


@dataclass(frozen=True, slots=True)
class Found:
    """A record answering a lookup: Kafka's TimestampAndOffset."""

    timestamp: int
    offset: int
    leader_epoch: int  # the batch's partition leader epoch, -1 when it has none


def _epoch(header: BatchHeader) -> int:
    return header.partition_leader_epoch if header.partition_leader_epoch >= 0 else -1


def in_batch(header: BatchHeader, batch: memoryview, target: int, start: int) -> Found | None:
    """Kafka's answer inside one batch: its first record at or after `target` whose offset
    is at least `start`; None when it has none."""
    if header.max_timestamp < target or header.next_offset <= start:
        return None
    for delta, timestamp, _, _ in walk_records(header, batch):
        offset = header.base_offset + delta
        if timestamp >= target and offset >= start:
            return Found(timestamp, offset, _epoch(header))
    return None


def in_batches(
    records: memoryview, target: int, start: int, end: int | None = None
) -> Found | None:
    """Kafka's answer among a run of whole batches (a block, a log cache entry): only the
    batches past `start` and, when `end` is given, starting below it are looked at; the
    others are skipped by their headers."""
    for header, batch in iter_batches(records):
        if end is not None and header.base_offset >= end:
            return None
        found = in_batch(header, batch, target, start)
        if found is not None:
            return found
    return None


class TimedBlock(Protocol):
    """A block of an object's time index (objects/format.py's IndexEntry): the largest max
    timestamp of its batches, None when its object does not record it."""

    @property
    def max_timestamp(self) -> int | None: ...


Block = TypeVar("Block", bound=TimedBlock)


def candidate_blocks(entries: Sequence[Block], target: int) -> list[Block]:
    """The blocks that may hold the answer to `target`: those whose max timestamp (the
    objects' time index) reaches it, and those with none known (a version 1 object's
    blocks, read to learn it). The others are skipped unread."""
    return [e for e in entries if e.max_timestamp is None or e.max_timestamp >= target]


def max_timestamp_in(records: memoryview, start: int, end: int | None = None) -> int:
    """The largest max timestamp of the batches of a run holding offsets from `start` on
    (below `end` when given); -1 when none has one."""
    best = -1
    for header, _ in iter_batches(records):
        if end is not None and header.base_offset >= end:
            break
        if header.next_offset > start:
            best = max(best, header.max_timestamp)
    return best


def offset_of_max(
    records: memoryview, max_timestamp: int, start: int, end: int | None = None
) -> Found | None:
    """Kafka's MAX_TIMESTAMP answer in a run: the first batch (past `start`, below `end`)
    whose max timestamp is `max_timestamp`, and its first record with that timestamp."""
    for header, batch in iter_batches(records):
        if end is not None and header.base_offset >= end:
            return None
        if header.next_offset <= start or header.max_timestamp != max_timestamp:
            continue
        for delta, timestamp, _, _ in walk_records(header, batch):
            if timestamp == max_timestamp:
                return Found(timestamp, header.base_offset + delta, _epoch(header))
    return None
