"""ListOffsets for tiered partitions (docs/tiering.md, "Reading a tiered topic"): every
answer is Kafka's for the same log.

A tiered partition's log is Kafka's part below the cutover C, then the stream. Each
tiered partition of a request is routed (`route`):

- HERE, answered from the stream alone, when the objects hold all of [log start, C)
  (the offload job moved it, or retention or DeleteRecords moved the log start to C or
  past it; Kafka's copy may be gone): EARLIEST and EARLIEST_LOCAL (-4; no remote log on
  Kafka's side, so the same) answer the log start; a timestamp and MAX_TIMESTAMP (-3)
  are searched in the objects from the log start on (MAX_TIMESTAMP: from the start of the
  range holding it), migrated ranges included. LATEST is
  always answered here: the high watermark (the owner's; NOT_LEADER_OR_FOLLOWER when the
  owner is away, the committed end may be below its acks), or with isolation_level
  READ_COMMITTED the last stable offset (the owner's, as Kafka answers it: the first
  offset of the oldest open transaction, else the high watermark);
- BOTH, otherwise, for EARLIEST, -4 and a timestamp, and always for MAX_TIMESTAMP (Kafka
  counts the segment holding its log start whole, so its part may hold the log's largest
  timestamp below the log start, even once the log start is past the cutover; Kafka's
  answer then is that record, and the passthrough's would be too): the entry also goes to
  Kafka as it came (so Kafka's answer keeps its timestamp and leader epoch), the stream's
  part is searched meanwhile, and `combine` completes Kafka's answer with it. Kafka's
  answer is clamped at C: its log may hold data past C that is not the partition's (a
  transaction marker its coordinator wrote, records written to a broker directly), so for
  an offset at or past C from Kafka the stream's answer is taken instead (not noted in
  `beyond_cutover`: markers put it there, as expected). For MAX_TIMESTAMP such an answer
  hides the largest timestamp below C: once Kafka answered (`OffsetsPlan.
  upstream_answered`), where Kafka alone holds part of [log start, C) and the stream's
  largest does not beat Kafka's, Kafka's part's largest is asked of Kafka's leader
  (kafka_part.py: timestamp lookups, nearly always one) and compared with the stream's;
- the other special timestamps (-5 LATEST_TIERED, -6 EARLIEST_PENDING_UPLOAD) go to Kafka
  alone: Kafka keeps no remote log of the topic, and answers them as for any topic.

Timestamps follow Kafka's rules exactly (`proxy/records/timestamp_search.py`): the first
record, in offset order, at or after the target and at or above the log start, inside
compressed batches too; MAX_TIMESTAMP is the largest over the whole log, Kafka's part
first on a tie. With isolation_level READ_COMMITTED such an answer is a record below the
last stable offset, else none, as Kafka's (`below_stable`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from dataclasses import dataclass

from kio.schema.errors import ErrorCode

from proxy.apis.api02_list_offsets import (
    EARLIEST_LOCAL_TIMESTAMP,
    MAX_TIMESTAMP,
    ListOffsetsRequestView,
    OffsetsResult,
    Route,
    TieredOffsetsPartition,
    merge_responses,
    read_list_offsets_request,
    read_list_offsets_response,
    split,
)
from proxy.kafka.frames import FrameError, framed
from proxy.metadata.topic_index import stream_of
from proxy.objects.format import ObjectFormatError
from proxy.objects.store import ObjectStoreError
from proxy.records.batches import CorruptBatchError
from proxy.records.timestamp_search import Found
from proxy.tiered.kafka_part import KafkaRefused, kafka_lookup, largest_below
from proxy.tiered.outcome import pass_outcome
from proxy.tiered.ports import ReadHandlers
from proxy.tiered.timestamps import OwnerAway, StreamSearch

log = logging.getLogger("tierproxy.reads")

LATEST, EARLIEST = -1, -2
READ_COMMITTED = 1  # ListOffsets' isolation_level
_FIRST_VERSION = {MAX_TIMESTAMP: 7, EARLIEST_LOCAL_TIMESTAMP: 8}  # older: Kafka refuses it
_EARLIEST = (EARLIEST, EARLIEST_LOCAL_TIMESTAMP)
_ANY_TIMESTAMP = -(1 << 63)  # every record's timestamp is at least this


def route(
    tiering: ReadHandlers, topic: str, partition: int, timestamp: int, api_version: int
) -> Route:
    """Where this partition's entry is answered (see the module docstring)."""
    found = tiering.topics.topic(topic)
    if found is None:
        return Route.UPSTREAM
    if timestamp < 0 and timestamp not in (
        LATEST,
        EARLIEST,
        MAX_TIMESTAMP,
        EARLIEST_LOCAL_TIMESTAMP,
    ):
        return Route.UPSTREAM
    if api_version < _FIRST_VERSION.get(timestamp, 0):
        return Route.UPSTREAM  # Kafka answers UNSUPPORTED_VERSION
    stream = stream_of(found, partition)
    state = tiering.state(stream)
    if state.stream(stream) is None:
        return Route.UPSTREAM  # not cut over yet: Kafka's log is the whole log
    if timestamp == MAX_TIMESTAMP:
        return Route.BOTH  # Kafka's segment holding its log start counts whole
    if timestamp == LATEST or not state.backfill_gaps(stream):
        return Route.HERE
    return Route.BOTH


