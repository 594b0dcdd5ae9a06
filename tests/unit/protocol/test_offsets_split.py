"""Splitting a ListOffsets request between upstream and the tiered path, and merging the
answers, for every served version; requests and answers written and read back with kio."""

from __future__ import annotations

import struct

import pytest
from kio.schema.errors import ErrorCode

from proxy.apis.api02_list_offsets import (
    EARLIEST_TIMESTAMP,
    LATEST_TIMESTAMP,
    UNANSWERED,
    OffsetsResult,
    TieredOffsetsPartition,
    merge_responses,
    read_list_offsets_request,
    read_list_offsets_response,
    split,
)
from proxy.kafka.codec import decode, encode
from proxy.kafka.frames import FrameError
from tests.support.kio_types import MS, mod, only_fields, served

REQUESTS, RESPONSES, VERSIONS = served(2)
FLEXIBLE = [v for v in VERSIONS if v >= 6]
T = 1_700_000_000_000  # a timestamp in ms


def test_every_kio_list_offsets_version_is_served():
    assert sorted(REQUESTS) == sorted(RESPONSES) == list(VERSIONS) == list(range(1, 12))


# topic -> partitions, each (index, timestamp, current_leader_epoch)
LAYOUT = {
    "a": [(0, LATEST_TIMESTAMP, 5), (1, EARLIEST_TIMESTAMP, 5), (2, T, 6)],
    "b": [(0, -3, 1), (7, 42, 2)],
    "c": [(3, LATEST_TIMESTAMP, 0)],
}


def request(version, layout=None, **top):
    """A kio request; `top` overrides the top-level fields, those the version lacks dropped."""
    m = mod(REQUESTS, version)
    topics = tuple(
        m.ListOffsetsTopic(
            name=name,
            partitions=tuple(
                only_fields(
                    m.ListOffsetsPartition,
                    partition_index=index,
                    timestamp=timestamp,
                    current_leader_epoch=epoch,
                )
                for index, timestamp, epoch in partitions
            ),
        )
        for name, partitions in (LAYOUT if layout is None else layout).items()
    )
    fields = {"replica_id": -1, "isolation_level": 1, "topics": topics, "timeout": 1500 * MS}
    return only_fields(m.ListOffsetsRequest, **(fields | top))


def only(layout, keep):
    """The layout with only the partitions `keep(name, partition entry)` is true for."""
    kept = {name: [p for p in parts if keep(name, p)] for name, parts in layout.items()}
    return {name: parts for name, parts in kept.items() if parts}


# -- reading the request ----------------------------------------------------------------


@pytest.mark.parametrize("version", VERSIONS)
def test_read_finds_every_field_the_version_has(version):
    sent = request(version, replica_id=-2, isolation_level=1, timeout=2500 * MS)
    view = read_list_offsets_request(version, memoryview(encode(sent)))
    assert view.api_version == version
    assert view.replica_id == -2
    assert view.isolation_level == (1 if version >= 2 else 0)
    assert view.timeout_ms == (2500 if version >= 10 else None)
    assert [t.topic for t in view.topics] == list(LAYOUT)
    for topic, partitions in zip(view.topics, LAYOUT.values(), strict=True):
        got = [(p.partition, p.timestamp, p.current_leader_epoch) for p in topic.partitions]
        assert got == [
            (index, timestamp, epoch if version >= 4 else -1)
            for index, timestamp, epoch in partitions
        ]


@pytest.mark.parametrize("version", [2, 10])
def test_read_takes_a_follower_replica_id_and_read_uncommitted(version):
    view = read_list_offsets_request(
        version, encode(request(version, replica_id=3, isolation_level=0))
    )
    assert (view.replica_id, view.isolation_level) == (3, 0)


@pytest.mark.parametrize("version", [1, 5, 6, 11])
def test_read_an_empty_request(version):
    view = read_list_offsets_request(version, encode(request(version, {})))
    assert view.topics == ()
    assert split(view, lambda topic, p: False) == (None, [])


