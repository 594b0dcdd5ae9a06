"""Split a random ListOffsets request by a random predicate: upstream gets exactly the
passthrough partitions, byte for byte as kio writes them; the tiered partitions are the
others. Cut a random answer in three (from upstream, in an order of its own; from the
tiered path; from nobody): the merged answer to the request is the whole answer byte for
byte, the unanswered partitions NOT_LEADER_OR_FOLLOWER."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kio.schema.errors import ErrorCode

from proxy.apis.api02_list_offsets import (
    OffsetsResult,
    merge_responses,
    read_list_offsets_request,
    split,
)
from proxy.kafka.codec import decode, encode
from tests.support.kio_types import MS, mod, only_fields, served

REQUESTS, RESPONSES, VERSIONS = served(2)
INT32 = st.integers(-(2**31), 2**31 - 1)
INT64 = st.integers(-(2**63), 2**63 - 1)


@st.composite
def layouts(draw):
    """[(topic name, [partition index])], names and indexes unique."""
    names = draw(st.lists(st.text(min_size=1, max_size=6), max_size=4, unique=True))
    partitions = st.lists(st.integers(0, 2**31 - 1), max_size=4, unique=True)
    return [(name, draw(partitions)) for name in names]


def kio_request(version, topics, **top):
    """topics: [(name, [kio ListOffsetsPartition])]."""
    m = mod(REQUESTS, version)
    asked = tuple(m.ListOffsetsTopic(name=name, partitions=tuple(ps)) for name, ps in topics)
    return only_fields(m.ListOffsetsRequest, topics=asked, **top)


@st.composite
def list_offsets_requests(draw):
    version = draw(st.sampled_from(VERSIONS))
    m = mod(REQUESTS, version)
    timestamps = st.integers(-6, -1) | INT64
    topics = [
        (
            name,
            [
                only_fields(
                    m.ListOffsetsPartition,
                    partition_index=index,
                    current_leader_epoch=draw(INT32),
                    timestamp=draw(timestamps),
                )
                for index in indexes
            ],
        )
        for name, indexes in draw(layouts())
    ]
    top = {
        "replica_id": draw(st.sampled_from([-1, -2]) | INT32),
        "isolation_level": draw(st.sampled_from([0, 1])),
        "timeout": draw(st.integers(0, 2**31 - 1)) * MS,
    }
    pairs = [(name, p.partition_index) for name, partitions in topics for p in partitions]
    tiered = draw(st.sets(st.sampled_from(pairs))) if pairs else set()
    return version, topics, top, tiered


@settings(max_examples=300, deadline=None)
@given(list_offsets_requests())
def test_split_sends_upstream_exactly_the_passthrough_partitions(case):
    version, topics, top, tiered_pairs = case
    body = encode(kio_request(version, topics, **top))
    view = read_list_offsets_request(version, memoryview(body))
    upstream, tiered = split(view, lambda topic, p: (topic, p.partition) in tiered_pairs)

    kept = [(n, [p for p in ps if (n, p.partition_index) not in tiered_pairs]) for n, ps in topics]
    kept = [(name, partitions) for name, partitions in kept if partitions]
    if kept:
        expected = kio_request(version, kept, **top)
        assert upstream == encode(expected)
        assert decode(REQUESTS[version], upstream) == expected
    else:
        assert upstream is None
    sent = [(name, p) for name, partitions in topics for p in partitions]
    assert [(t.topic, t.partition, t.timestamp, t.current_leader_epoch) for t in tiered] == [
        (name, p.partition_index, p.timestamp, getattr(p, "current_leader_epoch", -1))
        for name, p in sent
        if (name, p.partition_index) in tiered_pairs
    ]


# -- answers ----------------------------------------------------------------------------


@st.composite
def cut_answers(draw):
    version = draw(st.sampled_from(VERSIONS))
    m = mod(RESPONSES, version)
    unanswered = OffsetsResult(ErrorCode.not_leader_or_follower.value)

    def partition(index, result):
        return only_fields(
            m.ListOffsetsPartitionResponse, partition_index=index,
            error_code=ErrorCode(result.error_code), timestamp=result.timestamp,
            offset=result.offset, leader_epoch=result.leader_epoch,
        )  # fmt: skip

    whole, upstream_topics, results = [], [], {}
    for name, indexes in draw(layouts()):
        partitions, sent = [], []
        for index in indexes:
            result = OffsetsResult(
                draw(st.sampled_from(list(ErrorCode))).value, draw(INT64), draw(INT64),
                draw(INT32) if version >= 4 else -1,
            )  # fmt: skip
            source = draw(st.sampled_from(["upstream", "tiered", "nobody"]))
            if source == "upstream":
                sent.append(partition(index, result))
            elif source == "tiered":
                results[name, index] = result
            partitions.append(partition(index, unanswered if source == "nobody" else result))
        whole.append((name, partitions))
        if sent:
            upstream_topics.append((name, draw(st.permutations(sent))))
    if draw(st.booleans()):  # a topic the request does not name
        upstream_topics.append(("\x00stranger", [partition(0, unanswered)]))
    throttle = draw(st.integers(0, 2**31 - 1)) * MS if version >= 2 else 0 * MS
    upstream = None
    if upstream_topics or draw(st.booleans()):
        topics = tuple(
            m.ListOffsetsTopicResponse(name=name, partitions=tuple(parts))
            for name, parts in draw(st.permutations(upstream_topics))
        )
        upstream = only_fields(m.ListOffsetsResponse, throttle_time=throttle, topics=topics)
    else:
        throttle = 0 * MS
    request_m = mod(REQUESTS, version)
    request = kio_request(
        version,
        [
            (name, [request_m.ListOffsetsPartition(partition_index=p.partition_index, timestamp=-1)
                    for p in partitions])
            for name, partitions in whole
        ],  # fmt: skip
        replica_id=-1, isolation_level=0, timeout=0 * MS,
    )  # fmt: skip
    answered = tuple(
        m.ListOffsetsTopicResponse(name=name, partitions=tuple(parts)) for name, parts in whole
    )
    expected = only_fields(m.ListOffsetsResponse, throttle_time=throttle, topics=answered)
    return version, request, upstream, results, expected


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cut_answers())
def test_merge_of_a_cut_answer_is_the_answer(case):
    version, request, upstream, results, whole = case
    view = read_list_offsets_request(version, encode(request))
    upstream_body = None if upstream is None else memoryview(encode(upstream))
    merged = merge_responses(version, view, upstream_body, results)
    assert merged == encode(whole)
