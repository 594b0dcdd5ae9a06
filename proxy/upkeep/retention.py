"""Retention of tiered streams, run by each shard's owner (docs/tiering.md, "Retention").

Every `tiering.retention_check_interval_s`, for each stream of each shard this proxy owns:

1. the topic's `retention.ms`, `retention.bytes` and `cleanup.policy` as Kafka resolves
   them (DescribeConfigs gives the effective value: the topic's override, else the broker
   default), read by the service's `TopicConfigs` (topic_configs.py) and kept for
   `CONFIG_MAX_AGE_S`;
2. the facts of each committed range of the stream, the offload job's below the cutover
   as well as the uploads' from it on (the log is one log): its size (the stream's blocks
   in the object's index) and its largest timestamp (the batch headers of its last block:
   one ranged read through the block cache), kept for as long as the range lives;
3. `plan_trim` (retention_plan.py) says which of the oldest ranges go; the owner writes
   a StreamTrim to the end of the last one and moves its partition's log start there.
   Only committed ranges are looked at, so the log start never passes the committed end.
4. once the trim is written, Kafka's copy below min(new log start, cutover) is deleted
   (DeleteRecords, `TopicConfigsPort.delete_below`): what the partition no longer holds,
   Kafka no longer answers either (a timestamp lookup, MAX_TIMESTAMP, EARLIEST), as the
   passthrough topic's own retention would have it, and Kafka frees the disk. One that
   fails (Kafka away, the proxy's user lacking Delete on the topic) is tried again at the
   start of every pass until it succeeds; until then the read path answers a Kafka that
   starts below the log start as it must (docs/tiering.md, "Reads after a trim").
   DeleteRecords names a topic by name, so the topic Kafka has under the stream's name
   is checked first to be the stream's (its topic id): a topic deleted and created again
   under that name holds other records, which are never deleted (left alone, logged).

The objects a trim leaves with no range are deleted like every other object no range
uses any more, by the compactor's garbage collector (object_gc.py) after
`tiering.object_delete_grace_s`, so that readers which began before the trim finish.
Below the log start Kafka keeps trimming its own copy too, by its own retention.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from aiokafka.errors import KafkaError

from proxy.clock import now_ms
from proxy.metadata.state import MetadataState
from proxy.metadata.store import ShardFenced, ShardOwner
from proxy.metadata.streams import StreamInfo, StreamRange, topic_shard
from proxy.objects.format import ObjectFormatError, find_entries
from proxy.objects.store import ObjectStoreError
from proxy.records.batches import CorruptBatchError, iter_batches
from proxy.upkeep.ports import RetentionHost
from proxy.upkeep.retention_plan import (
    RangeFacts,
    TrimPlan,
    plan_trim,
)
from proxy.upkeep.trims import write_trim

log = logging.getLogger("tierproxy.retention")

RangeKey = tuple[int, int, int, int]  # object id, stream, start, end


@dataclass(slots=True)
class RetentionReport:
    """What one pass did: stream -> new log start."""

    trimmed: dict[int, int] = field(default_factory=dict)
    # stream -> Kafka's low watermark after deleting its copy below the new log start
    kafka_trimmed: dict[int, int] = field(default_factory=dict)


class Retention:
    """The retention task of one proxy (`run`), or one pass of it (`run_once`)."""

    def __init__(self, service: RetentionHost, *, clock_ms: Callable[[], int] = now_ms) -> None:
        self.service = service
        self.interval_s = service.config.retention_check_interval_s
        self.configs = service.topic_configs  # closed by the service
        self._clock_ms = clock_ms
        self._facts: dict[RangeKey, RangeFacts] = {}
        # stream -> (topic, offset): Kafka's copy still to delete below offset
        self._kafka_behind: dict[int, tuple[str, int]] = {}
        # streams whose name Kafka gives to another topic now: warned once
        self._renamed: set[int] = set()

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                await self.run_once()
            except (KafkaError, ShardFenced, ObjectStoreError, OSError) as exc:
                log.warning("retention: %r; trying again in %s s", exc, self.interval_s)

    async def run_once(
        self, now_ms: int | None = None, *, refresh_configs: bool = False
    ) -> RetentionReport:
        """One pass of trims over the shards owned here. `now_ms` is the time retention.ms
        is measured from (default: the clock)."""
        now = self._clock_ms() if now_ms is None else now_ms
        report = RetentionReport()
        for stream, (topic, offset) in list(self._kafka_behind.items()):
            info = self.service.state(stream).stream(stream)
            if info is None:  # untiered or deleted
                del self._kafka_behind[stream]
                continue
            await self._trim_kafka(info, topic, offset, report)
        owners = self.service.owned_shards()
        live: set[RangeKey] = set()
        for owner in owners.values():
            await self._trim_shard(owner, now, refresh_configs, report, live)
        for key in set(self._facts) - live:
            del self._facts[key]
        return report

    # -- trims ---------------------------------------------------------------------------

    async def _trim_shard(
        self,
        owner: ShardOwner,
        now_ms: int,
        refresh: bool,
        report: RetentionReport,
        live: set[RangeKey],
    ) -> None:
        state = owner.state
        streams = [info for s in state.stream_ids() if (info := state.stream(s)) is not None]
        names = {info.stream_id: self._topic_name(info) for info in streams}
        configs = await self.configs.get({n for n in names.values() if n}, refresh=refresh)
        for info in streams:
            ranges = list(state.committed_ranges(info.stream_id))
            live.update(_range_key(r) for r in ranges)
            config = configs.get(names[info.stream_id] or "")
            if config is None or config.unlimited or not ranges:
                continue
            try:
                facts = [await self._range_facts(state, r) for r in ranges]
            except (ObjectFormatError, ObjectStoreError) as exc:
                log.error("retention of stream %d: %s", info.stream_id, exc)
                continue
            plan = plan_trim(facts, now_ms, config)
            name = names[info.stream_id]
            if plan.log_start_offset is not None and name is not None:
                await self._trim(owner, info, name, plan, now_ms, report)

    def _topic_name(self, info: StreamInfo) -> str | None:
        """The stream's topic name, from its mode record (whatever the mode is now)."""
        readers = self.service.readers
        mode = readers[topic_shard(info.topic_id, len(readers))].state.topic(info.topic_id)
        return None if mode is None else mode.topic

    async def _range_facts(self, state: MetadataState, r: StreamRange) -> RangeFacts:
        """Size and largest timestamp of a committed range: its blocks in the object's
        index, the batch headers of its last block."""
        key = _range_key(r)
        known = self._facts.get(key)
        if known is not None:
            return known
        cache = self.service.block_cache
        assert cache is not None  # the service is started
        name = r.object_key
        index = await cache.index(name, r.object_size)
        blocks = [
            e
            for e in find_entries(index, r.stream_id, r.start_offset)
            if e.start_offset < r.end_offset
        ]
        if not blocks or blocks[-1].end_offset < r.end_offset:
            raise ObjectFormatError(
                name,
                f"committed to hold offsets [{r.start_offset}, {r.end_offset}) of stream "
                f"{r.stream_id}; its blocks do not",
            )
        [block] = await cache.blocks(name, blocks[-1:], 1, reader_id=("retention", r.stream_id))
        try:
            stamps = [
                h.max_timestamp for h, _ in iter_batches(block) if h.base_offset < r.end_offset
            ]
        except CorruptBatchError as exc:
            cache.forget(name)
            raise ObjectFormatError(name, f"last block of stream {r.stream_id}: {exc}") from exc
        largest = max(stamps, default=-1)
        if largest < 0:  # no timestamp: as Kafka, which then takes the segment's mtime
            commit = state.object_commit(r.object_id)
            largest = commit.committed_at_ms if commit is not None else self._clock_ms()
        facts = RangeFacts(r.start_offset, r.end_offset, sum(e.size for e in blocks), largest)
        self._facts[key] = facts
        return facts

    async def _trim(
        self,
        owner: ShardOwner,
        info: StreamInfo,
        topic: str,
        plan: TrimPlan,
        now_ms: int,
        report: RetentionReport,
    ) -> None:
        assert plan.log_start_offset is not None
        stream = info.stream_id
        end = owner.state.stream_end(stream)
        log_start = plan.log_start_offset if end is None else min(plan.log_start_offset, end)
        if log_start <= info.log_start_offset:
            return
        partitions = self.service.partitions
        served = partitions is not None and partitions.get(stream) is not None
        if not served and owner.state.producer_snapshot(stream) is not None:
            # being started here (a claim's rebuild): a trim now would go without a
            # snapshot and drop the one there (docs/sequencer.md); the next pass trims
            log.debug("retention of stream %d: its partition is not started yet", stream)
            return
        verdict = await write_trim(self.service, owner, info, log_start, now_ms)
        if not verdict.accepted:
            log.warning("retention of stream %d: trim to %d: %s", stream, log_start, verdict.reason)
            return
        report.trimmed[stream] = log_start
        log.info(
            "retention of stream %d: log start %d -> %d (%d ranges by retention.ms, %d by "
            "retention.bytes)",
            stream,
            info.log_start_offset,
            log_start,
            plan.by_time,
            plan.by_size,
        )
        # Also when the log start was past the cutover before: Kafka's copy is then gone
        # unless a client's DeleteRecords trimmed the stream while its Kafka part failed,
        # which this request mends (one admin request per trim).
        below = min(log_start, info.cutover_offset)
        if below > 0:
            await self._trim_kafka(info, topic, below, report)

    async def _trim_kafka(
        self, info: StreamInfo, topic: str, offset: int, report: RetentionReport
    ) -> None:
        """Kafka's copy of the stream's partition below `offset` deleted, or remembered to
        be tried again next pass (a later trim of the stream replaces it). Never in a
        topic other than the stream's: one Kafka gives the name to now is left alone."""
        stream, partition = info.stream_id, info.partition
        self._kafka_behind[stream] = (topic, offset)
        low = None
        try:
            # None: deleted, nothing of Kafka's to delete
            topic_id = (await self.service.describe_topics([topic])).topic_id(topic)
            if topic_id == info.topic_id:
                low = await self.service.topic_configs.delete_below(topic, partition, offset)
        except (LookupError, KafkaError, OSError, TimeoutError) as exc:
            log.warning(
                "retention of stream %d: Kafka's copy of %s-%d below %d not deleted: %r; "
                "next pass tries again",
                stream,
                topic,
                partition,
                offset,
                exc,
            )
            return
        if low is None:  # the name is another topic's now, or nobody's
            del self._kafka_behind[stream]
            if stream not in self._renamed:
                self._renamed.add(stream)
                log.warning(
                    "retention of stream %d: Kafka's topic %s is %s, not the stream's topic "
                    "%s (deleted, and created again?): its records are left alone",
                    stream,
                    topic,
                    "gone" if topic_id is None else f"topic id {topic_id}",
                    info.topic_id,
                )
            return
        if self._kafka_behind.get(stream) == (topic, offset):
            del self._kafka_behind[stream]
        report.kafka_trimmed[stream] = low


def _range_key(r: StreamRange) -> RangeKey:
    return (r.object_id, r.stream_id, r.start_offset, r.end_offset)
