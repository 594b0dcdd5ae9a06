"""Fetch (api key 1), v4-v18 (all kio 0.6.5 has): split a request mixing tiered and
passthrough partitions, and merge the answers.

v5 adds log_start_offset per partition; v7 fetch sessions (KIP-227); v9 current_leader_epoch;
v11 rack_id, preferred_read_replica; v12 is flexible (answered partitions gain the tags
diverging_epoch, current_leader, snapshot_id); v13 names topics by id; v15 moves replica_id
into the tagged replica_state; v16 adds the node endpoints (KIP-951).

`read_fetch_request` locates every partition's entry; `split` keeps the passthrough entries
as they came (tags kio does not know included), rewriting only the head and array counts;
`merge_responses` answers every partition of the request, in its order. The answer is
assembled by hand: upstream's partition entries go in as slices of its answer (records, tags
and all), the tiered record pieces as they are, each byte copied once by one join. kio
takes one bytes value per records field (a join per partition) and copies it into a BytesIO
and out again; it would also need upstream's answer decoded, which `codec` forbids for
network bytes and which drops the tags kio does not know.

Fetch sessions. A broker-side session remembers earlier requests' partitions; with some of
them removed, it could not agree with the session the client believes in. So upstream gets
sessionless full fetches (session_id 0, epoch -1: no slot in the broker's session cache),
and the client is answered session_id 0, "no session":
- Java, clients/.../FetchSessionHandler.java `handleResponse` (and FetchMetadata.java): a
  full fetch answered with id 0 sets the next request to INITIAL (id 0, epoch 0): full again,
  so every fetch stays full. An incremental request (a session a broker gave earlier)
  answered with 0 reads as "closed by the server": INITIAL too. A full answer that omits a
  requested partition or names another is dropped whole (`verifyFullFetchResponsePartitions`):
  every partition is answered, and those upstream names unasked are left out.
- librdkafka, src/rdkafka_fetcher.c: never opens one (sends id 0, epoch -1) and ignores the
  answer's id; it applies a non-zero top-level error_code to every partition, tiered ones
  included, so upstream's is not forwarded: the answer's is always 0.
- aiokafka, aiokafka/protocol/fetch.py: 0.14 sends v4-v11 with id 0, epoch -1; older
  releases send v4 at most, which has no session.

A partition upstream left unanswered (a broker throttling a full fetch answers none, KIP-219)
is answered with no error, no records and -1 offsets, which Java ignores; clients fetch it
again. The top-level tags (v16 node endpoints) are upstream's as they came: they name
upstream brokers, so the answer goes through `api01_fetch.rewrite_response`.
"""

from __future__ import annotations

import importlib
import struct
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache

from proxy.apis.api01_fetch import API_KEY, REQUESTS, RESPONSES
from proxy.kafka.codec import response_type
from proxy.kafka.frames import FrameError
from proxy.kafka.wire import (
    INT32,
    expect_end,
    read_array_length,
    read_count,
    read_int32,
    read_nullable_bytes,
    read_string,
    read_tagged_fields,
    read_topic_key,
    skip,
    skip_tagged_fields,
    write_array_length,
    write_uvarint,
)

TopicKey = str | uuid.UUID  # a topic's name, or its id from v13
Span = slice  # of the request body
NO_SESSION = 0  # INVALID_SESSION_ID
FINAL_EPOCH = -1  # with NO_SESSION: a sessionless full fetch

_ABORTED = struct.Struct(">qq")  # producer_id, first_offset
_REPLICA_STATE = struct.Struct(">iq")  # replica_id, replica_epoch
_ABSENT = {"current_leader_epoch": -1, "last_fetched_epoch": -1, "log_start_offset": -1}
_NO_TAGS = b"\x00"


@dataclass(frozen=True, slots=True)
class FetchPartitionView:
    partition: int
    current_leader_epoch: int  # -1 before v9
    fetch_offset: int
    last_fetched_epoch: int  # -1 before v12
    log_start_offset: int  # -1 before v5; followers only
    partition_max_bytes: int
    span: Span  # the whole entry, its (v12+) tagged fields included


@dataclass(frozen=True, slots=True)
class FetchTopicView:
    topic: TopicKey
    key_span: Span  # the name (or topic id)
    partitions: tuple[FetchPartitionView, ...]
    tags_span: Span  # the topic's tagged-field section; empty before v12


