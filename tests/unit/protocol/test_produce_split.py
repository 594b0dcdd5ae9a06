"""Splitting a Produce request between upstream and the tiered path, and merging the
answers, for every served version, on requests carrying real v2 record batches."""

from __future__ import annotations

import datetime
import struct
import uuid

import pytest
from kio.schema.errors import ErrorCode

from proxy.apis.api00_produce import (
    NO_LEADER,
    PartitionResult,
    TieredPartition,
    build_produce_response,
    merge_responses,
    read_produce_request,
    split,
)
from proxy.kafka.codec import decode, encode
from proxy.kafka.frames import FrameError
from tests.support.batches import seeded_batch as batch
from tests.support.kio_types import mod, produce_request, served
from tests.support.kio_types import topic_key as key

REQUESTS, RESPONSES, VERSIONS = served(0)
EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
NO_TIME = datetime.timedelta(0)


def test_every_kio_produce_version_is_served():
    assert sorted(REQUESTS) == list(VERSIONS) == list(range(3, 14))


# topic -> [(partition, records)]; "c" has a null records field
LAYOUT = {
    "a": [(0, batch(3, 1)), (1, batch(1, 2)), (2, batch(5, 3) + batch(2, 4))],
    "b": [(0, batch(2, 5)), (7, batch(4, 6))],
    "c": [(3, None), (4, batch(1, 7))],
}


def request(version: int, layout=None, **options):
    return produce_request(version, LAYOUT if layout is None else layout, **options)


def only(layout, keep):
    """The layout with only the partitions `keep(name, partition)` is true for."""
    kept = {name: [(p, r) for p, r in parts if keep(name, p)] for name, parts in layout.items()}
    return {name: parts for name, parts in kept.items() if parts}


PREDICATES = {
    "nothing": lambda name, p: False,
    "everything": lambda name, p: True,
    "topic a": lambda name, p: name == "a",
    "odd partitions": lambda name, p: p % 2 == 1,
    "one partition": lambda name, p: (name, p) == ("b", 7),
    "all but one": lambda name, p: (name, p) != ("c", 3),
}


@pytest.mark.parametrize("version", VERSIONS)
def test_read_finds_every_partition_without_copying(version):
    body = encode(request(version, transactional_id="tx-1", acks=1, timeout_ms=2500))
    view = read_produce_request(version, memoryview(body))
    assert (view.transactional_id, view.acks, view.timeout_ms) == ("tx-1", 1, 2500)
    assert [t.topic for t in view.topics] == [key(version, name) for name in LAYOUT]
    for topic, (_, partitions) in zip(view.topics, LAYOUT.items(), strict=True):
        assert [p.index for p in topic.partitions] == [index for index, _ in partitions]
        for got, (_, records) in zip(topic.partitions, partitions, strict=True):
            if records is None:
                assert got.records is None
            else:
                assert got.records.obj is body  # a view of the request, not a copy
                assert bytes(got.records) == records


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("predicate", PREDICATES.values(), ids=PREDICATES.keys())
def test_split_keeps_passthrough_partitions_as_they_came(version, predicate):
    body = encode(request(version, transactional_id="tx", acks=-1, timeout_ms=900))
    resolve = {key(version, name): name for name in LAYOUT}

    def is_tiered(topic, partition):
        return predicate(resolve[topic], partition)

    passthrough, tiered = split(read_produce_request(version, body), is_tiered)

    kept = only(LAYOUT, lambda name, p: not predicate(name, p))
    if kept:
        expected = request(version, kept, transactional_id="tx", acks=-1, timeout_ms=900)
        assert passthrough == encode(expected)  # everything else byte for byte as it came
        assert decode(REQUESTS[version], passthrough) == expected
    else:
        assert passthrough is None
    moved = only(LAYOUT, predicate)
    assert tiered == [
        TieredPartition(key(version, name), index, records)
        for name, parts in moved.items()
        for index, records in parts
    ]
    for each in tiered:
        assert each.records is None or each.records.obj is body


@pytest.mark.parametrize("version", VERSIONS)
def test_split_with_nothing_tiered_is_the_request_as_it_came(version):
    body = encode(request(version))
    passthrough, tiered = split(read_produce_request(version, body), lambda t, p: False)
    assert passthrough == body
    assert tiered == []


@pytest.mark.parametrize("version", [9, 12, 13])
def test_split_keeps_tagged_fields_kio_does_not_know(version):
    unknown = b"\x01\x05\x02ab"  # one tagged field: tag 5, 2 bytes
    body = encode(request(version, {"a": [(0, batch(1, 1))]}))
    assert body.endswith(b"\x00\x00\x00")  # partition, topic and request tags: none
    tagged = body[:-3] + unknown * 3
    view = read_produce_request(version, tagged)
    passthrough, _ = split(view, lambda t, p: False)
    assert passthrough == tagged
    two = encode(request(version, {"a": [(0, batch(1, 1)), (1, batch(1, 2))]}))
    two = two[:-3] + unknown * 3  # partition 1, the topic and the request carry a tag
    passthrough, tiered = split(read_produce_request(version, two), lambda t, p: p == 0)
    assert passthrough.endswith(unknown * 3)
    assert [t.partition for t in tiered] == [0]


