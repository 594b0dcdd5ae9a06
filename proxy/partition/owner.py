"""The owner of a tiered partition: sequence, make durable in the WAL, commit, answer.

One `TieredPartition` task per stream owns its `PartitionSequencer` (STYLE.md rule 3),
fed by a bounded FIFO of produce requests; handlers await a result and take no locks.
For each request, in order: `sequencer.append`; a `PendingAppend` goes to
`wal.append` at once, without waiting for the writes before it (the WAL group-commits
them and makes them durable in the order they were queued), and is committed and
answered when its write is done, oldest first. The pipeline, the error mapping and the
recovery sources are in docs/sequencer.md ("The owner of a tiered partition").

`PartitionSet` holds the partitions of one proxy, keyed by stream id, and routes
`produce(stream_id, records, acks)` to them.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import AsyncIterable, Callable, Collection, Iterable, Sequence
from dataclasses import dataclass

from proxy.metadata.state import MetadataState
from proxy.partition.producer_state import ErrorCode
from proxy.partition.recovered_tail import RecoveredTail, TailEntry
from proxy.partition.rules import (
    PartitionConfig,
    ProduceResult,
    RecoveryError,
    RecoveryPoint,
    entry_batches,
    missing_committed,
    not_owner,
    rebuild_sequencer,
    refusal,
    sequence,
    storage_error,
)
from proxy.partition.sequence_holes import DROP_CODES, ProducerBatch, SequenceHoles
from proxy.partition.sequencer import Duplicate, PartitionSequencer, PendingAppend, Rejected
from proxy.reads.logcache import LogCache
from proxy.records.batches import BatchHeader
from proxy.wal.log import WriteAheadLog
from proxy.wal.types import WalPosition

__all__ = [
    "PartitionConfig",
    "PartitionSet",
    "ProduceResult",
    "ReadCommitted",
    "RecoveryError",
    "TieredPartition",
    "read_wal_batches",
]

log = logging.getLogger(__name__)

Records = bytes | bytearray | memoryview
# (stream, start, end) -> headers of the committed batches covering [start, end), in order
ReadCommitted = Callable[[int, int, int], AsyncIterable[BatchHeader]]
OnBroken = Callable[[int, BaseException], None]
OnAppended = Callable[[int, int, int, bytearray], None]  # stream, base, last offset, batches


def _wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass(slots=True, eq=False)
class _Request:
    records: Records
    future: asyncio.Future[ProduceResult] | None  # None for acks=0
    log_append_time: bool | None = None  # the topic's message.timestamp.type; None: config's


@dataclass(slots=True, eq=False)
class _InFlight:
    pending: PendingAppend
    write: asyncio.Task[WalPosition]
    # the request and retries of it: (answer, base offset, log append time)
    waiters: list[tuple[asyncio.Future[ProduceResult], int, int]]


class TieredPartition:
    """`start()` (or `async with`), `produce(...)`, `close()`. Rebuild with `recover`."""

    def __init__(
        self,
        stream_id: int,
        sequencer: PartitionSequencer,
        wal: WriteAheadLog,
        *,
        log_start_offset: int = 0,
        config: PartitionConfig | None = None,
        clock_ms: Callable[[], int] = _wall_clock_ms,
        on_broken: OnBroken | None = None,
    ) -> None:
        self.stream_id = stream_id
        self.config = config or PartitionConfig()
        self.log_start_offset = log_start_offset  # moved by the owner when the stream is trimmed
        self._sequencer, self._wal = sequencer, wal
        self._clock_ms = clock_ms
        self.on_broken = on_broken  # called once, with the error, when a write fails
        self.on_appended: OnAppended | None = None  # each durable append (the log cache)
        # the batches this proxy dropped, to tell its gaps from the client's (sequence_holes.py)
        self.holes: SequenceHoles | None = None
        # the queue: requests keep the order of their produce() calls
        self._inbox: deque[_Request] = deque()
        self._blocked: deque[tuple[_Request, asyncio.Future[None]]] = deque()
        # owned by the task
        self._in_flight: deque[_InFlight] = deque()
        self._last_expire = clock_ms()
        self._broken: BaseException | None = None
        self._appended = asyncio.Event()
        self._wake: asyncio.Future[None] | None = None
        self._closing = False
        self._task: asyncio.Task[None] | None = None

    @classmethod
    async def recover(
        cls,
        stream_id: int,
        wal: WriteAheadLog,
        metadata: MetadataState,
        wal_batches: Sequence[BatchHeader] | None = None,
        *,
        read_committed: ReadCommitted | None = None,
        config: PartitionConfig | None = None,
        clock_ms: Callable[[], int] = _wall_clock_ms,
        on_broken: OnBroken | None = None,
    ) -> TieredPartition:
        """The partition at the stream's log end, not started, from durable sources only
        (which wins where: `partition_rules`' docstring). Below the snapshot's offset S:
        the snapshot. Below the committed end E (`metadata.stream_end`): the objects are
        the log; the WAL's batches there replay the producer state from S, and
        `read_committed(stream, start, end)` is asked only for what of [S, E) the WAL no
        longer holds (RecoveryError without it). From E on: the WAL alone, continuing E
        with no gap; the log end (= high watermark) is its last batch's end. A gap or a
        straddle raises RecoveryError. `wal_batches`: this stream's WAL batch headers in
        order (`read_wal_batches`: one pass for many streams); None reads the WAL here."""
        config = config or PartitionConfig()
        if wal_batches is None:
            wal_batches = (await read_wal_batches(wal, {stream_id})).get(stream_id, [])
        point = RecoveryPoint.from_metadata(metadata, stream_id)
        gap = missing_committed(point, wal_batches)
        committed = None
        if gap is not None and read_committed is not None:
            committed = [header async for header in read_committed(stream_id, *gap)]
        sequencer = rebuild_sequencer(point, committed, wal_batches, clock_ms(), config)
        return cls(
            stream_id,
            sequencer,
            wal,
            log_start_offset=point.log_start_offset,
            config=config,
            clock_ms=clock_ms,
            on_broken=on_broken,
        )

    # -- what callers see ----------------------------------------------------------------

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=f"partition {self.stream_id}")

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

    async def produce(
        self, records: Records, acks: int, log_append_time: bool | None = None
    ) -> ProduceResult | None:
        """Queue one partition's records and return the answer once they are durable (or
        refused). acks=0 returns None once queued; the write is the same. Waits while the
        queue is full, in call order: requests are sequenced in the order of the calls.
        `records` must not change until the request is sequenced. `log_append_time`: the
        topic's message.timestamp.type is LogAppendTime, read from Kafka with each request
        (a topic config may change); None keeps `config.log_append_time`."""
        if not self._open:
            self._dropped(records)
            return None if acks == 0 else not_owner(self.stream_id)
        loop = asyncio.get_running_loop()
        future = None if acks == 0 else loop.create_future()
        request = _Request(records, future, log_append_time)
        if len(self._inbox) < self.config.queue_size and not self._blocked:
            self._inbox.append(request)
            self._poke()
        else:
            admitted: asyncio.Future[None] = loop.create_future()
            self._blocked.append((request, admitted))
            await admitted
        return None if future is None else await future

    async def close(self) -> None:
        """Stop taking requests; answer the queued ones NOT_LEADER_OR_FOLLOWER (none was
        sequenced); wait for the appends in flight and answer them. Idempotent."""
        self._closing = True
        self._poke()
        if self._task is None:
            self._refuse_queued()
        else:
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
                self._dropped(item.pending.records)
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
        result = sequence(self._sequencer, request.records, now, self.holes, self.stream_id)
        future = request.future
        if isinstance(result, Rejected):
            answer = refusal(result, self.stream_id, self.holes)
            if answer.error_code in DROP_CODES:  # fenced, or a gap this proxy made
                self._dropped(request.records)
            if result.error_code in _SEQUENCE_REFUSALS:  # rare, and what settles a duplicate
                log.warning(
                    "stream %d: %s refused (%s), answered %d",
                    self.stream_id,
                    result.error_code.name,
                    result.message,
                    answer.error_code,
                )
            _answer(future, answer)
        elif isinstance(result, Duplicate):
            if result.awaiting is None:  # the original is durable
                _answer(future, self._success(result.base_offset, result.log_append_time_ms))
            elif future is not None:
                item = next(i for i in self._in_flight if i.pending is result.awaiting)
                item.waiters.append((future, result.base_offset, result.log_append_time_ms))
        else:
            # Tasks start in creation order, so the WAL queues the writes in sequence order
            # and makes them durable in that order.
            write = asyncio.create_task(
                self._wal.append(self.stream_id, result.base_offset, result.records)
            )
            write.add_done_callback(self._written)
            waiters = (
                [] if future is None else [(future, result.base_offset, result.log_append_time_ms)]
            )
            self._in_flight.append(_InFlight(result, write, waiters))

    def _written(self, write: asyncio.Task[WalPosition]) -> None:
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
            code = self._sequencer.commit(item.pending)
            if code == ErrorCode.NONE and self.on_appended is not None:
                pending = item.pending
                self.on_appended(
                    self.stream_id, pending.base_offset, pending.last_offset, pending.records
                )
            for future, base_offset, append_time in item.waiters:
                if code == ErrorCode.NONE:
                    _answer(future, self._success(base_offset, append_time))
                else:
                    self._dropped(item.pending.records)
                    _answer(future, storage_error("the partition was fenced"))
            moved = True
        if moved:
            self._notify()

    def _fail(self, item: _InFlight, error: BaseException) -> None:
        """A write failed or its fate is unknown: fence, answer every waiting append with
        KAFKA_STORAGE_ERROR (later requests get it from the fenced sequencer)."""
        self._sequencer.abort(item.pending)
        self._broken = error
        result = storage_error(f"the WAL write failed: {error!r}")
        for failed in (item, *self._in_flight):  # their writes fail too (the WAL is broken)
            self._dropped(failed.pending.records)
            _answer_all(failed, result)
        self._in_flight.clear()
        self._notify()
        if self.on_broken is not None:
            self.on_broken(self.stream_id, error)

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
            self._dropped(request.records)
            _answer(request.future, result)

    def _dropped(self, records: Records) -> None:
        """Answered retriable, not appended: recorded before the answer is given, so no
        later batch of the producer can pass it unnoticed (sequence_holes.py)."""
        if self.holes is not None:
            self.holes.dropped(self.stream_id, ProducerBatch.of(records))

    def _success(self, base_offset: int, append_time: int) -> ProduceResult:
        return ProduceResult(0, base_offset, append_time, self.log_start_offset)

    def _poke(self) -> None:
        if self._wake is not None and not self._wake.done():
            self._wake.set_result(None)

    def _notify(self) -> None:
        self._appended.set()
        self._appended = asyncio.Event()


_SEQUENCE_REFUSALS = (ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER, ErrorCode.INVALID_PRODUCER_EPOCH)


def _answer(future: asyncio.Future[ProduceResult] | None, result: ProduceResult) -> None:
    if future is not None and not future.done():  # done: the caller gave up (cancelled)
        future.set_result(result)


def _answer_all(item: _InFlight, result: ProduceResult) -> None:
    for future, _, _ in item.waiters:
        _answer(future, result)


async def read_wal_batches(
    wal: WriteAheadLog, streams: Collection[int] | None = None, tail: RecoveredTail | None = None
) -> dict[int, list[BatchHeader]]:
    """One pass over the WAL's replay: each stream's batch headers in order (only those of
    `streams`, if given). Headers only: the batch bytes are not kept, except those `tail`
    keeps (the entries past each stream's committed end, for the log cache)."""
    found: dict[int, list[BatchHeader]] = {}
    async for entry in wal.replay():
        if streams is None or entry.stream_id in streams:
            headers = entry_batches(entry.stream_id, entry.base_offset, entry.batch)
            found.setdefault(entry.stream_id, []).extend(headers)
            if tail is not None:
                last = headers[-1].last_offset
                tail.add(entry.stream_id, entry.base_offset, last, entry.position, entry.batch)
    return found


class PartitionSet:
    """The tiered partitions this proxy owns, by stream id, sharing one WAL."""

    def __init__(
        self,
        wal: WriteAheadLog,
        *,
        config: PartitionConfig | None = None,
        clock_ms: Callable[[], int] = _wall_clock_ms,
        on_broken: OnBroken | None = None,
        log_cache: LogCache | None = None,
        holes: SequenceHoles | None = None,
    ) -> None:
        self._wal, self.config, self._clock_ms = wal, config or PartitionConfig(), clock_ms
        self.holes = holes  # shared with the Produce path (sequence_holes.py)
        self._on_broken = on_broken
        self.log_cache = log_cache
        self._partitions: dict[int, TieredPartition] = {}
        self.broken: dict[int, BaseException] = {}

    async def recover(
        self,
        streams: Iterable[int],
        metadata: MetadataState,
        *,
        read_committed: ReadCommitted | None = None,
    ) -> None:
        """Rebuild and start a partition per stream (`TieredPartition.recover`), reading
        the WAL once for all of them. The entries past each stream's committed end go to
        the log cache, as many as it has room for (`recovered_tail.py`)."""
        streams = [s for s in streams if s not in self._partitions]
        tail = None
        if self.log_cache is not None:
            ends = {s: info.end_offset for s in streams if (info := metadata.stream(s))}
            tail = RecoveredTail(ends, self.log_cache.room)
        batches = await read_wal_batches(self._wal, set(streams), tail)
        for stream in streams:
            partition = await TieredPartition.recover(
                stream,
                self._wal,
                metadata,
                batches.get(stream, []),
                read_committed=read_committed,
                config=self.config,
                clock_ms=self._clock_ms,
                on_broken=self._broken_partition,
            )
            self.add(partition, () if tail is None else tail.entries(stream))

    def add(self, partition: TieredPartition, tail: Sequence[TailEntry] = ()) -> None:
        """Start serving a partition; `tail`: its recovered entries not uploaded yet, for
        the log cache (those without data are noted as in the WAL)."""
        if partition.stream_id in self._partitions:
            raise ValueError(f"stream {partition.stream_id} already has a partition here")
        self._partitions[partition.stream_id] = partition
        if partition.on_broken is None:
            partition.on_broken = self._broken_partition
        if self.log_cache is not None:
            self.log_cache.drop(partition.stream_id)  # what it held is from an older owner
            for entry in tail:
                if entry.data is None:
                    self.log_cache.in_wal(
                        partition.stream_id, entry.base_offset, entry.last_offset, entry.position
                    )
                else:
                    self.log_cache.append(
                        partition.stream_id, entry.base_offset, entry.last_offset, entry.data
                    )
            partition.on_appended = self.log_cache.append
        partition.holes = self.holes
        partition.start()

    def get(self, stream_id: int) -> TieredPartition | None:
        return self._partitions.get(stream_id)

    async def produce(
        self, stream_id: int, records: Records, acks: int, log_append_time: bool | None = None
    ) -> ProduceResult | None:
        partition = self._partitions.get(stream_id)
        if partition is None:
            return None if acks == 0 else not_owner(stream_id)
        return await partition.produce(records, acks, log_append_time)

    async def remove(self, stream_id: int) -> None:
        """Give a partition up: close it (in-flight appends are answered) and forget it."""
        partition = self._partitions.pop(stream_id, None)
        if partition is not None:
            await partition.close()
        if self.log_cache is not None:
            self.log_cache.drop(stream_id)

    async def close(self) -> None:
        partitions, self._partitions = list(self._partitions.values()), {}
        await asyncio.gather(*(p.close() for p in partitions))
        if self.log_cache is not None:
            for partition in partitions:
                self.log_cache.drop(partition.stream_id)

    def _broken_partition(self, stream_id: int, error: BaseException) -> None:
        self.broken[stream_id] = error
        if self.log_cache is not None:
            self.log_cache.drop(stream_id)
        if self._on_broken is not None:
            self._on_broken(stream_id, error)
