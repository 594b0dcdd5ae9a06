"""Splitting a Fetch request between upstream and the tiered path, and merging the answers,
for every served version, on answers carrying real v2 record batches."""

from __future__ import annotations

import dataclasses
import struct
import uuid

import pytest
from kio.schema.errors import ErrorCode

from proxy.apis.fetch_merge import build_fetch_response, merge_responses
from proxy.apis.fetch_split import (
    FINAL_EPOCH,
    NO_SESSION,
    TieredFetchPartition,
    TieredFetchResult,
    read_fetch_request,
    split,
)
from proxy.kafka.codec import decode, encode
from proxy.kafka.frames import FrameError
from tests.support.batches import seeded_batch as batch
from tests.support.kio_types import MS, mod, only_fields, served
from tests.support.kio_types import topic_key as key

REQUESTS, RESPONSES, VERSIONS = served(1)


def test_every_kio_fetch_version_is_served():
    assert sorted(REQUESTS) == sorted(RESPONSES) == list(VERSIONS) == list(range(4, 19))


# topic -> partitions, each (index, fetch_offset, current_leader_epoch, partition_max_bytes)
LAYOUT = {
    "a": [(0, 100, 5, 1000), (1, 0, 5, 2000), (2, 77, 6, 3000)],
    "b": [(0, 12, 1, 4000), (7, 9_000_000_000, 2, 5000)],
    "c": [(3, 1, 0, 6000)],
}


def request(version, layout=None, *, forgotten=(), **top):
    """A kio request; `top` overrides the top-level fields, those the version lacks dropped."""
    m = mod(REQUESTS, version)
    topic_field = "topic_id" if version >= 13 else "topic"
    topics = tuple(
        m.FetchTopic(
            **{topic_field: key(version, name)},
            partitions=tuple(
                only_fields(
                    m.FetchPartition,
                    partition=index,
                    fetch_offset=offset,
                    current_leader_epoch=epoch,
                    partition_max_bytes=max_bytes,
                    last_fetched_epoch=epoch - 1,
                    log_start_offset=index + 10,
                )  # fmt: skip
                for index, offset, epoch, max_bytes in partitions
            ),
        )
        for name, partitions in (LAYOUT if layout is None else layout).items()
    )
    fields = {
        "replica_id": -1,
        "max_wait": 500 * MS,
        "min_bytes": 1,
        "max_bytes": 52428800,
        "isolation_level": 1,
        "session_id": 0,
        "session_epoch": 0,
        "rack_id": "zone-a",
        "topics": topics,
        "forgotten_topics_data": tuple(
            m.ForgottenTopic(**{topic_field: key(version, name)}, partitions=partitions)
            for name, partitions in (forgotten if version >= 7 else ())
        ),
    }
    return only_fields(m.FetchRequest, **(fields | top))


def only(layout, keep):
    """The layout with only the partitions `keep(name, partition)` is true for."""
    kept = {name: [p for p in parts if keep(name, p[0])] for name, parts in layout.items()}
    return {name: parts for name, parts in kept.items() if parts}


PREDICATES = {
    "nothing": lambda name, p: False,
    "everything": lambda name, p: True,
    "topic a": lambda name, p: name == "a",
    "partition 0s": lambda name, p: p == 0,
    "one partition": lambda name, p: (name, p) == ("b", 7),
    "all but one": lambda name, p: (name, p) != ("c", 3),
}


# -- reading the request ----------------------------------------------------------------


