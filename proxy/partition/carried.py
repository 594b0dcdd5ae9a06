"""Transactions carried across the cutover: the producer state a stream starts with.

A topic is cut over once its partitions' high watermarks are stable, whether or not a
transaction is open in Kafka's log of them (docs/tiering.md, "Cutover": holding the
cutover until none is open would stall a producer that sends more records in its
transaction, since produce to the topic is held meanwhile, until the coordinator times
the transaction out and fences it). Such a transaction goes on in the stream: its
records below the cutover are in Kafka's log, the later ones in the stream, and its
marker, which the coordinator writes to Kafka's log past the cutover, reaches the stream
through the marker follower.

So a stream that starts from its cutover (no producer snapshot past it) seeds its
sequencer with the producers whose transactions are open at the cutover, read from the
batch headers of Kafka's log from the last stable offset recorded at the cutover
(`StreamCutover.last_stable_offset`: the first offset of the oldest open transaction) up
to the cutover, by the same rules as a rebuild's replay (Kafka's, for a log it reloads):
per producer its epoch, its last batches (the sequence its next batch continues) and the
first offset of its open transaction, below the cutover. The stream's last stable offset
is then Kafka's until the marker comes; the marker ends the transaction in the stream and
fences zombies of an older epoch, as for any transaction.

Pure: no I/O, no asyncio.
"""

from __future__ import annotations

from collections.abc import Iterable

from proxy.partition.producer_state import ProducerStateEntry
from proxy.partition.sequencer import PartitionSequencer
from proxy.records.batches import BatchHeader

__all__ = ["carried_producers"]


def carried_producers(
    headers: Iterable[BatchHeader], start: int, cutover: int, now_ms: int
) -> list[ProducerStateEntry]:
    """The producers with a transaction open at `cutover`, from the headers of Kafka's
    log of the partition read from `start` (its last stable offset at the cutover) on, in
    offset order: those from `start` to `cutover` count (a batch holding `start` whole);
    the rest is passed over. Each counts as used at `now_ms` (a full expiration period)."""
    sequencer: PartitionSequencer | None = None
    for header in headers:
        if header.base_offset >= cutover:
            break
        if header.next_offset <= start:
            continue
        if sequencer is None:  # the batch holding `start`: replayed whole
            sequencer = PartitionSequencer(min(start, header.base_offset))
        if header.base_offset < sequencer.producer_state_end:
            raise ValueError(
                f"Kafka's batch at offsets {header.base_offset}..{header.last_offset} "
                f"overlaps the one before it (ends at {sequencer.producer_state_end})"
            )
        sequencer.replay(header, now_ms)
    if sequencer is None:
        return []
    states = sequencer.producer_states.values()
    return [entry for entry in states if entry.current_txn_first_offset is not None]
