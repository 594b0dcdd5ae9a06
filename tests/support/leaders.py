"""Moving a partition's leader on a live Kafka cluster without stopping a broker, as an
operator does: reorder its replicas (AlterPartitionReassignments, what
kafka-reassign-partitions.sh sends) and elect the preferred one. The old leader stays a
follower of the partition, in its ISR: a client whose metadata still names it reaches a
broker that answers, not a dead one."""

from __future__ import annotations

import datetime
import socket
import time
from collections.abc import Iterator

from confluent_kafka import ElectionType, TopicPartition
from confluent_kafka.admin import AdminClient
from kio.schema.alter_partition_reassignments.v0 import request as reassign
from kio.schema.alter_partition_reassignments.v0.response import (
    AlterPartitionReassignmentsResponse,
)

from offload_jobs.kafka_client import METADATA_VERSION, ReaderSettings, metadata, parse_bootstrap
from proxy.apis.api03_metadata import read_brokers, read_partition_leaders, read_topics
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
    host, port = address.split(":")
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(encode_request(request, correlation_id=1))
        size = int.from_bytes(sock.recv(4, socket.MSG_WAITALL), "big")
        frame = sock.recv(size, socket.MSG_WAITALL)
    _, answer = decode_response(frame, AlterPartitionReassignmentsResponse)
    assert answer.error_code == 0, answer
    assert all(p.error_code == 0 for t in answer.responses for p in t.partitions), answer


def _each_brokers_answer(bootstrap: str, topic: str) -> Iterator[tuple[int, memoryview]]:
    """(broker, its own Metadata answer about `topic`) for every broker of the cluster."""
    settings = ReaderSettings.of({})
    body = metadata(parse_bootstrap(bootstrap), topic, settings)
    for node, host, port, _ in read_brokers(METADATA_VERSION, body):
        yield node, metadata([(host, port)], topic, settings)


def leaders_seen_by_each_broker(bootstrap: str, topic: str, partition: int) -> dict[int, int]:
    """{broker: the partition's leader in that broker's own Metadata answer}: each KRaft
    broker applies a leader change in its own time, so they can differ for a while."""
    seen = {}
    for node, answer in _each_brokers_answer(bootstrap, topic):
        _, leaders = read_partition_leaders(METADATA_VERSION, answer, topic)
        seen[node] = leaders[partition][1] if partition in leaders else -1
    return seen


def partitions_seen_by_each_broker(bootstrap: str, topic: str) -> dict[int, int]:
    """{broker: the topic's partition count in that broker's own Metadata answer} (0 if
    it does not know the topic): partitions just added reach each broker in its own
    time, and a client given the old count fails a record for a new partition at once
    (librdkafka's local UNKNOWN_PARTITION), so a test waits until all agree."""
    seen = {}
    for node, answer in _each_brokers_answer(bootstrap, topic):
        topics = read_topics(METADATA_VERSION, answer)
        counts = [n for err, name, _, n in topics if name == topic and err == 0]
        seen[node] = counts[0] if counts else 0
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
    while True:
        seen = leaders_seen_by_each_broker(cluster.bootstrap, topic, partition)
        if set(seen.values()) == {to}:
            return
        assert time.monotonic() < deadline, f"not every broker names broker {to}: {seen}"
        time.sleep(0.1)
