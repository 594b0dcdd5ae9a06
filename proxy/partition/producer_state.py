"""Idempotent and transactional producer state of one partition, kept as Kafka's broker
keeps it.

Modelled on Kafka's ProducerStateEntry, BatchMetadata and ProducerAppendInfo
(storage/internals/log); see docs/sequencer.md. Per producer id: its epoch, when it was
last used, the metadata of its last 5 batches (KIP-98), enough to answer a retry of any
batch a producer can have in flight (max.in.flight.requests.per.connection <= 5), the
first offset of its open transaction and the coordinator epoch of its last marker.

Entries are immutable: an append makes new entries, which the sequencer applies only
when the append is committed. The snapshot codec is `producer_snapshot.py`.

Pure: no I/O, no asyncio.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from kio.schema.errors import ErrorCode

from proxy.apis.api61_describe_producers import DescribedProducer

NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
NO_SEQUENCE = -1
NO_TIMESTAMP = -1
NO_COORDINATOR_EPOCH = -1
NUM_BATCHES_TO_RETAIN = 5
INT32_MAX = (1 << 31) - 1
DEFAULT_PRODUCER_ID_EXPIRATION_MS = 86_400_000  # Kafka's producer.id.expiration.ms


def increment_sequence(sequence: int, increment: int) -> int:
    """`sequence + increment` in Kafka's sequence space, which wraps from INT32_MAX to 0."""
    return (sequence + increment) % (INT32_MAX + 1)


def decrement_sequence(sequence: int, decrement: int) -> int:
    return (sequence - decrement) % (INT32_MAX + 1)


def in_sequence(last_seq: int, next_seq: int) -> bool:
    return next_seq == last_seq + 1 or (next_seq == 0 and last_seq == INT32_MAX)


def sequence_before(seq: int, other: int) -> bool:
    """`seq` comes strictly before `other` in the wrapping sequence space (within half of
    it: a producer never has that many in flight)."""
    return 0 < (other - seq) % (INT32_MAX + 1) < (INT32_MAX + 1) // 2


@dataclass(frozen=True, slots=True)
class BatchMetadata:
    """One appended batch of a producer, as Kafka's BatchMetadata."""

    last_seq: int
    last_offset: int
    offset_delta: int  # last offset - first offset
    timestamp: int  # the batch's max timestamp as written (the append time on LogAppendTime)

    @property
    def first_seq(self) -> int:
        return decrement_sequence(self.last_seq, self.offset_delta)

    @property
    def first_offset(self) -> int:
        return self.last_offset - self.offset_delta


@dataclass(frozen=True, slots=True)
class ProducerStateEntry:
    """What a partition knows of one producer id. `batches` is oldest first, at most 5,
    all of `producer_epoch`. `last_timestamp` is when it was last used (for expiration).
    `current_txn_first_offset`: the first offset of its open transaction in this
    partition, None if none is open; `coordinator_epoch`: that of its last marker.
    `written_timestamp`: the timestamp of what it last wrote (the max timestamp of its
    last batch, or its last marker's), which Kafka keeps as the entry's lastTimestamp and
    DescribeProducers shows; None when not known (restored from a snapshot, which does not
    hold it: `described` then takes the last batch's). Not compared: it only describes.
    `history_cut`: seeded from the tail of Kafka's log at the cutover with fewer batches
    than Kafka's state may hold of it (`carried.py`): its older batches, which Kafka would
    still answer a retry of, are not known here (`older_retry`). Not compared, not in the
    snapshot (Kafka's own keeps one batch a producer); moot after an epoch change (a new
    epoch starts at sequence 0: nothing comes before it)."""

    producer_id: int
    producer_epoch: int
    last_timestamp: int
    batches: tuple[BatchMetadata, ...] = ()
    coordinator_epoch: int = NO_COORDINATOR_EPOCH
    current_txn_first_offset: int | None = None
    written_timestamp: int | None = field(default=None, compare=False)
    history_cut: bool = field(default=False, compare=False)

    @property
    def last_seq(self) -> int:
        return self.batches[-1].last_seq if self.batches else NO_SEQUENCE

    def described(self) -> DescribedProducer:
        """This producer as Kafka's DescribeProducers answers it."""
        written = self.written_timestamp
        if written is None:
            written = self.batches[-1].timestamp if self.batches else NO_TIMESTAMP
        first = self.current_txn_first_offset
        return DescribedProducer(
            self.producer_id,
            self.producer_epoch,
            self.last_seq,
            written,
            self.coordinator_epoch,
            -1 if first is None else first,
        )

    def find_duplicate(
        self, producer_epoch: int, first_seq: int, last_seq: int
    ) -> BatchMetadata | None:
        """The retained batch with exactly this epoch and sequence range: a retry."""
        if producer_epoch != self.producer_epoch:
            return None
        for batch in self.batches:
            if batch.last_seq == last_seq and batch.first_seq == first_seq:
                return batch
        return None

    def older_retry(self, producer_epoch: int, first_seq: int, last_seq: int) -> bool:
        """Whether a batch of this epoch, `first_seq` to `last_seq`, comes before every
        batch known here, for a producer whose older batches were cut (`history_cut`)
        while fewer than Kafka's 5 are known. Kafka appends a producer's batches in
        sequence order, so such a batch was appended before the cutover: a retry whose
        answer was lost, which Kafka would answer from its state (its cached offset) and
        this state cannot, so it is answered DUPLICATE_SEQUENCE_NUMBER, which the clients
        take as success (a duplicate of a batch written before; no offset). Compared in
        the wrapping sequence space; the next batch in sequence never counts (its last
        sequence may wrap past 0)."""
        if not self.history_cut or producer_epoch != self.producer_epoch:
            return False
        if not self.batches or len(self.batches) >= NUM_BATCHES_TO_RETAIN:
            return False
        if in_sequence(self.last_seq, first_seq):
            return False
        return sequence_before(last_seq, self.batches[0].first_seq)

    def with_batch(
        self, producer_epoch: int, batch: BatchMetadata, now_ms: int, transactional: bool = False
    ) -> ProducerStateEntry:
        """This entry after the data `batch`: a new epoch forgets the old epoch's batches.
        A transactional batch opens a transaction unless one is open (Kafka's
        appendDataBatch: an epoch bump alone does not end it, only a marker does)."""
        kept = self.batches if producer_epoch == self.producer_epoch else ()
        first = self.current_txn_first_offset
        if first is None and transactional:
            first = batch.first_offset
        return replace(
            self,
            producer_epoch=producer_epoch,
            last_timestamp=now_ms,
            batches=(*kept, batch)[-NUM_BATCHES_TO_RETAIN:],
            current_txn_first_offset=first,
            written_timestamp=batch.timestamp,
        )

    def with_marker(
        self,
        producer_epoch: int,
        coordinator_epoch: int | None,
        now_ms: int,
        marker_timestamp: int | None = None,
    ) -> ProducerStateEntry:
        """This entry after a transaction marker (Kafka's ProducerStateEntry.update): the
        transaction is over; a new epoch forgets the old epoch's batches.
        `coordinator_epoch` None keeps the known one (a replayed marker: its header does
        not carry it). `marker_timestamp`: the marker's own (None: `now_ms`)."""
        kept = self.batches if producer_epoch == self.producer_epoch else ()
        coordinator = self.coordinator_epoch if coordinator_epoch is None else coordinator_epoch
        return replace(
            self,
            producer_epoch=producer_epoch,
            last_timestamp=now_ms,
            batches=kept,
            coordinator_epoch=coordinator,
            current_txn_first_offset=None,
            written_timestamp=now_ms if marker_timestamp is None else marker_timestamp,
        )


