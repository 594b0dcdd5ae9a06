"""ListOffsets (api key 2), v1-v11 (all kio 0.6.5 has, all the proxy advertises): split a
request mixing tiered and passthrough partitions, and merge the answers.

v2 adds isolation_level and the answer's throttle time; v4 current_leader_epoch (answers:
leader_epoch); v6 is flexible; v7-v9 and v11 only admit new special timestamps (below);
v10 adds timeout_ms (KIP-1075). v0 (max_num_offsets, old_style_offsets) is not served.

`read_list_offsets_request` locates every partition's entry; `split` keeps the passthrough
entries as they came (tags kio does not know included), rewriting only array counts, and
routes each tiered one: answered here only, or (BOTH) also sent upstream as it came, so
Kafka answers for its part of the log and the caller completes the answer with the
stream's part, from `read_list_offsets_response`;
`merge_responses` answers every partition of the request, in its order: upstream's
entries as slices of its answer, tiered ones written; `read_list_offsets_response` gives
upstream's values to a caller that decides from them. The answer names no broker, so it
needs no rewriter.

A partition with no answer (upstream left it out, or no tiered result was given) is
answered NOT_LEADER_OR_FOLLOWER with -1 timestamp, offset and epoch, as Kafka answers a
partition it cannot serve (ListOffsetsRequest.getErrorResponse). It is the one code every
client below retries after refreshing metadata; leaving the partition out, or answering
UNKNOWN_SERVER_ERROR, breaks some of them:
- Java consumer, clients/.../consumer/internals/OffsetFetcherUtils.java
  `handleListOffsetResponse`: NOT_LEADER_OR_FOLLOWER is among the expected codes (retried,
  metadata refreshed); any other code is retried with a warning. A partition left out is
  neither fetched nor retried: `fetchOffsetsByTimes` in OffsetFetcher.java (and
  OffsetsRequestManager.java) keeps only the partitions to retry, so endOffsets and
  beginningOffsets return without it, and a position reset waits request.timeout.ms.
- Java admin, clients/.../admin/internals/ListOffsetsHandler.java `handleResponse`:
  NOT_LEADER_OR_FOLLOWER looks the leader up again and retries; UNKNOWN_SERVER_ERROR (not
  retriable) fails the partition, and so does leaving it out ("did not contain a result").
- librdkafka, src/rdkafka_request.c `rd_kafka_handle_ListOffsets`: NOT_LEADER_FOR_PARTITION
  refreshes metadata and src/rdkafka_partition.c `rd_kafka_toppar_handle_Offset` queries
  again in 500 ms; UNKNOWN (-1, `rd_kafka_err_action`'s default) and a partition left out
  (__UNKNOWN_PARTITION) are permanent: auto.offset.reset runs and the application gets
  the error. The admin API hands partition errors to the application.
- aiokafka, aiokafka/consumer/fetcher.py `_proc_offset_request`: NotLeaderForPartitionError
  is retriable and refreshes metadata; UnknownError is raised to the caller of
  end_offsets / offsets_for_times; a partition left out raises KeyError in
  `_update_fetch_positions`, which ends the fetcher task. It sends v0-v3 (v1-v3 here).
"""

from __future__ import annotations

import importlib
import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import IntEnum
from functools import cache

from kio.schema.errors import ErrorCode

from proxy.apis.merge import NO_TAGS, Pieces, merge_partitions
from proxy.apis.topics import TopicView, kept_topic, read_topics
from proxy.kafka.api_keys import ApiKey
from proxy.kafka.codec import load_response_types, load_types, response_type
from proxy.kafka.frames import malformed
from proxy.kafka.wire import (
    INT32,
    expect_end,
    read_count,
    read_int32,
    read_topic_key,
    read_topic_name,
    skip,
    skip_tagged_fields,
    write_array_length,
)

API_KEY = ApiKey.LIST_OFFSETS
REQUESTS = load_types(API_KEY, "request")
RESPONSES = load_response_types(API_KEY)

# The special timestamps (ListOffsetsRequest.java), each with the first version admitting it.
LATEST_TIMESTAMP = -1  # the high watermark, or the last stable offset if read_committed
EARLIEST_TIMESTAMP = -2  # the log start offset
MAX_TIMESTAMP = -3  # v7+: the record with the largest timestamp (KIP-734)
EARLIEST_LOCAL_TIMESTAMP = -4  # v8+: the local log start offset (KIP-405)
LATEST_TIERED_TIMESTAMP = -5  # v9+: the last offset in remote storage (KIP-1005)
EARLIEST_PENDING_UPLOAD_TIMESTAMP = -6  # v11+: the first offset not yet tiered (KIP-1023)

Span = slice  # of the request body


class Route(IntEnum):
    """Where a partition's entry goes (False and True read as UPSTREAM and HERE)."""

    UPSTREAM = 0  # a passthrough partition, or one Kafka alone answers
    HERE = 1  # answered here only
    BOTH = 2  # Kafka answers its part of the log, the caller completes it


