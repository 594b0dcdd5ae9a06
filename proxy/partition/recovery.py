"""Rebuilding a tiered partition's sequencer from durable sources, when a proxy takes a
stream over (or restarts): the snapshot, the committed objects and the WAL.

`read_wal_batches` reads the WAL's replay once for many streams; `rebuild` turns one
stream's share of it into the `PartitionSequencer` its `TieredPartition` starts from.
Which source wins where is `partition/rules.py`'s (`RecoveryPoint`, `rebuild_sequencer`);
this module only fetches what those pure rules decide over. docs/sequencer.md, "The owner
of a tiered partition", describes the recovery sources.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterable, Awaitable, Callable, Collection, Sequence

from proxy.metadata.state import MetadataState
from proxy.partition.carried import producers_at_cutover
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

log = logging.getLogger("tierproxy.tiering")

__all__ = ["ReadCommitted", "ReadUpstream", "read_wal_batches", "rebuild"]

# (stream, start, end) -> the committed object blocks covering [start, end), in order,
# with their batch headers (committed.py)
ReadCommitted = Callable[[int, int, int], AsyncIterable[CommittedBlock]]
# (stream, lowest, end) -> headers of the batches of Kafka's log of the stream's partition
# below `end` (the cutover), in order, from the recent tail's start or from the batch
# holding `lowest` if that is lower (a transaction open at the cutover starts there):
# Kafka's producer state at the cutover (carried.py)
ReadUpstream = Callable[[int, int | None, int], Awaitable[Sequence[BatchHeader]]]


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
    that starts from its cutover, soon after it or with a transaction open there
    (`RecoveryPoint.seeds_from_kafka`), is seeded with the producers of Kafka's log tail
    below it: `read_upstream(stream, lso or None, cutover)` (with a transaction open,
    RecoveryError without it)."""
    if wal_batches is None:
        wal_batches = (await read_wal_batches(wal, {stream_id})).get(stream_id, [])
    point = RecoveryPoint.from_metadata(metadata, stream_id)
    gap = missing_committed(point, wal_batches)
    committed = None
    if gap is not None and read_committed is not None:
        committed = [block async for block in read_committed(stream_id, *gap)]
    upstream = await _read_upstream(stream_id, point, read_upstream, clock_ms())
    now = clock_ms()
    carried: list[ProducerStateEntry] = []
    if upstream:
        try:
            carried = producers_at_cutover(upstream, point.cutover_offset, now, point.carried_from)
            if not point.seeds_idempotent(now):  # read for the open transactions only
                carried = [e for e in carried if e.current_txn_first_offset is not None]
        except ValueError as exc:
            if point.carried_from is not None:
                raise RecoveryError(
                    f"stream {stream_id}: Kafka's log below the cutover: {exc}"
                ) from exc
            log.warning("stream %d: Kafka's log below the cutover: %s", stream_id, exc)
    sequencer = rebuild_sequencer(point, committed, wal_batches, now, config, carried)
    return sequencer, point.log_start_offset


async def _read_upstream(
    stream_id: int, point: RecoveryPoint, read_upstream: ReadUpstream | None, now_ms: int
) -> Sequence[BatchHeader]:
    """The headers of Kafka's log tail below the cutover the rebuild seeds its producers
    from (`RecoveryPoint.seeds_from_kafka`), or nothing. Needed when a transaction was
    open at the cutover (RecoveryError without them); otherwise a failed read is logged
    and the stream starts as before, taking an unknown producer at any sequence."""
    if not point.seeds_from_kafka(now_ms):
        return ()
    lowest = point.carried_from
    if read_upstream is None:
        if lowest is None:
            return ()
        raise RecoveryError(
            f"stream {stream_id}: a transaction was open at the cutover: its producers "
            f"are in Kafka's log from offset {lowest} (read_upstream)"
        )
    if lowest is not None:
        return await read_upstream(stream_id, lowest, point.cutover_offset)
    try:
        return await read_upstream(stream_id, None, point.cutover_offset)
    except Exception as exc:  # KafkaError, OSError, a topic gone: optional, said
        log.warning(
            "stream %d: Kafka's log below the cutover %d not read (%r): producers that wrote "
            "there are unknown to the stream, and their next batch is taken at any sequence",
            stream_id,
            point.cutover_offset,
            exc,
        )
        return ()


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
            referenced = entry.reference is not None  # its bytes elsewhere (referenced.py)
            headers = entry_batches(
                entry.stream_id, entry.base_offset, entry.batch, header_only=referenced
            )
            found.setdefault(entry.stream_id, []).extend(headers)
            if tail is not None:
                last = headers[-1].last_offset
                batch = None if referenced else entry.batch
                tail.add(entry.stream_id, entry.base_offset, last, entry.position, batch)
    return found
