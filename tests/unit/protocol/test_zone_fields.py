"""The two fields the zone routing reads: a Fetch request's rack id (KIP-392) and the
brokers' racks in a Metadata answer."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from kio.schema.errors import ErrorCode
from kio.schema.fetch.v11.request import FetchRequest as FetchV11
from kio.schema.fetch.v15.request import FetchPartition, FetchRequest, FetchTopic
from kio.schema.metadata.v1.response import MetadataResponse as MetadataV1
from kio.schema.metadata.v1.response import MetadataResponseBroker as BrokerV1
from kio.schema.metadata.v12.response import (
    MetadataResponse,
    MetadataResponseBroker,
    MetadataResponsePartition,
    MetadataResponseTopic,
)
from kio.schema.types import BrokerId, TopicName
from kio.static.primitive import i8, i32, i32Timedelta, i64

from proxy.apis.api01_fetch import request_rack_id
from proxy.apis.api03_metadata import read_brokers, read_cluster_id, read_topics_answer
from proxy.errors import UnknownTopic
from proxy.kafka.codec import encode
from proxy.kafka.frames import FrameError


def fetch(rack: str, request_type=FetchRequest, **extra) -> bytes:
    partition = FetchPartition(
        partition=i32(0),
        current_leader_epoch=i32(-1),
        fetch_offset=i64(5),
        last_fetched_epoch=i32(-1),
        log_start_offset=i64(-1),
        partition_max_bytes=i32(1 << 20),
    )
    fields = dict(
        max_wait=i32Timedelta.parse(timedelta(milliseconds=500)),
        min_bytes=i32(1),
        max_bytes=i32(1 << 20),
        isolation_level=i8(0),
        session_id=i32(0),
        session_epoch=i32(-1),
        topics=(FetchTopic(topic_id=__import__("uuid").uuid4(), partitions=(partition,)),),
        forgotten_topics_data=(),
        rack_id=rack,
    )
    if request_type is not FetchRequest:
        return encode(
            request_type(
                replica_id=i32(-1),
                max_wait=fields["max_wait"],
                min_bytes=i32(1),
                max_bytes=i32(1 << 20),
                isolation_level=i8(0),
                session_id=i32(0),
                session_epoch=i32(-1),
                topics=(),
                forgotten_topics_data=(),
                rack_id=rack,
            )
        )
    return encode(request_type(**fields, **extra))


def test_rack_id_is_read_after_the_topics():
    assert request_rack_id(15, memoryview(fetch("eu-west-1b"))) == "eu-west-1b"
    assert request_rack_id(15, memoryview(fetch(""))) is None
    assert request_rack_id(11, memoryview(fetch("zone-c", FetchV11))) == "zone-c"
    assert request_rack_id(10, memoryview(b"")) is None  # no rack id before v11


def test_a_truncated_fetch_request_is_a_frame_error():
    body = fetch("zone-a")
    with pytest.raises(FrameError):
        request_rack_id(15, memoryview(body[:20]))


def test_metadata_brokers_with_their_racks():
    brokers = (
        MetadataResponseBroker(node_id=i32(1), host="k1", port=i32(9092), rack="zone-a"),
        MetadataResponseBroker(node_id=i32(2), host="k2", port=i32(9093), rack=None),
    )
    body = encode(
        MetadataResponse(
            throttle_time=i32Timedelta.parse(timedelta(0)),
            brokers=brokers,
            cluster_id="c",
            controller_id=i32(1),
            topics=(),
        )
    )
    assert read_brokers(12, memoryview(body)) == [(1, "k1", 9092, "zone-a"), (2, "k2", 9093, None)]
    v1 = encode(
        MetadataV1(
            brokers=(BrokerV1(node_id=i32(3), host="k3", port=i32(1), rack="r"),),
            controller_id=i32(3),
            topics=(),
        )
    )
    assert read_brokers(1, memoryview(v1)) == [(3, "k3", 1, "r")]
    with pytest.raises(FrameError, match="malformed Metadata v12 brokers"):
        read_brokers(12, memoryview(body[:12]))


def metadata_topic(name: str, error: ErrorCode, topic_id: uuid.UUID, partitions: int):
    return MetadataResponseTopic(
        error_code=error,
        name=TopicName(name),
        topic_id=topic_id,
        is_internal=False,
        partitions=tuple(
            MetadataResponsePartition(
                error_code=ErrorCode.none,
                partition_index=i32(p),
                leader_id=BrokerId(1),
                leader_epoch=i32(0),
                replica_nodes=(BrokerId(1),),
                isr_nodes=(BrokerId(1),),
                offline_replicas=(),
            )
            for p in range(partitions)
        ),
        topic_authorized_operations=i32(-2147483648),
    )


def test_a_metadata_answer_says_which_cluster_knows_which_topic():
    orders = uuid.uuid4()
    body = encode(
        MetadataResponse(
            throttle_time=i32Timedelta.parse(timedelta(0)),
            brokers=(),
            cluster_id="MkU3OEVBNTcwNTJENDM2Qk",
            controller_id=i32(1),
            topics=(
                metadata_topic("orders", ErrorCode.none, orders, 3),
                metadata_topic("gone", ErrorCode.unknown_topic_or_partition, uuid.UUID(int=0), 0),
                metadata_topic("secret", ErrorCode.topic_authorization_failed, uuid.UUID(int=0), 0),
                metadata_topic("new", ErrorCode.none, uuid.UUID(int=0), 0),  # being created
            ),
        )
    )
    answer = read_topics_answer(12, memoryview(body))
    assert answer.cluster_id == "MkU3OEVBNTcwNTJENDM2Qk"
    assert answer.found == {"orders": (orders, 3)} and answer.unknown == {"gone"}
    assert answer.errors == {"secret": ErrorCode.topic_authorization_failed, "new": 0}
    assert answer.topic("orders") == (orders, 3) and answer.topic_id("gone") is None
    with pytest.raises(UnknownTopic):
        answer.topic("gone")
    with pytest.raises(LookupError, match="error code 29"):
        answer.topic_id("secret")
    with pytest.raises(LookupError, match="gives it no topic id or partitions"):
        answer.topic("new")
    with pytest.raises(LookupError, match="not in Kafka's answer"):
        answer.topic_id("never-asked")
    v1 = encode(MetadataV1(brokers=(), controller_id=i32(3), topics=()))
    assert read_cluster_id(1, memoryview(v1)) is None  # no cluster id before v2
    with pytest.raises(FrameError, match="malformed Metadata v12"):
        read_topics_answer(12, memoryview(body[:9]))
