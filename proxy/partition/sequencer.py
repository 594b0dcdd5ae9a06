"""The sequencer of one tiered partition: checks produced batches, assigns their offsets.

What Kafka's broker does when it appends a client's records to a leader partition
(UnifiedLog.append, LogValidator, ProducerStateManager), for the proxy that owns the
partition. Pure: no I/O, no asyncio; one owner task calls it, so it takes no locks.
Rules, error codes and the snapshot format: docs/sequencer.md.

`append(records, now_ms)` takes one partition's `records` of a Produce request (one or
more v2 batches) and returns a `PendingAppend` (one copy of the run with offsets
assigned, the answer's offsets, the producer-state changes), a `Duplicate` (every batch
is a retry of one of its producer's last 5: answer with the original offsets, write
nothing) or `Rejected` (an error code; nothing changed: all or nothing per partition).

**Why appends are pending until committed.** Offsets are assigned before the WAL write
and acknowledged after it. The owner task may append request N+1 while N's write is in
flight, so one group commit covers both: N+1 is checked against the state N leaves and
takes the offsets after N's. `commit(pending)` applies an append once its write is
durable, oldest first (the WAL makes writes durable in queue order); `high_watermark`
is the end of what was committed, `log_end_offset` the next offset to assign.

`abort(pending)` is for a write that failed or whose fate is unknown (a failed fsync, an
append cancelled once queued): its bytes may be on disk with its offsets. Handing those
offsets to the next batch could give two batches one offset; keeping the offsets but
forgetting the batch lets the producer's retry be written twice; recording it as written
would answer a retry with offsets that may not exist. No choice is safe while the log's
content is unknown, so abort **fences** the sequencer, as Kafka takes a log directory
offline after an I/O error: pending appends are dropped, later appends and commits get
KAFKA_STORAGE_ERROR (retriable: clients refresh metadata and find the new owner), and a
new owner rebuilds from durable data (`restore` + `replay`), which settles whether the
batch exists. A retry of a batch still pending is a `Duplicate` whose `awaiting` is that
append: answer once it commits (Kafka holds such an answer in purgatory until the high
watermark passes it), with its error if it is aborted.

`snapshot()` / `restore(data, log_end_offset)` and `replay(header)` rebuild the state on
a new owner; `expire(now_ms)` drops producer ids unused for `producer_id_expiration_ms`
and no transaction open.

**Transactions** (docs/sequencer.md, "Transactions"). Transactional batches follow
Kafka's ProducerAppendInfo: the first one of a producer opens its transaction here (its
first offset), later ones must stay transactional until the marker (INVALID_TXN_STATE).
`append_marker(marker, now_ms)` appends a transaction marker the owner found in Kafka's
log of the partition as a control batch at the next offset, pending like any append; a
marker Kafka's leader would refuse is skipped (Rejected: no offset), and the follow
position (`marker_position`) still moves past it once what is pending before it commits.
`last_stable_offset` is the first offset of the oldest open transaction, at most the
high watermark.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping
from types import MappingProxyType

from kio.schema.errors import ErrorCode

from proxy.partition.appends import (
    AppendResult,
    CompletedTxn,
    Duplicate,
    PendingAppend,
    Rejected,
    duplicate_answer,
    sequence_gap,
    stamp_log_append_time,
    validate_records,
    validate_referenced,
)
from proxy.partition.marker_follow import MarkerFollow, MarkerIdentity, markers_end
from proxy.partition.producer_snapshot import encode_snapshot, read_snapshot
from proxy.partition.producer_state import (
    DEFAULT_PRODUCER_ID_EXPIRATION_MS,
    NO_TIMESTAMP,
    BatchMetadata,
    ProducerStateEntry,
    check_append,
    check_marker,
    check_transaction,
    empty_entry,
    increment_sequence,
)
from proxy.records.batches import (
    BatchHeader,
    assign_offsets,
    read_batch_header,
    set_base_offset,
    set_log_append_time,
)
from proxy.records.markers import Marker, marker_batch

__all__ = [
    "AppendResult",
    "CompletedTxn",
    "Duplicate",
    "MarkerIdentity",
    "PartitionSequencer",
    "PendingAppend",
    "Rejected",
]


class PartitionSequencer:
    """Offsets and idempotent-producer state of one partition; see the module docstring."""

    def __init__(
        self,
        log_end_offset: int,
        producer_states: Iterable[ProducerStateEntry] = (),
        *,
        log_append_time: bool = False,
        producer_id_expiration_ms: int = DEFAULT_PRODUCER_ID_EXPIRATION_MS,
    ) -> None:
        if log_end_offset < 0:
            raise ValueError(f"log_end_offset must be >= 0, not {log_end_offset}")
        if producer_id_expiration_ms <= 0:
            raise ValueError(
                f"producer_id_expiration_ms must be > 0, not {producer_id_expiration_ms}"
            )
        self.log_append_time = log_append_time  # the topic's message.timestamp.type
        self.producer_id_expiration_ms = producer_id_expiration_ms
        self._producers: dict[int, ProducerStateEntry] = {}
        # producer id -> first offset of its open transaction (committed state): the LSO
        # is its least value, read by every read_committed fetch, so it is kept, not scanned
        self._open: dict[int, int] = {}
        for entry in producer_states:
            self._set(entry.producer_id, entry)
        self._high_watermark = log_end_offset  # end of the committed appends
        self._state_end = log_end_offset  # the committed producer state covers offsets below
        self._log_end = log_end_offset  # the next offset to assign
        self._pending: deque[PendingAppend] = deque()
        self._pending_states: dict[int, ProducerStateEntry] = {}  # newest per producer
        self._fenced = False
        self._markers = MarkerFollow()  # the marker follower's position, replayed markers

    @property
    def high_watermark(self) -> int:
        return self._high_watermark

    @property
    def log_end_offset(self) -> int:
        return self._log_end

    @property
    def producer_state_end(self) -> int:
        """The committed producer state covers every batch below this offset."""
        return self._state_end

    @property
    def producer_states(self) -> Mapping[int, ProducerStateEntry]:
        """The committed state, by producer id (read-only)."""
        return MappingProxyType(self._producers)

    @property
    def last_stable_offset(self) -> int:
        """Kafka's LSO: the first offset of the oldest open transaction (committed state),
        at most the high watermark. read_committed consumers read below it."""
        return min(self._open.values(), default=self._high_watermark)

    @property
    def open_transactions(self) -> Mapping[int, int]:
        """Producer id -> first offset of its open transaction (committed state)."""
        return MappingProxyType(self._open)

    @property
    def marker_position(self) -> int | None:
        """The next offset of Kafka's log of the partition the marker follower has to
        consider, as of the committed state (None: the cutover, nothing considered yet)."""
        return self._markers.position

    @property
    def replayed_markers(self) -> tuple[MarkerIdentity, ...]:
        """The identities of the control batches `replay` saw since the sequencer was
        built or restored, in order, until a live marker moves `marker_position`: the
        markers already in the stream past `marker_position` (the resume rule)."""
        return tuple(identity for _, identity in self._markers.replayed)

    @property
    def pending(self) -> tuple[PendingAppend, ...]:
        return tuple(self._pending)

    @property
    def fenced(self) -> bool:
        return self._fenced

    def producer_state(self, producer_id: int) -> ProducerStateEntry | None:
        """What the next append is checked against: pending changes included."""
        entry = self._pending_states.get(producer_id)
        return entry if entry is not None else self._producers.get(producer_id)

    def append(
        self, records: bytes | bytearray | memoryview, now_ms: int, *, header_only: bool = False
    ) -> AppendResult:
        """Check and sequence one partition's `records`; see the module docstring.
        `header_only`: `records` is the first HEADER_SIZE bytes of one batch whose bytes
        are elsewhere (an S3-WAL object); sequenced the same, and the pending append holds
        that header with its offsets assigned. Not on a LogAppendTime topic (stamping
        changes bytes the batch CRC covers)."""
        if self._fenced:
            return Rejected(
                ErrorCode.kafka_storage_error,
                "the partition's sequencer was fenced after a failed write",
            )
        self._check_replayed()
        if header_only and self.log_append_time:
            raise ValueError("a batch known by its header only cannot take LogAppendTime")
        headers = validate_referenced(records) if header_only else validate_records(records)
        if isinstance(headers, Rejected):
            return headers
        changes: dict[int, ProducerStateEntry] = {}
        duplicates: list[BatchMetadata] = []
        next_offset = self._log_end
        for header in headers:
            if header.producer_id >= 0:
                pid, epoch = header.producer_id, header.producer_epoch
                first_seq = header.base_sequence
                entry = changes.get(pid) or self.producer_state(pid) or empty_entry(pid)
                last_seq = increment_sequence(first_seq, header.last_offset_delta)
                duplicate = entry.find_duplicate(epoch, first_seq, last_seq)
                if duplicate is not None:
                    duplicates.append(duplicate)
                    continue
                if entry.older_retry(epoch, first_seq, last_seq):
                    return Rejected(
                        ErrorCode.duplicate_sequence_number,
                        f"batch {first_seq}..{last_seq} of producer {pid} comes before its "
                        f"batches known here (from {entry.batches[0].first_seq}): written "
                        "before the cutover, its offset not known",
                    )
                refusal = check_append(entry, epoch, first_seq)
                if refusal is not None:
                    return Rejected(*refusal, sequence_gap(entry, epoch, first_seq, refusal[0]))
                refusal = check_transaction(entry, header.is_transactional)
                if refusal is not None:
                    return Rejected(*refusal)
                delta = header.last_offset_delta
                timestamp = now_ms if self.log_append_time else header.max_timestamp
                batch = BatchMetadata(last_seq, next_offset + delta, delta, timestamp)
                changes[pid] = entry.with_batch(epoch, batch, now_ms, header.is_transactional)
            next_offset += header.last_offset_delta + 1
        if duplicates:
            return duplicate_answer(
                duplicates, len(headers), self._pending, self._high_watermark, self.log_append_time
            )
        out = bytearray(records)  # the one copy of the run
        if header_only:
            set_base_offset(out, 0, self._log_end)
        else:
            assign_offsets(out, self._log_end)
        append_time = NO_TIMESTAMP
        if self.log_append_time:
            stamp_log_append_time(out, headers, now_ms)
            append_time = now_ms
        pending = PendingAppend(out, self._log_end, next_offset - 1, append_time, changes)
        self._pending.append(pending)
        self._pending_states.update(changes)
        self._log_end = next_offset
        return pending

    def append_marker(self, marker: Marker, now_ms: int) -> PendingAppend | Rejected:
        """Append `marker` (found in Kafka's log of the partition) as a control batch at
        the next offset, ending its producer's transaction here. Rejected: fenced
        (KAFKA_STORAGE_ERROR, nothing moves), or a marker Kafka's leader would refuse
        (INVALID_PRODUCER_EPOCH, TRANSACTION_COORDINATOR_FENCED) or one already
        considered (below `marker_position`): skipped, no offset, and the marker position
        moves past it once the appends pending before it commit."""
        if self._fenced:
            return Rejected(
                ErrorCode.kafka_storage_error,
                "the partition's sequencer was fenced after a failed write",
            )
        self._check_replayed()
        entry = self.producer_state(marker.producer_id) or empty_entry(marker.producer_id)
        position = self._markers.pending_position(self._pending)
        refusal = check_marker(entry, marker.producer_epoch, marker.coordinator_epoch)
        if position is not None and marker.upstream_offset < position:
            refusal = (
                ErrorCode.invalid_request,
                (
                    f"marker at upstream offset {marker.upstream_offset} was considered already "
                    f"(position {position})"
                ),
            )
        if refusal is not None:
            after = max(position or 0, marker.upstream_offset + 1)
            self._markers.skipped(self._pending, after, self._state_end)
            return Rejected(*refusal)
        base = self._log_end
        out = marker_batch(marker, base)
        append_time = NO_TIMESTAMP
        if self.log_append_time:  # as Kafka's leader stamped it: its time, kept
            set_log_append_time(out, 0, read_batch_header(out), marker.timestamp)
            append_time = marker.timestamp
        first = entry.current_txn_first_offset
        completed = None
        if first is not None:
            completed = CompletedTxn(marker.producer_id, first, base, not marker.commit)
        changed = entry.with_marker(
            marker.producer_epoch, marker.coordinator_epoch, now_ms, marker.timestamp
        )
        pending = PendingAppend(
            out, base, base, append_time, {marker.producer_id: changed}, marker, completed
        )
        self._pending.append(pending)
        self._pending_states[marker.producer_id] = changed
        self._markers.appended(base, marker.upstream_offset + 1)
        self._log_end = base + 1
        return pending

    def _set(self, pid: int, entry: ProducerStateEntry) -> None:
        """The committed state of producer `pid` is `entry` (the open-transaction index
        follows it)."""
        self._producers[pid] = entry
        first = entry.current_txn_first_offset
        if first is None:
            self._open.pop(pid, None)
        else:
            self._open[pid] = first

    def commit(self, pending: PendingAppend) -> ErrorCode:
        """`pending` is durable: apply it. Returns the code to answer its producer with:
        NONE, or KAFKA_STORAGE_ERROR if the sequencer was fenced meanwhile."""
        if self._fenced:
            return ErrorCode.kafka_storage_error
        if not self._pending or self._pending[0] is not pending:
            raise ValueError("commit takes the oldest pending append of this sequencer")
        self._pending.popleft()
        for pid, entry in pending.producer_states.items():
            self._set(pid, entry)
            if self._pending_states.get(pid) is entry:
                del self._pending_states[pid]
        self._high_watermark = self._state_end = pending.next_offset
        self._markers.committed(pending.base_offset, pending.next_offset)
        return ErrorCode.none

    def abort(self, pending: PendingAppend) -> None:
        """`pending`'s write failed or its fate is unknown: fence (module docstring).
        Aborting once fenced does nothing, so every failed write may be aborted."""
        if self._fenced:
            return
        if not any(p is pending for p in self._pending):
            raise ValueError("abort takes a pending append of this sequencer")
        self._fenced = True
        self._pending.clear()
        self._pending_states.clear()
        self._markers.moves.clear()

    def replay(self, header: BatchHeader, now_ms: int | None = None) -> bool:
        """Rebuild the producer state from a batch read back (its offsets as written), with
        no CRC or sequence checks. Batches wholly below `producer_state_end` are skipped
        (False). The log end moves past the batch. `now_ms` is the producer's last use
        for expiration; None takes the batch's max timestamp, as Kafka does when it
        reloads a log: pass the clock to give every producer a full period after a takeover."""
        if self._fenced or self._pending:
            raise RuntimeError("replay rebuilds a sequencer before it appends")
        if header.next_offset <= self._state_end:
            return False
        if header.base_offset < self._state_end:
            raise ValueError(
                f"batch at offsets {header.base_offset}..{header.last_offset} straddles the "
                f"producer state end {self._state_end}"
            )
        if header.producer_id >= 0:
            pid, epoch = header.producer_id, header.producer_epoch
            used = header.max_timestamp if now_ms is None else now_ms
            entry = self._producers.get(pid) or empty_entry(pid)
            if header.is_control:
                # written by append_marker: Kafka's rules passed; its coordinator epoch is
                # in the record, not the header, so the known one is kept
                self._markers.replay(header.base_offset, (pid, epoch, header.max_timestamp))
                if epoch >= entry.producer_epoch:
                    self._set(pid, entry.with_marker(epoch, None, used, header.max_timestamp))
            elif epoch >= entry.producer_epoch:  # an older epoch's batch changes nothing
                delta = header.last_offset_delta
                last_seq = increment_sequence(header.base_sequence, delta)
                batch = BatchMetadata(last_seq, header.last_offset, delta, header.max_timestamp)
                self._set(pid, entry.with_batch(epoch, batch, used, header.is_transactional))
        self._state_end = header.next_offset
        self._high_watermark = self._log_end = max(self._high_watermark, header.next_offset)
        return True

    def expire(self, now_ms: int) -> list[int]:
        """Drop the producer ids unused for `producer_id_expiration_ms`, with no append
        pending and no transaction open (Kafka never expires a producer with an open
        transaction: its LSO would jump); returns them. A dropped producer id is accepted
        again at any sequence."""
        limit = self.producer_id_expiration_ms
        expired = [
            pid
            for pid, entry in self._producers.items()
            if pid not in self._pending_states
            and entry.current_txn_first_offset is None
            and now_ms - entry.last_timestamp >= limit
        ]
        for pid in expired:
            del self._producers[pid]
        return expired

    def snapshot(self) -> bytes:
        """The committed producer state, the offset it covers and the marker position
        (docs/sequencer.md)."""
        snapshot = self.snapshot_at(self._state_end, forget=False)
        assert snapshot is not None  # the live place is always known
        return snapshot

    def snapshot_at(
        self, offset: int, committed_end: int | None = None, *, forget: bool = True
    ) -> bytes | None:
        """A snapshot at `offset` (at most `committed_end`, the stream's end in objects,
        by default `producer_state_end`) for a rebuild that replays the batches from
        `offset` on. Written with a trim to `offset` (docs/sequencer.md, "Producer state
        below the log start"): a producer whose batches the log start passed is known
        until it expires, as Kafka keeps it (KIP-360).

        - The committed state of the producers whose batches all lie below `offset`. One
          with a batch from `offset` on is kept with its batches that end below `offset`
          only (the replay brings the others back, after them, as they came): its epoch,
          its coordinator epoch, and its open transaction's first offset if that is below
          `offset`. So a retry of any of its last five batches is a duplicate, as Kafka
          keeps them (KIP-360). `offset` may fall inside a batch: the rebuild replays that
          batch whole.
        - The marker follower's place as of `committed_end` (`MarkerFollow.place_at`),
          with where the replayed markers still to be met upstream begin. None when the
          place there is no longer known (then no snapshot is written). With `forget`
          (a trim's snapshot), the moves below `committed_end` are forgotten: it only
          grows. `snapshot()` forgets none, so it may be taken at the live end at any
          time without keeping a later trim's snapshot from its committed end."""
        end = self._state_end if committed_end is None else committed_end
        if not 0 <= offset <= end <= self._state_end:
            raise ValueError(
                f"a snapshot at {offset} as of {end}, outside the committed state "
                f"[0, {self._state_end}]"
            )
        place = self._markers.place_at(end)
        if place is None:
            return None
        if forget:
            self._markers.forget_below(end)
        entries = []
        for entry in self._producers.values():
            first = entry.current_txn_first_offset
            if not entry.batches or entry.batches[-1].last_offset < offset:
                entries.append(entry)
            else:
                entries.append(
                    ProducerStateEntry(
                        entry.producer_id,
                        entry.producer_epoch,
                        entry.last_timestamp,
                        tuple(b for b in entry.batches if b.last_offset < offset),
                        entry.coordinator_epoch,
                        first if first is not None and first < offset else None,
                    )
                )
        position, _, replayed = place
        return encode_snapshot(
            offset,
            entries,
            position,
            markers_end=max(offset, markers_end(place)),
            expected=[identity for at, identity in replayed if at < offset],
        )

    @classmethod
    def restore(
        cls,
        data: bytes | bytearray | memoryview,
        log_end_offset: int,
        *,
        log_append_time: bool = False,
        producer_id_expiration_ms: int = DEFAULT_PRODUCER_ID_EXPIRATION_MS,
        replay_from: int | None = None,
    ) -> PartitionSequencer:
        """A sequencer for a log ending at `log_end_offset`, from a `snapshot()` or
        `snapshot_at()`. Replay the batches from the snapshot's offset
        (`producer_state_end`) on before appending; `replay_from`: from there instead,
        below the snapshot's offset, to replay whole a batch the snapshot's offset falls
        inside (the snapshot keeps its producer's batches that end below its offset
        only: the replay adds that one and the later ones back). Raises
        CorruptSnapshotError for bad bytes, ValueError for a snapshot past the log."""
        snapshot = read_snapshot(data)
        offset, entries = snapshot.offset, snapshot.entries
        if offset > log_end_offset:
            raise ValueError(
                f"the snapshot covers offsets below {offset}, past the log end {log_end_offset}"
            )
        start = offset if replay_from is None else replay_from
        if not 0 <= start <= offset:
            raise ValueError(f"a replay from {start}, past the snapshot's offset {offset}")
        sequencer = cls(
            log_end_offset,
            entries,
            log_append_time=log_append_time,
            producer_id_expiration_ms=producer_id_expiration_ms,
        )
        sequencer._state_end = start
        sequencer._markers = MarkerFollow(
            snapshot.marker_position, snapshot.markers_end, snapshot.expected, offset
        )
        return sequencer

    def _check_replayed(self) -> None:
        if self._state_end != self._high_watermark:
            raise RuntimeError(
                f"the producer state covers offsets below {self._state_end} but the log ends "
                f"at {self._high_watermark}: replay the batches in between before appending"
            )
