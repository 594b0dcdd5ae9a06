"""Fetch (api key 1), v4-v18 (all kio 0.6.5 has): read a request and split one mixing
tiered and passthrough partitions; the answers are merged by `fetch_merge.py`.

v5 adds log_start_offset per partition; v7 fetch sessions (KIP-227); v9 current_leader_epoch;
v11 rack_id, preferred_read_replica; v12 is flexible (answered partitions gain the tags
diverging_epoch, current_leader, snapshot_id); v13 names topics by id; v15 moves replica_id
into the tagged replica_state; v16 adds the node endpoints (KIP-951).

`read_fetch_request` locates every partition's entry; `split` keeps the passthrough entries
as they came (tags kio does not know included), rewriting only the head and array counts;
`fetch_merge.merge_responses` answers every partition of the request, in its order.

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
"""

from __future__ import annotations

import importlib
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache

from proxy.apis.api01_fetch import API_KEY, REQUESTS, RESPONSES
from proxy.apis.topics import TopicKey, TopicView, kept_topic, read_topics
from proxy.kafka.codec import response_type
from proxy.kafka.frames import FrameError, malformed
from proxy.kafka.wire import (
    expect_end,
    read_count,
    read_string,
    read_tagged_fields,
    read_topic_key,
    skip,
    skip_tagged_fields,
    write_array_length,
)

Span = slice  # of the request body
NO_SESSION = 0  # INVALID_SESSION_ID
FINAL_EPOCH = -1  # with NO_SESSION: a sessionless full fetch

_REPLICA_STATE = struct.Struct(">iq")  # replica_id, replica_epoch
_ABSENT = {"current_leader_epoch": -1, "last_fetched_epoch": -1, "log_start_offset": -1}


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
    topics: tuple[TopicView[TopicKey, FetchPartitionView], ...]  # tags empty before v12
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


class FetchLayout:
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


_layout = cache(FetchLayout)


def answer_layout(api_version: int) -> FetchLayout:
    """Which fields a Fetch answer of this version has (FrameError if not served)."""
    return _layout(api_version)


# -- the request ------------------------------------------------------------------------


def read_fetch_request(api_version: int, body: memoryview | bytes) -> FetchRequestView:
    """Every field the proxy routes by, every partition's entry located; FrameError if
    the body is malformed or truncated."""
    layout = _layout(api_version)
    with malformed(f"Fetch v{api_version} request"):
        return _read_request(layout, memoryview(body))


def _read_request(layout: FetchLayout, body: memoryview) -> FetchRequestView:
    flexible = layout.flexible
    offset = skip(body, 0, layout.head.size)
    head = list(layout.head.unpack_from(body, 0))
    replica_id = head.pop(0) if layout.replica_id else -1
    session = head[4:] if layout.session else [NO_SESSION, FINAL_EPOCH]

    def read_partition(body: memoryview, start: int) -> tuple[FetchPartitionView, int]:
        offset = skip(body, start, layout.partition.size)
        index, *values = layout.partition.unpack_from(body, start)
        offset = skip_tagged_fields(body, offset) if flexible else offset
        fields = _ABSENT | dict(zip(layout.partition_fields, values, strict=True))
        return FetchPartitionView(index, **fields, span=slice(start, offset)), offset

    def read_key(body: memoryview, start: int) -> tuple[TopicKey, int]:
        return read_topic_key(body, start, layout.topic_id, flexible)

    topics, offset = read_topics(body, offset, flexible, read_key, read_partition)
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
        kept_topics += kept_topic(body, topic, [body[p.span] for p in kept], flexible)
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