def empty_entry(producer_id: int) -> ProducerStateEntry:
    """A producer id the partition has no state for (Kafka's ProducerStateEntry.empty)."""
    return ProducerStateEntry(producer_id, NO_PRODUCER_EPOCH, NO_TIMESTAMP)


def check_append(
    entry: ProducerStateEntry, producer_epoch: int, first_seq: int
) -> tuple[ErrorCode, str] | None:
    """Kafka's checkProducerEpoch and checkSequence for a client batch that is not a
    duplicate: None if it may be appended, else the error code and why.

    A producer id with no state (`empty_entry`) is accepted at any sequence, as Kafka has
    done since 2.5 (KIP-360, KAFKA-8710): its state may have expired or been lost. One
    known with no batch of its epoch (seen only in a marker) starts at 0, as in Kafka: a
    transaction carried across the cutover has its batches in the stream's seeded state
    (carried.py), so its next one goes on from their sequence.
    """
    pid = entry.producer_id
    if producer_epoch < entry.producer_epoch:
        return ErrorCode.invalid_producer_epoch, (
            f"epoch {producer_epoch} of producer {pid} is smaller than the last seen "
            f"epoch {entry.producer_epoch}"
        )
    if producer_epoch != entry.producer_epoch:
        if first_seq != 0 and entry.producer_epoch != NO_PRODUCER_EPOCH:
            return ErrorCode.out_of_order_sequence_number, (
                f"invalid sequence number for new epoch {producer_epoch} of producer {pid}: "
                f"{first_seq} (a new epoch starts at 0), {entry.producer_epoch} (current epoch)"
            )
        return None
    if entry.producer_epoch == NO_PRODUCER_EPOCH or in_sequence(entry.last_seq, first_seq):
        return None
    return ErrorCode.out_of_order_sequence_number, (
        f"out of order sequence number for producer {pid}: {first_seq} (incoming seq. "
        f"number), {entry.last_seq} (current end sequence number)"
    )


def check_transaction(
    entry: ProducerStateEntry, transactional: bool
) -> tuple[ErrorCode, str] | None:
    """Kafka's appendDataBatch check, after the epoch and sequence ones: a producer with a
    transaction open here may only write transactional batches until its marker."""
    first = entry.current_txn_first_offset
    if first is not None and not transactional:
        return ErrorCode.invalid_txn_state, (
            f"expected a transactional write from producer {entry.producer_id}: its "
            f"transaction open since offset {first} has not ended"
        )
    return None


def check_marker(
    entry: ProducerStateEntry, producer_epoch: int, coordinator_epoch: int
) -> tuple[ErrorCode, str] | None:
    """Kafka's appendEndTxnMarker checks (checkProducerEpoch, checkCoordinatorEpoch):
    None if the marker may be appended, else the code Kafka's leader would raise."""
    pid = entry.producer_id
    if producer_epoch < entry.producer_epoch:
        return ErrorCode.invalid_producer_epoch, (
            f"marker epoch {producer_epoch} of producer {pid} is smaller than the last seen "
            f"epoch {entry.producer_epoch}"
        )
    if entry.coordinator_epoch > coordinator_epoch:
        return ErrorCode.transaction_coordinator_fenced, (
            f"invalid coordinator epoch for producer {pid}: {coordinator_epoch} (zombie), "
            f"{entry.coordinator_epoch} (current)"
        )
    return None