@pytest.mark.parametrize("version", [3, 8, 9, 13])
def test_every_truncation_is_a_frame_error(version):
    body = encode(request(version, transactional_id="tx"))
    for end in range(len(body)):
        with pytest.raises(FrameError, match=f"malformed Produce v{version} request"):
            read_produce_request(version, body[:end])


@pytest.mark.parametrize("version", [3, 9, 13])
def test_bytes_after_the_end_are_a_frame_error(version):
    with pytest.raises(FrameError, match="1 bytes after the end"):
        read_produce_request(version, encode(request(version)) + b"\x00")


def test_null_and_oversized_arrays_are_frame_errors():
    head = struct.pack(">hhi", -1, 1, 1000)  # null transactional id, acks, timeout
    with pytest.raises(FrameError, match="null topic_data array"):
        read_produce_request(3, head + struct.pack(">i", -1))
    with pytest.raises(FrameError, match="topic_data array of 2147483647 items"):
        read_produce_request(3, head + struct.pack(">i", 2**31 - 1))
    with pytest.raises(FrameError, match="null topic name"):
        read_produce_request(3, head + struct.pack(">ih", 1, -1))
    records = struct.pack(">ihiii", 1, 0, 1, 0, 100)  # topic "", partition 0, 100 bytes
    with pytest.raises(FrameError, match="truncated"):
        read_produce_request(3, head + records + b"x" * 99)


@pytest.mark.parametrize("version", [2, 14])
def test_unserved_versions_are_refused(version):
    with pytest.raises(FrameError, match=f"unsupported version {version} of Produce"):
        read_produce_request(version, encode(request(3)))


# -- answers ----------------------------------------------------------------------------


def kio_partition(version: int, result: PartitionResult):
    """The kio object `result` should come back as."""
    m = mod(RESPONSES, version)
    fields = {
        "index": result.partition,
        "error_code": ErrorCode(result.error_code),
        "base_offset": result.base_offset,
        "log_append_time": None
        if result.log_append_time_ms == -1
        else EPOCH + datetime.timedelta(milliseconds=result.log_append_time_ms),
    }
    if version >= 5:
        fields["log_start_offset"] = result.log_start_offset
    if version >= 8:
        fields["record_errors"] = tuple(
            m.BatchIndexAndErrorMessage(batch_index=i, batch_index_error_message=message)
            for i, message in result.record_errors
        )
        fields["error_message"] = result.error_message
    if version >= 10:
        leader_id, leader_epoch = result.current_leader
        fields["current_leader"] = m.LeaderIdAndEpoch(
            leader_id=leader_id, leader_epoch=leader_epoch
        )
    return m.PartitionProduceResponse(**fields)


def kio_answer(version, results, throttle_ms=0, node_endpoints=()):
    """A kio answer of `results`, grouped by topic in order of first appearance."""
    m = mod(RESPONSES, version)
    topics: dict = {}
    for result in results:
        topics.setdefault(result.topic, []).append(kio_partition(version, result))
    extra = {"node_endpoints": node_endpoints} if version >= 10 else {}
    return m.ProduceResponse(
        responses=tuple(
            m.TopicProduceResponse(
                **{"topic_id" if version >= 13 else "name": topic},
                partition_responses=tuple(partitions),
            )
            for topic, partitions in topics.items()
        ),
        throttle_time=datetime.timedelta(milliseconds=throttle_ms),
        **extra,
    )


def result(version, name, partition, **fields):
    return PartitionResult(key(version, name), partition, **fields)


def upstream_results(version):
    """What a broker answers for the passthrough partitions, in an order of its own."""
    leader = (2, 9) if version >= 10 else NO_LEADER  # KIP-951, with NOT_LEADER_OR_FOLLOWER
    return [
        result(version, "b", 7, error_code=6, current_leader=leader),
        result(version, "a", 2, error_code=0, base_offset=500, log_start_offset=3),
        result(version, "a", 0, error_code=0, base_offset=100, log_append_time_ms=1_700_000_000_123,
               log_start_offset=3 if version >= 5 else -1),
        result(version, "c", 3, error_code=87, error_message="bad" if version >= 8 else None,
               record_errors=((1, "no"), (4, None)) if version >= 8 else ()),
    ]  # fmt: skip


def local_results(version):
    """What the tiered path answers: a, 1 and the b, 0 and c, 4."""
    return [
        result(version, "c", 4, error_code=0, base_offset=40, log_start_offset=0),
        result(version, "a", 1, error_code=0, base_offset=7, log_start_offset=0),
        result(version, "b", 0, error_code=56, error_message="fenced" if version >= 8 else None),
    ]