@dataclass(frozen=True, slots=True)
class OffsetsPartitionView:
    partition: int
    current_leader_epoch: int  # -1 before v4
    timestamp: int  # ms since the epoch, or one of the special timestamps
    span: Span  # the whole entry, its (v6+) tagged fields included


@dataclass(frozen=True, slots=True)
class ListOffsetsRequestView:
    api_version: int
    body: memoryview
    replica_id: int  # -1 for a consumer, -2 for a debugging tool
    isolation_level: int  # 0 (read_uncommitted) before v2
    timeout_ms: int | None  # v10+
    topics: tuple[TopicView[str, OffsetsPartitionView], ...]  # tags from v6
    topics_span: Span  # the topics array, its count included; timeout and tags follow


@dataclass(frozen=True, slots=True)
class TieredOffsetsPartition:
    topic: str
    partition: int
    timestamp: int
    current_leader_epoch: int = -1
    also_upstream: bool = False  # routed BOTH: upstream answers it too


@dataclass(frozen=True, slots=True)
class OffsetsResult:
    """A tiered partition's answer; -1 means none (no offset found for the timestamp)."""

    error_code: int
    timestamp: int = -1
    offset: int = -1
    leader_epoch: int = -1  # v4+


UNANSWERED = OffsetsResult(ErrorCode.not_leader_or_follower.value)  # see the module docstring


class _Layout:
    """Which fields a version has, read off kio's classes for it."""

    def __init__(self, api_version: int) -> None:
        request = response_type(REQUESTS, API_KEY, api_version)  # FrameError if not served
        self.version, self.flexible = api_version, request.__flexible__
        fields = request.__dataclass_fields__
        self.isolation_level = "isolation_level" in fields
        self.timeout = "timeout" in fields
        asked = importlib.import_module(request.__module__).ListOffsetsPartition
        epoch = "current_leader_epoch" in asked.__dataclass_fields__
        self.head = struct.Struct(">i" + "b" * self.isolation_level)
        self.partition = struct.Struct(">i" + "i" * epoch + "q")
        response = RESPONSES[api_version]
        self.throttle = "throttle_time" in response.__dataclass_fields__
        answered = importlib.import_module(response.__module__).ListOffsetsPartitionResponse
        self.leader_epoch = "leader_epoch" in answered.__dataclass_fields__
        self.answer = struct.Struct(">ihqq" + "i" * self.leader_epoch)


_layout = cache(_Layout)


# -- the request ------------------------------------------------------------------------


def read_list_offsets_request(api_version: int, body: memoryview | bytes) -> ListOffsetsRequestView:
    """Every field the proxy routes by, every partition's entry located; FrameError if
    the version is not served or the body is malformed or truncated."""
    layout = _layout(api_version)
    with malformed(f"ListOffsets v{api_version} request"):
        return _read_request(layout, memoryview(body))


def _read_request(layout: _Layout, body: memoryview) -> ListOffsetsRequestView:
    flexible = layout.flexible
    offset = skip(body, 0, layout.head.size)
    replica_id, *isolation = layout.head.unpack_from(body, 0)
    isolation_level = isolation[0] if isolation else 0
    topics_start = offset

    def read_partition(body: memoryview, start: int) -> tuple[OffsetsPartitionView, int]:
        offset = skip(body, start, layout.partition.size)
        index, *epoch, timestamp = layout.partition.unpack_from(body, start)
        offset = skip_tagged_fields(body, offset) if flexible else offset
        leader_epoch = epoch[0] if epoch else -1
        return OffsetsPartitionView(index, leader_epoch, timestamp, slice(start, offset)), offset

    def read_key(body: memoryview, start: int) -> tuple[str, int]:
        return read_topic_name(body, start, flexible)

    topics, offset = read_topics(body, offset, flexible, read_key, read_partition)
    topics_span, timeout_ms = slice(topics_start, offset), None
    if layout.timeout:
        timeout_ms, offset = read_int32(body, offset)
    offset = skip_tagged_fields(body, offset) if flexible else offset
    expect_end(body, offset)
    return ListOffsetsRequestView(
        layout.version, body, replica_id, isolation_level, timeout_ms, tuple(topics), topics_span
    )