@dataclass(frozen=True, slots=True)
class FetchRequestView:
    api_version: int
    body: memoryview
    replica_id: int  # -1 for a consumer; from the tagged replica_state from v15
    replica_epoch: int  # v15+
    max_wait_ms: int
    min_bytes: int
    max_bytes: int
    isolation_level: int
    session_id: int  # NO_SESSION and FINAL_EPOCH before v7
    session_epoch: int
    topics: tuple[FetchTopicView, ...]
    forgotten_topics: tuple[tuple[TopicKey, tuple[int, ...]], ...]  # v7+
    rack_id: str  # v11+
    rest_span: Span  # rack id and top-level tags: what follows the forgotten topics


@dataclass(frozen=True, slots=True)
class TieredFetchPartition:
    topic: TopicKey
    partition: int
    fetch_offset: int
    partition_max_bytes: int
    current_leader_epoch: int = -1
    last_fetched_epoch: int = -1
    log_start_offset: int = -1


@dataclass(frozen=True, slots=True)
class TieredFetchResult:
    """A tiered partition's answer; -1 offsets mean unknown (clients keep what they have)."""

    error_code: int
    high_watermark: int = -1
    last_stable_offset: int = -1
    log_start_offset: int = -1  # v5+
    aborted_transactions: Sequence[tuple[int, int]] | None = None  # (producer_id, first_offset)
    preferred_read_replica: int = -1  # v11+
    records: Sequence[bytes | memoryview] = ()  # whole batches, written one after another


_UNANSWERED = TieredFetchResult(error_code=0)
# (topic, partition), upstream's entry for it -> the pieces of the entry to answer instead,
# or None to answer it as it came
Clamp = Callable[[tuple[TopicKey, int], memoryview], Sequence[bytes | memoryview] | None]


class _Layout:
    """Which fields a version has, read off kio's classes for it."""

    def __init__(self, api_version: int) -> None:
        request = response_type(REQUESTS, API_KEY, api_version)  # FrameError if not served
        self.version, self.flexible = api_version, request.__flexible__
        kio = importlib.import_module(request.__module__)
        fields = request.__dataclass_fields__
        self.replica_id = "replica_id" in fields  # before v15
        self.session = "session_id" in fields
        self.rack_id = "rack_id" in fields
        self.topic_id = "topic_id" in kio.FetchTopic.__dataclass_fields__
        codes = {"current_leader_epoch": "i", "fetch_offset": "q", "last_fetched_epoch": "i"}
        codes |= {"log_start_offset": "q", "partition_max_bytes": "i"}  # the untagged ones
        self.partition_fields = [f for f in kio.FetchPartition.__dataclass_fields__ if f in codes]
        self.partition = struct.Struct(">i" + "".join(codes[f] for f in self.partition_fields))
        self.head = struct.Struct(">" + "i" * self.replica_id + "iiib" + "ii" * self.session)
        answered = importlib.import_module(RESPONSES[api_version].__module__).PartitionData
        self.log_start_offset = "log_start_offset" in answered.__dataclass_fields__
        self.preferred_read_replica = "preferred_read_replica" in answered.__dataclass_fields__
        self.answer_head = struct.Struct(">ihqq" + "q" * self.log_start_offset)


_layout = cache(_Layout)


def answer_layout(api_version: int) -> _Layout:
    """Which fields a Fetch answer of this version has (FrameError if not served)."""
    return _layout(api_version)


# -- the request ------------------------------------------------------------------------


def read_fetch_request(api_version: int, body: memoryview | bytes) -> FetchRequestView:
    """Every field the proxy routes by, every partition's entry located; FrameError if
    the body is malformed or truncated."""
    layout = _layout(api_version)
    try:
        return _read_request(layout, memoryview(body))
    except FrameError as exc:
        raise FrameError(f"malformed Fetch v{api_version} request: {exc}") from None


