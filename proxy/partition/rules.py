"""The pure half of a tiered partition's owner (`partition.py`): its answers, its
settings, and how its sequencer is rebuilt (docs/sequencer.md). No I/O, no asyncio.

**Rebuilding: which source wins where.** A new owner, or the same owner after a restart,
has three sources for a stream:

- the metadata: the committed end E (`MetadataState.stream_end`: every offset below it is
  in objects) and the producer snapshot, whose state covers every batch below its offset
  S (none: S is where the proxy's offsets start, max(cutover, log start));
- the objects, which hold the batches below E;
- this proxy's WAL, which holds its entries not yet trimmed: a suffix of the stream's
  batches, some below E (committed, not trimmed yet), the rest from E on (acknowledged,
  not committed: nothing else has them).

1. Below S the snapshot is the producer state; no batch there is read.
2. Below E the metadata is the log. The WAL's batches there are the bytes the objects were
   built from, so they stand in for the objects when replaying [S, E); objects are read
   only for the part the WAL no longer holds (`missing_committed`). They never move the
   log end.
3. From E on the WAL alone is the log: its batches must continue E without a gap; the log
   end (and high watermark) is the end of the last one. A batch straddling E, or any gap
   from S on, is a RecoveryError: offsets would be handed out twice or acknowledged data
   skipped.

**A log start inside a batch.** DeleteRecords may move the log start L to any offset up
to the high watermark, in the middle of a batch too (Kafka Streams purges its
repartition topics after every commit). Kafka keeps such a batch whole in its segment,
and with it its producer's last sequence. So with S = L above the cutover (no snapshot,
or the one written with the trim to L, which keeps that batch's producer with its
batches that end below L only), the first batch from S on may begin below S: it is
replayed whole and the rebuild goes on from its end. The cutover is a batch boundary, so
a batch straddling it is still a RecoveryError.

**Holes a log cleaner left** (docs/tiering.md, "Compacted topics"). The objects of a
compacted stream hold offsets with no batch, where a cleaner dropped batches. The
objects are read back block by block (`CommittedBlock`): a hole between batches is taken
only inside blocks whose index entry counts fewer records than offsets, which is how a
cleaner's block declares its holes (ours; Kafka's, in a migrated compacted topic's
segments; an object compaction adds the counts up). A block the produce path wrote
counts one record per offset (`appends.py` refuses any other batch), so a hole there,
and a block whose batches do not hold the records its index counts, is damage: a
RecoveryError, as on any other topic. The WAL never has holes.

**A transaction carried across the cutover** (`carried.py`). With no snapshot and S the
cutover, the state at S is not empty when a transaction was open in Kafka's log at the
cutover (`RecoveryPoint.carried_from`: the last stable offset the cutover recorded): the
producers open there, read from Kafka's log [carried_from, cutover), seed the sequencer
before the replay from S. A snapshot holds them once one is written past the cutover;
a log start above the cutover with no snapshot has no such seed (the batches between the
cutover and the log start, which could hold their markers, are gone).

**Idempotent producers across the cutover** (`carried.py`, `producers_at_cutover`). A
rebuild with no snapshot and S the cutover within SEED_FOR_MS of the cutover
(`RecoveryPoint.seeds_from_kafka`) seeds the sequencer with every producer of the recent
tail of Kafka's log below the cutover, read from at most `carried_from` when a
transaction was open there: a batch Kafka appended and the producer sends again after the
cutover is a duplicate, a gap after it is 45, as Kafka answers. Past SEED_FOR_MS no
producer can still be retrying a batch from before the cutover (every client gives a
batch up within minutes: `delivery.timeout.ms`, 2 min by default; librdkafka's
`message.timeout.ms`, 5 min), and a later rebuild does not read Kafka for them.

Assumption: the WAL's entries of the stream were written under the ownership the
metadata continues (a restart of the same owner, or a new owner whose WAL holds none).
A proxy that gives a shard up uploads and trims its streams' entries first: batches carry
no owner epoch to tell a stale entry from a live one.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from kio.schema.errors import ErrorCode

from proxy.metadata.state import MetadataState
from proxy.partition.producer_snapshot import CorruptSnapshotError, read_snapshot
from proxy.partition.producer_state import (
    DEFAULT_PRODUCER_ID_EXPIRATION_MS,
    ProducerStateEntry,
)
from proxy.partition.sequence_holes import ProducerBatch, SequenceGap, SequenceHoles
from proxy.partition.sequencer import AppendResult, PartitionSequencer, Rejected
from proxy.records.batches import BatchHeader, CorruptBatchError, iter_batches, validate_header

# A rebuild this long after the cutover reads no producers from Kafka's log: every client
# has given up a batch from before the cutover by then (module docstring).
SEED_FOR_MS = 15 * 60 * 1000

__all__ = [
    "CommittedBlock",
    "PartitionConfig",
    "ProduceResult",
    "RecoveryError",
    "RecoveryPoint",
    "entry_batches",
    "missing_committed",
    "not_owner",
    "rebuild_sequencer",
    "refusal",
    "sequence",
    "storage_error",
]


@dataclass(frozen=True, slots=True)
class ProduceResult:
    """One partition's part of a Produce response (Kafka's PartitionProduceResponse)."""

    error_code: int
    base_offset: int = -1
    log_append_time_ms: int = -1
    log_start_offset: int = -1
    error_message: str | None = None
    # the owner took the batch by reference: ordered from its header, durable as a WAL
    # reference entry, its bytes still only in the S3-WAL object the sender holds until
    # the owner releases it (docs/wal.md, "The owner answering from the notification")
    referenced: bool = False


def storage_error(message: str) -> ProduceResult:
    """The answer while the WAL write failed or the partition is fenced (retriable)."""
    return ProduceResult(int(ErrorCode.kafka_storage_error), error_message=message)


def not_owner(stream_id: int) -> ProduceResult:
    """Not (or no longer) the owner: NOT_LEADER_OR_FOLLOWER makes the client refresh metadata."""
    return ProduceResult(
        ErrorCode.not_leader_or_follower, error_message=f"stream {stream_id} is not owned here"
    )


@dataclass(frozen=True, slots=True)
class PartitionConfig:
    """Queue bounds and the sequencer's topic settings. Errors name the key."""

    queue_size: int = 128  # requests waiting to be sequenced; more wait in produce()
    max_in_flight: int = 128  # WAL appends not yet durable
    expire_interval_ms: int = 60_000  # how often idle producer ids are looked for
    log_append_time: bool = False  # the topic's message.timestamp.type
    producer_id_expiration_ms: int = DEFAULT_PRODUCER_ID_EXPIRATION_MS

    def __post_init__(self) -> None:
        for key in ("queue_size", "max_in_flight", "expire_interval_ms"):
            value = getattr(self, key)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"partition config error at {key}: {value!r} is not positive")


