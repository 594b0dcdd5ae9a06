"""Reads of tiered partitions (docs/tiering.md, "Reading a tiered topic").

Any proxy answers a tiered partition's offsets committed to objects, through its block
cache, so a consumer reads in its own zone. The tail not uploaded yet is in the owner's
log cache: the owner answers it, and a proxy that does not own the partition asks the
owner for it over the peer protocol (those bytes cross zones; only the tail does). If the
owner does not answer, the committed end is the high watermark. A rebuilt owner loads the
tail it recovered into the log cache; what did not fit is read from its WAL (`_tail`),
so every offset below the high watermark is served at once, as Kafka serves it. Offsets
below the cutover that no object holds yet (and not below the log start) are not read
here: `fetch_here` sends those partitions to Kafka.

A corrupt object fails that partition with CORRUPT_MESSAGE, a missing or unreadable one
with KAFKA_STORAGE_ERROR (retriable); the other partitions are answered, and the log
names the object.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Hashable, Sequence
from typing import Any, Protocol

from kio.schema.errors import ErrorCode

from proxy.apis.api61_describe_producers import DescribedProducer
from proxy.apis.fetch_split import (
    FetchPartitionView,
    TieredFetchPartition,
    TieredFetchResult,
    TopicKey,
)
from proxy.metadata.state import MetadataState
from proxy.metadata.topic_index import TopicIndex, stream_of
from proxy.metrics import Stages
from proxy.objects.bandwidth import Bandwidth
from proxy.objects.format import ObjectFormatError
from proxy.objects.ratelimit import Priority
from proxy.objects.store import ObjectStoreError
from proxy.partition.owner import TieredPartition
from proxy.partition.partition_set import PartitionSet
from proxy.peer.clients import PeerClients
from proxy.peer.codec import PRODUCERS_PROTOCOL, STABLE_PROTOCOL, frame_size
from proxy.peer.messages import FetchRequest, FetchResponse
from proxy.reads.blockcache import BlockCache
from proxy.reads.logcache import LogCache
from proxy.reads.stream_reader import StreamReader
from proxy.records.batches import CorruptBatchError, iter_batches, read_batch_header
from proxy.records.transactions import ControlRecordError
from proxy.tiered.committed import Run, read_committed
from proxy.wal.port import Log
from proxy.wal.types import WalError

START_WAIT_S = 1.0  # a read waits this long for a partition being started here
log = logging.getLogger("tierproxy.reads")

READ_UNCOMMITTED, READ_COMMITTED = 0, 1

Key = tuple[object, int]  # (topic name or id, partition)
FETCH_REQUEST_BYTES = frame_size(FetchRequest(0, 0, 0, 0, 0))
FETCH_ANSWER_BYTES = frame_size(FetchResponse(0, 0))  # and the records


class ReadsHost(Protocol):
    """What the reads need of the tiered service: the tiered topics' metadata, the
    partitions owned here and their WAL, and the owners elsewhere (peer protocol)."""

    @property
    def topics(self) -> TopicIndex: ...

    def state(self, stream: int) -> MetadataState: ...

    async def changed(self, timeout_s: float) -> None: ...

    @property
    def partitions(self) -> PartitionSet | None: ...

    async def partition_here(
        self, stream: int, deadline: float | None = None
    ) -> TieredPartition | None:
        """The stream's partition if it is started here, one owned here and being started
        waited for until `deadline` at most (hold.py); None at once if it is not owned
        here or its start failed."""
        ...

    @property
    def log(self) -> Log | None:
        """The WAL as the partitions write it (references resolved on read)."""
        ...

    @property
    def bandwidth(self) -> Bandwidth | None: ...

    @property
    def peers(self) -> PeerClients: ...

    @property
    def fetch_stages(self) -> Stages: ...

    def owner_address(self, stream: int) -> tuple[str, int] | None:
        """Where the stream's owner takes peer requests; None if it is this proxy or
        not live."""
        ...

    def peer_protocol(self, member: str) -> int:
        """The peer protocol level of a member of the fleet (its heartbeat's)."""
        ...

    def count_peer_bytes(self, address: tuple[str, int], direction: str, size: int) -> None: ...


class TieredReads:
    def __init__(self, service: ReadsHost, cache: BlockCache, log_cache: LogCache) -> None:
        self.service = service
        self.cache = cache
        self.reader = StreamReader(cache)
        self.log_cache = log_cache

    def fetch_here(self, topic: TopicKey, p: FetchPartitionView) -> bool:
        """Whether the proxy answers this partition of a Fetch: a partition cut over, at
        an offset past its cutover or one an object holds, or at any offset once
        retention moved its log start past the cutover (below it: OFFSET_OUT_OF_RANGE,
        as Kafka, where Kafka would still serve records the stream trimmed), or below the
        log start wherever it is (retention or DeleteRecords trimmed migrated ranges below
        the cutover: Kafka's copy may still hold them)."""
        found = self.service.topics.topic(topic)
        if found is None:
            return False
        stream = stream_of(found, p.partition)
        state = self.service.state(stream)
        info = state.stream(stream)
        if info is None:
            return False
        if p.fetch_offset >= info.cutover_offset or info.log_start_offset > info.cutover_offset:
            return True
        if p.fetch_offset < info.log_start_offset:  # trimmed, Kafka's copy maybe not yet
            return True
        return bool(state.objects_for(stream, p.fetch_offset, limit=1))

    async def owner_high_watermark(self, stream: int) -> int | None:
        """The owner's high watermark, here or asked of the owner; None when no owner
        answers (away, or restarting and not serving the stream yet): the committed end
        may then be below offsets it acknowledged and consumers have read."""
        partition = await self._started(stream)
        if partition is not None:
            return partition.high_watermark
        end = self._committed_end(stream)
        tail = await self._owner_tail(stream, end, 0, 0)
        return max(end, tail.high_watermark) if tail is not None else None

    async def producers_here(self, stream: int) -> tuple[int, tuple[DescribedProducer, ...]]:
        """A peer's DescribeProducers of a stream: its producers if it is served here (or
        once started, `_started`), else NOT_LEADER_OR_FOLLOWER."""
        partition = await self._started(stream)
        if partition is None:
            return ErrorCode.not_leader_or_follower, ()
        return ErrorCode.none, partition.producers()

    async def owner_producers(self, stream: int) -> tuple[int, tuple[DescribedProducer, ...]]:
        """(error code, the stream's producers as DescribeProducers answers them): the
        partition's state here, else asked of its owner; NOT_LEADER_OR_FOLLOWER when no
        owner answers (away, restarting, or of a release before `PRODUCERS_PROTOCOL`), as
        a broker that is not the leader answers: the client asks again."""
        partition = await self._started(stream)
        if partition is not None:
            return ErrorCode.none, partition.producers()
        service = self.service
        address = service.owner_address(stream)
        owner = service.state(stream).owner
        if address is None or service.peer_protocol(owner) < PRODUCERS_PROTOCOL:
            return ErrorCode.not_leader_or_follower, ()
        try:
            code, producers = await service.peers.producers(address, stream)
        except (ConnectionError, TimeoutError, OSError, RuntimeError) as exc:  # Runtime: closed
            log.debug("producers of stream %d from %s: %r", stream, address, exc)
            return ErrorCode.not_leader_or_follower, ()
        if code != ErrorCode.none:
            return ErrorCode.not_leader_or_follower, ()
        return ErrorCode.none, producers

    async def owner_last_stable(self, stream: int) -> int | None:
        """The owner's last stable offset (read_committed's end), here or asked of the
        owner; None when no owner answers. An owner of a release before transactions
        (peer protocol below STABLE_PROTOCOL) took none: its high watermark."""
        partition = await self._started(stream)
        if partition is not None:
            return partition.last_stable_offset
        end = self._committed_end(stream)
        tail = await self._owner_tail(stream, end, 0, 0, stable=True)
        if tail is None:
            return None
        if tail.last_stable_offset is None:
            return max(end, tail.high_watermark)
        return tail.last_stable_offset

    async def tail_records(
        self, stream: int, offset: int, max_bytes: int
    ) -> tuple[Sequence[memoryview], int] | None:
        """(the stream's batches past its committed objects from `offset` on, its high
        watermark): the log cache on the owner, else asked of the owner over the peer
        protocol; None when no owner answers. For ListOffsets' timestamp search."""
        partition = await self._started(stream)
        if partition is not None:
            return await self._tail(stream, offset, max_bytes), partition.high_watermark
        answer = await self._owner_tail(stream, offset, max_bytes, 0)
        if answer is None:
            return None
        return tuple(memoryview(piece) for piece in answer.records), answer.high_watermark

    async def _started(self, stream: int, deadline: float | None = None) -> TieredPartition | None:
        """The stream's partition if it is owned here, waiting up to START_WAIT_S for it
        if it is being started (cut over or taken over just now: Kafka's leader answers
        then, where the proxy answered NOT_LEADER_OR_FOLLOWER, or, for a Fetch, served
        the committed objects only, its high watermark the committed end). Every read at
        the owner takes its partition here; a proxy that does not own the stream, or whose
        rebuild of it failed, goes on at once. `deadline`: a Fetch's, shared by its
        partitions (else START_WAIT_S from now). A shard being taken over is owned here
        only once its streams are rebuilt (group.py): reads meanwhile are answered as
        before."""
        partition = self._partition(stream)
        if partition is None:
            if deadline is None:
                deadline = time.monotonic() + START_WAIT_S
            partition = await self.service.partition_here(stream, deadline)
        return partition

    def _partition(self, stream: int) -> TieredPartition | None:
        """The stream's partition if it is owned (and started) here."""
        partitions = self.service.partitions
        return None if partitions is None else partitions.get(stream)

    def _committed_end(self, stream: int) -> int:
        state = self.service.state(stream)
        end = state.stream_end(stream)
        return end if end is not None else (state.cutover(stream) or 0)

    async def serve_tail(self, request) -> TieredFetchResult:
        """A peer's fetch (peer_messages.FetchRequest) of a stream owned here: the log
        cache from `offset` on, after waiting up to max_wait_ms for data past it."""
        stream, offset = request.stream_id, request.offset
        partition = await self._started(stream)
        if partition is not None and request.max_wait_ms > 0 and _nothing_at(partition, offset):
            await self.log_cache.wait_for_data(stream, offset, request.max_wait_ms)
            partition = self._partition(stream)
        if partition is None:
            return TieredFetchResult(ErrorCode.not_leader_or_follower)
        # the LSO with the high watermark, before the batches: they reach the markers of
        # every transaction below it (the asker decides with them: records/transactions.py)
        stable, end = _readable_end(partition)
        start = partition.log_start_offset
        if offset > partition.high_watermark or offset < start:
            return TieredFetchResult(ErrorCode.offset_out_of_range, end, stable, start)
        records: Sequence[memoryview] = ()
        if request.max_bytes > 0:
            records = await self._tail(stream, offset, request.max_bytes)
        return TieredFetchResult(ErrorCode.none, end, stable, start, None, -1, tuple(records))

    async def _tail(self, stream: int, offset: int, max_bytes: int) -> Sequence[memoryview]:
        """The owner's batches from `offset` past the committed objects: the log cache,
        else the WAL for an entry a rebuild recovered and the cache had no room for
        (`LogCache.in_wal`), by Kafka's rule (the first entry whole). Empty when the WAL
        was trimmed meanwhile: the objects hold it now."""
        records, _ = self.log_cache.read(stream, offset, max_bytes)
        partition = None if records else self._partition(stream)
        if partition is not None and _nothing_at(partition, offset):
            if partition.high_watermark > offset:  # committed, its bytes being fetched
                await self.log_cache.wait_for_data(stream, offset, FILL_WAIT_MS)
                records, _ = self.log_cache.read(stream, offset, max_bytes)
        where = None if records else self.log_cache.wal_position(stream, offset)
        wal = self.service.log
        if where is None or wal is None:
            return records
        try:
            async with asyncio.timeout(FILL_WAIT_MS / 1000):  # its bytes fetched, maybe
                entries = await wal.read(where.start, max(max_bytes, 1))
        except TimeoutError:
            log.debug("stream %d at offset %d: the WAL's bytes not fetched in time", stream, offset)
            return ()
        except WalError as exc:
            log.debug("stream %d at offset %d from the WAL: %r", stream, offset, exc)
            return ()
        found: list[memoryview] = []
        size = 0
        for entry in entries:
            if entry.stream_id != stream:
                continue
            if found and size + len(entry.batch) > max_bytes:
                break
            found.append(entry.batch)
            size += len(entry.batch)
        return found

    async def _owner_wakes(self, stream: int, offset: int, left_s: float) -> None:
        """Until the owner has data past `offset` (a long poll on it), at most `left_s`;
        the whole time if it does not answer (no busy loop while it is away)."""
        started = time.monotonic()
        if await self._owner_tail(stream, offset, 0, int(left_s * 1000)) is None:
            await asyncio.sleep(max(left_s - (time.monotonic() - started), 0))

    async def _owner_tail(
        self, stream: int, offset: int, max_bytes: int, max_wait_ms: int, *, stable: bool = False
    ) -> FetchResponse | None:
        """The owner's answer for the tail from `offset`, with its last stable offset if
        `stable` and the owner's release answers it (else `last_stable_offset` is None);
        None when it has no live owner elsewhere or does not answer."""
        service = self.service
        address = service.owner_address(stream)
        if address is None:
            return None
        if stable:
            stable = service.peer_protocol(service.state(stream).owner) >= STABLE_PROTOCOL
        try:
            answer = await service.peers.fetch(
                address, stream, offset, max_bytes, max_wait_ms, stable=stable
            )
        except (ConnectionError, TimeoutError, OSError, RuntimeError) as exc:  # Runtime: closed
            log.debug("tail of stream %d from %s: %r", stream, address, exc)
            return None
        size = sum(len(memoryview(piece)) for piece in answer.records)
        service.count_peer_bytes(address, "tail_request", FETCH_REQUEST_BYTES)
        service.count_peer_bytes(address, "tail_answer", FETCH_ANSWER_BYTES + size)
        return (
            answer if answer.error_code in (ErrorCode.none, ErrorCode.offset_out_of_range) else None
        )

    async def fetch(
        self,
        parts: Sequence[TieredFetchPartition],
        *,
        max_wait_ms: int,
        min_bytes: int,
        max_bytes: int,
        reader: Hashable,
        isolation_level: int = READ_UNCOMMITTED,
    ) -> dict[Key, TieredFetchResult]:
        """Every partition's answer, in request order within `max_bytes` (the first
        batch whole); waits up to `max_wait_ms` for `min_bytes` (0: answer now)."""
        deadline = time.monotonic() + max(max_wait_ms, 0) / 1000
        stages = self.service.fetch_stages
        while True:
            started = time.perf_counter()
            results = await self._read_all(parts, max_bytes, reader, isolation_level)
            stages.since("read", started)  # every partition once: caches, objects, tails
            got = sum(sum(len(piece) for piece in r.records) for r in results.values())
            left = deadline - time.monotonic()
            if min_bytes <= 0 or got >= min_bytes or left <= 0:
                return results
            if any(r.error_code != ErrorCode.none for r in results.values()):
                return results
            started = time.perf_counter()
            await self._wait_for_data(parts, left)
            stages.since("wait", started)  # for min_bytes: the client's max_wait_ms

    async def _read_all(
        self,
        parts: Sequence[TieredFetchPartition],
        max_bytes: int,
        reader: Hashable,
        isolation_level: int,
    ) -> dict[Key, TieredFetchResult]:
        results: dict[Key, TieredFetchResult] = {}
        room = max_bytes
        start_by = time.monotonic() + START_WAIT_S  # partitions being started: 1 s in all
        for part in parts:
            limit = min(part.partition_max_bytes, room) if results else part.partition_max_bytes
            result = await self._read_one(part, max(limit, 0), reader, isolation_level, start_by)
            results[part.topic, part.partition] = result
            room -= sum(len(piece) for piece in result.records)
        return results

    async def _read_one(
        self,
        part: TieredFetchPartition,
        max_bytes: int,
        reader: Hashable,
        isolation_level: int,
        start_by: float | None = None,
    ) -> TieredFetchResult:
        service = self.service
        found = service.topics.topic(part.topic)
        stream = None if found is None else stream_of(found, part.partition)
        info = None if stream is None else service.state(stream).stream(stream)
        if found is None or stream is None or info is None:  # untiered since the split
            return TieredFetchResult(ErrorCode.not_leader_or_follower)
        state = service.state(stream)
        partition = await self._started(stream, start_by)
        end = partition.high_watermark if partition is not None else state.stream_end(stream)
        end = info.cutover_offset if end is None else end
        # The owner's partition knows a trim (DeleteRecords, retention) the moment it is
        # written; this proxy's metadata reader applies it a little later. A Fetch after
        # the trim was answered must not be served what it dropped (Kafka: out of range).
        log_start = info.log_start_offset
        if partition is not None:
            log_start = max(log_start, partition.log_start_offset)
        offset = part.fetch_offset
        if offset < log_start or (partition is not None and offset > end):
            return TieredFetchResult(ErrorCode.offset_out_of_range, end, end, log_start)
        if isolation_level == READ_COMMITTED:
            run = functools.partial(self._run, state, stream, offset, end, (reader, stream))
            where = f"{found.name}-{part.partition} at offset {offset}"
            return await self._read_committed(run, stream, offset, max_bytes, log_start, where)
        records: Sequence[memoryview] = ()
        priority = Priority.CATCHUP_READ  # committed objects; the tail is TAIL_READ
        if max_bytes > 0 and offset < end:
            try:
                started = time.perf_counter()
                found_batches = await self.reader.read(
                    state, stream, offset, max_bytes, reader_id=(reader, stream)
                )
                service.fetch_stages.since("objects", started)  # log/block cache or GETs
                records = found_batches.batches
            except ObjectFormatError as exc:
                log.error("%s-%d at offset %d: %s", found.name, part.partition, offset, exc)
                return TieredFetchResult(ErrorCode.corrupt_message, end, end, log_start)
            except ObjectStoreError as exc:
                log.error("%s-%d at offset %d: %s", found.name, part.partition, offset, exc)
                return TieredFetchResult(ErrorCode.kafka_storage_error, end, end, log_start)
            if not records and partition is not None:
                records = await self._tail(stream, offset, max_bytes)
                priority = Priority.TAIL_READ
        if not records and partition is None and max_bytes > 0:  # the tail, on its owner
            started = time.perf_counter()
            tail = await self._owner_tail(stream, offset, max_bytes, 0)
            service.fetch_stages.since("owner_tail", started)  # a peer round trip
            if tail is not None:
                end = max(end, tail.high_watermark)
                if tail.error_code == ErrorCode.offset_out_of_range:
                    return TieredFetchResult(ErrorCode.offset_out_of_range, end, end, log_start)
                records = tuple(memoryview(piece) for piece in tail.records)
                priority = Priority.TAIL_READ
        if records and self.service.bandwidth is not None:
            size = sum(len(memoryview(piece)) for piece in records)
            await self.service.bandwidth.limiter.acquire(priority, size)
        return TieredFetchResult(ErrorCode.none, end, end, log_start, None, -1, tuple(records))

    async def _read_committed(
        self, run, stream: int, offset: int, max_bytes: int, log_start: int, where: str
    ) -> TieredFetchResult:
        """A read_committed answer (committed.py): never past the last stable offset,
        every transaction in it decided, the aborted ones named."""
        try:
            read = await read_committed(run, stream, offset, max(max_bytes, 0))
        except _OutOfRange as exc:
            end = exc.end
            return TieredFetchResult(ErrorCode.offset_out_of_range, end, end, log_start)
        except (ObjectFormatError, ControlRecordError, CorruptBatchError) as exc:
            log.error("%s: %s", where, exc)
            return TieredFetchResult(ErrorCode.corrupt_message, -1, -1, log_start)
        except ObjectStoreError as exc:
            log.error("%s: %s", where, exc)
            return TieredFetchResult(ErrorCode.kafka_storage_error, -1, -1, log_start)
        records = read.records
        if records and self.service.bandwidth is not None:
            size = sum(piece.nbytes for piece in records)
            priority = Priority.TAIL_READ if read.tail else Priority.CATCHUP_READ
            await self.service.bandwidth.limiter.acquire(priority, size)
        fields = (read.end, read.last_stable_offset, log_start, read.aborted, -1, tuple(records))
        return TieredFetchResult(ErrorCode.none, *fields)

    async def _run(
        self, state, stream: int, offset: int, end: int, reader_id: Hashable, limit: int
    ) -> Run:
        """The batches from `offset` on, up to `limit` bytes (the first whole): the
        objects, then the tail past them (the log cache here, else the owner's, which
        answers its last stable offset too). On the owner, its LSO and high watermark are
        read first, so a run reaching that high watermark holds every marker below it."""
        partition = self._partition(stream)
        last_stable: int | None = None
        if partition is not None:
            last_stable, end = _readable_end(partition)
        if limit <= 0:
            return Run((), end, last_stable, offset >= end)
        found = await self.reader.read(state, stream, offset, limit, reader_id=reader_id)
        batches = list(found.batches)
        size = sum(batch.nbytes for batch in batches)
        at = read_batch_header(batches[-1]).next_offset if batches else offset
        tail = False
        if size < limit and (not batches or at >= self._committed_end(stream)):
            # the bandwidth priority: catch-up whenever objects were read, as for
            # read_uncommitted (whose answer stops at the objects' records)
            tail = not batches
            if partition is not None:
                batches += await self._tail(stream, at, limit - size)
            else:
                answer = await self._owner_tail(stream, at, limit - size, 0, stable=True)
                if answer is not None and answer.error_code == ErrorCode.offset_out_of_range:
                    if not batches:
                        raise _OutOfRange(max(end, answer.high_watermark))
                elif answer is not None:
                    end = max(end, answer.high_watermark)
                    last_stable = answer.last_stable_offset
                    for piece in answer.records:
                        batches += (view for _, view in iter_batches(piece))
        at = read_batch_header(batches[-1]).next_offset if batches else offset
        return Run(batches, end, last_stable, at >= end, tail)

    async def _wait_for_data(self, parts: Sequence[TieredFetchPartition], left_s: float) -> None:
        """Until a partition here may have more (an append on an owned one, a metadata
        record for the others), at most `left_s`."""
        service = self.service
        waits: list[asyncio.Future[Any]] = [asyncio.ensure_future(service.changed(left_s))]
        for part in parts:
            found = service.topics.topic(part.topic)
            if found is None:
                continue
            stream = stream_of(found, part.partition)
            if self._partition(stream) is not None:
                end = self.log_cache.end_offset(stream)
                at = max(part.fetch_offset, end if end is not None else part.fetch_offset)
                wait = self.log_cache.wait_for_data(stream, at, left_s * 1000)
                waits.append(asyncio.ensure_future(wait))
            else:  # the owner answers once it has data past the committed end
                committed = service.state(stream).stream_end(stream) or 0
                at = max(part.fetch_offset, committed)
                waits.append(asyncio.ensure_future(self._owner_wakes(stream, at, left_s)))
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for pending in waits:
                pending.cancel()
            await asyncio.gather(*waits, return_exceptions=True)


# How long a read of the owner's tail waits for the bytes of a batch taken by reference
# (committed: a consumer may read it, and Kafka would serve it): a GET, normally
FILL_WAIT_MS = 2000


def _readable_end(partition: TieredPartition) -> tuple[int, int]:
    """(last stable offset, high watermark) as a read of the owner's tail sees them: at
    most the first batch whose bytes, taken by reference, are not here yet, so that a
    read_committed run that stops there is whole (no transaction past it looks decided)."""
    stable, end = partition.last_stable_offset, partition.high_watermark
    unfilled = partition.unfilled_from
    if unfilled is not None:
        stable, end = min(stable, unfilled), min(end, unfilled)
    return stable, end


def _nothing_at(partition: TieredPartition, offset: int) -> bool:
    """Nothing to read at `offset` yet: past the high watermark, or committed but its
    bytes, taken by reference, not fetched yet (partition/referenced.py)."""
    unfilled = partition.unfilled_from
    return partition.high_watermark <= offset or (unfilled is not None and unfilled <= offset)


class _OutOfRange(Exception):
    """The owner answered the fetch offset out of range (a trim it knows first)."""

    def __init__(self, end: int) -> None:
        super().__init__(end)
        self.end = end
