"""Moving a partition's leader on a live Kafka cluster without stopping a broker, as an
operator does: reorder its replicas (AlterPartitionReassignments, what
kafka-reassign-partitions.sh sends) and elect the preferred one. The old leader stays a
follower of the partition, in its ISR: a client whose metadata still names it reaches a
broker that answers, not a dead one."""

from __future__ import annotations

import datetime
import socket
import time

from confluent_kafka import ElectionType, TopicPartition
from confluent_kafka.admin import AdminClient
from kio.schema.alter_partition_reassignments.v0 import request as reassign
from kio.schema.alter_partition_reassignments.v0.response import (
    AlterPartitionReassignmentsResponse,
)
from kio.schema.metadata.v12 import request as metadata_request
from kio.schema.metadata.v12.response import MetadataResponse
from kio.schema.types import TopicName

from proxy.kafka.messages import decode_response, encode_request


def reassign_replicas(address: str, topic: str, partition: int, replicas: list[int]) -> None:
    """The partition's replicas in this order (AlterPartitionReassignments v0, sent to
    the broker at `address`)."""
    request = reassign.AlterPartitionReassignmentsRequest(
        timeout=reassign.i32Timedelta.parse(datetime.timedelta(seconds=30)),
        topics=(reassign.ReassignableTopic(name=topic, partitions=(
            reassign.ReassignablePartition(partition_index=partition, replicas=tuple(replicas)),
        )),),
    )  # fmt: skip
    answer = _ask(address, request, AlterPartitionReassignmentsResponse)
    assert answer.error_code == 0, answer
    assert all(p.error_code == 0 for t in answer.responses for p in t.partitions), answer


def _ask(address: str, request, response_type):
    """One request to the broker at `address` (host:port), its decoded answer."""
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(encode_request(request, correlation_id=1))
        size = int.from_bytes(sock.recv(4, socket.MSG_WAITALL), "big")
        frame = sock.recv(size, socket.MSG_WAITALL)
    return decode_response(frame, response_type)[1]


def _metadata(address: str, topic: str) -> MetadataResponse:
    request = metadata_request.MetadataRequest(
        topics=(metadata_request.MetadataRequestTopic(topic_id=None, name=TopicName(topic)),),
        allow_auto_topic_creation=False,
        include_topic_authorized_operations=False,
    )
    return _ask(address, request, MetadataResponse)


def leaders_seen_by_each_broker(bootstrap: str, topic: str, partition: int) -> dict[int, int]:
    """{broker: the partition's leader in that broker's own Metadata answer}: each KRaft
    broker applies a leader change in its own time, so they can differ for a while."""
    brokers = _metadata(bootstrap.split(",")[0], topic).brokers
    seen = {}
    for broker in brokers:
        answer = _metadata(f"{broker.host}:{broker.port}", topic)
        partitions = [p for t in answer.topics if t.name == topic for p in t.partitions]
        leader = [p.leader_id for p in partitions if p.partition_index == partition]
        seen[int(broker.node_id)] = int(leader[0]) if leader else -1
    return seen


def leader_of(admin: AdminClient, topic: str, partition: int = 0) -> int:
    return admin.list_topics(topic, timeout=30).topics[topic].partitions[partition].leader


def move_leader(cluster, topic: str, partition: int, to: int, timeout_s: float = 30.0) -> None:
    """Make broker `to` the partition's leader (its replicas reordered, the preferred one
    elected) and wait until every broker's own metadata says so: until then the old
    leader may go on answering as the leader (a reader that asked it would read on from
    it), and a client asking another broker may be sent back to it."""
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    others = [n for n in (1, 2, 3) if n != to]
    reassign_replicas(cluster.bootstrap.split(",")[0], topic, partition, [to, *others])
    admin.elect_leaders(ElectionType.PREFERRED, [TopicPartition(topic, partition)]).result(30)
    deadline = time.monotonic() + timeout_s
    while leader_of(admin, topic, partition) != to:
        assert time.monotonic() < deadline, f"the leader did not move to broker {to}"
        time.sleep(0.2)
    while True:
        seen = leaders_seen_by_each_broker(cluster.bootstrap, topic, partition)
        if set(seen.values()) == {to}:
            return
        assert time.monotonic() < deadline, f"not every broker names broker {to}: {seen}"
        time.sleep(0.1)