def refusal(rejected: Rejected, stream_id: int, holes: SequenceHoles | None) -> ProduceResult:
    """The answer to a batch the sequencer refused: Kafka's code, except for a sequence gap
    (OUT_OF_ORDER_SEQUENCE_NUMBER) that a batch this proxy dropped explains
    (`SequenceHoles.explains`): NOT_LEADER_OR_FOLLOWER. The gap is then the proxy's (a
    failed S3-WAL PUT, an unreachable owner, a partition not started yet or closing), not
    the client's: 45 would make librdkafka bump its epoch and renumber batches it only knows
    as "possibly persisted", which would be written twice; NOT_LEADER_OR_FOLLOWER makes it
    resend in order with the same sequences (docs/sequencer.md, "Gaps the proxy made")."""
    code = rejected.error_code
    if code == ErrorCode.out_of_order_sequence_number and holes is not None:
        if holes.explains(stream_id, rejected.gap):
            return ProduceResult(
                ErrorCode.not_leader_or_follower,
                error_message=f"stream {stream_id}: a batch before this one was not appended "
                f"({rejected.message}): resend from the oldest batch not answered",
            )
    return ProduceResult(int(code), error_message=rejected.message)


def sequence(
    sequencer: PartitionSequencer,
    records: bytes | bytearray | memoryview,
    now_ms: int,
    holes: SequenceHoles | None,
    stream_id: int,
    *,
    header_only: bool = False,
) -> AppendResult:
    """`sequencer.append`, except for a producer the partition has no state for whose
    earlier batch this proxy dropped: Kafka accepts an unknown producer at any sequence
    (KIP-360), which would take this batch past the dropped one and answer its retry 45.
    It is refused as a gap from the dropped batch instead, which `refusal` answers
    NOT_LEADER_OR_FOLLOWER."""
    if holes is not None and len(holes):
        batch = ProducerBatch.of(records, header_only=header_only)
        if batch is not None and sequencer.producer_state(batch.producer_id) is None:
            hole = holes.hole_before(stream_id, batch)
            if hole >= 0:
                gap = SequenceGap(
                    batch.producer_id, batch.producer_epoch, hole, batch.first_sequence
                )
                return Rejected(
                    ErrorCode.out_of_order_sequence_number,
                    f"producer {batch.producer_id} is not known here and its batch at "
                    f"{hole} was not appended: {batch.first_sequence} would leave a gap",
                    gap,
                )
    return sequencer.append(records, now_ms, header_only=header_only)