def epoch_at(offset: int, cutover: int, current_epoch: int, stamped: int) -> int:
    """The leader epoch Kafka answers with `offset` of a tiered partition: its epoch
    cache's entry for the offset. Every epoch since the cutover starts at the cutover
    (Kafka's log end), so at or past it that is the current leader epoch; below it, the
    epoch Kafka stamped on the batch (a migrated batch keeps it in the objects)."""
    return current_epoch if offset >= cutover else stamped


@dataclass(frozen=True, slots=True)
class StreamPart:
    """The stream's part of an answer, for `combine` (or alone, routed HERE)."""

    error_code: int
    cutover: int = -1
    log_start: int = -1
    found: Found | None = None  # the stream's record for a timestamp or MAX_TIMESTAMP
    start_held: bool = False  # an object holds the log start (EARLIEST only)
    current_epoch: int = -1  # the partition's leader epoch now (leader_epochs.py)
    start_epoch: int = -1  # EARLIEST below the cutover: the epoch of the log start's batch
    last_stable: int | None = None  # READ_COMMITTED: the last stable offset (`below_stable`)
    kafka_alone: bool = False  # MAX_TIMESTAMP: Kafka alone holds part of [log start, C)
    # MAX_TIMESTAMP past a Kafka answer at or past C: Kafka's part's largest below C, if
    # it reaches the stream's (`learn_kafka_part`)
    kafka_below: Found | None = None

    def needs_kafka_part(self, timestamp: int, kafka: OffsetsResult | None) -> bool:
        """Whether Kafka's answer hides its part's largest timestamp below the cutover,
        which could still be the answer (see the module docstring)."""
        if timestamp != MAX_TIMESTAMP or not self.kafka_alone or self.error_code:
            return False
        if kafka is None or kafka.error_code != ErrorCode.none or kafka.offset < self.cutover:
            return False
        return self.found is None or self.found.timestamp <= kafka.timestamp

    def alone(self, timestamp: int) -> OffsetsResult:
        """The answer when the stream holds the whole log."""
        if self.error_code != ErrorCode.none:
            return OffsetsResult(self.error_code)
        if timestamp in _EARLIEST:
            return self.earliest(self.log_start)
        if self.found is None:
            return OffsetsResult(ErrorCode.none)  # no record at or after it: Kafka answers -1 too
        found = self.found
        epoch = epoch_at(found.offset, self.cutover, self.current_epoch, found.leader_epoch)
        return OffsetsResult(ErrorCode.none, found.timestamp, found.offset, epoch)

    def earliest(self, log_start: int, stamped: int | None = None) -> OffsetsResult:
        """EARLIEST at `log_start`; below the cutover with the epoch of the batch there
        (`stamped`, else the one read from the objects)."""
        stamped = self.start_epoch if stamped is None else stamped
        epoch = epoch_at(log_start, self.cutover, self.current_epoch, stamped)
        return OffsetsResult(ErrorCode.none, -1, log_start, epoch)