def split(
    view: ListOffsetsRequestView, is_tiered: Callable[[str, OffsetsPartitionView], bool | Route]
) -> tuple[bytes | None, list[TieredOffsetsPartition]]:
    """(the request for upstream with the passthrough partitions and those routed BOTH,
    or None if none is left; the tiered partitions, HERE and BOTH, in request order).
    `is_tiered` sees each partition's entry and routes it (a bool: HERE or UPSTREAM), so
    it can decide by timestamp (EARLIEST from Kafka, LATEST answered locally).

    Everything kept is copied as it came, in one join: the head, each kept entry, the
    topic tags, the timeout and the top-level tags; only array counts are rewritten, and
    a topic left with no partition is dropped.
    """
    body, flexible = view.body, _layout(view.api_version).flexible
    tiered: list[TieredOffsetsPartition] = []
    pieces: list[bytes | memoryview] = []
    topic_count = 0
    for topic in view.topics:
        kept = []
        for p in topic.partitions:
            route = Route(is_tiered(topic.topic, p))
            if route != Route.HERE:
                kept.append(p)
            if route == Route.UPSTREAM:
                continue
            epoch, both = p.current_leader_epoch, route == Route.BOTH
            tiered.append(
                TieredOffsetsPartition(topic.topic, p.partition, p.timestamp, epoch, both)
            )
        if kept:
            topic_count += 1
            pieces += kept_topic(body, topic, [body[p.span] for p in kept], flexible)
    if not topic_count:
        return None, tiered
    head = body[: view.topics_span.start], write_array_length(topic_count, flexible)
    return b"".join((*head, *pieces, body[view.topics_span.stop :])), tiered


# -- the answer -------------------------------------------------------------------------


def merge_responses(
    api_version: int,
    view: ListOffsetsRequestView,
    upstream_body: memoryview | bytes | None,
    results: Mapping[tuple[str, int], OffsetsResult],
    *,
    throttle_ms: int = 0,
) -> bytes:
    """The answer body (no header) to `view`: each of its partitions, in its order, from
    `results` (tiered) or else upstream's answer (None: nothing went upstream) or else
    UNANSWERED (see the module docstring). Partitions the request did not name are left
    out; a partition named twice is answered twice, alike.

    The throttle time (v2+) is the larger of upstream's and `throttle_ms`; upstream's
    top-level tags are kept as they came. FrameError if upstream's answer is malformed;
    ValueError if a result does not fit its fields.
    """
    if api_version != view.api_version:
        raise ValueError(f"a ListOffsets v{view.api_version} request answered as v{api_version}")
    layout = _layout(api_version)
    flexible = layout.flexible
    answered: dict[tuple[str, int], memoryview] = {}
    tags: bytes | memoryview = NO_TAGS
    if upstream_body is not None:
        upstream_ms, answered, tags = _read_response(layout, memoryview(upstream_body))
        throttle_ms = max(throttle_ms, upstream_ms)
    out: list[bytes | memoryview] = [INT32.pack(throttle_ms)] if layout.throttle else []

    def answer(_: object, p: OffsetsPartitionView, result: OffsetsResult | None) -> Pieces:
        return (_answer(layout, p.partition, UNANSWERED if result is None else result),)

    out += merge_partitions(view, flexible, results, answered, answer)
    out += [tags] if flexible else []
    return b"".join(out)


def read_list_offsets_response(
    api_version: int, body: memoryview | bytes
) -> dict[tuple[str, int], OffsetsResult]:
    """Upstream's answer, per partition (the last entry if it names one twice), for a
    caller deciding from Kafka's answer (a timestamp Kafka's log does not reach is searched
    in the tiered stream). `merge_responses` still copies upstream's entries as they came,
    except those `results` replace. FrameError if malformed."""
    layout = _layout(api_version)
    _, entries, _ = _read_response(layout, memoryview(body))
    return {
        key: OffsetsResult(*layout.answer.unpack_from(entry)[1:]) for key, entry in entries.items()
    }


def _answer(layout: _Layout, partition: int, result: OffsetsResult) -> bytes:
    fields = [partition, result.error_code, result.timestamp, result.offset]
    fields += [result.leader_epoch] if layout.leader_epoch else []
    try:
        entry = layout.answer.pack(*fields)
    except struct.error as exc:
        raise ValueError(f"ListOffsets answer for partition {partition}: {exc}") from None
    return entry + NO_TAGS if layout.flexible else entry


def _read_response(
    layout: _Layout, body: memoryview
) -> tuple[int, dict[tuple[str, int], memoryview], memoryview]:
    """(throttle_time_ms, {(topic, partition): its whole entry}, the top-level tags)."""
    with malformed(f"ListOffsets v{layout.version} response"):
        return _read_entries(layout, body)


def _read_entries(
    layout: _Layout, body: memoryview
) -> tuple[int, dict[tuple[str, int], memoryview], memoryview]:
    flexible = layout.flexible
    throttle_ms, offset = read_int32(body, 0) if layout.throttle else (0, 0)
    entries: dict[tuple[str, int], memoryview] = {}
    count, offset = read_count(body, offset, flexible, "topics")
    for _ in range(count):
        name, offset = read_topic_key(body, offset, False, flexible)
        partition_count, offset = read_count(body, offset, flexible, "partitions")
        for _ in range(partition_count):
            start, offset = offset, skip(body, offset, layout.answer.size)
            offset = skip_tagged_fields(body, offset) if flexible else offset
            entries[name, INT32.unpack_from(body, start)[0]] = body[start:offset]
        offset = skip_tagged_fields(body, offset) if flexible else offset
    tags_start = offset
    offset = skip_tagged_fields(body, offset) if flexible else offset
    expect_end(body, offset)
    return throttle_ms, entries, body[tags_start:offset]
