"""The owner of a tiered partition: sequence, make durable in the WAL, commit, answer.

One `TieredPartition` task per stream owns its `PartitionSequencer` (STYLE.md rule 3),
fed by a bounded FIFO of produce requests; handlers await a result and take no locks.
For each request, in order: `sequencer.append`; a `PendingAppend` goes to
`wal.append` at once, without waiting for the writes before it (the WAL group-commits
them and makes them durable in the order they were queued), and is committed and
answered when its write is done, oldest first. The pipeline, the error mapping and the
recovery sources are in docs/sequencer.md ("The owner of a tiered partition").

Transaction markers the marker follower finds in Kafka's log of the partition take the
same FIFO (`append_marker`): ordered with produce requests, made durable by the same
WAL, given to the log cache by `on_appended` like any append.

How a partition is rebuilt from durable sources is `partition/recovery.py`; the
partitions of one proxy, by stream id, are `partition/partition_set.py` (`PartitionSet`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from kio.schema.errors import ErrorCode

from proxy.apis.api61_describe_producers import DescribedProducer
from proxy.clock import now_ms
from proxy.metadata.state import MetadataState
from proxy.metrics import Stages
from proxy.partition.recovery import ReadCommitted, ReadUpstream, rebuild
from proxy.partition.rules import (
    PartitionConfig,
    ProduceResult,
    RecoveryError,
    not_owner,
    refusal,
    sequence,
    storage_error,
)
from proxy.partition.sequence_holes import DROP_CODES, ProducerBatch, SequenceHoles
from proxy.partition.sequencer import (
    AppendResult,
    Duplicate,
    PartitionSequencer,
    PendingAppend,
    Rejected,
)
from proxy.partition.txn_gate import VerificationGate, Verify, producer_of
from proxy.records.batches import BatchHeader
from proxy.records.markers import Marker
from proxy.wal.port import Log
from proxy.wal.types import WalPosition

__all__ = [
    "OnBroken",
    "PartitionConfig",
    "ProduceResult",
    "Records",
    "RecoveryError",
    "TieredPartition",
]

log = logging.getLogger(__name__)

Records = bytes | bytearray | memoryview
OnBroken = Callable[[int, BaseException], None]
# stream, base, last offset, batches
OnAppended = Callable[[int, int, int, bytearray | memoryview], None]


@dataclass(slots=True, eq=False)
class _Request:
    records: Records
    future: asyncio.Future[ProduceResult] | None  # None for acks=0
    log_append_time: bool | None = None  # the topic's message.timestamp.type; None: config's
    marker: Marker | None = None  # a transaction marker to append (`records` is empty)
    queued_at: float = 0.0  # perf_counter() when queued, if `stages` are observed
    # a batch known by its header: `records` is its first 61 bytes, and this says where
    # its bytes are (an encoded S3-WAL location, kept in the WAL's reference entry)
    reference: bytes | None = None


@dataclass(slots=True, eq=False)
class _InFlight:
    pending: PendingAppend
    write: asyncio.Future[WalPosition]  # the WAL's answer (`Log.submit`)
    # the request and retries of it: (answer, base offset, log append time)
    waiters: list[tuple[asyncio.Future[ProduceResult], int, int]]
    started: float = 0.0  # perf_counter() when handed to the WAL, if `stages` are observed
    reference: bytes | None = None  # the request's (`_Request.reference`)


@dataclass(slots=True, eq=False)
class _Unfilled:
    """A commit not given to the log cache yet (`TieredPartition._committed`)."""

    base: int
    last: int
    reference: bytes | None
    data: memoryview | bytearray | None


class TieredPartition:
    """`start()` (or `async with`), `produce(...)`, `close()`. Rebuild with `recover`."""

    def __init__(
        self,
        stream_id: int,
        sequencer: PartitionSequencer,
        wal: Log,
        *,
        log_start_offset: int = 0,
        config: PartitionConfig | None = None,
        clock_ms: Callable[[], int] = now_ms,
        on_broken: OnBroken | None = None,
    ) -> None:
        self.stream_id = stream_id
        self.config = config or PartitionConfig()
        self.log_start_offset = log_start_offset  # moved by the owner when the stream is trimmed
        # (a log start, the base offset of the batch holding it): `last_stable_offset`
        self._start_batch = (log_start_offset, log_start_offset)
        self._sequencer, self._wal = sequencer, wal
        self._clock_ms = clock_ms
        self.on_broken = on_broken  # called once, with the error, when a write fails
        self.on_appended: OnAppended | None = None  # each durable append (the log cache)
        # Committed appends the log cache has not had yet, in offset order, from the first
        # batch taken by reference whose bytes are not here yet; and bytes that came
        # before their reference entry was committed
        self._unfilled: deque[_Unfilled] = deque()
        self._early: dict[bytes, memoryview] = {}
        # where a produce's time goes here (queue, sequencer, wal): ProxyMetrics.produce_stages
        self.stages: Stages | None = None
        # the batches this proxy dropped, to tell its gaps from the client's (sequence_holes.py)
        self.holes: SequenceHoles | None = None
        # the queue: requests keep the order of their produce() calls
        self._inbox: deque[_Request] = deque()
        # a producer's batches around a KIP-890 verification (txn_gate.py), and those in it
        self._gate = VerificationGate()
        self._in_gate: dict[_Request, None] = {}  # in arrival order (a close drops them)
        self._blocked: deque[tuple[_Request, asyncio.Future[None]]] = deque()
        # owned by the task
        self._in_flight: deque[_InFlight] = deque()
        self._last_expire = clock_ms()
        self._broken: BaseException | None = None
        self._appended = asyncio.Event()
        self._wake: asyncio.Future[None] | None = None
        self._closing = False
        self._task: asyncio.Task[None] | None = None
        # the loop the partition runs on, bound at start(): asyncio.get_running_loop() asks
        # the kernel for the pid on each call (CPython 3.11), a cost per request here
        self._loop: asyncio.AbstractEventLoop | None = None

    @classmethod
    async def recover(
        cls,
        stream_id: int,
        wal: Log,
        metadata: MetadataState,
        wal_batches: Sequence[BatchHeader] | None = None,
        *,
        read_committed: ReadCommitted | None = None,
        config: PartitionConfig | None = None,
        clock_ms: Callable[[], int] = now_ms,
        on_broken: OnBroken | None = None,
        read_upstream: ReadUpstream | None = None,
    ) -> TieredPartition:
        """The partition at the stream's log end, not started, rebuilt from durable
        sources only (`recovery.rebuild`: which source wins where; RecoveryError on a gap
        or a straddle). `wal_batches`: this stream's WAL batch headers in order
        (`recovery.read_wal_batches`: one pass for many streams); None reads the WAL here."""
        config = config or PartitionConfig()
        sequencer, log_start_offset = await rebuild(
            stream_id, wal, metadata, wal_batches, read_committed, config, clock_ms, read_upstream
        )
        return cls(
            stream_id,
            sequencer,
            wal,
            log_start_offset=log_start_offset,
            config=config,
            clock_ms=clock_ms,
            on_broken=on_broken,
        )

    # -- what callers see ----------------------------------------------------------------

    def start(self) -> None:
        if self._task is None:
            self._loop = asyncio.get_running_loop()
            self._task = self._loop.create_task(self._run(), name=f"partition {self.stream_id}")

    async def __aenter__(self) -> TieredPartition:
        self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    @property
    def high_watermark(self) -> int:
        """The end of what is durable and answered: what consumers may read."""
        return self._sequencer.high_watermark

    @property
    def log_end_offset(self) -> int:
        """The next offset to assign (appends in flight included)."""
        return self._sequencer.log_end_offset

    @property
    def broken(self) -> BaseException | None:
        """The WAL failure that fenced this partition: give the shard up."""
        return self._broken

    @property
    def appended(self) -> asyncio.Event:
        """Set when the high watermark moves (or the partition breaks or closes), then
        replaced by a fresh event: take it, check `high_watermark`, then wait on it."""
        return self._appended

    async def wait_for_append(self, offset: int, max_wait_ms: int) -> int:
        """A fetch long-poll: wait up to `max_wait_ms` for the high watermark to pass
        `offset`; returns the high watermark."""
        try:
            async with asyncio.timeout(max_wait_ms / 1000):
                while self.high_watermark <= offset and self._open and self._broken is None:
                    await self._appended.wait()
        except TimeoutError:
            pass
        return self.high_watermark

    def snapshot(self) -> bytes:
        """The committed producer state, covering offsets below the high watermark."""
        return self._sequencer.snapshot()

    def snapshot_at(self, offset: int, committed_end: int) -> bytes | None:
        """The producer snapshot a trim to `offset` writes with it, as of the stream's
        `committed_end` in objects (`PartitionSequencer.snapshot_at`); None when there is
        none to write: the sequencer is fenced (its state may not be the log's), the
        offsets are past what is committed here, or the marker follower's place there is
        no longer known."""
        sequencer = self._sequencer
        if sequencer.fenced or not offset <= committed_end <= sequencer.producer_state_end:
            return None
        return sequencer.snapshot_at(offset, committed_end)

    async def produce(
        self,
        records: Records,
        acks: int,
        log_append_time: bool | None = None,
        verify: Verify | None = None,
        *,
        reference: bytes | None = None,
    ) -> ProduceResult | None:
        """Queue one partition's records and return the answer once they are durable (or
        refused). acks=0 returns None once queued; the write is the same. Waits while the
        queue is full, in call order: requests are sequenced in the order of the calls.
        `records` must not change until the request is sequenced. `log_append_time`: the
        topic's message.timestamp.type is LogAppendTime, read from Kafka with each request
        (a topic config may change); None keeps `config.log_append_time`. `verify`: a
        transactional batch of a producer with no transaction open here is verified with
        the coordinator first (KIP-890, txn_gate.py); None: not verified. A producer's
        batches keep their call order around a verification.

        `reference`: `records` is one batch's header only (HEADER_SIZE bytes), its bytes
        in the S3-WAL object `reference` encodes (docs/wal.md, "The owner answering from the
        notification"): sequenced from the header, made durable as a WAL reference entry
        and answered then (`ProduceResult.referenced`); the bytes reach the log cache when
        the WAL has fetched them (`filled`). Not with LogAppendTime nor acks=0."""
        header_only = reference is not None
        stamped = self.config.log_append_time if log_append_time is None else log_append_time
        if header_only and (acks == 0 or stamped):
            raise ValueError("a batch taken by reference needs acks and CreateTime")
        if not self._open:
            self._dropped(records, header_only)
            return None if acks == 0 else not_owner(self.stream_id)
        loop = self._loop or asyncio.get_running_loop()
        future = None if acks == 0 else loop.create_future()
        request = _Request(records, future, log_append_time, reference=reference)
        if self.stages is not None:
            request.queued_at = time.perf_counter()
        producer = (
            producer_of(records, header_only=header_only)
            if verify is not None or self._gate.waiting
            else None
        )
        if producer is None or not self._gate.must_wait(
            producer, verify, self._open_here(producer.producer_id)
        ):
            await self._enqueue(request)
        else:

            async def enqueue() -> ProduceResult | None:
                if not self._open:
                    return not_owner(self.stream_id)
                await self._enqueue(request)
                return None

            self._in_gate[request] = None  # a close records it as dropped at once
            try:
                refused = await self._gate.in_turn(producer, verify, self._open_here, enqueue)
            finally:
                self._in_gate.pop(request, None)
            if refused is not None:
                if refused.error_code in DROP_CODES:
                    self._dropped(records, header_only)
                return None if future is None else refused
        return None if future is None else await future

    def _open_here(self, producer_id: int) -> bool:
        """The producer has a transaction open here (pending appends included)."""
        entry = self._sequencer.producer_state(producer_id)
        return entry is not None and entry.current_txn_first_offset is not None

    def producers(self) -> tuple[DescribedProducer, ...]:
        """The partition's producers as DescribeProducers answers them (Kafka's active
        producers: the committed state, in producer id order)."""
        states = self._sequencer.producer_states
        return tuple(states[pid].described() for pid in sorted(states))

    def has_transaction_of(self, producer_id: int) -> bool:
        """The producer has a transaction open here (pending appends included) or a batch
        waiting for its verification: a marker that fenced it may be in Kafka's log of
        the partition (InitProducerId's catch-up, tiered/fencing.py)."""
        return self._open_here(producer_id) or self._gate.waits_for(producer_id)

    async def append_marker(self, marker: Marker) -> ProduceResult:
        """Append a transaction marker found in Kafka's log of the partition, through the
        produce FIFO; answered once durable. An error code other than
        KAFKA_STORAGE_ERROR and NOT_LEADER_OR_FOLLOWER means Kafka's leader would have
        refused the marker: it was skipped (logged), and `marker_resume` moves past it."""
        if not self._open:
            return not_owner(self.stream_id)
        future: asyncio.Future[ProduceResult] = asyncio.get_running_loop().create_future()
        self._gate.marker_queued(marker.producer_id)
        await self._enqueue(_Request(b"", future, marker=marker))
        return await future

    async def _enqueue(self, request: _Request) -> None:
        """Queue `request`; while the queue is full, wait in call order."""
        if len(self._inbox) < self.config.queue_size and not self._blocked:
            self._inbox.append(request)
            self._poke()
        else:
            admitted: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._blocked.append((request, admitted))
            await admitted

    @property
    def last_stable_offset(self) -> int:
        """Kafka's LSO: read_committed consumers read below it (sequencer.last_stable_offset).
        As in Kafka, the first offset of the oldest open transaction counts as no lower
        than the log start: records deleted (DeleteRecords, retention) hold nothing a
        read_committed consumer could wait for (UnifiedLog.maybeIncrementFirstUnstableOffset).
        Kafka keeps that offset as the position of the batch holding it, so its LSO is then
        the base offset of the batch holding the log start, below it when DeleteRecords cut
        a batch (`note_start_batch`)."""
        stable = self._sequencer.last_stable_offset
        start = self.log_start_offset
        if stable < start:
            at, base = self._start_batch
            stable = base if at == start else start
        return min(stable, self._sequencer.high_watermark)

    def note_start_batch(self, log_start: int, base_offset: int) -> None:
        """The batch holding `log_start` begins at `base_offset` (a DeleteRecords inside a
        batch); `last_stable_offset` answers it while `log_start` is the log start."""
        if not base_offset <= log_start:
            raise ValueError(f"a batch holding {log_start} cannot begin at {base_offset}")
        self._start_batch = (log_start, base_offset)

    def opened_below(self, offset: int) -> bool:
        """Whether a transaction open now began below `offset` (committed state)."""
        return self._sequencer.last_stable_offset < min(offset, self._sequencer.high_watermark)

    def marker_resume(self) -> tuple[int | None, tuple[tuple[int, int, int], ...]]:
        """(where to read Kafka's log of the partition from, None: the cutover; the
        identities of the markers already in the stream past that point, in order): the
        marker follower skips an upstream marker equal to the head of the list (popping
        it) and any other while the list is not empty (it was considered and skipped)."""
        return self._sequencer.marker_position, self._sequencer.replayed_markers

    async def close(self) -> None:
        """Stop taking requests; answer the queued ones NOT_LEADER_OR_FOLLOWER (none was
        sequenced); take back the appends a full WAL holds for room and answer them
        NOT_LEADER_OR_FOLLOWER too; wait for the other writes in flight and answer them.
        Idempotent.

        A full WAL holds its queued appends until an upload trims it, and that upload's
        commit may need this partition's shard owned again, which waits for this close:
        so a close never waits for room in the WAL: it withdraws what the WAL holds now,
        and again each time the WAL starts to wait for room before the close ends."""
        self._closing = True
        # A batch waiting for its verification can only be refused from now on, but not
        # before the verification ends (seconds, if the coordinator is slow): recorded
        # as dropped now, before the stream can reach another owner (sequence_holes.py)
        for waiting in self._in_gate:  # oldest first: the newest stays in SequenceHoles
            self._dropped(waiting.records, waiting.reference is not None)
        full = self._wal.next_full()
        try:
            self._withdraw_unwritten()
            self._poke()
            if self._task is None:
                self._refuse_queued()
                return
            while not self._task.done():
                await asyncio.wait([self._task, full], return_when=asyncio.FIRST_COMPLETED)
                if full.done():
                    full = self._wal.next_full()
                    self._withdraw_unwritten()
        finally:
            full.cancel()
        await asyncio.shield(self._task)

    @property
    def _open(self) -> bool:
        return not self._closing and (self._task is None or not self._task.done())

    # -- the task ------------------------------------------------------------------------

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while True:
                self._settle()
                if self._closing:
                    self._refuse_queued()
                    if not self._in_flight:
                        return
                while self._inbox and len(self._in_flight) < self.config.max_in_flight:
                    self._handle(self._take())
                self._wake = loop.create_future()
                await self._wake
        finally:
            self._wake = None
            self._closing = True
            for item in self._in_flight:  # cancelled or a bug: the writes' fate is unknown
                self._dropped(item.pending.records, item.reference is not None)
                _answer_all(item, storage_error("the partition's task stopped"))
            self._refuse_queued()
            self._notify()

    def _take(self) -> _Request:
        request = self._inbox.popleft()
        while self._blocked:  # admit the oldest blocked caller still waiting
            waiting, admitted = self._blocked.popleft()
            if not admitted.done():
                admitted.set_result(None)
                self._inbox.append(waiting)
                break
        return request

    def _handle(self, request: _Request) -> None:
        now = self._clock_ms()
        if now - self._last_expire >= self.config.expire_interval_ms:
            self._sequencer.expire(now)
            self._last_expire = now
        if request.log_append_time is not None:  # stamped by the sequencer (Kafka's leader)
            self._sequencer.log_append_time = request.log_append_time
        future = request.future
        stages = self.stages
        started = 0.0
        if stages is not None and request.queued_at:
            started = time.perf_counter()
            stages.observe("queue", started - request.queued_at)
        result: AppendResult
        if request.marker is not None:
            self._gate.marker_sequenced(request.marker.producer_id)
            result = self._sequencer.append_marker(request.marker, now)
            if isinstance(result, Rejected):
                if result.error_code != ErrorCode.kafka_storage_error:
                    log.warning(
                        "stream %d: marker %s skipped: %s (%s)",
                        self.stream_id,
                        request.marker,
                        result.error_code.name.upper(),
                        result.message,
                    )
                _answer(future, ProduceResult(int(result.error_code), error_message=result.message))
                return
        else:
            result = sequence(
                self._sequencer,
                request.records,
                now,
                self.holes,
                self.stream_id,
                header_only=request.reference is not None,
            )
            if started:
                assert stages is not None
                stages.since("sequencer", started)
        if isinstance(result, Rejected):
            answer = refusal(result, self.stream_id, self.holes)
            if answer.error_code in DROP_CODES:  # fenced, or a gap this proxy made
                self._dropped(request.records, request.reference is not None)
            if result.error_code in _SEQUENCE_REFUSALS:  # rare, and what settles a duplicate
                log.warning(
                    "stream %d: %s refused (%s), answered %d",
                    self.stream_id,
                    result.error_code.name.upper(),  # Kafka's Errors name
                    result.message,
                    answer.error_code,
                )
            _answer(future, answer)
        elif isinstance(result, Duplicate):
            if result.awaiting is None:  # the original is durable
                _answer(future, self._success(result.base_offset, result.log_append_time_ms, False))
            elif future is not None:
                item = next(i for i in self._in_flight if i.pending is result.awaiting)
                item.waiters.append((future, result.base_offset, result.log_append_time_ms))
        else:
            # Queued in the WAL now, in sequence order, and made durable in that order.
            try:
                write = self._wal.submit(
                    self.stream_id, result.base_offset, result.records, request.reference
                )
            except Exception as exc:  # closed or broken: answered by _settle, in order
                write = (self._loop or asyncio.get_running_loop()).create_future()
                write.set_exception(exc)
            write.add_done_callback(self._written)
            waiters = (
                [] if future is None else [(future, result.base_offset, result.log_append_time_ms)]
            )
            in_flight = _InFlight(result, write, waiters, reference=request.reference)
            if started:
                in_flight.started = time.perf_counter()
            self._in_flight.append(in_flight)

    def _written(self, write: asyncio.Future[WalPosition]) -> None:
        if not write.cancelled():
            write.exception()  # retrieved here; _settle reads it in order
        self._poke()

    def _settle(self) -> None:
        """Commit and answer the oldest appends whose writes are done, in order."""
        moved = False
        while self._in_flight and self._in_flight[0].write.done():
            item = self._in_flight.popleft()
            write = item.write
            error = asyncio.CancelledError() if write.cancelled() else write.exception()
            if error is not None:
                self._fail(item, error)
                return
            if item.started and self.stages is not None:
                self.stages.since("wal", item.started)  # group commit: queue, write, fsync
            code = self._sequencer.commit(item.pending)
            pending = item.pending
            if code == ErrorCode.none:
                self._committed(pending.base_offset, pending.last_offset, pending.records, item)
            for i, (future, base_offset, append_time) in enumerate(item.waiters):
                referenced = item.reference is not None and i == 0  # the request itself
                if code == ErrorCode.none:
                    _answer(future, self._success(base_offset, append_time, referenced))
                else:  # written, not committed: the reference entry is in the WAL
                    self._dropped(item.pending.records, item.reference is not None)
                    fenced = storage_error("the partition was fenced")
                    _answer(future, dataclasses.replace(fenced, referenced=referenced))
            moved = True
        if moved:
            self._notify()

    def _fail(self, item: _InFlight, error: BaseException) -> None:
        """A write failed or its fate is unknown: fence, answer every waiting append with
        KAFKA_STORAGE_ERROR (later requests get it from the fenced sequencer)."""
        self._sequencer.abort(item.pending)
        self._broken = error
        self._early.clear()
        result = storage_error(f"the WAL write failed: {error!r}")
        for failed in (item, *self._in_flight):  # their writes fail too (the WAL is broken)
            self._dropped(failed.pending.records, failed.reference is not None)
            _answer_all(failed, result)
        self._in_flight.clear()
        self._notify()
        if self.on_broken is not None:
            self.on_broken(self.stream_id, error)

    def _withdraw_unwritten(self) -> None:
        """The newest appends in flight that a full WAL holds for room, withdrawn and
        answered retriable (the WAL writes in queue order: they are a suffix)."""
        withdrawn: list[_InFlight] = []
        while self._in_flight and self._wal.withdraw(self._in_flight[-1].write):
            withdrawn.append(self._in_flight.pop())
        if not withdrawn:
            return
        log.info(
            "stream %d: closed with the WAL full: %d appends it held for room withdrawn, "
            "answered NOT_LEADER_OR_FOLLOWER",
            *(self.stream_id, len(withdrawn)),
        )
        result = not_owner(self.stream_id)
        for item in reversed(withdrawn):
            if item.reference is not None:
                self._early.pop(item.reference, None)
            self._dropped(item.pending.records, item.reference is not None)
            _answer_all(item, result, written=False)

    def _refuse_queued(self) -> None:
        result = not_owner(self.stream_id)
        while self._inbox or self._blocked:
            if self._inbox:
                request = self._inbox.popleft()
            else:
                request, admitted = self._blocked.popleft()
                if admitted.done():
                    continue
                admitted.set_result(None)
            self._dropped(request.records, request.reference is not None)
            _answer(request.future, result)

    def _dropped(self, records: Records, header_only: bool = False) -> None:
        """Answered retriable, not appended: recorded before the answer is given, so no
        later batch of the producer can pass it unnoticed (sequence_holes.py)."""
        if self.holes is not None:
            batch = ProducerBatch.of(records, header_only=header_only)
            self.holes.dropped(self.stream_id, batch)

    def _success(self, base_offset: int, append_time: int, referenced: bool) -> ProduceResult:
        return ProduceResult(0, base_offset, append_time, self.log_start_offset, None, referenced)

    # -- the log cache, behind batches taken by reference -------------------------------

    @property
    def unfilled_from(self) -> int | None:
        """The first committed offset whose batch the log cache has not had yet (its
        bytes, taken by reference, not fetched yet); None when it has every one."""
        return self._unfilled[0].base if self._unfilled else None

    def filled(self, reference: bytes, data: memoryview) -> None:
        """The bytes of the batch taken by `reference`, its offsets assigned (the WAL
        fetched them): to the log cache, with the commits held behind them, in order."""
        for entry in self._unfilled:
            if entry.reference == reference and entry.data is None:
                entry.data = data
                self._flush()
                return
        if any(item.reference == reference for item in self._in_flight):
            self._early[reference] = data  # before its reference entry was committed

    def _committed(self, base: int, last: int, records: bytearray, item: _InFlight) -> None:
        """A commit for the log cache: given at once unless a batch before it waits for
        its bytes (then in order behind it)."""
        data: memoryview | bytearray | None = records
        if item.reference is not None:
            data = self._early.pop(item.reference, None)
        elif not self._unfilled:
            if self.on_appended is not None:
                self.on_appended(self.stream_id, base, last, records)
            return
        self._unfilled.append(_Unfilled(base, last, item.reference, data))
        self._flush()

    def _flush(self) -> None:
        while self._unfilled and (data := self._unfilled[0].data) is not None:
            entry = self._unfilled.popleft()
            if self.on_appended is not None:
                self.on_appended(self.stream_id, entry.base, entry.last, data)

    def _poke(self) -> None:
        if self._wake is not None and not self._wake.done():
            self._wake.set_result(None)

    def _notify(self) -> None:
        self._appended.set()
        self._appended = asyncio.Event()


_SEQUENCE_REFUSALS = (  # logged: DUPLICATE_SEQUENCE_NUMBER is a success without an offset
    ErrorCode.out_of_order_sequence_number,
    ErrorCode.invalid_producer_epoch,
    ErrorCode.duplicate_sequence_number,
)


def _answer(future: asyncio.Future[ProduceResult] | None, result: ProduceResult) -> None:
    if future is not None and not future.done():  # done: the caller gave up (cancelled)
        future.set_result(result)


def _answer_all(item: _InFlight, result: ProduceResult, written: bool = True) -> None:
    """`result` to the request and its retries. A batch taken by reference whose write
    may have reached the WAL (`written`: not withdrawn) is answered `referenced`: its
    sender keeps the S3-WAL object until this WAL, reopened, says whether it holds it."""
    for i, (future, _, _) in enumerate(item.waiters):
        if i == 0 and written and item.reference is not None:
            _answer(future, dataclasses.replace(result, referenced=True))
        else:
            _answer(future, result)