@dataclass(frozen=True, slots=True)
class CommittedBlock:
    """One object block read back for a rebuild (`partition/committed.py`): the offsets
    [start, end) and the record count its index entry records, and its batch headers."""

    start: int
    end: int
    record_count: int
    headers: tuple[BatchHeader, ...]

    @property
    def declares_holes(self) -> bool:
        """Fewer records than offsets: a log cleaner wrote it (module docstring)."""
        return self.record_count < self.end - self.start


class RecoveryError(Exception):
    """The sources disagree or do not cover what the rebuild needs: do not serve the
    partition (offsets could be handed out twice)."""


@dataclass(frozen=True, slots=True)
class RecoveryPoint:
    """What the metadata says of a stream, for the rebuild."""

    stream_id: int
    log_start_offset: int
    committed_end: int  # E: every offset below is in objects
    state_offset: int  # S: the producer state (snapshot) covers every batch below
    snapshot: bytes | None  # PartitionSequencer.snapshot() bytes, or None: empty at S
    cutover_offset: int = 0
    cutover_stable_offset: int | None = None  # Kafka's LSO at the cutover; None: the cutover
    tiered_at_ms: int = 0  # when the cutover was written

    @property
    def carried_from(self) -> int | None:
        """Where Kafka's log holds the transactions open at the cutover that this rebuild
        seeds the sequencer with (module docstring): the last stable offset the cutover
        recorded, when below the cutover and the state starts at the cutover with no
        snapshot; else None (nothing to read)."""
        lso = self.cutover_stable_offset
        if lso is None or lso >= self.cutover_offset or self.snapshot is not None:
            return None
        return lso if self.state_offset == self.cutover_offset else None

    @property
    def starts_from_cutover(self) -> bool:
        """The producer state starts at the cutover with no snapshot, and Kafka's log holds
        offsets below it: Kafka's producer state there is what the stream goes on from."""
        return (
            self.snapshot is None
            and self.state_offset == self.cutover_offset
            and self.log_start_offset < self.cutover_offset
        )

    def seeds_from_kafka(self, now_ms: int) -> bool:
        """Whether the rebuild reads the producers of Kafka's log tail below the cutover
        (module docstring): it starts from the cutover, and either a transaction was open
        there (`carried_from`) or the cutover is less than SEED_FOR_MS old."""
        if not self.starts_from_cutover:
            return False
        return self.carried_from is not None or self.seeds_idempotent(now_ms)

    def seeds_idempotent(self, now_ms: int) -> bool:
        """Whether the producers with no transaction open at the cutover are seeded too:
        the cutover is less than SEED_FOR_MS old (module docstring). Past it only the
        transactions open there are carried: an idempotent producer of the tail would be
        one Kafka may have expired since, whose next batch it takes at any sequence."""
        return now_ms - self.tiered_at_ms < SEED_FOR_MS

    @property
    def starts_at_log_start(self) -> bool:
        """S is a log start above the cutover (with no snapshot, or the one written with
        the trim that put the log start there): DeleteRecords may have put it inside a
        batch, which the rebuild then replays whole (module docstring)."""
        return self.state_offset == self.log_start_offset > self.cutover_offset

    @classmethod
    def from_metadata(cls, state: MetadataState, stream: int) -> RecoveryPoint:
        info = state.stream(stream)
        if info is None:
            raise RecoveryError(f"stream {stream} is not tiered in shard {state.shard}")
        snapshot = state.producer_snapshot(stream)
        if snapshot is not None:
            offset, data = snapshot.offset, bytes(snapshot.state)
        else:
            offset, data = max(info.cutover_offset, info.log_start_offset), None
        if offset > info.end_offset:
            raise RecoveryError(
                f"stream {stream}: producer state at {offset} is past the committed end "
                f"{info.end_offset}"
            )
        return cls(
            stream,
            info.log_start_offset,
            info.end_offset,
            offset,
            data,
            info.cutover_offset,
            info.cutover_stable_offset,
            info.tiered_at_ms,
        )


