"""Gaps the proxy made in a producer's sequence, told from gaps the client made.

Kafka answers a sequence gap OUT_OF_ORDER_SEQUENCE_NUMBER (45), and clients take it as a
broken sequence: librdkafka and the Java producer bump their epoch and renumber what they
hold, which writes again any batch they only knew as "possibly persisted". A real broker
rarely makes a gap itself. The proxy can: between the client and the partition's sequencer
a batch can be answered with a retriable error without being appended (its S3-WAL PUT
failed, the owner was unreachable, the partition was not started yet or was closing)
while a later batch of the same producer, already on its way, reaches the sequencer.

The rule (docs/sequencer.md, "Gaps the proxy made"): every proxy records, per stream and
producer, the first sequence of each batch it answered with a retriable error and did not
append (`dropped`; a hand-off lost with its peer connection counts). A sequence gap is
answered NOT_LEADER_OR_FOLLOWER instead of 45 when a recorded batch starts inside the
missing range (`explains`): the client then resends its batches in order with the same
sequences. Any other gap is the client's and gets Kafka's 45. A hand-off carries the
newest hole its proxy knows before the batch (`hole_before`), so the owner decides with
what every proxy on the way knows, across hand-overs and restarts of the owner.

Stale records need no clean-up for correctness: a hole the client has since filled lies
before the sequencer's next expected sequence, outside any missing range. `delivered`
forgets them anyway, and `SequenceHoles` is bounded.

Pure: no I/O, no asyncio.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from kio.schema.errors import ErrorCode

from proxy.partition.producer_state import INT32_MAX, increment_sequence, sequence_before
from proxy.records.batches import CorruptBatchError, iter_batches, validate_header

__all__ = [
    "DROP_CODES",
    "ProducerBatch",
    "SequenceGap",
    "SequenceHoles",
    "seq_within",
]

SEQUENCE_SPACE = INT32_MAX + 1
# Answers meaning "not appended here, send it again": a batch answered so was dropped.
DROP_CODES = frozenset(
    {
        ErrorCode.not_leader_or_follower,
        ErrorCode.request_timed_out,
        ErrorCode.network_exception,
        ErrorCode.not_enough_replicas,
        ErrorCode.not_enough_replicas_after_append,
        ErrorCode.kafka_storage_error,
    }
)


def seq_within(seq: int, start: int, end: int) -> bool:
    """`start <= seq < end` in Kafka's sequence space, which wraps from 2**31-1 to 0."""
    return (seq - start) % SEQUENCE_SPACE < (end - start) % SEQUENCE_SPACE


@dataclass(frozen=True, slots=True)
class ProducerBatch:
    """Who sent one partition's records of a Produce request, and which sequences: the
    first batch's producer, epoch and base sequence, and the last batch's last sequence."""

    producer_id: int
    producer_epoch: int
    first_sequence: int
    last_sequence: int

    @classmethod
    def of(
        cls, records: bytes | bytearray | memoryview | None, *, header_only: bool = False
    ) -> ProducerBatch | None:
        """From the batch headers (no CRC check, no record read); None without a producer
        id, or for records that cannot be read (the sequencer refuses those anyway).
        `header_only`: `records` is one batch's header, its bytes elsewhere."""
        if records is None:
            return None
        first = last = None
        try:
            if header_only:
                first = last = validate_header(records)
            else:
                for header, _ in iter_batches(records):
                    first = first or header
                    last = header
        except CorruptBatchError:
            return None
        if first is None or last is None or first.producer_id < 0 or first.base_sequence < 0:
            return None
        last_seq = increment_sequence(last.base_sequence, last.last_offset_delta)
        return cls(first.producer_id, first.producer_epoch, first.base_sequence, last_seq)


@dataclass(frozen=True, slots=True)
class SequenceGap:
    """What the sequencer expected of a producer and what came: the batches from
    `expected` up to `first_sequence` (excluded) of `producer_epoch` are missing."""

    producer_id: int
    producer_epoch: int
    expected: int
    first_sequence: int


class SequenceHoles:
    """Per (stream, producer id): the epoch and first sequences of the last batches this
    proxy dropped (at most `per_producer`), for at most `max_producers` pairs (the least
    recently dropped are forgotten first)."""

    def __init__(self, *, per_producer: int = 8, max_producers: int = 100_000) -> None:
        if per_producer <= 0 or max_producers <= 0:
            raise ValueError("per_producer and max_producers must be positive")
        self.per_producer = per_producer
        self.max_producers = max_producers
        self._holes: OrderedDict[tuple[int, int], tuple[int, tuple[int, ...]]] = OrderedDict()
        self.explained = 0  # gaps answered retriable because of a hole (a metric)

    def __len__(self) -> int:
        return len(self._holes)

    def dropped(self, stream: int, batch: ProducerBatch | None) -> None:
        """`batch` was answered with a retriable error and not appended by this proxy (or
        its hand-off was lost with the connection): the client will send it again."""
        if batch is None:
            return
        key = (stream, batch.producer_id)
        held = self._holes.pop(key, None)
        seqs: tuple[int, ...] = ()
        if held is not None:
            epoch, seqs = held
            if batch.producer_epoch < epoch:  # an older epoch's batch: fenced anyway
                self._holes[key] = held
                return
            if batch.producer_epoch > epoch:
                seqs = ()
        seqs = (*(s for s in seqs if s != batch.first_sequence), batch.first_sequence)
        self._holes[key] = (batch.producer_epoch, seqs[-self.per_producer :])
        while len(self._holes) > self.max_producers:
            self._holes.popitem(last=False)

    def delivered(self, stream: int, batch: ProducerBatch | None) -> None:
        """`batch` was appended (or answered as a duplicate): every hole of its producer
        up to its last sequence is filled, and any of an older epoch is moot."""
        if batch is None:
            return
        key = (stream, batch.producer_id)
        held = self._holes.get(key)
        if held is None:
            return
        epoch, seqs = held
        if batch.producer_epoch < epoch:
            return
        if batch.producer_epoch == epoch:
            left = tuple(s for s in seqs if sequence_before(batch.last_sequence, s))
        else:
            left = ()
        if left:
            self._holes[key] = (epoch, left)
        else:
            del self._holes[key]

    def observe(self, stream: int, batch: ProducerBatch | None, error_code: int) -> None:
        """An answer given for `batch`: success fills holes, a retriable error makes one."""
        if error_code == 0:
            self.delivered(stream, batch)
        elif error_code in DROP_CODES:
            self.dropped(stream, batch)

    def hole_before(self, stream: int, batch: ProducerBatch | None) -> int:
        """The newest hole of `batch`'s producer and epoch before its first sequence, -1 if
        none: what a hand-off tells the owner (if any hole lies in the owner's missing
        range, this one does)."""
        if batch is None:
            return -1
        held = self._holes.get((stream, batch.producer_id))
        if held is None or held[0] != batch.producer_epoch:
            return -1
        before = [s for s in held[1] if sequence_before(s, batch.first_sequence)]
        if not before:
            return -1
        return max(before, key=lambda s: (s - batch.first_sequence) % SEQUENCE_SPACE)

    def explains(self, stream: int, gap: SequenceGap | None) -> bool:
        """Whether the proxy dropped a batch starting inside the gap: then the gap is the
        proxy's, answered retriable; else the client made it (Kafka's 45)."""
        if gap is None:
            return False
        held = self._holes.get((stream, gap.producer_id))
        if held is None or held[0] != gap.producer_epoch:
            return False
        found = any(seq_within(s, gap.expected, gap.first_sequence) for s in held[1])
        if found:
            self.explained += 1
        return found
