"""Raw Kafka requests over a plain socket (kio's messages), for what no client library
exposes: Metadata's leader epochs, OffsetForLeaderEpoch as a consumer sends it, a
Produce of any partition number with any batch, and the producer id an idempotent
producer gets (InitProducerId), for batches with sequence numbers a test chooses."""

from __future__ import annotations

import datetime
import socket
import struct
import time

from kio.schema.errors import ErrorCode
from kio.schema.fetch.v12.request import FetchPartition, FetchRequest, FetchTopic
from kio.schema.fetch.v12.response import FetchResponse, PartitionData
from kio.schema.init_producer_id.v4.request import InitProducerIdRequest
from kio.schema.init_producer_id.v4.response import InitProducerIdResponse
from kio.schema.metadata.v12.request import MetadataRequest, MetadataRequestTopic
from kio.schema.metadata.v12.response import MetadataResponse
from kio.schema.offset_for_leader_epoch.v4.request import (
    OffsetForLeaderEpochRequest,
    OffsetForLeaderPartition,
    OffsetForLeaderTopic,
)
from kio.schema.offset_for_leader_epoch.v4.response import OffsetForLeaderEpochResponse
from kio.schema.produce.v9.request import PartitionProduceData, ProduceRequest, TopicProduceData
from kio.schema.produce.v9.response import PartitionProduceResponse, ProduceResponse
from kio.schema.types import BrokerId, TopicName
from kio.static.primitive import i16, i32, i64

from proxy.kafka.messages import decode_response, encode_request


def call(address: tuple[str, int], message, response_type):
    with socket.create_connection(address, timeout=30) as sock:
        sock.sendall(encode_request(message, 7, "epochs-test"))
        size = struct.unpack(">i", _read(sock, 4))[0]
        _, answer = decode_response(_read(sock, size), response_type)
    return answer


def produce_v9(
    address: tuple[str, int], topic: str, partition: int, records: bytes
) -> PartitionProduceResponse:
    """The partition's answer to Produce v9 (acks=all, 30 s) of `records`."""
    request = ProduceRequest(
        transactional_id=None,
        acks=i16(-1),
        timeout=datetime.timedelta(seconds=30),
        topic_data=(
            TopicProduceData(
                name=TopicName(topic),
                partition_data=(PartitionProduceData(index=i32(partition), records=records),),
            ),
        ),
    )
    [part] = call(address, request, ProduceResponse).responses[0].partition_responses
    return part


def init_producer_id(address: tuple[str, int], timeout_s: float = 30.0) -> tuple[int, int]:
    """(producer id, epoch) for an idempotent producer (no transactional id), asked again
    while Kafka answers a retriable error (a cluster just started loads its coordinators:
    COORDINATOR_LOAD_IN_PROGRESS), as a producer does."""
    request = InitProducerIdRequest(
        transactional_id=None, transaction_timeout=datetime.timedelta(seconds=60)
    )
    deadline = time.monotonic() + timeout_s
    while True:
        answer = call(address, request, InitProducerIdResponse)
        if answer.error_code not in _COORDINATOR_RETRIABLE or time.monotonic() > deadline:
            break
        time.sleep(0.1)  # the producer's retry.backoff.ms
    assert answer.error_code == 0, answer
    return int(answer.producer_id), int(answer.producer_epoch)


_COORDINATOR_RETRIABLE = frozenset(
    {
        ErrorCode.coordinator_load_in_progress,
        ErrorCode.coordinator_not_available,
        ErrorCode.not_coordinator,
    }
)


def leader_address(bootstrap: str, topic: str, partition: int = 0) -> tuple[str, int]:
    """The address `bootstrap` (a broker, or a proxy) gives for the partition's leader."""
    host, port = bootstrap.rsplit(":", 1)
    request = MetadataRequest(
        topics=(MetadataRequestTopic(topic_id=None, name=TopicName(topic)),),
        allow_auto_topic_creation=False,
        include_topic_authorized_operations=False,
    )
    answer = call((host, int(port)), request, MetadataResponse)
    brokers = {int(b.node_id): (b.host, int(b.port)) for b in answer.brokers}
    [found] = answer.topics
    [leader] = [p.leader_id for p in found.partitions if int(p.partition_index) == partition]
    return brokers[int(leader)]


def fetch_v12(
    address: tuple[str, int], topic: str, partition: int, offset: int, max_bytes: int = 1 << 20
) -> PartitionData:
    """The partition's answer to Fetch v12 (read_uncommitted, no wait) from `offset`."""
    asked = FetchPartition(
        partition=i32(partition), fetch_offset=i64(offset), partition_max_bytes=i32(max_bytes)
    )
    request = FetchRequest(
        max_wait=datetime.timedelta(0),
        min_bytes=i32(0),
        max_bytes=i32(max_bytes),
        topics=(FetchTopic(topic=TopicName(topic), partitions=(asked,)),),
        forgotten_topics_data=(),
        rack_id="",
    )
    (data,) = call(address, request, FetchResponse).responses[0].partitions
    return data


def _read(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        assert chunk, "connection closed"
        data += chunk
    return data


def leaders(address: tuple[str, int], topics: list[str]) -> dict[tuple[str, int], tuple]:
    """(topic, partition) -> (leader id, leader epoch), from a Metadata v12 request."""
    request = MetadataRequest(
        topics=tuple(MetadataRequestTopic(topic_id=None, name=TopicName(t)) for t in topics),
        allow_auto_topic_creation=False,
        include_topic_authorized_operations=False,
    )
    answer = call(address, request, MetadataResponse)
    return {
        (t.name, p.partition_index): (int(p.leader_id), int(p.leader_epoch))
        for t in answer.topics
        for p in t.partitions
    }


def epoch_ends(address, asked: dict[tuple[str, int], int]) -> dict[tuple[str, int], tuple]:
    """(topic, partition) -> (error code, leader epoch, end offset) for the epochs asked."""
    topics: dict[str, list[OffsetForLeaderPartition]] = {}
    for (topic, partition), epoch in asked.items():
        topics.setdefault(topic, []).append(
            OffsetForLeaderPartition(
                partition=i32(partition), current_leader_epoch=i32(-1), leader_epoch=i32(epoch)
            )
        )
    request = OffsetForLeaderEpochRequest(
        replica_id=BrokerId(-1),
        topics=tuple(
            OffsetForLeaderTopic(topic=TopicName(t), partitions=tuple(ps))
            for t, ps in topics.items()
        ),
    )
    answer = call(address, request, OffsetForLeaderEpochResponse)
    return {
        (t.topic, p.partition): (p.error_code.value, int(p.leader_epoch), int(p.end_offset))
        for t in answer.topics
        for p in t.partitions
    }