def combine(timestamp: int, kafka: OffsetsResult | None, part: StreamPart) -> OffsetsResult:
    """Kafka's answer for its part of the log (below the cutover), completed with the
    stream's."""
    if kafka is None or kafka.error_code != ErrorCode.none:
        return kafka if kafka is not None else OffsetsResult(ErrorCode.not_leader_or_follower)
    if part.error_code != ErrorCode.none:  # retriable (the topic untiered since the
        # split: asked again, Kafka answers it whole); never an offset of a part unknown
        return OffsetsResult(part.error_code)
    cutover = part.cutover
    if timestamp in _EARLIEST:
        if kafka.offset > cutover:  # Kafka's log start past its part: the stream's
            return part.earliest(max(cutover, part.log_start))
        if part.log_start > kafka.offset or (part.start_held and part.log_start < kafka.offset):
            # trimmed below the cutover while Kafka's copy lives on, or migrated and gone
            # from Kafka: what a Fetch from that offset is served (TieredReads.fetch_here)
            if part.start_held:
                return part.earliest(part.log_start)
            # Kafka's batch: the epoch of its entry for its own log start, most likely
            # the same one (Kafka is not asked for this offset's)
            return part.earliest(part.log_start, kafka.leader_epoch)
        return kafka
    below = 0 <= kafka.offset < cutover
    if timestamp == MAX_TIMESTAMP:
        stream = part.found
        if below and (stream is None or stream.timestamp <= kafka.timestamp):
            return kafka  # Kafka's part first on a tie, as Kafka's maxBy keeps the first
        hidden = part.kafka_below  # Kafka answered past C: its part's largest below C
        if (
            not below
            and hidden is not None
            and (stream is None or stream.timestamp <= hidden.timestamp)
        ):
            return OffsetsResult(
                ErrorCode.none, hidden.timestamp, hidden.offset, hidden.leader_epoch
            )
        return part.alone(timestamp)
    return kafka if below else part.alone(timestamp)


def below_stable(answer: OffsetsResult, last_stable: int | None) -> OffsetsResult:
    """A timestamp's answer as Kafka gives it to READ_COMMITTED: a record at or past the
    last stable offset is not fetchable, so none is found (Partition.
    fetchOffsetForTimestamp filters on its last fetchable offset)."""
    if last_stable is None or answer.error_code != ErrorCode.none or answer.offset < last_stable:
        return answer
    return OffsetsResult(ErrorCode.none)


async def stream_part(tiering: ReadHandlers, item: TieredOffsetsPartition) -> StreamPart:
    """The stream's part of one partition's answer, with the partition's leader epoch."""
    part, epoch = await asyncio.gather(
        _stream_part(tiering, item), tiering.leader_epochs.epoch(item.topic, item.partition)
    )
    return dataclasses.replace(part, current_epoch=epoch)


async def _stream_part(tiering: ReadHandlers, item: TieredOffsetsPartition) -> StreamPart:
    found = tiering.topics.topic(item.topic)
    stream = None if found is None else stream_of(found, item.partition)
    state = None if stream is None else tiering.state(stream)
    info = None if state is None else state.stream(stream)
    if info is None:  # untiered since the split
        return StreamPart(ErrorCode.not_leader_or_follower)
    timestamp = item.timestamp
    held = timestamp in _EARLIEST and bool(
        state.objects_for(stream, info.log_start_offset, limit=1)
    )
    part = StreamPart(ErrorCode.none, info.cutover_offset, info.log_start_offset, start_held=held)
    search = StreamSearch(tiering, stream)
    if timestamp in _EARLIEST and (not held or part.log_start >= part.cutover):
        return part

    # Kafka alone holds offsets below the cutover that no object holds; else the
    # objects hold all of the log from its start
    start = (
        max(info.cutover_offset, info.log_start_offset)
        if state.backfill_gaps(stream)
        else info.log_start_offset
    )
    where = f"{found.name}-{item.partition}: ListOffsets timestamp {timestamp}"
    try:
        if timestamp in _EARLIEST:  # migrated ranges below the cutover: their batch's epoch
            hit = await search.first_at_or_after(_ANY_TIMESTAMP, info.log_start_offset)
            epoch = -1 if hit is None else hit.leader_epoch
            return dataclasses.replace(part, start_epoch=epoch)
        if timestamp == MAX_TIMESTAMP:
            # the range holding the start counts whole, as Kafka counts the segment
            # holding its log start whole (deleted records included)
            holding = state.objects_for(stream, start, limit=1)
            hit = await search.max_timestamp(min([start, *(r.start_offset for r in holding)]))
        else:
            hit = await search.first_at_or_after(timestamp, start)
    except OwnerAway:
        return StreamPart(ErrorCode.not_leader_or_follower)
    except (ObjectFormatError, ObjectStoreError, CorruptBatchError) as exc:
        log.error("%s: %s", where, exc)
        return StreamPart(ErrorCode.kafka_storage_error)
    kafka_alone = (
        timestamp == MAX_TIMESTAMP
        and info.log_start_offset < info.cutover_offset
        and bool(state.backfill_gaps(stream))
    )
    return StreamPart(
        ErrorCode.none, info.cutover_offset, info.log_start_offset, hit, kafka_alone=kafka_alone
    )


