"""Produce (api key 0), v3-v13 (all kio 0.6.5 has): the answer's node endpoints, and the
split of a request mixing tiered and passthrough partitions with the merge of the answers.

When a partition's leader moved, a v10+ answer names the new leader in the top-level
tagged field `node_endpoints`, so the client can skip a Metadata round trip. That field
is rewritten in place (`rewrite_response`); an answer without it (the usual case) is
returned as it came.

v13 names topics by id (KIP-516), earlier versions by name; v9+ are flexible. Answers
carry log_start_offset from v5, record errors and an error message from v8, KIP-951's
current leader (per partition) and node endpoints (top level) as tagged fields from v10.

`read_produce_request` finds each partition's records as a view of the request; `split`
re-encodes it with the passthrough partitions only (kept bytes as they came, copied once)
and hands the tiered partitions' views on; `merge_responses` answers with the upstream
answer and the local results, in the request's order. Per-partition work only. Network
bytes are read by hand (never by kio's reader: `codec`); answers are written with kio, so
upstream tagged fields kio does not know are dropped, and the node endpoints still name
upstream brokers: the answer goes through `rewrite_response` as usual. An answer of plain
results (no record errors, no current leader, no node endpoints: every success) is
written by hand instead, the same bytes at a fraction of kio's cost
(`_write_plain_response`), since the tiered path writes one per request.
"""

from __future__ import annotations

import datetime
import importlib
import struct
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import cache

from kio.schema.errors import ErrorCode

from proxy.apis.topics import TopicKey, TopicView, kept_topic, read_topics
from proxy.kafka.api_keys import ApiKey
from proxy.kafka.codec import encode, load_response_types, response_type
from proxy.kafka.frames import FrameError, malformed
from proxy.kafka.rewrite import Advertise, node_endpoints_rewriter
from proxy.kafka.wire import (
    expect_end,
    read_count,
    read_int16,
    read_int32,
    read_int64,
    read_nullable_bytes,
    read_string,
    read_tagged_fields,
    read_topic_key,
    skip,
    skip_tagged_fields,
    write_array_length,
    write_string,
)

API_KEY = ApiKey.PRODUCE
FIRST_NODE_ENDPOINTS_VERSION = 10
RESPONSES = load_response_types(API_KEY)
_rewrite_node_endpoints = node_endpoints_rewriter(API_KEY, FIRST_NODE_ENDPOINTS_VERSION, RESPONSES)
LAST_KNOWN_VERSION = 13


def rewrite_response(
    api_version: int, body: memoryview, advertise: Advertise
) -> bytes | memoryview:
    """The answer with its node endpoints advertised (`_rewrite_node_endpoints`, the
    schema walk); an answer whose top-level tagged fields are empty (every answer but
    one after a leader moved) is seen to be so by `_no_top_level_tags`, a walk written
    for this message alone, several times quicker, and returned as it came."""
    if FIRST_NODE_ENDPOINTS_VERSION <= api_version <= LAST_KNOWN_VERSION:
        if _no_top_level_tags(api_version, body):
            return body
    return _rewrite_node_endpoints(api_version, body, advertise)


def _no_top_level_tags(api_version: int, body: memoryview) -> bool:
    """Whether a flexible Produce answer ends with an empty top-level tagged-field
    section exactly at its end. False whenever in doubt (a field in that section, a
    length or varint beyond the usual, bytes that do not add up): the schema walk then
    judges the answer, and reports a malformed one."""
    try:
        offset = 0
        topics = body[0] - 1
        offset = 1
        if topics < 0 or body[0] >= 0x80:
            return False
        for _ in range(topics):
            if api_version >= 13:
                offset += 16  # topic id
            else:
                size = body[offset]
                if size == 0 or size >= 0x80:
                    return False
                offset += size  # the compact string's length + 1, then its bytes
            partitions = body[offset] - 1
            if partitions < 0 or body[offset] >= 0x80:
                return False
            offset += 1
            for _ in range(partitions):
                offset += 30  # index, error_code, base_offset, log_append_time, log_start
                if body[offset] != 1 or body[offset + 1] != 0:  # record errors, message
                    return False
                offset += 2
                if body[offset]:  # tagged fields (current_leader): the schema walk
                    return False
                offset += 1
            if body[offset]:
                return False
            offset += 1
        return offset + 5 == len(body) and body[offset + 4] == 0  # throttle, no tags
    except IndexError:
        return False