def _read_request(layout: _Layout, body: memoryview) -> FetchRequestView:
    flexible = layout.flexible
    offset = skip(body, 0, layout.head.size)
    head = list(layout.head.unpack_from(body, 0))
    replica_id = head.pop(0) if layout.replica_id else -1
    session = head[4:] if layout.session else [NO_SESSION, FINAL_EPOCH]
    topics = []
    count, offset = read_count(body, offset, flexible, "topics")
    for _ in range(count):
        key_start, partitions = offset, []
        topic, offset = read_topic_key(body, offset, layout.topic_id, layout.flexible)
        key_span = slice(key_start, offset)
        partition_count, offset = read_count(body, offset, flexible, "partitions")
        for _ in range(partition_count):
            start, offset = offset, skip(body, offset, layout.partition.size)
            index, *values = layout.partition.unpack_from(body, start)
            offset = skip_tagged_fields(body, offset) if flexible else offset
            fields = _ABSENT | dict(zip(layout.partition_fields, values, strict=True))
            partitions.append(FetchPartitionView(index, **fields, span=slice(start, offset)))
        tags_start = offset
        offset = skip_tagged_fields(body, offset) if flexible else offset
        topics.append(FetchTopicView(topic, key_span, tuple(partitions), slice(tags_start, offset)))
    forgotten = []
    if layout.session:
        count, offset = read_count(body, offset, flexible, "forgotten_topics_data")
        for _ in range(count):
            topic, offset = read_topic_key(body, offset, layout.topic_id, layout.flexible)
            count, offset = read_count(body, offset, flexible, "partitions")
            end = skip(body, offset, 4 * count)
            forgotten.append((topic, struct.unpack_from(f">{count}i", body, offset)))
            offset = skip_tagged_fields(body, end) if flexible else end
    rest_start, rack_id, replica_epoch = offset, "", -1
    if layout.rack_id:
        rack, offset = read_string(body, offset, flexible)
        if rack is None:
            raise FrameError(f"null rack_id at byte {rest_start}")
        rack_id = rack
    if flexible:
        tags, offset = read_tagged_fields(body, offset)
        for tag, start, end in tags:
            if tag == 1 and not layout.replica_id:  # replica_state
                replica_id, replica_epoch = _read_replica_state(body, start, end)
    expect_end(body, offset)
    return FetchRequestView(
        layout.version, body, replica_id, replica_epoch, *head[:4], *session, tuple(topics),
        tuple(forgotten), rack_id, slice(rest_start, len(body)),
    )  # fmt: skip


def _read_replica_state(buf: memoryview, start: int, end: int) -> tuple[int, int]:
    """The replica_state tagged value: replica_id, replica_epoch, its own tagged fields."""
    after = skip(buf, start, _REPLICA_STATE.size)
    replica_id, replica_epoch = _REPLICA_STATE.unpack_from(buf, start)
    if skip_tagged_fields(buf, after) != end:
        raise FrameError(f"replica_state at byte {start} does not fill its tagged field")
    return replica_id, replica_epoch


def split(
    view: FetchRequestView,
    is_tiered: Callable[[TopicKey, FetchPartitionView], bool],
    *,
    max_wait_ms: int | None = None,
    min_bytes: int | None = None,
    max_bytes: int | None = None,
) -> tuple[bytes | None, list[TieredFetchPartition]]:
    """(the request for upstream with only the passthrough partitions, or None if none is
    left; the tiered partitions, in request order). `is_tiered` sees each partition's
    entry (a tiered partition's offsets below its cutover are still read from Kafka).

    Upstream's request is a sessionless full fetch (NO_SESSION, FINAL_EPOCH) with no
    forgotten topics; max_wait_ms, min_bytes and max_bytes are the client's unless given
    (0 max_wait_ms when the tiered partitions already have data; a smaller max_bytes to
    leave room for theirs). Everything else is copied as it came, in one join.
    """
    layout = _layout(view.api_version)
    body, flexible = view.body, layout.flexible
    kept_topics: list[bytes | memoryview] = []
    kept_count = 0
    tiered: list[TieredFetchPartition] = []
    for topic in view.topics:
        kept = []
        for p in topic.partitions:
            if not is_tiered(topic.topic, p):
                kept.append(p)
                continue
            tiered.append(
                TieredFetchPartition(
                    topic.topic, p.partition, p.fetch_offset, p.partition_max_bytes,
                    p.current_leader_epoch, p.last_fetched_epoch, p.log_start_offset,
                )
            )  # fmt: skip
        if not kept:
            continue
        kept_count += 1
        kept_topics += (body[topic.key_span], write_array_length(len(kept), flexible))
        kept_topics += (body[p.span] for p in kept)
        kept_topics.append(body[topic.tags_span])
    if not kept_count:
        return None, tiered
    head = [view.replica_id] if layout.replica_id else []
    head += (
        view.max_wait_ms if max_wait_ms is None else max_wait_ms,
        view.min_bytes if min_bytes is None else min_bytes,
        view.max_bytes if max_bytes is None else max_bytes,
        view.isolation_level,
    )
    head += (NO_SESSION, FINAL_EPOCH) if layout.session else ()
    forgotten = write_array_length(0, flexible) if layout.session else b""
    count = write_array_length(kept_count, flexible)
    rest = body[view.rest_span]
    return b"".join((layout.head.pack(*head), count, *kept_topics, forgotten, rest)), tiered