def endpoints(version):
    if version < 10:
        return ()
    m = mod(RESPONSES, version)
    return (m.NodeEndpoint(node_id=2, host="broker-2", port=9092, rack="zone-b"),)


@pytest.mark.parametrize("version", VERSIONS)
def test_build_writes_every_field_the_version_has(version):
    results = upstream_results(version)
    body = build_produce_response(version, results, throttle_ms=25)
    assert decode(RESPONSES[version], body) == kio_answer(version, results, 25)


@pytest.mark.parametrize("version", VERSIONS)
def test_merge_answers_in_request_order(version):
    view = read_produce_request(version, encode(request(version)))
    upstream = encode(kio_answer(version, upstream_results(version), 30, endpoints(version)))
    merged = merge_responses(version, memoryview(upstream), local_results(version), request=view)
    got = decode(RESPONSES[version], merged)
    by_partition = {(r.topic, r.partition): r for r in upstream_results(version)}
    by_partition |= {(r.topic, r.partition): r for r in local_results(version)}
    in_order = [by_partition[key(version, name), p] for name, ps in LAYOUT.items() for p, _ in ps]
    assert got == kio_answer(version, in_order, 30, endpoints(version))


@pytest.mark.parametrize("version", VERSIONS)
def test_merge_with_nothing_upstream(version):
    view = read_produce_request(
        version, encode(request(version, only(LAYOUT, PREDICATES["topic a"])))
    )
    local = [r for r in local_results(version) if r.topic == key(version, "a")]
    merged = merge_responses(version, None, local, request=view, throttle_ms=5)
    assert decode(RESPONSES[version], merged) == kio_answer(version, local, 5)


@pytest.mark.parametrize("version", VERSIONS)
def test_merge_with_nothing_local_is_the_upstream_answer(version):
    upstream = encode(kio_answer(version, upstream_results(version), 12, endpoints(version)))
    assert merge_responses(version, upstream, []) == upstream


def test_merge_without_the_request_puts_upstream_first():
    upstream = encode(kio_answer(9, upstream_results(9)))
    merged = decode(RESPONSES[9], merge_responses(9, upstream, local_results(9)))
    names = [(t.name, [p.index for p in t.partition_responses]) for t in merged.responses]
    assert names == [("b", [7, 0]), ("a", [2, 0, 1]), ("c", [3, 4])]


def test_merge_keeps_an_error_code_kio_does_not_know():
    answer = encode(kio_answer(3, [result(3, "t", 0, error_code=0, base_offset=1)]))
    at = 4 + 2 + 1 + 4 + 4  # topic count, name, partition count, index
    upstream = answer[:at] + struct.pack(">h", 9999) + answer[at + 2 :]
    merged = merge_responses(3, upstream, [result(3, "t", 1, error_code=0)])
    assert merged[at : at + 2] == struct.pack(">h", 9999)


def test_merge_drops_a_tagged_field_kio_does_not_know():
    answer = encode(kio_answer(10, upstream_results(10)))
    assert answer.endswith(b"\x00")  # no top-level tagged field
    upstream = answer[:-1] + b"\x01\x07\x01z"  # tag 7, one byte
    assert merge_responses(10, upstream, []) == answer


@pytest.mark.parametrize("version", [3, 8, 10, 13])
def test_every_truncated_upstream_answer_is_a_frame_error(version):
    upstream = encode(kio_answer(version, upstream_results(version), 1, endpoints(version)))
    for end in range(len(upstream)):
        with pytest.raises(FrameError, match=f"malformed Produce v{version} response"):
            merge_responses(version, upstream[:end], local_results(version))


def test_a_current_leader_overrunning_its_tag_is_a_frame_error():
    answer = encode(kio_answer(10, [result(10, "t", 0, error_code=6, current_leader=(1, 2))]))
    at = answer.index(b"\x01\x00\x09")  # one tag: 0, 9 bytes (leader, epoch, no tags)
    upstream = answer[:at] + b"\x01\x00\x08" + answer[at + 3 :]
    with pytest.raises(FrameError, match="tagged field value ends"):
        merge_responses(10, upstream, [])


def test_topics_must_be_named_as_the_version_names_them():
    with pytest.raises(ValueError, match="v13 names topics by ids"):
        build_produce_response(13, [PartitionResult("t", 0, 0)])
    with pytest.raises(ValueError, match="v12 names topics by names"):
        build_produce_response(12, [PartitionResult(uuid.uuid4(), 0, 0)])


def test_local_result_defaults_mean_no_value():
    got = decode(RESPONSES[12], build_produce_response(12, [PartitionResult("t", 0, 0)]))
    partition = got.responses[0].partition_responses[0]
    assert partition.log_append_time is None
    assert partition.log_start_offset == -1
    assert (partition.current_leader.leader_id, partition.current_leader.leader_epoch) == (-1, -1)
