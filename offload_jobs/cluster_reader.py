"""A partition's record batches from a live Kafka cluster, byte-exact, by offset range.

Managed Kafka has no segment files to read, so the offload jobs fetch: a Metadata request
finds the partition's leader, then raw Fetch requests (v12, READ_UNCOMMITTED, no fetch
session) walk the range. The answers are read by the proxy's own protocol code
(`fetch_split.read_fetch_response`, `batches.whole_batches`) and every batch is handed on
as a view of the answer it came in: never decompressed, never re-encoded, so codecs,
producer ids, sequences, timestamps and transaction markers (batches too, READ_UNCOMMITTED
returns them) reach the caller as Kafka stored them.

Synchronous, plain blocking sockets: it runs inside a Spark task. The pure part, what an
answer's records field yields for a position (`take_batches`), is separate and
unit-tested with bytes built by hand.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass

from offload_jobs.kafka_client import (
    MAX_FETCH_BYTES_CAP,
    ClusterReadError,
    PartitionFetcher,
    ReaderSettings,
)
from offload_jobs.sources import SourceBatch
from proxy.records.batches import CorruptBatchError, validate_batch, whole_batches

__all__ = ["ClusterReadError", "ReaderSettings", "Taken", "read_batches", "take_batches"]


# -- pure: one answer's records ------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Taken:
    batches: list[SourceBatch]
    next_offset: int  # where the next Fetch starts
    done: bool  # a batch at or past `end` was seen
    partial: bool  # nothing taken, and the answer ended inside a batch: fetch more bytes


def take_batches(
    topic: str,
    partition: int,
    records: memoryview,
    position: int,
    end: int,
    *,
    first: bool,
    allow_gaps: bool,
) -> Taken:
    """The batches of one Fetch answer's records that continue a read at `position`.

    Batches that end at or before `position` are ones already read (an answer starts at
    the batch holding the fetch offset) and are skipped. The first batch of the whole read
    (`first`) may start below `position`; later ones must start exactly there, or past it
    when `allow_gaps`. The CRC of every batch taken is checked. A batch the broker cut
    short at the end (it filled max bytes) is left for the next Fetch."""
    whole, cut_at = whole_batches(records)
    taken: list[SourceBatch] = []
    at = 0
    for header, view in whole:
        here = at
        at += header.size
        if header.next_offset <= position:
            continue
        if header.base_offset >= end:
            return Taken(taken, position, True, False)
        if header.base_offset > position and not allow_gaps:
            raise ClusterReadError(
                topic, partition, position,
                f"gap: the next batch Kafka holds starts at offset {header.base_offset}",
            )  # fmt: skip
        if header.base_offset < position and not (first and not taken):
            raise ClusterReadError(
                topic, partition, position,
                f"batch [{header.base_offset}, {header.last_offset}] overlaps the one before",
            )  # fmt: skip
        try:
            validate_batch(view, here)
        except CorruptBatchError as exc:
            raise ClusterReadError(
                topic, partition, header.base_offset, f"corrupt batch in a Fetch answer: {exc}"
            ) from None
        taken.append(SourceBatch(header.base_offset, header.last_offset, view))
        position = header.next_offset
        if position >= end:
            return Taken(taken, position, True, False)
    return Taken(taken, position, False, not taken and cut_at < len(records))


def read_batches(
    bootstrap: str, topic: str, partition: int, start: int, end: int | None = None, **settings
) -> Iterator[SourceBatch]:
    """The partition's batches from the one holding `start` to the last one starting
    below `end` (None: the high watermark of the first answer), as Kafka stores them.

    ClusterReadError names the topic, partition and offset of a gap, an overlap, a corrupt
    batch, an offset out of range, or a leader that stays unreachable."""
    options = ReaderSettings.of(settings)
    if start < 0 or (end is not None and end < start):
        raise ValueError(f"{topic}-{partition}: range [{start}, {end}) is not a range")
    fetcher = PartitionFetcher(bootstrap, topic, partition, options)
    position, first, stalls = start, True, 0
    try:
        while end is None or position < end:
            answer = fetcher.fetch(position)
            if end is None:
                end = answer.high_watermark
                if position >= end:
                    return
            taken = take_batches(
                topic, partition, answer.records, position, end,
                first=first, allow_gaps=options.allow_gaps,
            )  # fmt: skip
            yield from taken.batches
            first = first and not taken.batches
            position = taken.next_offset
            if taken.done:
                return
            if taken.batches:
                stalls = 0
                continue
            if taken.partial and fetcher.max_bytes < MAX_FETCH_BYTES_CAP:
                fetcher.max_bytes *= 2  # a batch larger than what was asked for
                continue
            # Nothing to take below `end`. Right after a leader change the new leader's
            # high watermark may lag for a moment: ask Metadata again, a few times.
            stalls += 1
            if stalls > MAX_STALLS:
                raise ClusterReadError(topic, partition, position, _stalled(answer, end, stalls))
            fetcher.close()
            time.sleep(0.1 * stalls)
    finally:
        fetcher.close()


MAX_STALLS = 5  # answers in a row with nothing to take, each after a fresh Metadata


def _stalled(answer, end: int, stalls: int) -> str:
    if answer.high_watermark < end:
        return (
            f"the log ends at the high watermark {answer.high_watermark}, before the end "
            f"{end} asked for"
        )
    return (
        f"Kafka answers no batch there, {stalls} times, below its high watermark "
        f"{answer.high_watermark}"
    )