@pytest.mark.parametrize("version", VERSIONS)
def test_read_finds_every_field_the_version_has(version):
    sent = request(
        version, session_id=41, session_epoch=7, forgotten=[("z", (4, 5))], max_wait=250 * MS,
        min_bytes=16, max_bytes=1 << 20, isolation_level=1, rack_id="zone-c",
    )  # fmt: skip
    view = read_fetch_request(version, memoryview(encode(sent)))
    assert view.api_version == version
    assert (view.max_wait_ms, view.min_bytes, view.max_bytes) == (250, 16, 1 << 20)
    assert (view.replica_id, view.replica_epoch, view.isolation_level) == (-1, -1, 1)
    if version >= 7:
        assert (view.session_id, view.session_epoch) == (41, 7)
        assert view.forgotten_topics == ((key(version, "z"), (4, 5)),)
    else:
        assert (view.session_id, view.session_epoch) == (NO_SESSION, FINAL_EPOCH)
        assert view.forgotten_topics == ()
    assert view.rack_id == ("zone-c" if version >= 11 else "")
    assert [t.topic for t in view.topics] == [key(version, name) for name in LAYOUT]
    for topic, partitions in zip(view.topics, LAYOUT.values(), strict=True):
        got = [
            (p.partition, p.fetch_offset, p.current_leader_epoch, p.partition_max_bytes,
             p.last_fetched_epoch, p.log_start_offset)
            for p in topic.partitions
        ]  # fmt: skip
        assert got == [
            (index, offset, epoch if version >= 9 else -1, max_bytes,
             epoch - 1 if version >= 12 else -1, index + 10 if version >= 5 else -1)
            for index, offset, epoch, max_bytes in partitions
        ]  # fmt: skip


@pytest.mark.parametrize("version", [4, 14])
def test_read_takes_a_follower_replica_id_from_the_head(version):
    view = read_fetch_request(version, encode(request(version, replica_id=3)))
    assert (view.replica_id, view.replica_epoch) == (3, -1)


@pytest.mark.parametrize("version", [15, 18])
def test_read_takes_the_replica_id_from_the_tagged_replica_state(version):
    state = mod(REQUESTS, version).ReplicaState(replica_id=3, replica_epoch=9)
    view = read_fetch_request(version, encode(request(version, replica_state=state)))
    assert (view.replica_id, view.replica_epoch) == (3, 9)


# -- splitting --------------------------------------------------------------------------


def sessionless(version, layout, **top):
    """What upstream should get: the partitions of `layout`, no fetch session."""
    return request(version, layout, **top, session_id=NO_SESSION, session_epoch=FINAL_EPOCH)


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("predicate", PREDICATES.values(), ids=PREDICATES.keys())
def test_split_sends_upstream_a_sessionless_fetch_of_the_passthrough_partitions(version, predicate):
    body = encode(request(version, session_id=41, session_epoch=7, forgotten=[("a", (9,))]))
    resolve = {key(version, name): name for name in LAYOUT}
    upstream, tiered = split(
        read_fetch_request(version, body), lambda topic, p: predicate(resolve[topic], p.partition)
    )

    kept = only(LAYOUT, lambda name, p: not predicate(name, p))
    if kept:
        expected = sessionless(version, kept)
        assert decode(REQUESTS[version], upstream) == expected
        assert upstream == encode(expected)  # and everything kept byte for byte
    else:
        assert upstream is None
    assert tiered == [
        TieredFetchPartition(
            key(version, name),
            index,
            offset,
            max_bytes,
            epoch if version >= 9 else -1,
            epoch - 1 if version >= 12 else -1,
            index + 10 if version >= 5 else -1,
        )  # fmt: skip
        for name, partitions in only(LAYOUT, predicate).items()
        for index, offset, epoch, max_bytes in partitions
    ]


@pytest.mark.parametrize("version", VERSIONS)
def test_split_overrides_wait_and_sizes_when_asked(version):
    view = read_fetch_request(version, encode(request(version, max_wait=500 * MS, min_bytes=9)))
    upstream, _ = split(
        view, lambda t, p: p.partition == 0, max_wait_ms=0, min_bytes=1, max_bytes=777
    )
    kept = only(LAYOUT, lambda name, p: p != 0)
    expected = sessionless(version, kept, max_wait=0 * MS, min_bytes=1, max_bytes=777)
    assert decode(REQUESTS[version], upstream) == expected