# -- splitting --------------------------------------------------------------------------

PREDICATES = {
    "nothing": lambda name, p: False,
    "everything": lambda name, p: True,
    "topic a": lambda name, p: name == "a",
    "latest only": lambda name, p: p[1] == LATEST_TIMESTAMP,
    "one partition": lambda name, p: (name, p[0]) == ("b", 7),
    "all but one": lambda name, p: (name, p[0]) != ("c", 3),
}


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("predicate", PREDICATES.values(), ids=PREDICATES.keys())
def test_split_sends_upstream_only_the_passthrough_partitions(version, predicate):
    sent = request(version, replica_id=-1, isolation_level=1, timeout=700 * MS)
    seen = []

    def is_tiered(topic, p):
        seen.append((topic, p.partition))
        return predicate(topic, (p.partition, p.timestamp, p.current_leader_epoch))

    upstream, tiered = split(read_list_offsets_request(version, encode(sent)), is_tiered)

    assert seen == [(name, p[0]) for name, partitions in LAYOUT.items() for p in partitions]
    kept = only(LAYOUT, lambda name, p: not predicate(name, p))
    if kept:
        expected = request(version, kept, replica_id=-1, isolation_level=1, timeout=700 * MS)
        assert decode(REQUESTS[version], upstream) == expected
        assert upstream == encode(expected)  # and everything kept byte for byte
    else:
        assert upstream is None
    assert tiered == [
        TieredOffsetsPartition(name, index, timestamp, epoch if version >= 4 else -1)
        for name, partitions in only(LAYOUT, predicate).items()
        for index, timestamp, epoch in partitions
    ]


def test_split_decides_by_timestamp():
    """EARLIEST from Kafka, LATEST answered by the proxy, for the same topic."""
    view = read_list_offsets_request(7, encode(request(7)))
    upstream, tiered = split(view, lambda topic, p: p.timestamp == LATEST_TIMESTAMP)
    assert [(t.topic, t.partition) for t in tiered] == [("a", 0), ("c", 3)]
    partitions = decode(REQUESTS[7], upstream).topics
    assert [(t.name, [p.partition_index for p in t.partitions]) for t in partitions] == [
        ("a", [1, 2]),
        ("b", [0, 7]),
    ]


@pytest.mark.parametrize("version", FLEXIBLE)
def test_split_keeps_tags_kio_does_not_know(version):
    """An unknown tag on a partition, on a topic and at the top level passes as it came."""
    one = {"a": [(0, LATEST_TIMESTAMP, 1), (1, EARLIEST_TIMESTAMP, 1)]}
    body = encode(request(version, one))
    unknown = b"\x01\x05\x02ab"  # one tagged field: tag 5, 2 bytes
    at = len(body) - 3 - (4 if version >= 10 else 0)  # before the timeout and top-level tags
    assert body[at : at + 2] == b"\x00\x00"  # partition 1's tags, topic a's tags
    tagged = body[:at] + unknown + unknown + body[at + 2 : -1] + unknown
    upstream, _ = split(read_list_offsets_request(version, tagged), lambda t, p: p.partition == 0)
    partition_1 = struct.pack(">i", 1) + (struct.pack(">i", 1) if version >= 4 else b"")
    partition_1 += struct.pack(">q", EARLIEST_TIMESTAMP)
    assert partition_1 + unknown + unknown in upstream
    assert upstream.endswith(unknown)
    assert upstream.count(unknown) == 3


# -- malformed requests -----------------------------------------------------------------


@pytest.mark.parametrize("version", VERSIONS)
def test_every_truncation_is_a_frame_error(version):
    body = encode(request(version))
    for end in range(len(body)):
        with pytest.raises(FrameError, match=f"malformed ListOffsets v{version} request"):
            read_list_offsets_request(version, body[:end])


@pytest.mark.parametrize("version", [1, 6, 11])
def test_bytes_after_the_end_are_a_frame_error(version):
    with pytest.raises(FrameError, match="1 bytes after the end"):
        read_list_offsets_request(version, encode(request(version)) + b"\x00")


