"""OffsetForLeaderEpoch: the partitions a request names, and answers' end offsets
rewritten, for every served version; messages written and read back with kio."""

from __future__ import annotations

import datetime

import pytest
from kio.schema.errors import ErrorCode

from proxy.apis.api23_offset_for_leader_epoch import read_requested, rewrite_end_offsets
from proxy.kafka.codec import decode, encode
from proxy.kafka.frames import FrameError
from tests.support.kio_types import mod, served

REQUESTS, RESPONSES, VERSIONS = served(23)


def request(version: int, asked: dict[str, list[int]]):
    m = mod(REQUESTS, version)
    topics = tuple(
        m.OffsetForLeaderTopic(
            topic=name,
            partitions=tuple(
                m.OffsetForLeaderPartition(partition=p, current_leader_epoch=3, leader_epoch=2)
                for p in partitions
            ),
        )
        for name, partitions in asked.items()
    )
    extra = {"replica_id": -1} if "replica_id" in REQUESTS[version].__dataclass_fields__ else {}
    return m.OffsetForLeaderEpochRequest(topics=topics, **extra)


def response(version: int, answers: dict[str, list[tuple[int, int, int, int]]]):
    m = mod(RESPONSES, version)
    return m.OffsetForLeaderEpochResponse(
        throttle_time=datetime.timedelta(milliseconds=5),
        topics=tuple(
            m.OffsetForLeaderTopicResult(
                topic=name,
                partitions=tuple(
                    m.EpochEndOffset(
                        error_code=ErrorCode(code), partition=p, leader_epoch=e, end_offset=end
                    )
                    for code, p, e, end in entries
                ),
            )
            for name, entries in answers.items()
        ),
    )


def test_served_versions():
    assert VERSIONS == sorted(RESPONSES) == [2, 3, 4]


@pytest.mark.parametrize("version", VERSIONS)
def test_read_requested_names_every_partition_in_order(version):
    body = encode(request(version, {"a": [1, 0], "b": [7]}))
    assert read_requested(version, body) == [("a", 1), ("a", 0), ("b", 7)]
    with pytest.raises(FrameError, match=f"OffsetForLeaderEpoch v{version} request"):
        read_requested(version, body[:-2])
    with pytest.raises(FrameError, match="bytes after the end"):
        read_requested(version, body + b"\x00")


@pytest.mark.parametrize("version", VERSIONS)
def test_rewrite_replaces_only_the_end_offsets_asked_and_never_an_error(version):
    body = encode(response(version, {"a": [(0, 0, 2, 100), (6, 1, -1, -1)], "b": [(0, 7, 2, 9)]}))
    seen = []

    def new_end(topic, partition, epoch, end):
        seen.append((topic, partition, epoch, end))
        return 250 if topic == "a" else None

    rewritten = rewrite_end_offsets(version, body, new_end)
    assert seen == [("a", 0, 2, 100), ("b", 7, 2, 9)]  # the errored partition is not asked
    assert decode(RESPONSES[version], bytes(rewritten)) == response(
        version, {"a": [(0, 0, 2, 250), (6, 1, -1, -1)], "b": [(0, 7, 2, 9)]}
    )
    unchanged = memoryview(body)
    assert rewrite_end_offsets(version, unchanged, lambda *_: None) is unchanged
    with pytest.raises(FrameError, match=f"OffsetForLeaderEpoch v{version} response"):
        rewrite_end_offsets(version, body[:-3], new_end)
