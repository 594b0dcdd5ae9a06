"""Splitting a DescribeProducers request between Kafka and the tiered path, and merging the
answers; requests and answers written and read back with kio."""

from __future__ import annotations

import datetime

import pytest
from kio.schema.errors import ErrorCode

from proxy.apis.api61_describe_producers import (
    DescribedProducer,
    PartitionProducers,
    merge_response,
    read_request,
    read_response,
    upstream_request,
)
from proxy.kafka.codec import decode, encode
from proxy.kafka.frames import FrameError
from proxy.partition.producer_state import BatchMetadata, empty_entry
from tests.support.kio_types import mod, served

REQUESTS, RESPONSES, VERSIONS = served(61)
KAFKA_PRODUCER = DescribedProducer(7, 1, 9, 1_700_000_000_000, -1, -1)


def test_every_kio_describe_producers_version_is_served():
    assert VERSIONS == sorted(RESPONSES) == [0]


def request(topics: dict[str, list[int]]):
    m = mod(REQUESTS, 0)
    return m.DescribeProducersRequest(
        topics=tuple(
            m.TopicRequest(name=name, partition_indexes=tuple(parts))
            for name, parts in topics.items()
        )
    )


def response(topics: dict[str, list[tuple[int, int, tuple[DescribedProducer, ...]]]], ms=0):
    m = mod(RESPONSES, 0)
    return m.DescribeProducersResponse(
        throttle_time=datetime.timedelta(milliseconds=ms),
        topics=tuple(
            m.TopicResponse(
                name=name,
                partitions=tuple(
                    m.PartitionResponse(
                        partition_index=index,
                        error_code=ErrorCode(code),
                        error_message=None,
                        active_producers=tuple(
                            m.ProducerState(
                                producer_id=p.producer_id,
                                producer_epoch=p.producer_epoch,
                                last_sequence=p.last_sequence,
                                last_timestamp=p.last_timestamp,
                                coordinator_epoch=p.coordinator_epoch,
                                current_txn_start_offset=p.current_txn_start_offset,
                            )
                            for p in producers
                        ),
                    )
                    for index, code, producers in parts
                ),
            )
            for name, parts in topics.items()
        ),
    )


def answered(body: bytes) -> dict[tuple[str, int], tuple[int, tuple[DescribedProducer, ...]]]:
    decoded = decode(mod(RESPONSES, 0).DescribeProducersResponse, body)
    return {
        (t.name, p.partition_index): (
            p.error_code.value,
            tuple(
                DescribedProducer(
                    s.producer_id,
                    s.producer_epoch,
                    s.last_sequence,
                    s.last_timestamp,
                    s.coordinator_epoch,
                    s.current_txn_start_offset,
                )
                for s in p.active_producers
            ),
        )
        for t in decoded.topics
        for p in t.partitions
    }


def test_a_request_is_read_and_the_kafka_part_split_off_in_its_order():
    body = encode(request({"tiered": [0, 1], "plain": [2, 0], "mixed": [3]}))
    view = read_request(0, body)
    asked = [(t.topic, p.partition) for t in view.topics for p in t.partitions]
    assert asked == [("tiered", 0), ("tiered", 1), ("plain", 2), ("plain", 0), ("mixed", 3)]
    upstream = upstream_request(view, [("mixed", 3), ("plain", 2), ("plain", 0)])
    assert upstream == encode(request({"plain": [2, 0], "mixed": [3]}))
    assert upstream_request(view, []) is None


def test_the_answer_merges_the_proxys_partitions_with_kafkas_in_the_requests_order():
    body = encode(request({"tiered": [0, 1], "plain": [0]}))
    view = read_request(0, body)
    kafka = encode(response({"plain": [(0, 0, (KAFKA_PRODUCER,))]}, ms=12))
    mine = DescribedProducer(1001, 0, 41, 1_700_000_000_123, 2, 40)
    results = {
        ("tiered", 0): PartitionProducers(0, (mine,)),
        ("tiered", 1): PartitionProducers(ErrorCode.not_leader_or_follower.value),
    }
    merged = merge_response(view, memoryview(kafka), results)
    assert merged == encode(
        response(
            {
                "tiered": [(0, 0, (mine,)), (1, ErrorCode.not_leader_or_follower.value, ())],
                "plain": [(0, 0, (KAFKA_PRODUCER,))],
            },
            ms=12,
        )
    )
    assert answered(merged)[("plain", 0)] == (0, (KAFKA_PRODUCER,))


def test_a_partition_no_one_answered_is_not_leader_or_follower():
    view = read_request(0, encode(request({"tiered": [0], "plain": [1]})))
    merged = merge_response(view, None, {("tiered", 0): PartitionProducers(0)})
    assert answered(merged) == {
        ("tiered", 0): (0, ()),
        ("plain", 1): (ErrorCode.not_leader_or_follower.value, ()),
    }


def test_kafkas_answer_is_read_into_one_entry_per_partition():
    kafka = encode(response({"a": [(0, 0, (KAFKA_PRODUCER,)), (1, 3, ())], "b": [(2, 0, ())]}))
    entries = read_response(0, kafka)
    assert sorted(entries) == [("a", 0), ("a", 1), ("b", 2)]
    assert bytes(entries["a", 1])[:6] == b"\x00\x00\x00\x01\x00\x03"


@pytest.mark.parametrize("cut", [1, 5, 9, 20])
def test_malformed_requests_and_answers_are_frame_errors(cut):
    body = encode(request({"tiered": [0, 1]}))
    with pytest.raises(FrameError, match="malformed DescribeProducers v0 request"):
        read_request(0, body[:-cut] if cut < len(body) else b"")
    kafka = encode(response({"a": [(0, 0, (KAFKA_PRODUCER,))]}))
    with pytest.raises(FrameError, match="malformed DescribeProducers v0 response"):
        read_response(0, kafka[:-cut])
    with pytest.raises(FrameError, match="unsupported version 1"):
        read_request(1, body)


def test_an_entry_is_described_as_kafka_describes_it():
    """Kafka's lastTimestamp is the timestamp of what the producer last wrote (its last
    batch's max timestamp, or its last marker's), not when the partition last saw it."""
    entry = empty_entry(5)
    assert entry.described() == DescribedProducer(5, -1, -1, -1, -1, -1)
    batch = BatchMetadata(last_seq=4, last_offset=104, offset_delta=4, timestamp=1_000)
    written = entry.with_batch(0, batch, now_ms=99_000, transactional=True)
    assert written.described() == DescribedProducer(5, 0, 4, 1_000, -1, 100)
    ended = written.with_marker(0, 3, now_ms=99_500, marker_timestamp=2_000)
    assert ended.described() == DescribedProducer(5, 0, 4, 2_000, 3, -1)
    assert ended.last_timestamp == 99_500  # expiration still counts from the partition's clock
    restored = type(ended)(5, 0, 99_500, ended.batches, 3)  # a snapshot holds no written time
    assert restored == ended
    assert restored.described().last_timestamp == 1_000  # the last batch's, then
