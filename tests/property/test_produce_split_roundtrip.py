"""Split a random Produce request by a random predicate: the passthrough request and the
tiered partitions together are the original, records byte for byte. Merge a random kio
answer cut in two (one half from upstream, in an order of its own, the other local): the
merged answer, in request order, is the original answer byte for byte."""

from __future__ import annotations

import dataclasses
import datetime
import uuid

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.apis import api00_produce
from proxy.apis.api00_produce import (
    PartitionResult,
    merge_responses,
    read_produce_request,
    split,
)
from proxy.kafka.codec import decode, encode
from tests.support import kio_types
from tests.support.kio_types import mod, served

REQUESTS, RESPONSES, VERSIONS = served(0)
EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
NO_TOPIC_ID = uuid.UUID(int=0)  # what a null topic id is on the wire
NO_TIME = datetime.timedelta(0)


def kio_request(version, topics, transactional_id=None, acks=-1, timeout_ms=0):
    """topics: [(name or topic id, [(partition, records)])]."""
    m = mod(REQUESTS, version)
    return m.ProduceRequest(
        transactional_id=transactional_id,
        acks=acks,
        timeout=datetime.timedelta(milliseconds=timeout_ms),
        topic_data=tuple(
            m.TopicProduceData(
                **{"topic_id" if version >= 13 else "name": topic},
                partition_data=tuple(
                    m.PartitionProduceData(index=index, records=records)
                    for index, records in partitions
                ),
            )
            for topic, partitions in topics
        ),
    )


@st.composite
def produce_requests(draw):
    version = draw(st.sampled_from(VERSIONS))
    names = draw(st.lists(st.text(min_size=1, max_size=6), max_size=4, unique=True))
    topics = [
        (
            kio_types.topic_key(version, name),
            draw(
                st.lists(
                    st.tuples(st.integers(0, 2**31 - 1), st.none() | st.binary(max_size=80)),
                    max_size=4,
                    unique_by=lambda partition: partition[0],
                )
            ),
        )
        for name in names
    ]
    fields = {
        "transactional_id": draw(st.none() | st.text(max_size=8)),
        "acks": draw(st.sampled_from([-1, 0, 1])),
        "timeout_ms": draw(st.integers(0, 2**31 - 1)),
    }
    pairs = [(topic, index) for topic, partitions in topics for index, _ in partitions]
    tiered = draw(st.sets(st.sampled_from(pairs))) if pairs else set()
    return version, topics, fields, tiered


@settings(max_examples=300, deadline=None)
@given(produce_requests())
def test_split_then_union_is_the_request(case):
    version, topics, fields, tiered_pairs = case
    body = encode(kio_request(version, topics, **fields))
    passthrough, tiered = split(
        read_produce_request(version, memoryview(body)), lambda t, p: (t, p) in tiered_pairs
    )

    kept = [
        (topic, [(p, r) for p, r in partitions if (topic, p) not in tiered_pairs])
        for topic, partitions in topics
    ]
    kept = [(topic, partitions) for topic, partitions in kept if partitions]
    if kept:
        expected = kio_request(version, kept, **fields)
        assert passthrough == encode(expected)
        assert decode(REQUESTS[version], passthrough) == expected
    else:
        assert passthrough is None
    if topics and not tiered_pairs and all(partitions for _, partitions in topics):
        assert passthrough == body  # nothing to cut: the very bytes

    original = {(t, p): r for t, partitions in topics for p, r in partitions}
    moved = {(each.topic, each.partition): each.records for each in tiered}
    passed = {(t, p): r for t, partitions in kept for p, r in partitions}
    assert moved.keys() == tiered_pairs
    assert moved.keys() | passed.keys() == original.keys()
    assert all(bytes(view) == original[k] for k, view in moved.items() if view is not None)
    assert all(original[k] is None for k, view in moved.items() if view is None)
    assert all(view.obj is body for view in moved.values() if view is not None)


