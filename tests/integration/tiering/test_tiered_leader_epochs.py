"""OffsetForLeaderEpoch on a tiered partition (proxy/server/tiered_epochs.py).

A tiered partition's latest epoch goes on past Kafka's log end, the cutover. Asked where
that epoch ends, Kafka says the cutover; the proxy says the stream's high watermark (the
committed objects and the tail only the owner's WAL holds), so a consumer whose position
is past the cutover does not take the answer for a truncated log. Asked in one request
with a partition of a plain topic, the proxy passes that one's answer on as it came.
"""

from __future__ import annotations

import socket
import struct
import uuid

import pytest
from cutover_load import create_topic, proxy_config, wait_owned
from kio.schema.metadata.v12.request import MetadataRequest, MetadataRequestTopic
from kio.schema.metadata.v12.response import MetadataResponse
from kio.schema.offset_for_leader_epoch.v4.request import (
    OffsetForLeaderEpochRequest,
    OffsetForLeaderPartition,
    OffsetForLeaderTopic,
)
from kio.schema.offset_for_leader_epoch.v4.response import OffsetForLeaderEpochResponse
from kio.schema.types import BrokerId, TopicName
from kio.static.primitive import i32
from tiered_topic import TieredTopic, produce

from proxy.config import parse_config
from proxy.devstack.paths import free_port_block
from proxy.devstack.proxy_thread import ProxyThread
from proxy.protocol.messages import decode_response, encode_request

pytestmark = pytest.mark.kafka

PER_ROUND = 40


def _call(address: tuple[str, int], message, response_type):
    with socket.create_connection(address, timeout=30) as sock:
        sock.sendall(encode_request(message, 7, "epochs-test"))
        size = struct.unpack(">i", _read(sock, 4))[0]
        _, answer = decode_response(_read(sock, size), response_type)
    return answer


def _read(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        assert chunk, "connection closed"
        data += chunk
    return data


def _leaders(address: tuple[str, int], topics: list[str]) -> dict[tuple[str, int], tuple]:
    """(topic, partition) -> (leader id, leader epoch), from a Metadata v12 request."""
    request = MetadataRequest(
        topics=tuple(MetadataRequestTopic(topic_id=None, name=TopicName(t)) for t in topics),
        allow_auto_topic_creation=False,
        include_topic_authorized_operations=False,
    )
    answer = _call(address, request, MetadataResponse)
    return {
        (t.name, p.partition_index): (int(p.leader_id), int(p.leader_epoch))
        for t in answer.topics
        for p in t.partitions
    }


def _epoch_ends(address, asked: dict[tuple[str, int], int]) -> dict[tuple[str, int], tuple]:
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
    answer = _call(address, request, OffsetForLeaderEpochResponse)
    return {
        (t.topic, p.partition): (p.error_code.value, int(p.leader_epoch), int(p.end_offset))
        for t in answer.topics
        for p in t.partitions
    }


def test_the_latest_epoch_of_a_tiered_partition_ends_at_its_high_watermark(kafka_cluster, tmp_path):
    suffix = uuid.uuid4().hex[:8]
    topic, plain = f"epochs-{suffix}", f"epochs-plain-{suffix}"
    create_topic(kafka_cluster, topic, 1)
    create_topic(kafka_cluster, plain, 1)
    base = free_port_block(8)
    config = proxy_config(
        kafka_cluster, tmp_path, f"epochs-{suffix}", "zone-a", suffix, base,
        upload_interval_s=3600.0,
    )  # fmt: skip
    with ProxyThread(parse_config(config)) as proxy:
        wait_owned([proxy], 2)
        t = TieredTopic(proxy, topic, 1, PER_ROUND)
        t.round("objects")
        t.produce("tail")  # in the owner's WAL only
        produce(proxy.bootstrap, plain, 1, "plain", 5)
        high_watermark = t.acked[0][-1][0] + 1
        assert high_watermark == 3 * PER_ROUND

        host, port = kafka_cluster.bootstrap.split(",")[0].rsplit(":", 1)
        leaders = _leaders((host, int(port)), [topic, plain])
        brokers = {b.node_id: b for b in kafka_cluster.nodes}
        for key, (leader, epoch) in leaders.items():
            direct = _epoch_ends(("127.0.0.1", brokers[leader].port), {key: epoch})[key]
            # the proxy shows broker N at broker_port_base + N
            proxied = _epoch_ends(("127.0.0.1", base + leader), {key: epoch})[key]
            if key[0] == topic:
                assert direct == (0, epoch, PER_ROUND)  # Kafka's log ends at the cutover
                assert proxied == (0, epoch, high_watermark)
            else:
                assert proxied == direct == (0, epoch, 5)
        if leaders[topic, 0][0] == leaders[plain, 0][0]:  # one request naming both
            leader, epoch = leaders[topic, 0]
            both = _epoch_ends(
                ("127.0.0.1", base + leader), {(topic, 0): epoch, (plain, 0): leaders[plain, 0][1]}
            )
            assert both == {
                (topic, 0): (0, epoch, high_watermark),
                (plain, 0): (0, leaders[plain, 0][1], 5),
            }
