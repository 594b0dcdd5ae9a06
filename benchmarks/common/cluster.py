"""The 3-rack Kafka cluster of a benchmark: its topics laid out the same way in every
run, and the bytes of their replicas on disk (what replication carried)."""

from __future__ import annotations

import time

from confluent_kafka import ElectionType, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from proxy.devstack import KafkaCluster


class Cluster:
    def __init__(self, kafka: KafkaCluster) -> None:
        self.kafka = kafka
        self.admin = AdminClient({"bootstrap.servers": kafka.bootstrap})
        self.racks = {node.node_id: node.rack for node in kafka.nodes}
        self.ports = {node.port: node.node_id for node in kafka.nodes}

    def close(self) -> None:
        del self.admin  # librdkafka's handle goes with the last reference

    def partitions(self, topic: str) -> dict[int, tuple[int, list[int], list[int]]]:
        """{partition: (leader, replicas, in-sync replicas)}."""
        meta = self.admin.list_topics(topic, timeout=30).topics[topic]
        return {p: (m.leader, list(m.replicas), list(m.isrs)) for p, m in meta.partitions.items()}

    def create_topic(self, topic: str, partitions: int) -> dict[int, int]:
        """Partition p led by broker p mod 3 + 1, the two others following: the same
        layout in every scenario and run. {partition: leader} once every replica is in
        sync and every preferred replica leads (one elected while its broker was still
        fenced would not)."""
        nodes = sorted(self.racks)
        layout = [
            [nodes[(p + i) % len(nodes)] for i in range(len(nodes))] for p in range(partitions)
        ]
        new = NewTopic(topic, num_partitions=partitions, replica_assignment=layout)
        self.admin.create_topics([new])[topic].result(60)
        deadline, elected = time.monotonic() + 90, False
        while True:
            state = self.partitions(topic)
            full = len(state) == partitions and all(len(isr) == 3 for _, _, isr in state.values())
            if full and all(leader == replicas[0] for leader, replicas, _ in state.values()):
                return {p: leader for p, (leader, _, _) in sorted(state.items())}
            if full and not elected:
                parts = [TopicPartition(topic, p) for p in state]
                self.admin.elect_leaders(ElectionType.PREFERRED, parts).result(60)
                elected = True
            if time.monotonic() > deadline:
                raise RuntimeError(f"topic {topic}: replicas or leaders not in place: {state}")
            time.sleep(0.5)

    def delete_topic(self, topic: str) -> None:
        self.admin.delete_topics([topic], operation_timeout=30)[topic].result(60)

    def replica_logs(self, topic: str, timeout: float = 60.0) -> dict:
        """Bytes of the topic's .log files per partition and replica, once the followers
        hold as much as their leader: the leaders' are what one replica stores, the
        followers' what replication carried."""
        deadline = time.monotonic() + timeout
        while True:
            state = self.partitions(topic)
            sizes = {
                p: {node: self._log_bytes(node, topic, p) for node in replicas}
                for p, (_, replicas, _) in state.items()
            }
            caught_up = all(len(set(s.values())) == 1 for s in sizes.values())
            if caught_up or time.monotonic() > deadline:
                break
            time.sleep(1)
        for p, (_, replicas, _) in state.items():
            if len({self.racks[node] for node in replicas}) != len(replicas):
                raise RuntimeError(f"{topic}-{p}: two replicas in one rack: {replicas}")
        return {
            "leader_bytes": sum(sizes[p][leader] for p, (leader, _, _) in state.items()),
            "follower_bytes": sum(
                size
                for p, (leader, _, _) in state.items()
                for node, size in sizes[p].items()
                if node != leader
            ),
            "followers_caught_up": caught_up,
            "by_partition": {p: {"leader": state[p][0], "bytes": sizes[p]} for p in sorted(state)},
        }

    def _log_bytes(self, node: int, topic: str, partition: int) -> int:
        folder = self.kafka.node(node).data_dir / "logs" / f"{topic}-{partition}"
        return sum(path.stat().st_size for path in folder.glob("*.log"))
