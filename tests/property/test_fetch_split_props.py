"""Split a random Fetch request by a random predicate: upstream gets exactly the passthrough
partitions, byte for byte as kio writes them, with no fetch session; the tiered partitions
are the others. Cut a random answer in two (one part from upstream, in an order of its own,
the other from the tiered path, records in pieces): the merged answer to the request is the
whole answer byte for byte, with top-level error 0 and session id 0."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kio.schema.errors import ErrorCode

from proxy.apis.fetch_merge import merge_responses
from proxy.apis.fetch_split import (
    FINAL_EPOCH,
    NO_SESSION,
    TieredFetchResult,
    read_fetch_request,
    split,
)
from proxy.kafka.codec import decode, encode
from tests.support.kio_types import MS, mod, only_fields, served, topic_key

REQUESTS, RESPONSES, VERSIONS = served(1)
INT32 = st.integers(-(2**31), 2**31 - 1)
INT64 = st.integers(-(2**63), 2**63 - 1)


def kio_request(version, topics, **top):
    """topics: [(name, [kio FetchPartition])]."""
    m = mod(REQUESTS, version)
    field = "topic_id" if version >= 13 else "topic"
    fetch_topics = tuple(
        m.FetchTopic(**{field: topic_key(version, name)}, partitions=tuple(partitions))
        for name, partitions in topics
    )
    return only_fields(m.FetchRequest, topics=fetch_topics, **top)


@st.composite
def layouts(draw):
    """[(topic name, [partition index])], names and indexes unique."""
    names = draw(st.lists(st.text(min_size=1, max_size=6), max_size=4, unique=True))
    partitions = st.lists(st.integers(0, 2**31 - 1), max_size=4, unique=True)
    return [(name, draw(partitions)) for name in names]


@st.composite
def fetch_requests(draw):
    version = draw(st.sampled_from(VERSIONS))
    m = mod(REQUESTS, version)
    topics = [
        (
            name,
            [
                only_fields(
                    m.FetchPartition,
                    partition=index,
                    fetch_offset=draw(INT64),
                    current_leader_epoch=draw(INT32),
                    last_fetched_epoch=draw(INT32),
                    log_start_offset=draw(INT64),
                    partition_max_bytes=draw(INT32),
                )  # fmt: skip
                for index in indexes
            ],
        )
        for name, indexes in draw(layouts())
    ]
    field = "topic_id" if version >= 13 else "topic"
    forgotten = tuple(
        m.ForgottenTopic(**{field: topic_key(version, name)}, partitions=tuple(indexes))
        for name, indexes in (draw(layouts()) if version >= 7 else ())
    )
    top = {
        "replica_id": -1,
        "max_wait": draw(st.integers(0, 2**31 - 1)) * MS,
        "min_bytes": draw(INT32),
        "max_bytes": draw(INT32),
        "isolation_level": draw(st.sampled_from([0, 1])),
        "session_id": draw(INT32),
        "session_epoch": draw(INT32),
        "forgotten_topics_data": forgotten,
        "rack_id": draw(st.text(max_size=8)),
    }
    pairs = [(name, p.partition) for name, partitions in topics for p in partitions]
    tiered = draw(st.sets(st.sampled_from(pairs))) if pairs else set()
    return version, topics, top, tiered


@settings(max_examples=300, deadline=None)
@given(fetch_requests())
def test_split_sends_upstream_exactly_the_passthrough_partitions(case):
    version, topics, top, tiered_pairs = case
    body = encode(kio_request(version, topics, **top))
    resolve = {topic_key(version, name): name for name, _ in topics}
    upstream, tiered = split(
        read_fetch_request(version, memoryview(body)),
        lambda topic, p: (resolve[topic], p.partition) in tiered_pairs,
    )

    kept = [(n, [p for p in ps if (n, p.partition) not in tiered_pairs]) for n, ps in topics]
    kept = [(name, partitions) for name, partitions in kept if partitions]
    if kept:
        no_session = {"session_id": NO_SESSION, "session_epoch": FINAL_EPOCH}
        expected = kio_request(version, kept, **top | no_session | {"forgotten_topics_data": ()})
        assert upstream == encode(expected)
        assert decode(REQUESTS[version], upstream) == expected
    else:
        assert upstream is None
    by_key = {(topic_key(version, n), p.partition): p for n, ps in topics for p in ps}
    assert [(t.topic, t.partition) for t in tiered] == [
        (topic_key(version, name), p.partition)
        for name, partitions in topics
        for p in partitions
        if (name, p.partition) in tiered_pairs
    ]
    for each in tiered:
        sent = by_key[each.topic, each.partition]
        assert each.fetch_offset == sent.fetch_offset
        assert each.partition_max_bytes == sent.partition_max_bytes


# -- answers ----------------------------------------------------------------------------


@st.composite
def record_pieces(draw):
    """Some records cut in pieces, some of them views: (the records, the pieces)."""
    records = draw(st.binary(max_size=64))
    cuts = sorted(draw(st.lists(st.integers(0, len(records)), max_size=3)))
    bounds = [0, *cuts, len(records)]
    pieces = [records[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]
    return records, [memoryview(p) if draw(st.booleans()) else p for p in pieces]


@st.composite
def answered_partition(draw, version, index):
    """(kio PartitionData, the same as a TieredFetchResult or None if it cannot be one)."""
    m = mod(RESPONSES, version)
    aborted = draw(st.none() | st.lists(st.tuples(INT64, INT64), max_size=3))
    fields = {
        "partition_index": index,
        "error_code": draw(st.sampled_from(list(ErrorCode))),
        "high_watermark": draw(INT64),
        "last_stable_offset": draw(INT64),
        "log_start_offset": draw(INT64),
        "aborted_transactions": None
        if aborted is None
        else tuple(m.AbortedTransaction(producer_id=p, first_offset=f) for p, f in aborted),
        "preferred_read_replica": draw(INT32),
    }
    if fields["error_code"] != ErrorCode.none:  # Kafka's error answers know no offset
        fields |= {"high_watermark": -1, "last_stable_offset": -1, "log_start_offset": -1}
    if version >= 12 and draw(st.booleans()):  # tags the tiered path does not write
        fields["diverging_epoch"] = draw(st.from_type(m.EpochEndOffset))
        fields["current_leader"] = draw(st.from_type(m.LeaderIdAndEpoch))
        fields["snapshot_id"] = draw(st.from_type(m.SnapshotId))
        data = only_fields(m.PartitionData, **fields, records=draw(st.none() | st.binary()))
        return data, None
    if draw(st.booleans()):  # null records: upstream only
        return only_fields(m.PartitionData, **fields, records=None), None
    records, pieces = draw(record_pieces())
    data = only_fields(m.PartitionData, **fields, records=records)
    result = TieredFetchResult(
        error_code=fields["error_code"].value,
        high_watermark=data.high_watermark,
        last_stable_offset=data.last_stable_offset,
        log_start_offset=getattr(data, "log_start_offset", -1),
        aborted_transactions=aborted,
        preferred_read_replica=getattr(data, "preferred_read_replica", -1),
        records=pieces,
    )
    return data, result


def kio_answer(version, topics, **top):
    """topics: [(name, [kio PartitionData])]."""
    m = mod(RESPONSES, version)
    field = "topic_id" if version >= 13 else "topic"
    responses = tuple(
        m.FetchableTopicResponse(**{field: topic_key(version, name)}, partitions=tuple(parts))
        for name, parts in topics
    )
    fields = {"error_code": ErrorCode.none, "session_id": 0, "responses": responses}
    return only_fields(m.FetchResponse, **fields | top)


@st.composite
def cut_answers(draw):
    version = draw(st.sampled_from(VERSIONS))
    m = mod(RESPONSES, version)
    whole, upstream_topics, results = [], [], {}
    for name, indexes in draw(layouts()):
        partitions, sent = [], []
        for index in indexes:
            data, result = draw(answered_partition(version, index))
            partitions.append(data)
            if result is not None and draw(st.booleans()):
                results[topic_key(version, name), index] = result
            else:
                sent.append(data)
        whole.append((name, partitions))
        if sent:
            upstream_topics.append((name, draw(st.permutations(sent))))
    if draw(st.booleans()):  # a topic the request does not name
        upstream_topics.append(("\x00stranger", [draw(answered_partition(version, 0))[0]]))
    top = {"throttle_time": draw(st.integers(0, 2**31 - 1)) * MS}
    if version >= 16:
        top["node_endpoints"] = tuple(draw(st.lists(st.from_type(m.NodeEndpoint), max_size=2)))
    upstream = None
    if upstream_topics or draw(st.booleans()):
        topics = draw(st.permutations(upstream_topics))
        upstream = kio_answer(version, topics, **top, session_id=draw(INT32))
    else:
        top = {"throttle_time": 0 * MS}
    request_m = mod(REQUESTS, version)
    request = kio_request(
        version,
        [
            (name, [only_fields(request_m.FetchPartition, partition=p.partition_index,
                                fetch_offset=0, partition_max_bytes=1) for p in partitions])
            for name, partitions in whole
        ],  # fmt: skip
        replica_id=-1, max_wait=0 * MS, min_bytes=1, session_id=draw(INT32),
        session_epoch=draw(INT32), forgotten_topics_data=(),
    )  # fmt: skip
    return version, request, upstream, results, kio_answer(version, whole, **top)


@settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(cut_answers())
def test_merge_of_a_cut_answer_is_the_answer(case):
    version, request, upstream, results, whole = case
    view = read_fetch_request(version, encode(request))
    upstream_body = None if upstream is None else memoryview(encode(upstream))
    merged = merge_responses(version, view, upstream_body, results)
    assert merged == encode(whole)
