"""The tiered partitions one proxy owns, keyed by stream id, sharing one WAL.

`PartitionSet` rebuilds them when the proxy takes their streams over (one WAL pass for
all of them: `recovery.read_wal_batches`), routes `produce(stream_id, records, acks)` to
each one's `TieredPartition` (`owner.py`), wires them to the log cache and the record of
dropped batches, and gives them up. A partition whose WAL write failed is noted in
`broken`: its shard is to be given up.

The WAL entries of a stream are its log only while the ownership that wrote them goes on
(docs/sequencer.md, "Rebuilding a partition"). When another member owned the stream since
(an unclean takeover: this proxy killed or paused, its shard taken after
`unclean_takeover_after_s`), the new owner's log went on from the committed end without
them, and may hold other records at their offsets: `disown` marks every entry of those
streams written so far as stale, and neither the rebuild nor the uploader (`stale`) uses
them again.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Sequence

from proxy.clock import now_ms
from proxy.metadata.state import MetadataState
from proxy.metrics import Stages
from proxy.partition.owner import OnBroken, Records, TieredPartition
from proxy.partition.recovered_tail import RecoveredTail, TailEntry
from proxy.partition.recovery import ReadCommitted, ReadUpstream, read_wal_batches
from proxy.partition.rules import PartitionConfig, ProduceResult, RecoveryError, not_owner
from proxy.partition.sequence_holes import SequenceHoles
from proxy.partition.txn_gate import Verify
from proxy.reads.logcache import LogCache
from proxy.records.batches import BatchHeader
from proxy.wal.port import Log
from proxy.wal.types import WalEntry

log = logging.getLogger("tierproxy.tiering")

# Streams rebuilt at once: each may read Kafka's log below its cutover (recovery.py), and
# produce to a partition just cut over waits for its rebuild.
REBUILDS_AT_ONCE = 8

__all__ = ["PartitionSet"]


class PartitionSet:
    """The tiered partitions this proxy owns, by stream id, sharing one WAL."""

    def __init__(
        self,
        wal: Log,
        *,
        config: PartitionConfig | None = None,
        clock_ms: Callable[[], int] = now_ms,
        on_broken: OnBroken | None = None,
        log_cache: LogCache | None = None,
        holes: SequenceHoles | None = None,
        stages: Stages | None = None,
    ) -> None:
        self._wal, self.config, self._clock_ms = wal, config or PartitionConfig(), clock_ms
        self.stages = stages  # each partition's produce stages (ProxyMetrics.produce_stages)
        self.holes = holes  # shared with the Produce path (sequence_holes.py)
        self._on_broken = on_broken
        self.log_cache = log_cache
        self._partitions: dict[int, TieredPartition] = {}
        self.broken: dict[int, BaseException] = {}
        # stream -> why its last rebuild failed: not started until it is rebuilt again
        self.not_rebuilt: dict[int, BaseException] = {}
        self._recovering: set[int] = set()  # streams a recover() is rebuilding now
        # of those: removed meanwhile (their shard lost: not started when rebuilt), and
        # asked for by a later recover() that left them to the first
        self._abandoned: set[int] = set()
        self._asked_again: set[int] = set()
        # stream -> WAL offset: its entries starting below it are stale (`disown`)
        self._stale_below: dict[int, int] = {}
        # stream -> its partition's close under way (`remove`): in the set until it ends
        self._closing: dict[int, asyncio.Future[None]] = {}

    def disown(self, streams: Iterable[int]) -> None:
        """Every WAL entry of `streams` written so far is stale: another member owned
        them since this proxy wrote it (module docstring). Not for a stream served here."""
        end = self._wal.durable_end
        for stream in streams:
            if stream in self._partitions:
                raise ValueError(f"stream {stream} is served here: its WAL entries are its log")
            self._stale_below[stream] = max(self._stale_below.get(stream, 0), end)

    def stale(self, entry: WalEntry) -> bool:
        """Whether the entry was written under an ownership of its stream that another
        member's took over since (`disown`): not to be replayed nor uploaded."""
        return entry.position.start < self._stale_below.get(entry.stream_id, 0)

    async def recover(
        self,
        streams: Iterable[int],
        metadata: MetadataState,
        *,
        read_committed: ReadCommitted | None = None,
        read_upstream: ReadUpstream | None = None,
        may_start: Callable[[int], bool] | None = None,
    ) -> None:
        """Rebuild and start a partition per stream (`TieredPartition.recover`, up to
        REBUILDS_AT_ONCE at a time), reading the WAL once for all of them. The entries past
        each stream's committed end go to the log cache, as many as it has room for
        (`recovered_tail.py`). Each partition is started as soon as it is rebuilt. A
        stream whose rebuild fails (or that another recovery started meanwhile) is not
        started, the others are, and the first failure is raised; the failed ones are in
        `not_rebuilt` until a later rebuild starts them. A stream another recover() is
        rebuilding now is left to it. A stream removed while it is rebuilt (its shard
        lost) is not started when its rebuild ends: it would take produces on a proxy that
        no longer owns it, acknowledged and never committed. If a later recover() left it
        to that rebuild meanwhile (the shard claimed again), it goes to `not_rebuilt`, so
        the retry of failed starts rebuilds it from the new claim's metadata. `may_start`,
        asked right before a rebuilt stream is started: False, and it is not (its shard
        is being given up)."""
        streams = list(streams)
        closing = [self._closing[s] for s in streams if s in self._closing]
        if closing:  # given up and claimed again: rebuilt once its old partition is closed
            await asyncio.wait([asyncio.shield(c) for c in closing])
        self._asked_again.update(s for s in streams if s in self._recovering)
        streams = [s for s in streams if s not in self._partitions and s not in self._recovering]
        if not streams:
            return
        self._recovering.update(streams)
        pending = set(streams)  # not ended each on its own (a failed WAL read, a cancel)
        try:
            await self._recover(
                streams, pending, metadata, read_committed, read_upstream, may_start
            )
        finally:
            for stream in pending:
                self._rebuild_ended(stream)

    def _rebuild_ended(self, stream: int) -> None:
        """Its rebuild is over (each stream's as soon as it is: a stream started, then
        removed and asked for again while others of its recover() still run, is rebuilt
        by the later one, which the earlier one's end must not mark ended)."""
        self._recovering.discard(stream)
        self._abandoned.discard(stream)
        self._asked_again.discard(stream)

    def _start_failed(self, stream: int, error: BaseException, given_up: bool = False) -> None:
        """Noted in `not_rebuilt`, unless given up meanwhile (removed, or `given_up`: its
        shard lost) and not asked for again."""
        if not (given_up or stream in self._abandoned) or stream in self._asked_again:
            self.not_rebuilt[stream] = error

    async def _recover(
        self,
        streams: list[int],
        pending: set[int],
        metadata: MetadataState,
        read_committed: ReadCommitted | None,
        read_upstream: ReadUpstream | None,
        may_start: Callable[[int], bool] | None,
    ) -> None:
        for stream in streams:  # being started again
            self.not_rebuilt.pop(stream, None)
        tail = None
        try:
            if self.log_cache is not None:
                ends = {s: info.end_offset for s in streams if (info := metadata.stream(s))}
                tail = RecoveredTail(ends, self.log_cache.room)
            batches = await read_wal_batches(self._wal, set(streams), tail, self.stale)
        except Exception as exc:  # the WAL unreadable: none of them is started
            for stream in streams:
                self._start_failed(stream, exc)
            raise
        limit = asyncio.Semaphore(REBUILDS_AT_ONCE)

        def allowed(stream: int) -> bool:
            return may_start is None or may_start(stream)

        async def rebuilt(stream: int) -> None:
            try:
                async with limit:
                    try:
                        partition = await TieredPartition.recover(
                            stream,
                            self._wal,
                            metadata,
                            batches.get(stream, []),
                            read_committed=read_committed,
                            config=self.config,
                            clock_ms=self._clock_ms,
                            on_broken=self._broken_partition,
                            read_upstream=read_upstream,
                        )
                    except Exception as exc:  # requests for it stop waiting for its start
                        self._start_failed(stream, exc, not allowed(stream))
                        raise
                if stream in self._abandoned or not allowed(stream):
                    self._rebuilt_for_nobody(stream)
                    return
                _log_rebuilt(partition, metadata, batches.get(stream, []))
                # served at once: a produce held for it does not wait for the slower ones
                self.add(partition, () if tail is None else tail.entries(stream))
            finally:
                pending.discard(stream)
                self._rebuild_ended(stream)

        results = await asyncio.gather(*(rebuilt(s) for s in streams), return_exceptions=True)
        failed = next((r for r in results if isinstance(r, BaseException)), None)
        if failed is not None:
            raise failed

    def _rebuilt_for_nobody(self, stream: int) -> None:
        """A rebuild that ended after its stream was removed (`_abandoned`), or while its
        shard is being given up (`may_start`): not started."""
        if stream in self._asked_again:  # claimed again since: the retry rebuilds it
            why = RecoveryError(f"stream {stream}: its shard changed hands during its rebuild")
            self.not_rebuilt[stream] = why
        log.info("stream %d rebuilt after it was given up here: not started", stream)

    def add(self, partition: TieredPartition, tail: Sequence[TailEntry] = ()) -> None:
        """Start serving a partition; `tail`: its recovered entries not uploaded yet, for
        the log cache (those without data are noted as in the WAL)."""
        if partition.stream_id in self._partitions:
            raise ValueError(f"stream {partition.stream_id} already has a partition here")
        self._partitions[partition.stream_id] = partition
        self.not_rebuilt.pop(partition.stream_id, None)
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
        partition.stages = self.stages
        partition.start()

    def get(self, stream_id: int) -> TieredPartition | None:
        return self._partitions.get(stream_id)

    def streams(self) -> list[int]:
        """The streams served here now (the marker follower follows their partitions)."""
        return list(self._partitions)

    def known(self) -> set[int]:
        """Every stream this set holds anything of: served, being rebuilt, or whose start
        failed (a shard given up gives up these too, also one its reader has not read yet:
        a stream just cut over)."""
        return {*self._partitions, *self._recovering, *self.not_rebuilt}

    async def produce(
        self,
        stream_id: int,
        records: Records,
        acks: int,
        log_append_time: bool | None = None,
        verify: Verify | None = None,
        *,
        reference: bytes | None = None,
    ) -> ProduceResult | None:
        partition = self._partitions.get(stream_id)
        if partition is None:
            return None if acks == 0 else not_owner(stream_id)
        return await partition.produce(records, acks, log_append_time, verify, reference=reference)

    def fetched(self, stream_id: int, reference: bytes, data: memoryview) -> None:
        """The bytes of a batch its partition took by reference, fetched by the WAL
        (partition/referenced.py): on to the partition, for the log cache."""
        partition = self._partitions.get(stream_id)
        if partition is not None:
            partition.filled(reference, data)

    async def remove(self, stream_id: int) -> None:
        """Give a partition up: close it (in-flight appends are answered) and forget it
        (a failed start of it too, and a rebuild of it under way: `recover`).

        The partition stays in the set until its close has answered every write in
        flight: meanwhile a produce for the stream still reaches it and is refused
        (NOT_LEADER_OR_FOLLOWER, recorded as dropped by the partition itself), and no
        batch of the stream is handed to its next owner before the drops of the writes
        that failed here are in `holes` (docs/sequencer.md, "Across an owner change in
        flight"). A recover() of the stream meanwhile waits for the close. Removing a
        stream being closed waits for that close."""
        self.not_rebuilt.pop(stream_id, None)
        if stream_id in self._recovering:
            self._abandoned.add(stream_id)
            self._asked_again.discard(stream_id)  # only a recover() after this counts
        partition = self._partitions.get(stream_id)
        if partition is not None:
            closing = self._closing.get(stream_id)
            if closing is None:
                closing = asyncio.ensure_future(self._close_and_forget(partition))
                self._closing[stream_id] = closing
            await asyncio.shield(closing)
        if self.log_cache is not None:
            self.log_cache.drop(stream_id)

    async def _close_and_forget(self, partition: TieredPartition) -> None:
        stream = partition.stream_id
        try:
            await partition.close()
        finally:
            if self._partitions.get(stream) is partition:
                del self._partitions[stream]
            self._closing.pop(stream, None)

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


def _log_rebuilt(
    partition: TieredPartition, metadata: MetadataState, wal_batches: Sequence[BatchHeader]
) -> None:
    """One line per rebuilt partition, as Kafka logs each log it loads: where its log and
    its producer state came from, for reading a failure after the fact."""
    info = metadata.stream(partition.stream_id)
    snapshot = metadata.producer_snapshot(partition.stream_id)
    wal = (
        f"{len(wal_batches)} WAL batches [{wal_batches[0].base_offset}, "
        f"{wal_batches[-1].next_offset})"
        if wal_batches
        else "no WAL batches"
    )
    log.info(
        "stream %d rebuilt at shard %d epoch %d: log [%d, %d), committed end %s, producer "
        "state from %s, %s",
        partition.stream_id,
        metadata.shard,
        metadata.epoch,
        partition.log_start_offset,
        partition.high_watermark,
        None if info is None else info.end_offset,
        "no snapshot" if snapshot is None else f"the snapshot at {snapshot.offset}",
        wal,
    )
