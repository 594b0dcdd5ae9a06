"""Rebuilding a tiered partition's sequencer from durable sources, when a proxy takes a
stream over (or restarts): the snapshot, the committed objects and the WAL.

`read_wal_batches` reads the WAL's replay once for many streams; `rebuild` turns one
stream's share of it into the `PartitionSequencer` its `TieredPartition` starts from.
Which source wins where is `partition/rules.py`'s (`RecoveryPoint`, `rebuild_sequencer`);
this module only fetches what those pure rules decide over. docs/sequencer.md, "The owner
of a tiered partition", describes the recovery sources.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, Awaitable, Callable, Collection, Sequence

from proxy.metadata.state import MetadataState
from proxy.partition.carried import carried_producers
from proxy.partition.producer_state import ProducerStateEntry
from proxy.partition.recovered_tail import RecoveredTail
from proxy.partition.rules import (
    CommittedBlock,
    PartitionConfig,
    RecoveryError,
    RecoveryPoint,
    entry_batches,
    missing_committed,
    rebuild_sequencer,
)
from proxy.partition.sequencer import PartitionSequencer
from proxy.records.batches import BatchHeader
from proxy.wal.port import Log
from proxy.wal.types import WalEntry

__all__ = ["ReadCommitted", "ReadUpstream", "read_wal_batches", "rebuild"]

# (stream, start, end) -> the committed object blocks covering [start, end), in order,
# with their batch headers (committed.py)
ReadCommitted = Callable[[int, int, int], AsyncIterable[CommittedBlock]]
# (stream, start, end) -> headers of the batches of Kafka's log of the stream's partition
# from the one holding `start` to `end` (the cutover), in order: the transactions carried
# across the cutover (carried.py)
ReadUpstream = Callable[[int, int, int], Awaitable[Sequence[BatchHeader]]]


async def rebuild(
    stream_id: int,
    wal: Log,
    metadata: MetadataState,
    wal_batches: Sequence[BatchHeader] | None,
    read_committed: ReadCommitted | None,
    config: PartitionConfig,
    clock_ms: Callable[[], int],
    read_upstream: ReadUpstream | None = None,
) -> tuple[PartitionSequencer, int]:
    """(the sequencer at the stream's log end, the stream's log start offset), from
    durable sources only (which wins where: `partition/rules.py`'s docstring). Below the
    snapshot's offset S: the snapshot. Below the committed end E (`metadata.stream_end`):
    the objects are the log; the WAL's batches there replay the producer state from S,
    and `read_committed(stream, start, end)` is asked only for what of [S, E) the WAL no
    longer holds (RecoveryError without it). From E on: the WAL alone, continuing E with
    no gap; the log end (= high watermark) is its last batch's end. A gap or a straddle
    raises RecoveryError. `wal_batches`: this stream's WAL batch headers in order
    (`read_wal_batches`: one pass for many streams); None reads the WAL here. `clock_ms`
    is read once everything is read: the producer state expires from then. A stream
    that starts from a cutover with a transaction open (`RecoveryPoint.carried_from`)
    is seeded with its producers from Kafka's log: `read_upstream(stream, lso, cutover)`
    (RecoveryError without it)."""
    if wal_batches is None:
        wal_batches = (await read_wal_batches(wal, {stream_id})).get(stream_id, [])
    point = RecoveryPoint.from_metadata(metadata, stream_id)
    gap = missing_committed(point, wal_batches)
    committed = None
    if gap is not None and read_committed is not None:
        committed = [block async for block in read_committed(stream_id, *gap)]
    upstream = None
    if point.carried_from is not None:
        if read_upstream is None:
            raise RecoveryError(
                f"stream {stream_id}: a transaction was open at the cutover: its producers "
                f"are in Kafka's log from offset {point.carried_from} (read_upstream)"
            )
        upstream = await read_upstream(stream_id, point.carried_from, point.cutover_offset)
    now = clock_ms()
    carried: list[ProducerStateEntry] = []
    if point.carried_from is not None and upstream is not None:
        try:
            carried = carried_producers(upstream, point.carried_from, point.cutover_offset, now)
        except ValueError as exc:
            raise RecoveryError(
                f"stream {stream_id}: Kafka's log below the cutover: {exc}"
            ) from exc
    sequencer = rebuild_sequencer(point, committed, wal_batches, now, config, carried)
    return sequencer, point.log_start_offset


async def read_wal_batches(
    wal: Log,
    streams: Collection[int] | None = None,
    tail: RecoveredTail | None = None,
    stale: Callable[[WalEntry], bool] | None = None,
) -> dict[int, list[BatchHeader]]:
    """One pass over the WAL's replay: each stream's batch headers in order (only those of
    `streams`, if given, and none of the entries `stale` names: PartitionSet.disown).
    Headers only: the batch bytes are not kept, except those `tail` keeps (the entries
    past each stream's committed end, for the log cache)."""
    found: dict[int, list[BatchHeader]] = {}
    async for entry in wal.replay():
        if stale is not None and stale(entry):
            continue
        if streams is None or entry.stream_id in streams:
            headers = entry_batches(entry.stream_id, entry.base_offset, entry.batch)
            found.setdefault(entry.stream_id, []).extend(headers)
            if tail is not None:
                last = headers[-1].last_offset
                tail.add(entry.stream_id, entry.base_offset, last, entry.position, entry.batch)
    return found
