"""DeleteRecords on tiered partitions (docs/tiering.md, "DeleteRecords").

A tiered partition's log is Kafka's below the cutover and the stream's from it on, so
deleting the records below offset o (-1: the high watermark) is two deletes:

- Kafka deletes its records below min(o, cutover): the partition stays in the request
  sent upstream, its offset rewritten when o is past the cutover (or -1);
- the owner of the stream's shard moves the stream's log start to o (trims.py), so the
  proxy no longer serves what objects hold below it (an offload job's copy included).

Kafka checks the offset against the partition's high watermark before it deletes
anything (`UnifiedLog.maybeIncrementLogStartOffset`): an offset past it, or negative and
not -1, is OFFSET_OUT_OF_RANGE and the log is left as it was. So does the proxy, before
Kafka's part goes upstream: an offset past the cutover is checked against the stream's
high watermark (the owner's, asked over the peer protocol when it is elsewhere;
NOT_LEADER_OR_FOLLOWER when no owner answers, and the client retries), and a refused
partition is left out of the request sent upstream, so neither part is deleted.
Kafka also refuses to delete records of a topic whose `cleanup.policy` lacks `delete` (a
compacted topic), POLICY_VIOLATION (`Partition.deleteRecordsOnLeader`): so does the
proxy, from the topic's configs as retention reads them, before either part.

The answer is Kafka's error if Kafka's part failed (the client retries the whole delete;
both parts are idempotent), else the trim's error, else the larger of the trim's new log
start (o) and Kafka's low watermark: Kafka's own log start may be past o already (its
retention, or a DeleteRecords sent to Kafka directly), and Kafka answers a delete below
its log start with its log start (`combined`). Partitions of topics that are not tiered
go upstream as they came.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass

from kio.schema.errors import ErrorCode

from proxy.apis.api21_delete_records import (
    HIGH_WATERMARK,
    DeletePartitionView,
    DeleteRecordsRequestView,
    DeleteResult,
    merge_responses,
    read_delete_records_request,
    read_delete_records_response,
    split,
)
from proxy.kafka.frames import framed
from proxy.metadata.topic_index import stream_of
from proxy.peer.messages import TrimRequest
from proxy.tiered.ports import DeletesHost
from proxy.upkeep.retention_plan import RetentionConfig
from proxy.upkeep.trims import trim_stream

Key = tuple[str, int]


@dataclass(slots=True, eq=False)
class DeletePlan:
    view: DeleteRecordsRequestView
    upstream_frame: tuple[bytes | memoryview, ...] | None  # framed, header included
    local: asyncio.Future[dict]  # (topic, partition) -> DeleteResult of the trims
    tiered: tuple[Key, ...] = ()
    passthrough_topics: tuple[str, ...] = ()  # not counted in flight

    def merge(self, api_version: int, upstream: memoryview | None, local: dict) -> bytes:
        kafka = {} if upstream is None else read_delete_records_response(api_version, upstream)[1]
        results = {key: combined(kafka.get(key), trimmed) for key, trimmed in local.items()}
        return merge_responses(api_version, self.view, upstream, results)

    def failed(self, error: BaseException) -> dict:
        return {key: DeleteResult(ErrorCode.kafka_storage_error) for key in self.tiered}


def combined(kafka: DeleteResult | None, trimmed: DeleteResult) -> DeleteResult:
    """A tiered partition's answer from Kafka's part's (None: not sent upstream, refused
    before) and the stream's trim's (module docstring)."""
    if kafka is not None and kafka.error_code:
        return kafka
    if trimmed.error_code or kafka is None or kafka.low_watermark <= trimmed.low_watermark:
        return trimmed
    return DeleteResult(trimmed.error_code, kafka.low_watermark)


def needs_high_watermark(offset: int, cutover: int) -> bool:
    """Whether deleting below `offset` must first be checked against the stream's high
    watermark: only an offset past the cutover can pass it (-1 means the high watermark,
    and Kafka's own log holds up to the cutover)."""
    return offset > cutover


def refusal(offset: int, cutover: int, high_watermark: int | None) -> int | None:
    """Kafka's error for a delete below `offset` of a tiered partition, checked before
    anything is deleted (None: go ahead). `high_watermark` is the stream's, None when no
    owner answered; only looked at when `needs_high_watermark`."""
    if offset < HIGH_WATERMARK:
        return ErrorCode.offset_out_of_range  # as Kafka answers a negative offset
    if not needs_high_watermark(offset, cutover):
        return None
    if high_watermark is None:
        return ErrorCode.not_leader_or_follower
    return ErrorCode.offset_out_of_range if offset > high_watermark else None


def policy_refusal(config: RetentionConfig | None) -> int | None:
    """Kafka's error for a delete the topic's cleanup.policy forbids (a compacted topic
    without `delete`), None to go ahead. A config not read (Kafka did not describe it,
    logged) is a retriable KAFKA_STORAGE_ERROR: the check is not guessed (it was taken as
    allowed, so a compacted topic's records could go where Kafka refuses)."""
    if config is None:
        return ErrorCode.kafka_storage_error
    return None if config.delete else ErrorCode.policy_violation


async def plan_delete_records(
    tiering: DeletesHost, header_bytes: memoryview, body: memoryview, api_version: int
) -> DeletePlan | None:
    """The plan for one DeleteRecords; None to forward it as it came. FrameError if it
    cannot be read. Waits for the high watermarks the offsets are checked against."""
    if not tiering.topics.any():
        return None
    view = read_delete_records_request(api_version, body)
    cutovers: dict[Key, tuple[int, int]] = {}  # tiered (topic, partition) -> stream, cutover
    for topic in view.topics:
        found = tiering.topics.topic(topic.topic)
        if found is None:
            continue
        for p in topic.partitions:
            stream = stream_of(found, p.partition)
            info = tiering.state(stream).stream(stream)
            if info is not None:
                cutovers[topic.topic, p.partition] = (stream, info.cutover_offset)
    if not cutovers:
        return None
    asked = [
        (topic.topic, p.partition, p.offset)
        for topic in view.topics
        for p in topic.partitions
        if (topic.topic, p.partition) in cutovers
    ]
    refused = await _refusals(tiering, asked, cutovers)
    configs = await tiering.topic_configs.get({name for name, _, _ in asked})
    for name, partition, _ in asked:
        code = policy_refusal(configs.get(name))
        if code is not None:
            refused[name, partition] = DeleteResult(code)

    def kafka_offset(topic: str, p: DeletePartitionView) -> int | None:
        tiered = cutovers.get((topic, p.partition))
        if tiered is None or HIGH_WATERMARK < p.offset <= tiered[1]:
            return p.offset
        if (topic, p.partition) in refused:
            return None  # nothing of it is deleted, as Kafka deletes nothing
        return tiered[1]  # -1 or past the cutover: all of Kafka's part

    upstream_body = split(view, kafka_offset)
    trims = [entry for entry in asked if entry[:2] not in refused]
    local = asyncio.ensure_future(_trim_all(tiering, trims, cutovers, view.timeout_ms, refused))
    frame = None if upstream_body is None else framed(header_bytes, upstream_body)
    return DeletePlan(view, frame, local, tuple(cutovers))


async def _refusals(
    tiering: DeletesHost, asked: Sequence[tuple[str, int, int]], cutovers: dict
) -> dict[Key, DeleteResult]:
    """The partitions whose delete Kafka would refuse, with its error."""
    checked = [e for e in asked if needs_high_watermark(e[2], cutovers[e[0], e[1]][1])]
    reads = tiering.reads
    ends = await asyncio.gather(
        *(reads.owner_high_watermark(cutovers[t, p][0]) for t, p, _ in checked)
    )
    high_watermarks = {(t, p): end for (t, p, _), end in zip(checked, ends, strict=True)}
    refused = {}
    for topic, partition, offset in asked:
        cutover = cutovers[topic, partition][1]
        code = refusal(offset, cutover, high_watermarks.get((topic, partition)))
        if code is not None:
            refused[topic, partition] = DeleteResult(code)
    return refused


async def _trim_all(
    tiering: DeletesHost,
    asked: Sequence[tuple[str, int, int]],
    cutovers: dict,
    timeout_ms: int,
    refused: dict[Key, DeleteResult],
) -> dict[Key, DeleteResult]:
    timeout_ms = max(timeout_ms, 0)

    async def one(topic: str, partition: int, offset: int) -> DeleteResult:
        request = TrimRequest(0, cutovers[topic, partition][0], offset, timeout_ms)
        code, log_start, _ = await trim_stream(tiering, request)
        return DeleteResult(code, log_start)

    answers = await asyncio.gather(*(one(*entry) for entry in asked))
    trimmed = {
        (topic, partition): r for (topic, partition, _), r in zip(asked, answers, strict=True)
    }
    return {**refused, **trimmed}
