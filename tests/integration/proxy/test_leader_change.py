"""A broker stops while clients produce and consume through the proxy.

On a cluster of its own (it loses a broker), an idempotent acks=all producer sends keyed
records through the proxy while a group member reads them; halfway through, the broker
leading partition 0 goes down. Leadership moves, the proxy's listener for that broker
refuses service, and the clients must follow the new leaders: every record is
acknowledged, the log holds each exactly once, and the consumer saw them all.
"""

from __future__ import annotations

import threading
import time
import uuid

import pytest
from confluent_kafka import Consumer, KafkaException, Producer
from confluent_kafka.admin import AdminClient

from proxy.devstack import KafkaCluster

pytestmark = pytest.mark.kafka

PARTITIONS = 6
RECORDS = 20_000
BATCH = 200
PAUSE_S = 0.02  # ~ 10,000 records/s: long enough a run to stop a broker in its middle


@pytest.fixture(scope="module")
def failover_cluster():
    with KafkaCluster(size=3, name="kafka-failover", heap="-Xms128m -Xmx512m") as cluster:
        yield cluster


@pytest.mark.parametrize("how", ["stop_node", "kill_node"])
def test_clients_survive_a_leader_change_with_no_lost_acknowledged_record(
    failover_cluster, start_proxy, compat, how
):
    cluster = failover_cluster
    proxy = start_proxy(cluster)
    conf = {"bootstrap.servers": proxy.bootstrap}
    topic = compat.create_topic(conf, PARTITIONS)
    admin = AdminClient(conf)
    leader = _leader(admin, topic, 0)

    reader = GroupReader(conf, topic)
    reader.start()
    records = compat.records(f"failover-{how}", RECORDS)
    acked: list[tuple[bytes, bytes]] = []
    failed: list[str] = []

    def delivered(err, msg) -> None:
        if err is None:
            acked.append((msg.key(), msg.value()))
        else:
            failed.append(str(err))

    producer = Producer(
        {
            **conf,
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 5,
            "on_delivery": delivered,
        }
    )
    try:
        for start in range(0, RECORDS, BATCH):
            if start == RECORDS // 2:
                getattr(cluster, how)(leader)
            for key, value in records[start : start + BATCH]:
                produce(producer, topic, key, value)
            producer.poll(PAUSE_S)
        assert producer.flush(120) == 0, "records unacknowledged after 120 s"
        assert failed == [], failed[:5]
        assert sorted(acked) == sorted(records)

        after = admin.list_topics(topic, timeout=10).topics[topic].partitions
        assert all(p.leader not in (leader, -1) for p in after.values()), after
        compat.assert_exactly_once(compat.read_all(conf, topic, RECORDS), records)
        reader.wait_for(set(records))
    finally:
        reader.stop()
        cluster.start_node(leader)  # the next test wants three brokers again


def _leader(admin: AdminClient, topic: str, partition: int, timeout_s: float = 30.0) -> int:
    """The partition's leader as metadata names it. A broker the test before restarted
    may answer metadata before it has read the topic's creation from KRaft's log (it then
    names the topic without partitions), as it would to any client: asked again."""
    deadline = time.monotonic() + timeout_s
    while True:
        answer = admin.list_topics(topic, timeout=10).topics[topic]
        found = answer.partitions.get(partition)
        if answer.error is None and found is not None and found.leader >= 0:
            return found.leader
        assert time.monotonic() < deadline, f"{topic}-{partition} has no leader: {answer}"
        time.sleep(0.2)


def produce(producer: Producer, topic: str, key: bytes, value: bytes) -> None:
    while True:
        try:
            producer.produce(topic, key=key, value=value)
            return
        except BufferError:
            producer.poll(0.1)


class GroupReader(threading.Thread):
    """A group member reading while the broker goes away (at least once is its promise)."""

    def __init__(self, conf: dict, topic: str) -> None:
        super().__init__(daemon=True)
        self.consumer = Consumer(
            {
                **conf,
                "group.id": f"failover-{uuid.uuid4().hex[:8]}",
                "auto.offset.reset": "earliest",
            }
        )
        self.consumer.subscribe([topic])
        self.seen: set[tuple[bytes, bytes]] = set()
        self.transient: list[str] = []
        self.error: BaseException | None = None
        self._halt = threading.Event()

    def run(self) -> None:
        try:
            while not self._halt.is_set():
                for msg in self.consumer.consume(1000, timeout=0.2):
                    error = msg.error()
                    if error is None:
                        self.seen.add((msg.key(), msg.value()))
                    elif error.fatal():
                        raise KafkaException(error)
                    else:  # e.g. a topic unknown to a broker whose metadata lags: retried
                        self.transient.append(str(error))
        except BaseException as exc:
            self.error = exc
        finally:
            self.consumer.close()

    def wait_for(self, expected: set[tuple[bytes, bytes]], timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while not expected <= self.seen and self.error is None:
            if time.monotonic() > deadline:
                break
            time.sleep(0.1)
        if self.error is not None:
            raise self.error
        missing = expected - self.seen
        assert not missing, (
            f"the group member never saw {len(missing)} records; errors: {self.transient[:5]}"
        )

    def stop(self) -> None:
        self._halt.set()
        self.join(30)
