"""Splitting a DeleteRecords request between Kafka and the tiered path, and merging the
answers, for every served version; requests and answers written and read back with kio."""

from __future__ import annotations

import datetime

import pytest
from kio.schema.errors import ErrorCode

from proxy.apis.api21_delete_records import (
    UNANSWERED,
    DeleteResult,
    merge_responses,
    read_delete_records_request,
    read_delete_records_response,
    split,
)
from proxy.kafka.codec import decode, encode
from proxy.kafka.frames import FrameError
from tests.support.kio_types import mod, served

REQUESTS, RESPONSES, VERSIONS = served(21)


def test_every_kio_delete_records_version_is_served():
    assert VERSIONS == sorted(RESPONSES) == [0, 1, 2]


def request(version: int, topics: dict[str, list[tuple[int, int]]], timeout_ms: int = 3000):
    m = mod(REQUESTS, version)
    return m.DeleteRecordsRequest(
        topics=tuple(
            m.DeleteRecordsTopic(
                name=name,
                partitions=tuple(
                    m.DeleteRecordsPartition(partition_index=p, offset=o) for p, o in entries
                ),
            )
            for name, entries in topics.items()
        ),
        timeout=datetime.timedelta(milliseconds=timeout_ms),
    )


def response(version: int, topics: dict[str, list[tuple[int, int, int]]], throttle_ms: int = 0):
    m = mod(RESPONSES, version)
    return m.DeleteRecordsResponse(
        throttle_time=datetime.timedelta(milliseconds=throttle_ms),
        topics=tuple(
            m.DeleteRecordsTopicResult(
                name=name,
                partitions=tuple(
                    m.DeleteRecordsPartitionResult(
                        partition_index=p, low_watermark=low, error_code=ErrorCode(code)
                    )
                    for p, low, code in entries
                ),
            )
            for name, entries in topics.items()
        ),
    )


def answers(version: int, body: bytes) -> dict[tuple[str, int], tuple[int, int]]:
    decoded = decode(RESPONSES[version], body)
    return {
        (t.name, p.partition_index): (p.low_watermark, p.error_code.value)
        for t in decoded.topics
        for p in t.partitions
    }


@pytest.mark.parametrize("version", VERSIONS)
def test_read_locates_every_partition_and_the_timeout(version):
    body = encode(request(version, {"a": [(0, 10), (1, -1)], "b": [(3, 7)]}, timeout_ms=1234))
    view = read_delete_records_request(version, body)
    assert view.timeout_ms == 1234
    assert [(t.topic, [(p.partition, p.offset) for p in t.partitions]) for t in view.topics] == [
        ("a", [(0, 10), (1, -1)]),
        ("b", [(3, 7)]),
    ]


@pytest.mark.parametrize("version", VERSIONS)
def test_split_keeps_rewrites_and_leaves_out_partitions(version):
    body = encode(request(version, {"a": [(0, 10), (1, -1)], "b": [(3, 7)], "c": [(0, 5)]}))
    view = read_delete_records_request(version, body)
    wanted = {("a", 0): 10, ("a", 1): 500, ("b", 3): None, ("c", 0): 5}
    upstream = split(view, lambda topic, p: wanted[topic, p.partition])
    assert upstream is not None
    assert decode(REQUESTS[version], upstream) == request(
        version, {"a": [(0, 10), (1, 500)], "c": [(0, 5)]}
    )
    assert split(view, lambda topic, p: None) is None
    assert split(view, lambda topic, p: p.offset) == bytes(body)  # nothing changed: as it came


@pytest.mark.parametrize("version", VERSIONS)
def test_merge_answers_every_partition_in_request_order(version):
    body = encode(request(version, {"a": [(0, 10), (1, -1)], "b": [(3, 7), (4, 1)]}))
    view = read_delete_records_request(version, body)
    upstream = encode(
        response(version, {"b": [(4, 1, 0), (3, 7, 0)], "a": [(0, 9, 6)]}, throttle_ms=25)
    )
    local = {("a", 0): DeleteResult(0, 10), ("a", 1): DeleteResult(0, 4000)}
    merged = merge_responses(version, view, upstream, local)
    assert decode(RESPONSES[version], merged).throttle_time == datetime.timedelta(milliseconds=25)
    assert answers(version, merged) == {
        ("a", 0): (10, 0),  # the tiered result replaces upstream's
        ("a", 1): (4000, 0),
        ("b", 3): (7, 0),
        ("b", 4): (1, 0),
    }
    # nothing went upstream, and a partition nobody answered: NOT_LEADER_OR_FOLLOWER
    alone = answers(version, merge_responses(version, view, None, local))
    assert alone[("b", 3)] == (UNANSWERED.low_watermark, UNANSWERED.error_code) == (-1, 6)
    assert read_delete_records_response(version, upstream) == (
        25,
        {("b", 4): DeleteResult(0, 1), ("b", 3): DeleteResult(0, 7), ("a", 0): DeleteResult(6, 9)},
    )


@pytest.mark.parametrize("version", VERSIONS)
def test_malformed_bodies_name_the_api_and_version(version):
    body = encode(request(version, {"a": [(0, 10)]}))
    for cut in (1, 5, len(body) - 1):
        with pytest.raises(FrameError, match=f"malformed DeleteRecords v{version} request"):
            read_delete_records_request(version, body[:cut])
    with pytest.raises(FrameError, match="bytes after the end"):
        read_delete_records_request(version, body + b"\x00")
    view = read_delete_records_request(version, body)
    with pytest.raises(FrameError, match=f"malformed DeleteRecords v{version} response"):
        merge_responses(version, view, b"\x00\x00", {})
    with pytest.raises(ValueError, match="answered as"):
        merge_responses((version + 1) % 3, view, None, {})


def test_an_unserved_version_is_a_frame_error():
    with pytest.raises(FrameError, match="unsupported version 3"):
        read_delete_records_request(3, b"")