@pytest.mark.parametrize("version", [17, 18])
def test_split_keeps_tagged_fields_as_they_came(version):
    m = mod(REQUESTS, version)
    tags = {"cluster_id": "c-1", "replica_state": m.ReplicaState(replica_id=-1, replica_epoch=4)}
    sent = request(version, **tags)
    first = sent.topics[0]
    tagged = dataclasses.replace(
        first.partitions[1],
        replica_directory_id=uuid.UUID(int=5),
        **({"high_watermark": 88} if version >= 18 else {}),
    )
    partitions = (first.partitions[0], tagged, *first.partitions[2:])
    sent = dataclasses.replace(sent, topics=(dataclasses.replace(first, partitions=partitions),))
    upstream, _ = split(read_fetch_request(version, encode(sent)), lambda t, p: p.partition == 0)
    expected = dataclasses.replace(
        sent,
        topics=(dataclasses.replace(first, partitions=partitions[1:]),),
        session_id=NO_SESSION,
        session_epoch=FINAL_EPOCH,
    )
    assert decode(REQUESTS[version], upstream) == expected


def test_split_keeps_a_tag_kio_does_not_know():
    body = encode(request(12, {"a": [(0, 1, 0, 10), (1, 2, 0, 10)]}))
    # partition and topic tags; no forgotten topic; the rack id; no top-level tag
    assert body.endswith(b"\x00\x00\x01\x07zone-a\x00")
    unknown = b"\x01\x05\x02ab"  # one tagged field: tag 5, 2 bytes
    tagged = body[:-1] + unknown
    upstream, _ = split(read_fetch_request(12, tagged), lambda t, p: p.partition == 0)
    assert upstream.endswith(b"\x07zone-a" + unknown)


# -- malformed requests -----------------------------------------------------------------


@pytest.mark.parametrize("version", [4, 7, 11, 12, 13, 15, 18])
def test_every_truncation_is_a_frame_error(version):
    body = encode(request(version, forgotten=[("z", (1, 2))]))
    for end in range(len(body)):
        with pytest.raises(FrameError, match=f"malformed Fetch v{version} request"):
            read_fetch_request(version, body[:end])


@pytest.mark.parametrize("version", [4, 12, 18])
def test_bytes_after_the_end_are_a_frame_error(version):
    with pytest.raises(FrameError, match="1 bytes after the end"):
        read_fetch_request(version, encode(request(version)) + b"\x00")


def test_garbled_arrays_and_strings_are_frame_errors():
    head = struct.pack(">iiiib", -1, 500, 1, 1000, 0)  # v4: replica, wait, min, max, isolation
    with pytest.raises(FrameError, match="null topics array"):
        read_fetch_request(4, head + struct.pack(">i", -1))
    with pytest.raises(FrameError, match="topics array of 2147483647 items"):
        read_fetch_request(4, head + struct.pack(">i", 2**31 - 1))
    with pytest.raises(FrameError, match="null topic name"):
        read_fetch_request(4, head + struct.pack(">ih", 1, -1))
    with pytest.raises(FrameError, match="partitions array of 1000 items"):
        read_fetch_request(4, head + struct.pack(">ihi", 1, 0, 1000) + bytes(40))
    v11 = struct.pack(">iiiibii", -1, 500, 1, 1000, 0, 0, -1) + struct.pack(">ii", 0, 0)
    with pytest.raises(FrameError, match="null rack_id"):
        read_fetch_request(11, v11 + struct.pack(">h", -1))
    read_fetch_request(11, v11 + struct.pack(">h", 0))  # the same with an empty rack id


def test_a_replica_state_overrunning_its_tag_is_a_frame_error():
    state = mod(REQUESTS, 15).ReplicaState(replica_id=1, replica_epoch=2)
    body = encode(request(15, replica_state=state))
    at = body.rindex(b"\x01\x01\x0d")  # one tag: 1, 13 bytes (id, epoch, no tags)
    garbled = body[:at] + b"\x01\x01\x0e" + body[at + 3 :] + b"\x00"
    with pytest.raises(FrameError, match="replica_state at byte"):
        read_fetch_request(15, garbled)


