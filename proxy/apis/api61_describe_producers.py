"""DescribeProducers (api key 61), v0 (all Kafka has): split a request naming tiered
partitions, and merge the answers.

An admin client (`kafka-transactions.sh describe-producers` and `find-hanging`, KIP-664)
asks a partition's leader for the idempotent and transactional producers it keeps state
for. v0 is flexible. The request is `topics[name, partition_indexes[int32]]`, the answer
`throttle_time_ms, topics[name, partitions[partition_index, error_code, error_message,
active_producers[producer_id, producer_epoch, last_sequence, last_timestamp,
coordinator_epoch, current_txn_start_offset]]]`.

`read_request` locates every partition asked; `upstream_request` is the request for the
partitions Kafka answers; `merge_response` answers every partition of the request, in
its order: the proxy's answer where it has one, upstream's entry as it came otherwise,
and NOT_LEADER_OR_FOLLOWER for one no one answered (the admin client looks the leader up
again and retries). Written by hand, as the other split APIs are: kio does not decode
bytes from the network (`proxy.kafka.codec`), and an answer entry is a few fixed fields.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import astuple, dataclass

from kio.schema.errors import ErrorCode

from proxy.apis.merge import NO_TAGS, merge_partitions
from proxy.apis.topics import TopicView, read_topics
from proxy.kafka.api_keys import ApiKey
from proxy.kafka.codec import load_response_types, load_types, response_type
from proxy.kafka.frames import malformed
from proxy.kafka.wire import (
    expect_end,
    read_count,
    read_int32,
    read_string,
    read_topic_name,
    skip,
    skip_tagged_fields,
    write_array_length,
    write_string,
)

API_KEY = ApiKey.DESCRIBE_PRODUCERS
REQUESTS = load_types(API_KEY, "request")
RESPONSES = load_response_types(API_KEY)

_INT32 = struct.Struct(">i")
_PARTITION_HEAD = struct.Struct(">ih")  # partition_index, error_code
_PRODUCER = struct.Struct(">qiiqiq")  # a ProducerState's fields, before its tagged fields
_NULL_STRING = b"\x00"  # a compact nullable string's null

Key = tuple[str, int]


@dataclass(frozen=True, slots=True)
class DescribedProducer:
    """One producer of a partition as DescribeProducers answers it (Kafka's
    ProducerState in that answer): its last sequence (-1: none kept), the timestamp of
    what it last wrote, and the first offset of its open transaction (-1: none)."""

    producer_id: int
    producer_epoch: int
    last_sequence: int
    last_timestamp: int
    coordinator_epoch: int
    current_txn_start_offset: int


@dataclass(frozen=True, slots=True)
class AskedPartition:
    partition: int


@dataclass(frozen=True, slots=True)
class DescribeProducersView:
    api_version: int
    body: memoryview
    topics: tuple[TopicView[str, AskedPartition], ...]


@dataclass(frozen=True, slots=True)
class PartitionProducers:
    """One partition's answer: an error code (then no producers), or its producers."""

    error_code: int
    producers: tuple[DescribedProducer, ...] = ()
    error_message: str | None = None


UNANSWERED = PartitionProducers(ErrorCode.not_leader_or_follower.value)


def _check_version(api_version: int) -> None:
    response_type(REQUESTS, API_KEY, api_version)  # FrameError if not served


def read_request(api_version: int, body: memoryview | bytes) -> DescribeProducersView:
    """Every partition asked, located; FrameError if the version is not served or the body
    is malformed or truncated."""
    _check_version(api_version)
    buf = memoryview(body)
    with malformed(f"DescribeProducers v{api_version} request"):

        def read_key(buf: memoryview, start: int) -> tuple[str, int]:
            return read_topic_name(buf, start, True)

        def read_partition(buf: memoryview, start: int) -> tuple[AskedPartition, int]:
            index, offset = read_int32(buf, start)
            return AskedPartition(index), offset

        arrays = ("topics", "partition_indexes")
        topics, offset = read_topics(buf, 0, True, read_key, read_partition, arrays)
        offset = skip_tagged_fields(buf, offset)
        expect_end(buf, offset)
    return DescribeProducersView(api_version, buf, tuple(topics))


def upstream_request(view: DescribeProducersView, keep: Iterable[Key]) -> bytes | None:
    """The request for the partitions `keep` (in the request's order), None if none."""
    kept = set(keep)
    topics = []
    for topic in view.topics:
        partitions = [p.partition for p in topic.partitions if (topic.topic, p.partition) in kept]
        if partitions:
            topics.append((topic.topic, partitions))
    if not topics:
        return None
    out = [write_array_length(len(topics), True)]
    for name, partitions in topics:
        out.append(write_string(name, True))
        out.append(write_array_length(len(partitions), True))
        out.extend(_INT32.pack(p) for p in partitions)
        out.append(NO_TAGS)
    out.append(NO_TAGS)
    return b"".join(out)


def read_response(api_version: int, body: memoryview | bytes) -> dict[Key, memoryview]:
    """Upstream's entry of each partition it answered, a slice of `body`; FrameError if
    the answer is malformed."""
    _check_version(api_version)
    buf = memoryview(body)
    entries: dict[Key, memoryview] = {}
    with malformed(f"DescribeProducers v{api_version} response"):
        offset = skip(buf, 0, 4)  # throttle_time_ms
        topics, offset = read_count(buf, offset, True, "topics")
        for _ in range(topics):
            name, offset = read_topic_name(buf, offset, True)
            partitions, offset = read_count(buf, offset, True, "partitions")
            for _ in range(partitions):
                start, offset = offset, skip(buf, offset, _PARTITION_HEAD.size)
                index, _error = _PARTITION_HEAD.unpack_from(buf, start)
                _message, offset = read_string(buf, offset, True)
                producers, offset = read_count(buf, offset, True, "active_producers")
                for _ in range(producers):
                    offset = skip(buf, offset, _PRODUCER.size)
                    offset = skip_tagged_fields(buf, offset)
                offset = skip_tagged_fields(buf, offset)
                entries[name, index] = buf[start:offset]
            offset = skip_tagged_fields(buf, offset)
        offset = skip_tagged_fields(buf, offset)
        expect_end(buf, offset)
    return entries


def encode_partition(partition: int, answer: PartitionProducers) -> bytes:
    """One partition's entry of the answer."""
    out = [_PARTITION_HEAD.pack(partition, answer.error_code)]
    message = answer.error_message
    out.append(_NULL_STRING if message is None else write_string(message, True))
    out.append(write_array_length(len(answer.producers), True))
    for p in answer.producers:
        out.append(_PRODUCER.pack(*astuple(p)))  # the fields in the answer's order
        out.append(NO_TAGS)
    out.append(NO_TAGS)
    return b"".join(out)


def merge_response(
    view: DescribeProducersView,
    upstream: memoryview | None,
    results: Mapping[Key, PartitionProducers],
) -> bytes:
    """The answer to the whole request: `results` where the proxy answered, upstream's
    entries elsewhere (its throttle time kept), UNANSWERED for the rest. FrameError if
    upstream's answer is malformed."""
    answered = {} if upstream is None else read_response(view.api_version, upstream)

    def answer(key: Key, asked: AskedPartition, result: PartitionProducers | None) -> Sequence:
        return (encode_partition(asked.partition, result or UNANSWERED),)

    throttle = bytes(upstream[:4]) if upstream is not None else b"\x00\x00\x00\x00"
    topics = merge_partitions(view, True, results, answered, answer)
    return b"".join([throttle, *topics, NO_TAGS])