Span = slice  # of the request body
NO_LEADER = (-1, -1)  # (leader_id, leader_epoch): kio's default, not written

_PARTITION_HEAD = struct.Struct(">ihqq")  # index, error_code, base_offset, log_append_time
_LEADER = struct.Struct(">ii")  # leader_id, leader_epoch
_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)


@dataclass(frozen=True, slots=True)
class PartitionView:
    index: int
    records: memoryview | None  # a view of the request body; None if null
    span: Span  # the whole entry: index, records and (v9+) tagged fields


@dataclass(frozen=True, slots=True)
class ProduceRequestView:
    api_version: int
    body: memoryview
    transactional_id: str | None
    acks: int
    timeout_ms: int
    topics: tuple[TopicView[TopicKey, PartitionView], ...]  # tags empty before v9
    topics_span: Span  # topic_data, its count included; the top-level tags follow


@dataclass(frozen=True, slots=True)
class TieredPartition:
    topic: TopicKey
    partition: int
    records: memoryview | None  # a view of the request body, not a copy


@dataclass(frozen=True, slots=True)
class PartitionResult:
    """One partition's answer, from upstream or from the tiered path."""

    topic: TopicKey
    partition: int
    error_code: int
    base_offset: int = -1
    log_append_time_ms: int = -1  # -1 unless the topic uses LogAppendTime
    log_start_offset: int = -1  # v5+
    error_message: str | None = None  # v8+
    record_errors: tuple[tuple[int, str | None], ...] = ()  # v8+: (batch index, message)
    current_leader: tuple[int, int] = NO_LEADER  # v10+: (leader_id, leader_epoch)


class _Layout:
    """Which fields a version has, read off kio's classes for it."""

    def __init__(self, api_version: int) -> None:
        response = response_type(RESPONSES, API_KEY, api_version)  # FrameError if not served
        self.version, self.flexible = api_version, response.__flexible__
        self.kio = importlib.import_module(response.__module__)
        self.topic_id = "topic_id" in self.kio.TopicProduceResponse.__dataclass_fields__
        partition = self.kio.PartitionProduceResponse.__dataclass_fields__
        self.log_start_offset = "log_start_offset" in partition
        self.record_errors = "record_errors" in partition  # and error_message
        self.current_leader = "current_leader" in partition
        self.node_endpoints = "node_endpoints" in response.__dataclass_fields__


_layout = cache(_Layout)


# -- the request ------------------------------------------------------------------------


def read_produce_request(api_version: int, body: memoryview | bytes) -> ProduceRequestView:
    """Every partition's records located in the body, none copied; FrameError if malformed."""
    layout = _layout(api_version)
    body = memoryview(body)
    with malformed(f"Produce v{api_version} request"):
        return _read_request(layout, body)


def _read_request(layout: _Layout, body: memoryview) -> ProduceRequestView:
    flexible = layout.flexible
    txn_id, offset = read_string(body, 0, flexible)
    acks, offset = read_int16(body, offset)
    timeout_ms, offset = read_int32(body, offset)
    topics_start = offset

    def read_partition(body: memoryview, start: int) -> tuple[PartitionView, int]:
        index, offset = read_int32(body, start)
        records, offset = read_nullable_bytes(body, offset, flexible)
        offset = skip_tagged_fields(body, offset) if flexible else offset
        return PartitionView(index, records, slice(start, offset)), offset

    def read_key(body: memoryview, start: int) -> tuple[TopicKey, int]:
        return read_topic_key(body, start, layout.topic_id, flexible)

    arrays = ("topic_data", "partition_data")
    topics, offset = read_topics(body, offset, flexible, read_key, read_partition, arrays)
    topics_end = offset
    offset = skip_tagged_fields(body, offset) if flexible else offset
    expect_end(body, offset)
    spans = slice(topics_start, topics_end)
    return ProduceRequestView(layout.version, body, txn_id, acks, timeout_ms, tuple(topics), spans)