async def learn_kafka_part(
    tiering: ReadHandlers, item: TieredOffsetsPartition, kafka: OffsetsResult, part: StreamPart
) -> StreamPart:
    """`part` with Kafka's part's largest timestamp below the cutover (`kafka_below`),
    asked of Kafka's leader, when Kafka's own answer lies at or past the cutover; with
    NOT_LEADER_OR_FOLLOWER (retriable: the client asks again) when Kafka cannot say."""
    floor = 0 if part.found is None else max(part.found.timestamp, 0)
    topic, partition = item.topic, item.partition
    try:
        async with tiering.at_leader(topic, partition) as send:

            async def lookup(timestamp: int) -> Found | None:
                return await kafka_lookup(send, topic, partition, timestamp)

            found = await largest_below(
                part.cutover, lookup, floor, kafka.timestamp, part.log_start
            )
    except (LookupError, OSError, TimeoutError, KafkaRefused) as exc:
        log.info("%s-%d: MAX_TIMESTAMP of Kafka's part not learned: %r", topic, partition, exc)
        return StreamPart(ErrorCode.not_leader_or_follower)
    return dataclasses.replace(part, kafka_below=found)


async def _latest(
    tiering: ReadHandlers, item: TieredOffsetsPartition, isolation_level: int
) -> OffsetsResult:
    """The high watermark, or the last stable offset for READ_COMMITTED, with the
    current leader epoch (Kafka's Partition answers its leader epoch with LATEST)."""
    found = tiering.topics.topic(item.topic)
    stream = None if found is None else stream_of(found, item.partition)
    if stream is None or tiering.state(stream).stream(stream) is None:
        return OffsetsResult(ErrorCode.not_leader_or_follower)
    reads = tiering.reads
    end_of = reads.owner_last_stable if isolation_level == READ_COMMITTED else None
    end, epoch = await asyncio.gather(
        (end_of or reads.owner_high_watermark)(stream),
        tiering.leader_epochs.epoch(item.topic, item.partition),
    )
    if end is None:  # the owner is away: the committed end may be below its acks
        return OffsetsResult(ErrorCode.not_leader_or_follower)
    return OffsetsResult(ErrorCode.none, -1, end, epoch)


