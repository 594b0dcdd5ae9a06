"""Kafka's producer state at the cutover: the producer state a stream starts with.

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
batch headers of Kafka's log from (at most) the last stable offset recorded at the cutover
(`StreamCutover.last_stable_offset`: the first offset of the oldest open transaction) up
to the cutover, by the same rules as a rebuild's replay (Kafka's, for a log it reloads):
per producer its epoch, its last batches (the sequence its next batch continues) and the
first offset of its open transaction, below the cutover. The stream's last stable offset
is then Kafka's until the marker comes; the marker ends the transaction in the stream and
fences zombies of an older epoch, as for any transaction.

Idempotent producers cross the cutover too (`producers_at_cutover`). A producer whose
batch Kafka appended just before the cutover may not have its answer: its connection
broke, or Kafka answered a retriable error after appending it (REQUEST_TIMED_OUT waiting
for replicas). It sends the batch again, with the same sequence numbers, and after the
cutover the stream takes it. Kafka would have found it among the producer's last 5
batches and answered with the offset it was first written at; a stream that knew nothing
of the producer took it at any sequence (KIP-360's rule for an unknown producer id) and
wrote it twice, and took a batch after a gap Kafka would have answered
OUT_OF_ORDER_SEQUENCE_NUMBER (45), which cut the retried batch's records out of the log
order the producer meant (the retry then met 45, and librdkafka stops with a fatal
error). So a stream rebuilt soon after its cutover (`RecoveryPoint.seeds_from_kafka`)
starts from every producer of the recent tail of Kafka's log below it: its epoch and its
last batches, as Kafka's state holds them there. Only the tail: a producer that last
wrote before it (`UpstreamLog.tail`: at least the last RECENT_MS of the log by its
batches' timestamps, at most TAIL_BYTES unless a transaction open at the cutover needs
more) is as unknown to the stream as before, and its next batch is taken at any
sequence.

Pure: no I/O, no asyncio.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from proxy.partition.producer_state import NUM_BATCHES_TO_RETAIN, ProducerStateEntry
from proxy.partition.sequencer import PartitionSequencer
from proxy.records.batches import BatchHeader

__all__ = ["producers_at_cutover"]


def producers_at_cutover(
    headers: Sequence[BatchHeader], cutover: int, now_ms: int, open_from: int | None
) -> list[ProducerStateEntry]:
    """Every producer with a data batch in the headers of Kafka's log below `cutover`
    (read from the first one on, in offset order), as Kafka's state holds it at the
    cutover: its epoch, its last batches (those the headers hold, up to 5), and the first
    offset of its transaction if one is open there. Only with `open_from` (the last
    stable offset the cutover recorded; the read starts at or below it, unless Kafka's
    retention took that part of its log since, as the read logs) is a transaction open:
    without it the cutover recorded none open, and a producer whose transaction began
    before the headers' start seems open and is not. Each counts as used at `now_ms`."""
    if not headers:
        return []
    sequencer = PartitionSequencer(headers[0].base_offset)
    for header in headers:
        if header.base_offset >= cutover:
            break
        if header.base_offset < sequencer.producer_state_end:
            raise ValueError(
                f"Kafka's batch at offsets {header.base_offset}..{header.last_offset} "
                f"overlaps the one before it (ends at {sequencer.producer_state_end})"
            )
        sequencer.replay(header, now_ms)  # by a rebuild's rules
    # A producer the tail shows only a marker of has its batches before the tail: its last
    # sequence is unknown, and it stays unknown to the stream (any sequence), as before
    # A producer with fewer batches here than Kafka's state keeps may have older ones
    # Kafka would still answer a retry of: a retry of one is answered as a duplicate
    states = [
        replace(entry, history_cut=len(entry.batches) < NUM_BATCHES_TO_RETAIN)
        for entry in sequencer.producer_states.values()
        if entry.batches
    ]
    if open_from is None:
        return [replace(entry, current_txn_first_offset=None) for entry in states]
    return states
