"""The harness runs a real Apache Kafka: real clients produce and consume through it."""

from __future__ import annotations

import asyncio
import os
import uuid

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from proxy.devstack import KafkaCluster
from proxy.devstack.kafka import describe_brokers

RECORDS = 10_000
pytestmark = pytest.mark.kafka


def create_topic(bootstrap: str, partitions: int = 6, replication: int = 3) -> str:
    name = f"harness-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(name, partitions, replication)]).values():
        future.result(30)
    return name


def test_three_brokers_carry_their_zone_as_rack(kafka_cluster):
    admin = AdminClient({"bootstrap.servers": kafka_cluster.bootstrap})
    cluster = admin.describe_cluster(request_timeout=30).result(30)
    assert sorted(node.rack for node in cluster.nodes) == ["zone-a", "zone-b", "zone-c"]
    assert all(node.host == "127.0.0.1" for node in cluster.nodes)


def produce_with_librdkafka(bootstrap: str, topic: str, prefix: str) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    failures: list[str] = []

    def delivered(err, _msg):
        if err is not None:
            failures.append(str(err))

    for i in range(RECORDS):
        producer.produce(topic, key=f"{prefix}{i}", value=f"value-{i}", on_delivery=delivered)
        if i % 1000 == 0:
            producer.poll(0)
    assert producer.flush(60) == 0
    assert failures == []


def consume_with_librdkafka(bootstrap: str, topic: str) -> list[tuple[bytes, bytes]]:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"g-{uuid.uuid4().hex[:8]}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([topic])
    seen: list[tuple[bytes, bytes]] = []
    idle = 0
    try:
        while len(seen) < RECORDS and idle < 30:
            batch = consumer.consume(1000, timeout=1.0)
            idle = 0 if batch else idle + 1
            for msg in batch:
                assert msg.error() is None, msg.error()
                seen.append((msg.key(), msg.value()))
    finally:
        consumer.close()
    return seen


async def produce_with_aiokafka(bootstrap: str, topic: str, prefix: str) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=True)
    await producer.start()
    try:
        futures = [
            await producer.send(topic, key=f"{prefix}{i}".encode(), value=f"value-{i}".encode())
            for i in range(RECORDS)
        ]
        await asyncio.gather(*futures)
    finally:
        await producer.stop()


async def consume_with_aiokafka(bootstrap: str, topic: str) -> list[tuple[bytes, bytes]]:
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        group_id=f"g-{uuid.uuid4().hex[:8]}",
        auto_offset_reset="earliest",
        enable_auto_commit=False,
    )
    await consumer.start()
    seen: list[tuple[bytes, bytes]] = []
    try:
        async with asyncio.timeout(60):
            while len(seen) < RECORDS:
                batches = await consumer.getmany(timeout_ms=1000, max_records=2000)
                for records in batches.values():
                    seen.extend((r.key, r.value) for r in records)
    finally:
        await consumer.stop()
    return seen


def expected(prefix: str) -> set[tuple[bytes, bytes]]:
    return {(f"{prefix}{i}".encode(), f"value-{i}".encode()) for i in range(RECORDS)}


async def test_librdkafka_to_aiokafka_and_back(kafka_cluster):
    """10,000 records each way, between two independent client implementations."""
    topic = create_topic(kafka_cluster.bootstrap)
    await asyncio.to_thread(produce_with_librdkafka, kafka_cluster.bootstrap, topic, "c-")
    got = await consume_with_aiokafka(kafka_cluster.bootstrap, topic)
    assert len(got) == RECORDS
    assert set(got) == expected("c-")

    topic2 = create_topic(kafka_cluster.bootstrap)
    await produce_with_aiokafka(kafka_cluster.bootstrap, topic2, "a-")
    got2 = await asyncio.to_thread(consume_with_librdkafka, kafka_cluster.bootstrap, topic2)
    assert len(got2) == RECORDS
    assert set(got2) == expected("a-")


def test_single_node_starts_answers_and_stops_without_leftovers(tmp_path):
    cluster = KafkaCluster(size=1, base_dir=tmp_path, name="kafka-single")
    with cluster:
        node = cluster.nodes[0]
        assert describe_brokers("127.0.0.1", node.port) == {1: ("127.0.0.1", node.port)}
        pid = node.process.pid
    assert pid is not None
    assert not os.path.exists(f"/proc/{pid}") or _is_zombie_free(pid)
    assert "Kafka Server started" in node.process.log_path.read_text()


def _is_zombie_free(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split()[2] == "Z"
    except FileNotFoundError:
        return True