def split(
    view: ProduceRequestView, is_tiered: Callable[[TopicKey, int], bool]
) -> tuple[bytes | None, list[TieredPartition]]:
    """(the request body with only the passthrough partitions, or None if none is left;
    the tiered partitions, in request order).

    Everything kept is copied as it came, in one join; only array counts are rewritten,
    and a topic left with no partition is dropped.
    """
    body = view.body
    flexible = _layout(view.api_version).flexible
    kept_topics: list[bytes | memoryview] = []
    kept_count = 0
    tiered: list[TieredPartition] = []
    for topic in view.topics:
        kept = []
        for partition in topic.partitions:
            if is_tiered(topic.topic, partition.index):
                tiered.append(TieredPartition(topic.topic, partition.index, partition.records))
            else:
                kept.append(partition)
        if not kept:
            continue
        kept_count += 1
        kept_topics += kept_topic(body, topic, [body[p.span] for p in kept], flexible)
    if not kept_count:
        return None, tiered
    head = (body[: view.topics_span.start], write_array_length(kept_count, flexible))
    return b"".join((*head, *kept_topics, body[view.topics_span.stop :])), tiered


# -- the answer -------------------------------------------------------------------------


def build_produce_response(
    api_version: int, partition_results: Iterable[PartitionResult], throttle_ms: int = 0
) -> bytes:
    """A Produce answer body: topics in order of first appearance, partitions as given."""
    return _encode_response(_layout(api_version), partition_results, throttle_ms, ())


def merge_responses(
    api_version: int,
    upstream_body: memoryview | bytes | None,
    local: Iterable[PartitionResult],
    *,
    request: ProduceRequestView | None = None,
    throttle_ms: int = 0,
) -> bytes:
    """The upstream answer (None: nothing went upstream) and the local results as one.

    In the order of `request` when given (partitions it does not name last), else upstream
    partitions then local ones. The throttle time is the larger of upstream's and
    `throttle_ms`; upstream's node endpoints are kept. FrameError if upstream's is malformed.
    """
    layout = _layout(api_version)
    results: list[PartitionResult] = []
    upstream_throttle_ms, endpoints = 0, ()
    if upstream_body is not None:
        with malformed(f"Produce v{api_version} response"):
            results, upstream_throttle_ms, endpoints = _read_response(
                layout, memoryview(upstream_body)
            )
    results += local
    if request is not None:
        results = _in_request_order(request, results)
    return _encode_response(layout, results, max(throttle_ms, upstream_throttle_ms), endpoints)


def _in_request_order(
    request: ProduceRequestView, results: list[PartitionResult]
) -> list[PartitionResult]:
    position: dict[tuple[TopicKey, int], int] = {}
    for topic in request.topics:
        for partition in topic.partitions:
            position.setdefault((topic.topic, partition.index), len(position))
    unnamed = len(position)
    return sorted(
        results, key=lambda result: position.get((result.topic, result.partition), unnamed)
    )


def _read_response(
    layout: _Layout, body: memoryview
) -> tuple[list[PartitionResult], int, tuple[object, ...]]:
    """(every partition's result, throttle_time_ms, kio node endpoints)."""
    flexible = layout.flexible
    results = []
    count, offset = read_count(body, 0, flexible, "responses")
    for _ in range(count):
        topic, offset = read_topic_key(body, offset, layout.topic_id, layout.flexible)
        partition_count, offset = read_count(body, offset, flexible, "partition_responses")
        for _ in range(partition_count):
            result, offset = _read_partition_result(layout, topic, body, offset)
            results.append(result)
        offset = skip_tagged_fields(body, offset) if flexible else offset
    throttle_ms, offset = read_int32(body, offset)
    endpoints: tuple[object, ...] = ()
    if flexible:
        tags, offset = read_tagged_fields(body, offset)
        for tag, start, end in tags:
            if tag == 0 and layout.node_endpoints:
                endpoints = _read_node_endpoints(layout, body, start, end)
    expect_end(body, offset)
    return results, throttle_ms, endpoints