# -- the answer -------------------------------------------------------------------------


def build_fetch_response(
    api_version: int,
    view: FetchRequestView,
    results: Mapping[tuple[TopicKey, int], TieredFetchResult],
    *,
    throttle_ms: int = 0,
) -> bytes:
    """The answer to a request whose partitions are all tiered."""
    return merge_responses(api_version, view, None, results, throttle_ms=throttle_ms)


def merge_responses(
    api_version: int,
    view: FetchRequestView,
    upstream_body: memoryview | bytes | None,
    results: Mapping[tuple[TopicKey, int], TieredFetchResult],
    *,
    throttle_ms: int = 0,
    clamp: Clamp | None = None,
) -> bytes:
    """The answer body (no header) to `view`: each of its partitions, in its order, from
    `results` (tiered) or else upstream's answer (None: nothing went upstream) or else
    unanswered (see the module docstring); topics named as the request named them.
    `clamp` may replace an upstream partition entry (fetch_clamp: a tiered partition read
    below its cutover is cut there).

    Top-level error 0 and session id 0; the throttle time is the larger of upstream's and
    `throttle_ms`. FrameError if upstream's answer is malformed.
    """
    if api_version != view.api_version:
        raise ValueError(f"a Fetch v{view.api_version} request answered as v{api_version}")
    layout = _layout(api_version)
    answered: dict[tuple[TopicKey, int], memoryview] = {}
    tags: bytes | memoryview = _NO_TAGS
    if upstream_body is not None:
        try:
            upstream_ms, answered, tags = _read_response(layout, memoryview(upstream_body))
        except FrameError as exc:
            raise FrameError(f"malformed Fetch v{api_version} response: {exc}") from None
        throttle_ms = max(throttle_ms, upstream_ms)
    flexible = layout.flexible
    out: list[bytes | memoryview] = [INT32.pack(throttle_ms)]
    if layout.session:
        out.append(struct.pack(">hi", 0, NO_SESSION))
    out.append(write_array_length(len(view.topics), flexible))
    for topic in view.topics:
        out += (view.body[topic.key_span], write_array_length(len(topic.partitions), flexible))
        for p in topic.partitions:
            key = (topic.topic, p.partition)
            result = results.get(key)
            if result is None and key in answered:
                pieces = None if clamp is None else clamp(key, answered[key])
                out += (answered[key],) if pieces is None else pieces
            else:
                out += _partition_answer(
                    layout, p.partition, result if result is not None else _UNANSWERED
                )
        if flexible:
            out.append(_NO_TAGS)
    if flexible:
        out.append(tags)
    return b"".join(out)


def _partition_answer(
    layout: _Layout, partition: int, result: TieredFetchResult
) -> list[bytes | memoryview]:
    flexible = layout.flexible
    head = [partition, result.error_code, result.high_watermark, result.last_stable_offset]
    head += [result.log_start_offset] if layout.log_start_offset else []
    out: list[bytes | memoryview] = [layout.answer_head.pack(*head)]
    aborted = result.aborted_transactions
    out.append(write_array_length(-1 if aborted is None else len(aborted), flexible))
    for producer_id, first_offset in aborted or ():
        out.append(_ABORTED.pack(producer_id, first_offset))
        out += [_NO_TAGS] if flexible else []
    if layout.preferred_read_replica:
        out.append(INT32.pack(result.preferred_read_replica))
    size = sum(len(piece) for piece in result.records)
    if not flexible and size > 0x7FFFFFFF:
        raise ValueError(f"{size} bytes of records for partition {partition} exceed an int32")
    out.append(write_uvarint(size + 1) if flexible else INT32.pack(size))
    out += result.records
    out += [_NO_TAGS] if flexible else []
    return out


