"""DeleteRecords (api key 21), v0-v2: split a request naming tiered partitions, and merge
the answers.

v1 is v0 (throttling changed), v2 is flexible. The request is `topics[name,
partitions[partition_index, offset]], timeout_ms`, the answer `throttle_time_ms,
topics[name, partitions[partition_index, low_watermark, error_code]]`. An offset of -1
means the high watermark.

`read_delete_records_request` locates every partition's entry; `split` builds the request
for Kafka: a partition's entry as it came, or with its offset rewritten (a tiered
partition's Kafka part ends at the cutover), or left out; `merge_responses` answers every
partition of the request, in its order, upstream's entries as they came unless a result
replaces them. A partition with no answer is NOT_LEADER_OR_FOLLOWER with low watermark -1,
which Kafka's admin clients retry after looking up the leader again.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass
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

API_KEY = ApiKey.DELETE_RECORDS
REQUESTS = load_types(API_KEY, "request")
RESPONSES = load_response_types(API_KEY)
HIGH_WATERMARK = -1  # the offset that means "everything below the high watermark"

_PARTITION = struct.Struct(">iq")  # partition_index, offset
_ANSWER = struct.Struct(">iqh")  # partition_index, low_watermark, error_code


@dataclass(frozen=True, slots=True)
class DeletePartitionView:
    partition: int
    offset: int  # delete the records below it; -1: the high watermark
    span: slice  # the whole entry, its (v2) tagged fields included


@dataclass(frozen=True, slots=True)
class DeleteRecordsRequestView:
    api_version: int
    body: memoryview
    topics: tuple[TopicView[str, DeletePartitionView], ...]  # tags from v2
    timeout_ms: int
    tail_span: slice  # timeout_ms and the top-level tags


@dataclass(frozen=True, slots=True)
class DeleteResult:
    error_code: int
    low_watermark: int = -1


UNANSWERED = DeleteResult(ErrorCode.not_leader_or_follower.value)


@cache
def _flexible(api_version: int) -> bool:
    return response_type(REQUESTS, API_KEY, api_version).__flexible__  # FrameError if unserved


def read_delete_records_request(
    api_version: int, body: memoryview | bytes
) -> DeleteRecordsRequestView:
    """Every partition's entry located; FrameError if the version is not served or the
    body is malformed or truncated."""
    flexible = _flexible(api_version)
    buf = memoryview(body)
    with malformed(f"DeleteRecords v{api_version} request"):

        def read_partition(buf: memoryview, start: int) -> tuple[DeletePartitionView, int]:
            offset = skip(buf, start, _PARTITION.size)
            index, wanted = _PARTITION.unpack_from(buf, start)
            offset = skip_tagged_fields(buf, offset) if flexible else offset
            return DeletePartitionView(index, wanted, slice(start, offset)), offset

        def read_key(buf: memoryview, start: int) -> tuple[str, int]:
            return read_topic_name(buf, start, flexible)

        topics, offset = read_topics(buf, 0, flexible, read_key, read_partition)
        tail_start = offset
        timeout_ms, offset = read_int32(buf, offset)
        offset = skip_tagged_fields(buf, offset) if flexible else offset
        expect_end(buf, offset)
    return DeleteRecordsRequestView(
        api_version, buf, tuple(topics), timeout_ms, slice(tail_start, offset)
    )


def split(
    view: DeleteRecordsRequestView, kafka_offset: Callable[[str, DeletePartitionView], int | None]
) -> bytes | None:
    """The request for Kafka, or None if it names no partition. `kafka_offset` says, per
    partition, the offset Kafka is asked to delete to: `p.offset` (the entry goes as it
    came, tags included), another one (written anew), or None (left out)."""
    body, flexible = view.body, _flexible(view.api_version)
    pieces: list[bytes | memoryview] = []
    topic_count = 0
    for topic in view.topics:
        kept: list[bytes | memoryview] = []
        for p in topic.partitions:
            wanted = kafka_offset(topic.topic, p)
            if wanted is None:
                continue
            if wanted == p.offset:
                kept.append(body[p.span])
            else:
                kept.append(_PARTITION.pack(p.partition, wanted) + (NO_TAGS if flexible else b""))
        if kept:
            topic_count += 1
            pieces += kept_topic(body, topic, kept, flexible)
    if not topic_count:
        return None
    return b"".join((write_array_length(topic_count, flexible), *pieces, body[view.tail_span]))


def read_delete_records_response(
    api_version: int, body: memoryview | bytes
) -> tuple[int, dict[tuple[str, int], DeleteResult]]:
    """(throttle_time_ms, each partition's result); FrameError if malformed."""
    throttle_ms, entries = _read_response(api_version, memoryview(body))
    results = {}
    for key, entry in entries.items():
        _, low_watermark, error_code = _ANSWER.unpack_from(entry)
        results[key] = DeleteResult(error_code, low_watermark)
    return throttle_ms, results


def merge_responses(
    api_version: int,
    view: DeleteRecordsRequestView,
    upstream_body: memoryview | bytes | None,
    results: Mapping[tuple[str, int], DeleteResult],
) -> bytes:
    """The answer body (no header) to `view`: each partition in its order, from `results`,
    else upstream's entry as it came, else UNANSWERED. FrameError if upstream's answer is
    malformed; ValueError if a result does not fit its fields."""
    if api_version != view.api_version:
        raise ValueError(f"a DeleteRecords v{view.api_version} request answered as v{api_version}")
    flexible = _flexible(api_version)
    throttle_ms, answered = 0, {}
    if upstream_body is not None:
        throttle_ms, answered = _read_response(api_version, memoryview(upstream_body))
    out: list[bytes | memoryview] = [INT32.pack(throttle_ms)]

    def answer(key: tuple[str, int], p: DeletePartitionView, result: DeleteResult | None) -> Pieces:
        entry = _entry(key, p.partition, UNANSWERED if result is None else result)
        return (entry + NO_TAGS if flexible else entry,)

    out += merge_partitions(view, flexible, results, answered, answer)
    out += [NO_TAGS] if flexible else []
    return b"".join(out)


def _entry(key: tuple[str, int], partition: int, result: DeleteResult) -> bytes:
    try:
        return _ANSWER.pack(partition, result.low_watermark, result.error_code)
    except struct.error as exc:
        raise ValueError(f"DeleteRecords answer for {key}: {exc}") from None


def _read_response(
    api_version: int, body: memoryview
) -> tuple[int, dict[tuple[str, int], memoryview]]:
    flexible = _flexible(api_version)
    with malformed(f"DeleteRecords v{api_version} response"):
        throttle_ms, offset = read_int32(body, 0)
        entries: dict[tuple[str, int], memoryview] = {}
        count, offset = read_count(body, offset, flexible, "topics")
        for _ in range(count):
            name, offset = read_topic_key(body, offset, False, flexible)
            partition_count, offset = read_count(body, offset, flexible, "partitions")
            for _ in range(partition_count):
                start, offset = offset, skip(body, offset, _ANSWER.size)
                offset = skip_tagged_fields(body, offset) if flexible else offset
                entries[name, INT32.unpack_from(body, start)[0]] = body[start:offset]
            offset = skip_tagged_fields(body, offset) if flexible else offset
        offset = skip_tagged_fields(body, offset) if flexible else offset
        expect_end(body, offset)
    return throttle_ms, entries
