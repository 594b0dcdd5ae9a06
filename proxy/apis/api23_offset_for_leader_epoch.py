"""OffsetForLeaderEpoch (api key 23), v2-v4 (all the proxy advertises): which partitions a
request names, and an answer's end offsets rewritten.

A consumer that sees a partition's leader epoch change asks where the epoch of its
position ends, to detect a truncated log. The request is `[replica_id (v3+)],
topics[topic, partitions[partition, current_leader_epoch, leader_epoch]]`, the answer
`throttle_time_ms, topics[topic, partitions[error_code, partition, leader_epoch,
end_offset]]`; v4 is flexible. A tiered partition's log goes on past Kafka's log end (the
cutover) in the latest epoch, so where Kafka answers the cutover or more, the proxy
answers the stream's high watermark (tiered_epochs.py).
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache

from proxy.apis.topics import read_topics
from proxy.kafka.api_keys import ApiKey
from proxy.kafka.codec import load_response_types, load_types, response_type
from proxy.kafka.frames import malformed
from proxy.kafka.wire import (
    INT32,
    expect_end,
    read_count,
    read_topic_key,
    read_topic_name,
    skip,
    skip_tagged_fields,
)

API_KEY = ApiKey.OFFSET_FOR_LEADER_EPOCH
REQUESTS = load_types(API_KEY, "request")
RESPONSES = load_response_types(API_KEY)

_ASKED = struct.Struct(">iii")  # partition, current_leader_epoch, leader_epoch
_ANSWER = struct.Struct(">hiiq")  # error_code, partition, leader_epoch, end_offset
_END_OFFSET = struct.Struct(">q")
_END_AT = 10  # the end offset's position in an answer entry

Key = tuple[str, int]


@dataclass(frozen=True, slots=True)
class EpochError:
    """An error to answer for a partition instead of Kafka's end offset (its leader
    epoch and end offset then -1, as Kafka answers errors)."""

    error_code: int


# (topic, partition, leader_epoch, end_offset) -> the end offset to answer, an error to
# answer instead, or None to keep Kafka's answer
NewEnd = Callable[[str, int, int, int], int | EpochError | None]


@cache
def _layout(api_version: int) -> tuple[bool, bool]:
    """(flexible, has replica_id); FrameError if the version is not served."""
    request = response_type(REQUESTS, API_KEY, api_version)
    return request.__flexible__, "replica_id" in request.__dataclass_fields__


def read_requested(api_version: int, body: memoryview | bytes) -> list[Key]:
    """The (topic, partition) pairs a request names, in its order; FrameError if malformed."""
    flexible, replica_id = _layout(api_version)
    buf = memoryview(body)

    def read_key(buf: memoryview, start: int) -> tuple[str, int]:
        return read_topic_name(buf, start, flexible)

    def read_partition(buf: memoryview, start: int) -> tuple[int, int]:
        offset = skip(buf, start, _ASKED.size)
        offset = skip_tagged_fields(buf, offset) if flexible else offset
        return INT32.unpack_from(buf, start)[0], offset

    with malformed(f"OffsetForLeaderEpoch v{api_version} request"):
        offset = skip(buf, 0, 4) if replica_id else 0
        topics, offset = read_topics(buf, offset, flexible, read_key, read_partition)
        offset = skip_tagged_fields(buf, offset) if flexible else offset
        expect_end(buf, offset)
    return [(topic.topic, partition) for topic in topics for partition in topic.partitions]


def rewrite_end_offsets(
    api_version: int, body: memoryview | bytes, new_end: NewEnd
) -> memoryview | bytearray:
    """The answer with the end offsets `new_end` replaces; the very view it was given
    when none is replaced. FrameError if malformed."""
    flexible, _ = _layout(api_version)
    buf = body if isinstance(body, memoryview) else memoryview(body)
    patches: list[tuple[int, int]] = []  # (position of an end offset, its new value)
    errors: list[tuple[int, int, int]] = []  # (position of an answer, error code, partition)
    with malformed(f"OffsetForLeaderEpoch v{api_version} response"):
        offset = skip(buf, 0, 4)  # throttle_time_ms
        count, offset = read_count(buf, offset, flexible, "topics")
        for _ in range(count):
            name, offset = read_topic_key(buf, offset, False, flexible)
            partitions, offset = read_count(buf, offset, flexible, "partitions")
            for _ in range(partitions):
                start, offset = offset, skip(buf, offset, _ANSWER.size)
                error_code, partition, epoch, end = _ANSWER.unpack_from(buf, start)
                if error_code == 0:
                    new = new_end(name, partition, epoch, end)
                    if isinstance(new, EpochError):
                        errors.append((start, new.error_code, partition))
                    elif new is not None and new != end:
                        patches.append((start + _END_AT, new))
                offset = skip_tagged_fields(buf, offset) if flexible else offset
            offset = skip_tagged_fields(buf, offset) if flexible else offset
        offset = skip_tagged_fields(buf, offset) if flexible else offset
        expect_end(buf, offset)
    if not patches and not errors:
        return buf
    out = bytearray(buf)
    for position, value in patches:
        _END_OFFSET.pack_into(out, position, value)
    for position, error_code, partition in errors:
        _ANSWER.pack_into(out, position, error_code, partition, -1, -1)
    return out