def entry_batches(
    stream: int, base_offset: int, batch: bytes | memoryview, *, header_only: bool = False
) -> list[BatchHeader]:
    """The batch headers of one WAL entry, checked against the entry's base offset.
    `header_only`: a reference entry's, one batch's header (partition/referenced.py)."""
    try:
        if header_only:
            headers = [validate_header(batch)]
        else:
            headers = [header for header, _ in iter_batches(batch)]
    except CorruptBatchError as exc:
        raise RecoveryError(f"stream {stream}: WAL entry at offset {base_offset}: {exc}") from exc
    if not headers or headers[0].base_offset != base_offset:
        first = headers[0].base_offset if headers else None
        raise RecoveryError(
            f"stream {stream}: WAL entry says base offset {base_offset}, its batch {first}"
        )
    return headers


def missing_committed(
    point: RecoveryPoint, wal_batches: Sequence[BatchHeader]
) -> tuple[int, int] | None:
    """The committed offsets [start, end) that the producer state needs and the WAL no
    longer holds: read their batch headers from the objects. None if the WAL suffices."""
    first = next((h.base_offset for h in wal_batches if h.next_offset > point.state_offset), None)
    end = point.committed_end if first is None else min(first, point.committed_end)
    return (point.state_offset, end) if point.state_offset < end else None