def test_garbled_arrays_and_strings_are_frame_errors():
    head = struct.pack(">ib", -1, 0)  # v2: replica id, isolation level
    with pytest.raises(FrameError, match="null topics array"):
        read_list_offsets_request(2, head + struct.pack(">i", -1))
    with pytest.raises(FrameError, match="topics array of 2147483647 items"):
        read_list_offsets_request(2, head + struct.pack(">i", 2**31 - 1))
    with pytest.raises(FrameError, match="null topic name"):
        read_list_offsets_request(2, head + struct.pack(">ih", 1, -1))
    with pytest.raises(FrameError, match="partitions array of 1000 items"):
        read_list_offsets_request(2, head + struct.pack(">ihi", 1, 0, 1000) + bytes(40))
    compact = struct.pack(">ib", -1, 0) + b"\x02\x00"  # v6: one topic, a null name
    with pytest.raises(FrameError, match="null topic name"):
        read_list_offsets_request(6, compact)
    read_list_offsets_request(6, struct.pack(">ib", -1, 0) + b"\x01\x00")  # no topic: fine


@pytest.mark.parametrize("version", [0, 12])
def test_unserved_versions_are_refused(version):
    with pytest.raises(FrameError, match=f"unsupported version {version} of ListOffsets"):
        read_list_offsets_request(version, encode(request(1)))


# -- answers ----------------------------------------------------------------------------


def partition_response(version, index, error=ErrorCode.none, **fields):
    """A kio answered partition; fields the version lacks are dropped."""
    m = mod(RESPONSES, version)
    return only_fields(
        m.ListOffsetsPartitionResponse, partition_index=index, error_code=error, **fields
    )


def answer(version, topics, throttle_ms=0):
    """A kio answer: topics is [(name, [ListOffsetsPartitionResponse])]."""
    m = mod(RESPONSES, version)
    responses = tuple(
        m.ListOffsetsTopicResponse(name=name, partitions=tuple(parts)) for name, parts in topics
    )
    return only_fields(m.ListOffsetsResponse, throttle_time=throttle_ms * MS, topics=responses)


def upstream_partitions(version):
    """What a broker answers for a/0, a/2, b/0, b/7 and c/3, an error among them."""
    return {
        ("a", 0): partition_response(version, 0, timestamp=-1, offset=104, leader_epoch=5),
        ("a", 2): partition_response(version, 2, timestamp=T + 3, offset=77, leader_epoch=6),
        ("b", 0): partition_response(version, 0, ErrorCode.fenced_leader_epoch),
        ("b", 7): partition_response(version, 7, timestamp=50, offset=9_000_000_000),
        ("c", 3): partition_response(version, 3, ErrorCode.unknown_topic_or_partition),
    }


def upstream_answer(version, throttle_ms=0):
    """Upstream's answer in an order of its own, with a topic and a partition the proxy
    did not ask for."""
    got = upstream_partitions(version)
    stranger = partition_response(version, 5, timestamp=1, offset=1)
    topics = [
        ("c", [got["c", 3]]),
        ("b", [got["b", 7], got["b", 0]]),
        ("not asked", [stranger]),
        ("a", [got["a", 2], stranger, got["a", 0]]),
    ]
    return answer(version, topics, throttle_ms)


def as_kio(version, index, result: OffsetsResult):
    return partition_response(
        version, index, ErrorCode(result.error_code), timestamp=result.timestamp,
        offset=result.offset, leader_epoch=result.leader_epoch,
    )  # fmt: skip


def in_request_order(got):
    return [(name, [got[name, p[0]] for p in parts]) for name, parts in LAYOUT.items()]


TIERED = {("a", 1): OffsetsResult(error_code=0, timestamp=T, offset=60, leader_epoch=4)}