@dataclass(slots=True, eq=False)
class OffsetsPlan:
    """`local`: (topic, partition) -> OffsetsResult, or StreamPart if BOTH. With a
    MAX_TIMESTAMP partition routed BOTH, `local` is done only once Kafka answered
    (`upstream_answered`) and what its answer hides was asked of Kafka (`learn_kafka_part`);
    `parts` are the stream's parts, under way meanwhile."""

    view: ListOffsetsRequestView
    upstream_frame: tuple[bytes | memoryview, ...] | None  # framed, header included
    local: asyncio.Future[dict]
    tiered: tuple[TieredOffsetsPartition, ...] = ()
    passthrough_topics: tuple[str, ...] = ()  # not counted in flight
    parts: asyncio.Future[dict] | None = None
    tiering: ReadHandlers | None = None

    def upstream_answered(self, api_version: int, upstream: memoryview) -> None:
        """Kafka's answer is here: learn what it hides, then `local` is done."""
        parts = self.parts
        if parts is None or self.local.done():
            return
        try:
            kafka = read_list_offsets_response(api_version, upstream)
        except FrameError:  # merged as it came: `combine` sees no Kafka answer
            kafka = {}
        task = asyncio.ensure_future(self._learn(parts, kafka))
        task.add_done_callback(lambda t: pass_outcome(t, self.local))

    async def _learn(self, parts: asyncio.Future[dict], kafka: dict) -> dict:
        local = dict(await parts)
        asking: list[tuple[TieredOffsetsPartition, StreamPart, OffsetsResult]] = []
        for item in self.tiered:
            key = (item.topic, item.partition)
            part, answer = local.get(key), kafka.get(key)
            if isinstance(part, StreamPart) and part.needs_kafka_part(item.timestamp, answer):
                asking.append((item, part, answer))
        assert self.tiering is not None
        learned = await asyncio.gather(
            *(learn_kafka_part(self.tiering, item, answer, part) for item, part, answer in asking)
        )
        for (item, _, _), part in zip(asking, learned, strict=True):
            local[(item.topic, item.partition)] = part
        return local

    def merge(self, api_version: int, upstream: memoryview | None, local: dict) -> bytes:
        """The answer: HERE partitions as `local` has them, BOTH ones Kafka's answer
        completed with the stream's part, the rest upstream's."""
        kafka = {}
        if upstream is not None and any(p.also_upstream for p in self.tiered):
            kafka = read_list_offsets_response(api_version, upstream)
        results = {}
        for item in self.tiered:
            key = (item.topic, item.partition)
            answer = local.get(key)
            if isinstance(answer, StreamPart):
                combined = combine(item.timestamp, kafka.get(key), answer)
                answer = below_stable(combined, answer.last_stable)
            if answer is not None:
                results[key] = answer
        return merge_responses(api_version, self.view, upstream, results)

    def failed(self, error: BaseException) -> dict:
        return {
            (p.topic, p.partition): OffsetsResult(ErrorCode.kafka_storage_error)
            for p in self.tiered
        }


def plan_list_offsets(
    tiering: ReadHandlers, header_bytes: memoryview, body: memoryview, api_version: int
) -> OffsetsPlan | None:
    """The plan for one ListOffsets; None to forward it as it came. FrameError if it
    cannot be read."""
    if not tiering.topics.any():
        return None
    view = read_list_offsets_request(api_version, body)
    upstream_body, tiered = split(
        view, lambda topic, p: route(tiering, topic, p.partition, p.timestamp, api_version)
    )
    if not tiered:
        return None
    parts = asyncio.ensure_future(_answer_all(tiering, tiered, view.isolation_level))
    frame = None if upstream_body is None else framed(header_bytes, upstream_body)
    if frame is None or not any(p.also_upstream and p.timestamp == MAX_TIMESTAMP for p in tiered):
        return OffsetsPlan(view, frame, parts, tuple(tiered))
    local: asyncio.Future[dict] = asyncio.get_running_loop().create_future()
    return OffsetsPlan(view, frame, local, tuple(tiered), parts=parts, tiering=tiering)


async def _answer_all(tiering: ReadHandlers, tiered, isolation_level: int) -> dict:
    answers = await asyncio.gather(*(_answer(tiering, p, isolation_level) for p in tiered))
    return {(p.topic, p.partition): a for p, a in zip(tiered, answers, strict=True)}


async def _answer(
    tiering: ReadHandlers, item: TieredOffsetsPartition, isolation_level: int
) -> OffsetsResult | StreamPart:
    if item.timestamp == LATEST:
        return await _latest(tiering, item, isolation_level)
    part = await stream_part(tiering, item)
    committed = isolation_level == READ_COMMITTED and item.timestamp not in _EARLIEST
    if committed and part.error_code == ErrorCode.none:
        found = tiering.topics.topic(item.topic)
        stream = stream_of(found, item.partition) if found is not None else None
        stable = None if stream is None else await tiering.reads.owner_last_stable(stream)
        if stable is None:  # the owner is away: what is stable is not known
            return OffsetsResult(ErrorCode.not_leader_or_follower)
        part = dataclasses.replace(part, last_stable=stable)
    if item.also_upstream:
        return part
    return below_stable(part.alone(item.timestamp), part.last_stable)