def _read_partition_result(
    layout: _Layout, topic: TopicKey, buf: memoryview, offset: int
) -> tuple[PartitionResult, int]:
    flexible = layout.flexible
    end = skip(buf, offset, _PARTITION_HEAD.size)
    head = _PARTITION_HEAD.unpack_from(buf, offset)  # index .. log_append_time
    offset = end
    log_start_offset, error_message, record_errors = -1, None, []
    if layout.log_start_offset:
        log_start_offset, offset = read_int64(buf, offset)
    if layout.record_errors:
        count, offset = read_count(buf, offset, flexible, "record_errors")
        for _ in range(count):
            batch_index, offset = read_int32(buf, offset)
            message, offset = read_string(buf, offset, flexible)
            offset = skip_tagged_fields(buf, offset) if flexible else offset
            record_errors.append((batch_index, message))
        error_message, offset = read_string(buf, offset, flexible)
    current_leader = NO_LEADER
    if flexible:
        tags, offset = read_tagged_fields(buf, offset)
        for tag, start, stop in tags:
            if tag == 0 and layout.current_leader:
                current_leader = _read_leader(buf, start, stop)
    rest = (log_start_offset, error_message, tuple(record_errors), current_leader)
    return PartitionResult(topic, *head, *rest), offset


def _read_leader(buf: memoryview, start: int, stop: int) -> tuple[int, int]:
    """The current_leader tagged value: leader_id, leader_epoch, its own tagged fields."""
    end = skip(buf, start, _LEADER.size)
    leader_id, leader_epoch = _LEADER.unpack_from(buf, start)
    _expect_value_end(skip_tagged_fields(buf, end), stop)
    return leader_id, leader_epoch


def _read_node_endpoints(
    layout: _Layout, buf: memoryview, offset: int, end: int
) -> tuple[object, ...]:
    endpoints = []
    count, offset = read_count(buf, offset, True, "node_endpoints")
    for _ in range(count):
        node_id, offset = read_int32(buf, offset)
        host, offset = read_string(buf, offset, True)
        if host is None:
            raise FrameError(f"null host for node endpoint {node_id} at byte {offset}")
        port, offset = read_int32(buf, offset)
        rack, offset = read_string(buf, offset, True)
        offset = skip_tagged_fields(buf, offset)
        endpoints.append(layout.kio.NodeEndpoint(node_id=node_id, host=host, port=port, rack=rack))
    _expect_value_end(offset, end)
    return tuple(endpoints)


def _encode_response(
    layout: _Layout,
    results: Iterable[PartitionResult],
    throttle_ms: int,
    endpoints: tuple[object, ...],
) -> bytes:
    results = list(results)
    for result in results:
        if isinstance(result.topic, uuid.UUID) != layout.topic_id:
            names = "ids" if layout.topic_id else "names"
            raise ValueError(f"Produce v{layout.version} names topics by {names}: {result.topic!r}")
    if not endpoints and all(_plain(result) for result in results):
        return _write_plain_response(layout, results, throttle_ms)
    return _encode_with_kio(layout, results, throttle_ms, endpoints)


def _plain(result: PartitionResult) -> bool:
    """A result with no record errors and no current leader (every success, most errors):
    what `_write_plain_response` writes."""
    return not result.record_errors and tuple(result.current_leader) == NO_LEADER


_PLAIN_PARTITION = struct.Struct(">ihqq")  # index, error_code, base_offset, log_append_time
_INT64 = struct.Struct(">q")
_INT32 = struct.Struct(">i")
_INT16 = struct.Struct(">h")