def _read_response(
    layout: _Layout, body: memoryview
) -> tuple[int, dict[tuple[TopicKey, int], memoryview], memoryview]:
    """(throttle_time_ms, {(topic, partition): its whole entry}, the top-level tags)."""
    flexible = layout.flexible
    throttle_ms, offset = read_int32(body, 0)
    if layout.session:
        offset = skip(body, offset, 2 + 4)  # error_code, session_id: not forwarded
    entries: dict[tuple[TopicKey, int], memoryview] = {}
    count, offset = read_count(body, offset, flexible, "responses")
    for _ in range(count):
        topic, offset = read_topic_key(body, offset, layout.topic_id, layout.flexible)
        partition_count, offset = read_count(body, offset, flexible, "partitions")
        for _ in range(partition_count):
            start = offset
            partition, _ = read_int32(body, offset)
            offset = _skip_partition_answer(layout, body, offset)
            entries[topic, partition] = body[start:offset]
        offset = skip_tagged_fields(body, offset) if flexible else offset
    tags_start = offset
    offset = skip_tagged_fields(body, offset) if flexible else offset
    expect_end(body, offset)
    return throttle_ms, entries, body[tags_start:offset]


def _skip_partition_answer(layout: _Layout, buf: memoryview, offset: int) -> int:
    """Past one answered partition: fixed fields, aborted transactions, one jump over the
    records (never read), its tagged fields."""
    return _walk_partition_answer(layout, buf, offset, None)[1]


def _walk_partition_answer(
    layout: _Layout, buf: memoryview, offset: int, aborted: list[tuple[int, int]] | None
) -> tuple[memoryview | None, int]:
    """(a view of the partition's records or None, the offset past its entry)."""
    flexible = layout.flexible
    offset = skip(buf, offset, layout.answer_head.size)
    start = offset
    count, offset = read_array_length(buf, offset, flexible)
    if count > len(buf) - offset:
        raise FrameError(f"aborted_transactions array of {count} items at byte {start}")
    for _ in range(max(count, 0)):
        end = skip(buf, offset, _ABORTED.size)
        if aborted is not None:  # else skipped: the merge copies the entry whole
            aborted.append(_ABORTED.unpack_from(buf, offset))
        offset = skip_tagged_fields(buf, end) if flexible else end
    if layout.preferred_read_replica:
        offset = skip(buf, offset, 4)
    records, offset = read_nullable_bytes(buf, offset, flexible)
    return records, skip_tagged_fields(buf, offset) if flexible else offset


@dataclass(frozen=True, slots=True)
class FetchPartitionAnswer:
    """One partition of a Fetch answer, as the offload jobs' cluster reader needs it."""

    partition: int
    error_code: int
    high_watermark: int
    last_stable_offset: int
    log_start_offset: int  # -1 before v5
    aborted_transactions: tuple[tuple[int, int], ...]  # (producer_id, first_offset)
    records: memoryview  # a view of the answer, no copy; empty when null


def read_fetch_response(
    api_version: int, body: memoryview | bytes
) -> dict[tuple[TopicKey, int], FetchPartitionAnswer]:
    """Every answered partition of a Fetch answer body (no header), records as views of
    `body`; FrameError if it is malformed. Records are not looked into: a batch the broker
    cut short at the end of `records` is the caller's to handle (`batches.whole_batches`)."""
    layout = _layout(api_version)
    try:
        _, entries, _ = _read_response(layout, memoryview(body))
        answers = {}
        for key, entry in entries.items():
            aborted: list[tuple[int, int]] = []
            records, _ = _walk_partition_answer(layout, entry, 0, aborted)
            head = layout.answer_head.unpack_from(entry, 0)
            log_start = head[4] if layout.log_start_offset else -1
            answers[key] = FetchPartitionAnswer(
                *head[:4], log_start, tuple(aborted), records if records is not None else entry[:0]
            )
    except FrameError as exc:
        raise FrameError(f"malformed Fetch v{api_version} response: {exc}") from None
    return answers