@pytest.mark.parametrize("version", [3, 19])
def test_unserved_versions_are_refused(version):
    with pytest.raises(FrameError, match=f"unsupported version {version} of Fetch"):
        read_fetch_request(version, encode(request(4)))


# -- answers ----------------------------------------------------------------------------


def partition_data(version, index, error=ErrorCode.none, records=b"", **fields):
    """A kio answered partition; fields the version lacks are dropped."""
    m = mod(RESPONSES, version)
    fields = {"high_watermark": 10, "aborted_transactions": None} | fields
    return only_fields(
        m.PartitionData, partition_index=index, error_code=error, records=records, **fields
    )


def upstream_partitions(version):
    """What a broker answers for topic b and partitions a/0, a/2 and c/3, with record
    batches, tagged fields from v12, an aborted transaction, an error."""
    m = mod(RESPONSES, version)
    tags = {}
    if version >= 12:
        tags = {
            "diverging_epoch": m.EpochEndOffset(epoch=4, end_offset=90),
            "current_leader": m.LeaderIdAndEpoch(leader_id=2, leader_epoch=9),
            "snapshot_id": m.SnapshotId(end_offset=7, epoch=1),
        }
    aborted = (m.AbortedTransaction(producer_id=5, first_offset=101),)
    return {
        ("a", 0): partition_data(version, 0, records=batch(3, 1) + batch(1, 2), high_watermark=104,
                                 last_stable_offset=103, log_start_offset=0),
        ("a", 2): partition_data(version, 2, records=batch(2, 3), aborted_transactions=aborted,
                                 preferred_read_replica=1),
        ("b", 0): partition_data(version, 0, ErrorCode.not_leader_or_follower, records=b"",
                                 high_watermark=-1, **tags),
        ("b", 7): partition_data(version, 7, records=batch(4, 4)),
        ("c", 3): partition_data(version, 3, ErrorCode.offset_out_of_range, records=None),
    }  # fmt: skip


def tiered_results(version):
    """What the tiered path answers for a/1: batches in pieces, a view among them."""
    pieces = [batch(2, 5), memoryview(batch(3, 6) + batch(1, 7)), b""]
    return {
        (key(version, "a"), 1): TieredFetchResult(
            error_code=0,
            high_watermark=60,
            last_stable_offset=58,
            log_start_offset=3,
            aborted_transactions=[(77, 50)],
            preferred_read_replica=-1,
            records=pieces,
        )
    }


def as_kio(version, result: TieredFetchResult, index):
    m = mod(RESPONSES, version)
    aborted = result.aborted_transactions
    return partition_data(
        version, index, ErrorCode(result.error_code),
        records=b"".join(bytes(piece) for piece in result.records),
        high_watermark=result.high_watermark, last_stable_offset=result.last_stable_offset,
        log_start_offset=result.log_start_offset,
        aborted_transactions=None if aborted is None else tuple(
            m.AbortedTransaction(producer_id=p, first_offset=f) for p, f in aborted
        ),
        preferred_read_replica=result.preferred_read_replica,
    )  # fmt: skip


def answer(version, topics, throttle_ms=0, endpoints=(), **top):
    """A kio answer: topics is [(name, [PartitionData])]."""
    m = mod(RESPONSES, version)
    field = "topic_id" if version >= 13 else "topic"
    fields = {
        "throttle_time": throttle_ms * MS,
        "error_code": ErrorCode.none,
        "session_id": 0,
        "responses": tuple(
            m.FetchableTopicResponse(**{field: key(version, name)}, partitions=tuple(parts))
            for name, parts in topics
        ),
        "node_endpoints": endpoints,
    }
    return only_fields(m.FetchResponse, **(fields | top))


def endpoints(version):
    if version < 16:
        return ()
    m = mod(RESPONSES, version)
    return (m.NodeEndpoint(node_id=2, host="broker-2", port=9092, rack="zone-b"),)