def _write_plain_response(
    layout: _Layout, results: list[PartitionResult], throttle_ms: int
) -> bytes:
    """The answer written by hand, byte for byte what kio writes for it (a property test
    compares the two over every version), for plain results only: kio builds a dataclass
    per field and walks its schema, ~25 µs an answer against ~2 µs here, on the tiered
    produce path of every request. Record errors, a current leader and node endpoints
    are rare (errors, a moved leader) and go to kio."""
    flexible = layout.flexible
    by_topic: dict[TopicKey, list[PartitionResult]] = {}
    for result in results:
        by_topic.setdefault(result.topic, []).append(result)
    out = [write_array_length(len(by_topic), flexible)]
    for topic, partitions in by_topic.items():
        if isinstance(topic, uuid.UUID):
            out.append(topic.bytes)
        else:
            out.append(write_string(topic, flexible))
        out.append(write_array_length(len(partitions), flexible))
        for r in partitions:
            out.append(
                _PLAIN_PARTITION.pack(
                    r.partition, r.error_code, r.base_offset, r.log_append_time_ms
                )
            )
            if layout.log_start_offset:
                out.append(_INT64.pack(r.log_start_offset))
            if layout.record_errors:
                out.append(write_array_length(0, flexible))  # no record errors
                out.append(_nullable_string(r.error_message, flexible))
            if flexible:
                out.append(b"\x00")  # the partition's tagged fields: none
        if flexible:
            out.append(b"\x00")  # the topic's
    out.append(_INT32.pack(throttle_ms))
    if flexible:
        out.append(b"\x00")  # the answer's
    return b"".join(out)


def _nullable_string(value: str | None, compact: bool) -> bytes:
    if value is None:
        return b"\x00" if compact else _INT16.pack(-1)
    return write_string(value, compact)


def _encode_with_kio(
    layout: _Layout,
    results: list[PartitionResult],
    throttle_ms: int,
    endpoints: tuple[object, ...],
) -> bytes:
    kio = layout.kio
    by_topic: dict[TopicKey, list[object]] = {}
    for result in results:
        by_topic.setdefault(result.topic, []).append(_partition_response(layout, result))
    key = "topic_id" if layout.topic_id else "name"
    topics = tuple(
        kio.TopicProduceResponse(**{key: topic}, partition_responses=tuple(partitions))
        for topic, partitions in by_topic.items()
    )
    extra = {"node_endpoints": endpoints} if layout.node_endpoints else {}
    throttle = datetime.timedelta(milliseconds=throttle_ms)
    return encode(kio.ProduceResponse(responses=topics, throttle_time=throttle, **extra))


def _partition_response(layout: _Layout, result: PartitionResult) -> object:
    kio = layout.kio
    fields: dict[str, object] = {
        "index": result.partition,
        "error_code": _error_code(result.error_code),
        "base_offset": result.base_offset,
        "log_append_time": _timestamp(result.log_append_time_ms),
    }
    if layout.log_start_offset:
        fields["log_start_offset"] = result.log_start_offset
    if layout.record_errors:
        fields["record_errors"] = tuple(
            kio.BatchIndexAndErrorMessage(batch_index=index, batch_index_error_message=message)
            for index, message in result.record_errors
        )
        fields["error_message"] = result.error_message
    if layout.current_leader and tuple(result.current_leader) != NO_LEADER:
        leader_id, leader_epoch = result.current_leader
        fields["current_leader"] = kio.LeaderIdAndEpoch(
            leader_id=leader_id, leader_epoch=leader_epoch
        )
    return kio.PartitionProduceResponse(**fields)


class _UnknownErrorCode(int):
    """A code kio's enum lacks (a newer broker's), written as it came: kio reads `.value`."""

    @property
    def value(self) -> int:
        return int(self)


def _error_code(code: int) -> ErrorCode | _UnknownErrorCode:
    try:
        return ErrorCode(code)
    except ValueError:
        return _UnknownErrorCode(code)


def _timestamp(ms: int) -> datetime.datetime | None:
    """kio's log_append_time: None is written as -1."""
    if ms == -1:
        return None
    try:
        return _EPOCH + datetime.timedelta(milliseconds=ms)
    except OverflowError:
        raise FrameError(f"log_append_time {ms} ms is outside the dates kio writes") from None


# -- shared readers ---------------------------------------------------------------------


def _expect_value_end(offset: int, end: int) -> None:
    if offset != end:
        raise FrameError(f"tagged field value ends at byte {end}, its content at {offset}")