@pytest.mark.parametrize("version", VERSIONS)
def test_merge_answers_every_partition_in_request_order(version):
    view = read_list_offsets_request(version, encode(request(version)))
    upstream = encode(upstream_answer(version, throttle_ms=30))
    merged = merge_responses(version, view, memoryview(upstream), TIERED)

    got = upstream_partitions(version) | {("a", 1): as_kio(version, 1, TIERED["a", 1])}
    expected = answer(version, in_request_order(got), throttle_ms=30)
    assert decode(RESPONSES[version], merged) == expected
    assert merged == encode(expected)  # upstream's entries byte for byte, nothing else


@pytest.mark.parametrize("version", VERSIONS)
def test_partitions_nobody_answered_are_not_leader_or_follower(version):
    """Upstream answers a subset; a tiered partition without a result is unanswered too."""
    view = read_list_offsets_request(version, encode(request(version)))
    got = upstream_partitions(version)
    upstream = answer(version, [("b", [got["b", 7]]), ("a", [got["a", 2]])], throttle_ms=9)
    merged = merge_responses(version, view, encode(upstream), TIERED)

    unanswered = partition_response(version, 0, ErrorCode.not_leader_or_follower)
    assert as_kio(version, 0, UNANSWERED) == unanswered
    by_key = {
        (t.name, p.partition_index): p for t in decode(RESPONSES[version], merged).topics
        for p in t.partitions
    }  # fmt: skip
    assert list(by_key) == [(name, p[0]) for name, parts in LAYOUT.items() for p in parts]
    assert by_key["b", 7] == got["b", 7]
    assert by_key["a", 2] == got["a", 2]
    assert by_key["a", 1] == as_kio(version, 1, TIERED["a", 1])
    for key in [("a", 0), ("b", 0), ("c", 3)]:
        assert by_key[key] == partition_response(version, key[1], ErrorCode.not_leader_or_follower)
        assert (by_key[key].timestamp, by_key[key].offset) == (-1, -1)


@pytest.mark.parametrize("version", VERSIONS)
def test_merge_without_upstream_answers_from_the_results(version):
    view = read_list_offsets_request(version, encode(request(version, {"a": LAYOUT["a"]})))
    results = {
        ("a", 0): OffsetsResult(error_code=0, timestamp=-1, offset=5, leader_epoch=2),
        ("a", 2): OffsetsResult(error_code=ErrorCode.offset_not_available.value),
        ("z", 9): OffsetsResult(error_code=0, offset=1),  # not asked: dropped
    }
    merged = merge_responses(version, view, None, results, throttle_ms=12)
    expected = answer(
        version,
        [("a", [as_kio(version, 0, results["a", 0]), as_kio(version, 1, UNANSWERED),
                as_kio(version, 2, results["a", 2])])],
        throttle_ms=12,
    )  # fmt: skip
    assert decode(RESPONSES[version], merged) == expected


def test_a_tiered_result_wins_over_an_upstream_answer_for_the_same_partition():
    view = read_list_offsets_request(4, encode(request(4, {"a": [(0, -1, 0)]})))
    upstream = encode(answer(4, [("a", [partition_response(4, 0, offset=1)])]))
    tiered = {("a", 0): OffsetsResult(error_code=0, offset=2)}
    merged = decode(RESPONSES[4], merge_responses(4, view, upstream, tiered))
    assert merged.topics[0].partitions[0].offset == 2


def test_merge_takes_the_larger_throttle_time():
    view = read_list_offsets_request(2, encode(request(2, {"a": [(0, -1, 0)]})))
    upstream = encode(answer(2, [("a", [partition_response(2, 0)])], throttle_ms=30))
    for asked, expected in ((0, 30), (45, 45)):
        merged = merge_responses(2, view, upstream, {}, throttle_ms=asked)
        assert decode(RESPONSES[2], merged).throttle_time == expected * MS


def test_a_partition_asked_twice_is_answered_twice():
    m = mod(REQUESTS, 4)
    twice = tuple(m.ListOffsetsPartition(partition_index=0, timestamp=t) for t in (-1, -2))
    sent = request(4, {}, topics=(m.ListOffsetsTopic(name="a", partitions=twice),))
    results = {("a", 0): OffsetsResult(error_code=0, offset=3)}
    merged = decode(
        RESPONSES[4], merge_responses(4, read_list_offsets_request(4, encode(sent)), None, results)
    )
    assert merged.topics[0].partitions == (as_kio(4, 0, results["a", 0]),) * 2