def rebuild_sequencer(
    point: RecoveryPoint,
    committed: Iterable[CommittedBlock] | None,
    wal_batches: Sequence[BatchHeader],
    now_ms: int,
    config: PartitionConfig,
    carried: Iterable[ProducerStateEntry] = (),
) -> PartitionSequencer:
    """The sequencer at the stream's log end: the snapshot (or, with none, the state at S:
    empty, or `carried`: Kafka's producers at the cutover, read from the tail of its log
    below it, transactions open there included: `point.seeds_from_kafka`), then
    every batch from S on, from `committed` (the object blocks read for
    `missing_committed`, in order; None: not read) and then `wal_batches` (this stream's
    WAL batches in order), each offset taken once. A batch straddling a log start S is
    replayed whole; a hole between batches is taken only where the blocks declare one
    (module docstring).
    Producers count as used at `now_ms`, so each gets a full expiration period."""
    stream, end = point.stream_id, point.committed_end
    options = {
        "log_append_time": config.log_append_time,
        "producer_id_expiration_ms": config.producer_id_expiration_ms,
    }
    blocks = None if committed is None else list(committed)
    headers_read = [] if blocks is None else _checked_headers(stream, blocks)
    expected = point.state_offset
    if point.starts_at_log_start:
        first = _first_batch_from(expected, end, headers_read, wal_batches)
        if first is not None and first.base_offset < expected:
            expected = first.base_offset  # the batch holding the log start: kept whole
    carried = list(carried)
    if carried and not point.starts_from_cutover:
        raise ValueError("producers carried across the cutover, for a rebuild that takes none")
    if point.snapshot is None:
        sequencer = PartitionSequencer(expected, carried, **options)
    else:
        try:
            covered = read_snapshot(point.snapshot).offset
            sequencer = PartitionSequencer.restore(
                point.snapshot, point.state_offset, replay_from=expected, **options
            )
        except (CorruptSnapshotError, ValueError) as exc:
            raise RecoveryError(f"stream {stream}: producer snapshot: {exc}") from exc
        if covered != point.state_offset:
            raise RecoveryError(
                f"stream {stream}: the snapshot record says offset {point.state_offset}, its "
                f"state covers offsets below {covered}"
            )
    gap = missing_committed(point, wal_batches) if blocks is None else None
    if gap is not None:
        raise RecoveryError(
            f"stream {stream}: the producer state needs committed offsets [{gap[0]}, {gap[1]}) "
            f"that the WAL no longer holds: read them from the objects (read_committed)"
        )
    for source, headers in (("objects", headers_read), ("WAL", wal_batches)):
        for header in headers:
            if source == "objects" and header.base_offset >= end:
                break  # nothing is committed there: the WAL is the source
            if header.next_offset <= expected:
                continue  # below the snapshot, or replayed from the objects already
            if header.base_offset < end < header.next_offset:
                raise RecoveryError(
                    f"stream {stream}: {source} batch at offsets {header.base_offset}.."
                    f"{header.last_offset} straddles the committed end {end}"
                )
            if header.base_offset != expected and not (
                source == "objects"
                and header.base_offset > expected
                and _holes_declared(blocks or [], expected, header.base_offset)
            ):
                raise RecoveryError(
                    f"stream {stream}: offsets [{expected}, {header.base_offset}) are missing "
                    f"before the {source} batch at {header.base_offset} (committed end {end})"
                )
            sequencer.replay(header, now_ms)
            expected = header.next_offset
    if expected < end:
        raise RecoveryError(
            f"stream {stream}: committed offsets [{expected}, {end}) are neither in the WAL "
            f"nor in what was read from the objects"
        )
    return sequencer


def _checked_headers(stream: int, blocks: Sequence[CommittedBlock]) -> list[BatchHeader]:
    """The blocks' batch headers in order, each block's checked against its index entry:
    its batches inside its offsets, holding the records it counts."""
    out: list[BatchHeader] = []
    for block in blocks:
        where = f"stream {stream}: the object block at offsets [{block.start}, {block.end})"
        held = sum(h.record_count for h in block.headers)
        if held != block.record_count:
            raise RecoveryError(
                f"{where} holds {held} records, its index counts {block.record_count}"
            )
        for header in block.headers:
            if header.base_offset < block.start or header.next_offset > block.end:
                raise RecoveryError(
                    f"{where} holds a batch at offsets {header.base_offset}..{header.last_offset}"
                )
        out += block.headers
    return out


def _holes_declared(blocks: Sequence[CommittedBlock], start: int, end: int) -> bool:
    """Whether the blocks read cover [start, end) and each one there declares holes."""
    at = bisect.bisect_right(blocks, start, key=lambda b: b.start) - 1
    offset = start
    for block in blocks[max(at, 0) :]:
        if block.start > offset or not block.declares_holes:
            return False
        offset = block.end
        if offset >= end:
            return True
    return False


def _first_batch_from(
    offset: int, end: int, committed: Iterable[BatchHeader], wal_batches: Iterable[BatchHeader]
) -> BatchHeader | None:
    """The first batch the rebuild would replay from `offset`: the objects' (below the
    committed end `end`), else the WAL's."""
    for header in committed:
        if header.base_offset >= end:
            break
        if header.next_offset > offset:
            return header
    return next((h for h in wal_batches if h.next_offset > offset), None)