def upstream_answer(version, **top):
    """Upstream's answer in an order of its own, with a topic and a partition the proxy
    did not ask for."""
    got = upstream_partitions(version)
    stranger = partition_data(version, 5, records=batch(1, 9))
    topics = [
        ("c", [got["c", 3]]),
        ("b", [got["b", 7], got["b", 0]]),
        ("not asked", [stranger]),
        ("a", [got["a", 2], stranger, got["a", 0]]),
    ]
    return answer(version, topics, endpoints=endpoints(version), **top)


@pytest.mark.parametrize("version", VERSIONS)
def test_merge_answers_every_partition_in_request_order(version):
    view = read_fetch_request(version, encode(request(version, session_id=41, session_epoch=7)))
    upstream = encode(upstream_answer(version, throttle_ms=30, session_id=0))
    results = tiered_results(version)
    merged = merge_responses(version, view, memoryview(upstream), results)

    got = upstream_partitions(version)
    got["a", 1] = as_kio(version, results[key(version, "a"), 1], 1)
    expected = answer(
        version,
        [(name, [got[name, p[0]] for p in partitions]) for name, partitions in LAYOUT.items()],
        throttle_ms=30,
        endpoints=endpoints(version),
    )
    assert decode(RESPONSES[version], merged) == expected
    assert merged.count(batch(4, 4)) == 1  # upstream's records, and only the asked-for ones
    assert merged.count(batch(1, 9)) == 0


@pytest.mark.parametrize("version", VERSIONS)
def test_merge_answers_with_session_id_0_and_no_error(version):
    view = read_fetch_request(version, encode(request(version, session_id=41, session_epoch=7)))
    upstream = answer(version, [("a", [partition_data(version, 0)])], session_id=41)
    assert getattr(upstream, "session_id", 0) == (41 if version >= 7 else 0)
    merged = decode(RESPONSES[version], merge_responses(version, view, encode(upstream), {}))
    assert getattr(merged, "session_id", 0) == 0
    assert getattr(merged, "error_code", ErrorCode.none) == ErrorCode.none


@pytest.mark.parametrize("version", VERSIONS)
def test_merge_keeps_records_it_could_not_parse_as_they_came(version):
    """Records are carried, never read: bytes that are no batch at all pass unchanged."""
    view = read_fetch_request(version, encode(request(version, {"a": [(0, 1, 0, 10)]})))
    garbage = b"\xff" * 7 + b"not a batch"
    upstream = answer(version, [("a", [partition_data(version, 0, records=garbage)])])
    merged = merge_responses(version, view, encode(upstream), {})
    assert decode(RESPONSES[version], merged).responses[0].partitions[0].records == garbage


@pytest.mark.parametrize("version", VERSIONS)
def test_partitions_upstream_left_unanswered_are_answered_empty(version):
    """A throttling broker answers a full fetch with no partition (KIP-219)."""
    view = read_fetch_request(version, encode(request(version)))
    upstream = encode(answer(version, [], throttle_ms=250))
    results = tiered_results(version)
    merged = decode(RESPONSES[version], merge_responses(version, view, upstream, results))
    assert merged.throttle_time == 250 * MS
    empty = partition_data(version, 0, high_watermark=-1)
    by_partition = {
        (t.topic_id if version >= 13 else t.topic, p.partition_index): p
        for t in merged.responses
        for p in t.partitions
    }
    assert len(by_partition) == 6
    assert by_partition[key(version, "a"), 1] == as_kio(version, results[key(version, "a"), 1], 1)
    for (topic, index), partition in by_partition.items():
        if (topic, index) != (key(version, "a"), 1):
            assert partition == dataclasses.replace(empty, partition_index=index)
            assert partition.records == b""