def distinct(answer):
    """The answer with each topic and each of its partitions once, topic ids never null,
    and no topic without partitions (the proxy answers for partitions, not topics)."""
    topics, seen = [], set()
    for topic in answer.responses:
        if getattr(topic, "topic_id", 0) is None:
            topic = dataclasses.replace(topic, topic_id=NO_TOPIC_ID)
        name = getattr(topic, "topic_id", None) or topic.name
        if name in seen or not topic.partition_responses:
            continue
        seen.add(name)
        partitions = {p.index: p for p in reversed(topic.partition_responses)}
        unique = tuple(p for p in topic.partition_responses if partitions[p.index] is p)
        topics.append(dataclasses.replace(topic, partition_responses=unique))
    return dataclasses.replace(answer, responses=tuple(topics))


def topic_key(topic):
    return topic.topic_id if hasattr(topic, "topic_id") else topic.name


def as_result(topic, p) -> PartitionResult:
    millis = datetime.timedelta(milliseconds=1)
    leader = getattr(p, "current_leader", None)
    return PartitionResult(
        topic_key(topic),
        p.index,
        int(p.error_code),
        p.base_offset,
        -1 if p.log_append_time is None else (p.log_append_time - EPOCH) // millis,
        getattr(p, "log_start_offset", -1),
        getattr(p, "error_message", None),
        tuple(
            (e.batch_index, e.batch_index_error_message) for e in getattr(p, "record_errors", ())
        ),
        (-1, -1) if leader is None else (leader.leader_id, leader.leader_epoch),
    )


@st.composite
def cut_answers(draw):
    version = draw(st.sampled_from(VERSIONS))
    answer = distinct(draw(st.from_type(RESPONSES[version])))
    # Kafka's throttle times are never negative; the merge keeps the larger of two.
    answer = dataclasses.replace(answer, throttle_time=max(answer.throttle_time, NO_TIME))
    upstream_topics, local = [], []
    for topic in answer.responses:
        sent = [p for p in topic.partition_responses if draw(st.booleans())]
        local += [as_result(topic, p) for p in topic.partition_responses if p not in sent]
        if sent:
            upstream_topics.append(dataclasses.replace(topic, partition_responses=tuple(sent)))
    upstream_topics = draw(st.permutations(upstream_topics))  # the broker's own order
    upstream = dataclasses.replace(answer, responses=tuple(upstream_topics))
    return version, answer, upstream, draw(st.permutations(local))


@settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(cut_answers())
def test_merge_of_a_cut_answer_is_the_answer(case):
    version, answer, upstream, local = case
    order = [
        (topic_key(topic), [(p.index, None) for p in topic.partition_responses])
        for topic in answer.responses
    ]
    request = read_produce_request(version, encode(kio_request(version, order)))
    merged = merge_responses(version, encode(upstream), local, request=request)
    assert merged == encode(answer)


@st.composite
def plain_results(draw):
    """(version, results, throttle ms): results with no record errors and no current
    leader, the answers the tiered path writes by hand."""
    version = draw(st.sampled_from(VERSIONS))
    names = draw(st.lists(st.text(min_size=1, max_size=6), min_size=1, max_size=3, unique=True))
    topics = [kio_types.topic_key(version, name) for name in names]
    results = draw(
        st.lists(
            st.builds(
                PartitionResult,
                st.sampled_from(topics),
                st.integers(0, 2**31 - 1),
                st.integers(-(2**15), 2**15 - 1),  # error codes kio does not know too
                st.integers(-1, 2**63 - 1),
                st.just(-1) | st.integers(0, 253402300799999),  # kio writes up to 9999-12-31
                st.integers(-1, 2**63 - 1),
                st.none() | st.text(max_size=12),
            ),
            max_size=8,
        )
    )
    return version, results, draw(st.integers(0, 2**31 - 1))


@settings(max_examples=300, deadline=None)
@given(plain_results())
def test_a_plain_answer_written_by_hand_is_what_kio_writes(case):
    version, results, throttle_ms = case
    layout = api00_produce._layout(version)
    by_hand = api00_produce._write_plain_response(layout, results, throttle_ms)
    assert by_hand == api00_produce._encode_with_kio(layout, results, throttle_ms, ())
    assert api00_produce.build_produce_response(version, results, throttle_ms) == by_hand