def test_merge_writes_an_error_code_kio_does_not_know_as_it_came():
    view = read_list_offsets_request(1, encode(request(1, {"a": [(0, -1, 0)]})))
    merged = merge_responses(1, view, None, {("a", 0): OffsetsResult(error_code=999, offset=8)})
    assert merged == struct.pack(">ih", 1, 1) + b"a" + struct.pack(">iihqq", 1, 0, 999, -1, 8)


@pytest.mark.parametrize("version", FLEXIBLE)
def test_merge_keeps_upstream_tags_kio_does_not_know(version):
    view = read_list_offsets_request(version, encode(request(version, {"a": [(0, -1, 0)]})))
    plain = encode(answer(version, [("a", [partition_response(version, 0, offset=4)])]))
    assert plain.endswith(b"\x00\x00\x00")  # partition, topic, top-level tags
    unknown = b"\x01\x07\x01z"  # tag 7, one byte
    upstream = plain[:-3] + unknown + b"\x00" + unknown
    assert merge_responses(version, view, upstream, {}) == upstream


def test_merge_refuses_another_version_than_the_request():
    view = read_list_offsets_request(6, encode(request(6)))
    with pytest.raises(ValueError, match="ListOffsets v6 request answered as v7"):
        merge_responses(7, view, None, {})


def test_a_result_that_does_not_fit_is_a_value_error():
    view = read_list_offsets_request(4, encode(request(4, {"a": [(0, -1, 0)]})))
    with pytest.raises(ValueError, match="ListOffsets answer for partition 0"):
        merge_responses(4, view, None, {("a", 0): OffsetsResult(error_code=2**15)})


@pytest.mark.parametrize("version", VERSIONS)
def test_every_truncated_upstream_answer_is_a_frame_error(version):
    view = read_list_offsets_request(version, encode(request(version)))
    upstream = encode(upstream_answer(version, throttle_ms=1))
    for end in range(len(upstream)):
        with pytest.raises(FrameError, match=f"malformed ListOffsets v{version} response"):
            merge_responses(version, view, upstream[:end], {})


def test_garbled_upstream_answers_are_frame_errors():
    view = read_list_offsets_request(2, encode(request(2)))
    with pytest.raises(FrameError, match="null topics array"):
        merge_responses(2, view, struct.pack(">ii", 0, -1), {})
    with pytest.raises(FrameError, match="null topic name"):
        merge_responses(2, view, struct.pack(">iih", 0, 1, -1), {})
    topic = struct.pack(">iih", 0, 1, 1) + b"a"
    with pytest.raises(FrameError, match="partitions array of 99 items"):
        merge_responses(2, view, topic + struct.pack(">i", 99) + bytes(30), {})
    with pytest.raises(FrameError, match="4 bytes after the end"):
        merge_responses(2, view, encode(answer(2, [])) + bytes(4), {})


@pytest.mark.parametrize("version", VERSIONS)
def test_read_gives_upstreams_values_per_partition(version):
    upstream = encode(upstream_answer(version, throttle_ms=3))
    got = read_list_offsets_response(version, memoryview(upstream))
    expected = {
        key: OffsetsResult(
            p.error_code.value, p.timestamp, p.offset, getattr(p, "leader_epoch", -1)
        )
        for key, p in upstream_partitions(version).items()
    }
    stranger = OffsetsResult(0, timestamp=1, offset=1)
    assert got == expected | {("not asked", 5): stranger, ("a", 5): stranger}
    assert got["a", 2].leader_epoch == (6 if version >= 4 else -1)
    with pytest.raises(FrameError, match=f"malformed ListOffsets v{version} response"):
        read_list_offsets_response(version, upstream[:-1])