@pytest.mark.parametrize("version", VERSIONS)
def test_build_answers_a_request_that_is_all_tiered(version):
    view = read_fetch_request(
        version, encode(request(version, {"a": [(0, 1, 0, 9), (1, 1, 0, 9)]}))
    )
    results = {
        (key(version, "a"), 1): TieredFetchResult(error_code=0, high_watermark=5, records=[b"x"]),
        (key(version, "a"), 0): TieredFetchResult(error_code=1, log_start_offset=7, records=()),
    }
    merged = build_fetch_response(version, view, results, throttle_ms=5)
    # an error's offsets are -1, as Kafka answers them (OFFSET_OUT_OF_RANGE here)
    unknown = dataclasses.replace(results[key(version, "a"), 0], log_start_offset=-1)
    expected = answer(
        version,
        [("a", [as_kio(version, unknown, 0), as_kio(version, results[key(version, "a"), 1], 1)])],
        throttle_ms=5,
    )
    assert decode(RESPONSES[version], merged) == expected


def test_merge_keeps_upstream_tags_kio_does_not_know():
    view = read_fetch_request(16, encode(request(16, {"a": [(0, 1, 0, 10)]})))
    plain = encode(answer(16, [("a", [partition_data(16, 0, records=b"r")])]))
    assert plain.endswith(b"\x02r\x00\x00\x00")  # records; partition, topic, top-level tags
    unknown = b"\x01\x07\x01z"  # tag 7, one byte
    upstream = plain[:-3] + unknown + b"\x00" + unknown
    assert merge_responses(16, view, upstream, {}) == upstream


def test_merge_takes_the_larger_throttle_time():
    view = read_fetch_request(4, encode(request(4, {"a": [(0, 1, 0, 10)]})))
    upstream = encode(answer(4, [("a", [partition_data(4, 0)])], throttle_ms=30))
    for asked, expected in ((0, 30), (45, 45)):
        merged = merge_responses(4, view, upstream, {}, throttle_ms=asked)
        assert decode(RESPONSES[4], merged).throttle_time == expected * MS


def test_a_tiered_result_wins_over_an_upstream_answer_for_the_same_partition():
    view = read_fetch_request(9, encode(request(9, {"a": [(0, 1, 0, 10)]})))
    upstream = encode(answer(9, [("a", [partition_data(9, 0, records=b"upstream")])]))
    tiered = {("a", 0): TieredFetchResult(error_code=0, records=[b"tiered"])}
    merged = decode(RESPONSES[9], merge_responses(9, view, upstream, tiered))
    assert merged.responses[0].partitions[0].records == b"tiered"


def test_merge_refuses_another_version_than_the_request():
    view = read_fetch_request(12, encode(request(12)))
    with pytest.raises(ValueError, match="Fetch v12 request answered as v13"):
        merge_responses(13, view, None, {})


@pytest.mark.parametrize("version", [4, 7, 11, 12, 13, 16])
def test_every_truncated_upstream_answer_is_a_frame_error(version):
    view = read_fetch_request(version, encode(request(version)))
    upstream = encode(upstream_answer(version, throttle_ms=1))
    for end in range(len(upstream)):
        with pytest.raises(FrameError, match=f"malformed Fetch v{version} response"):
            merge_responses(version, view, upstream[:end], {})


def test_garbled_upstream_arrays_are_frame_errors():
    view = read_fetch_request(4, encode(request(4)))
    with pytest.raises(FrameError, match="null responses array"):
        merge_responses(4, view, struct.pack(">ii", 0, -1), {})
    partition = struct.pack(">ihqq", 0, 0, 1, 1)  # index, error, high watermark, LSO
    topic = struct.pack(">ih", 1, 1) + b"a" + struct.pack(">i", 1) + partition
    with pytest.raises(FrameError, match="aborted_transactions array of 99999 items"):
        merge_responses(4, view, struct.pack(">i", 0) + topic + struct.pack(">i", 99999), {})
    with pytest.raises(FrameError, match="truncated"):  # records longer than the answer
        merge_responses(4, view, struct.pack(">i", 0) + topic + struct.pack(">ii", -1, 10), {})
