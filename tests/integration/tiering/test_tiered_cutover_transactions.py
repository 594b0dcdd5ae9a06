"""A cutover waits for the transactions open in the topic (proxy/upkeep/cutover.py).

A transactional producer writes to a passthrough topic through the proxy and leaves its
transaction open; the topic is then tiered. Kafka's high watermark is past its last
stable offset, and the coordinator will write the transaction's marker to Kafka when it
ends: a cutover now would give that offset to the tiered stream too. So no partition is
cut over while the transaction is open. The producer commits; the marker lands in Kafka,
the cutover follows at Kafka's log end after it, and a read_committed consumer through
the proxy reads the committed records, then records produced after the cutover.
"""

from __future__ import annotations

import time
import uuid

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from cutover_load import (
    create_topic,
    proxy_config,
    tiered_topic_id,
    topics_command,
    wait_owned,
    wait_until,
)

from proxy.config import parse_config
from proxy.devstack.paths import free_port_block
from proxy.devstack.proxy_thread import ProxyThread
from proxy.metadata.streams import stream_id

pytestmark = pytest.mark.kafka

IN_TRANSACTION = 5
AFTER = 3


def _watermarks(bootstrap: str, topic: str, isolation: str) -> tuple[int, int]:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"w-{uuid.uuid4().hex}",
            "isolation.level": isolation,
        }
    )
    try:
        return consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=30, cached=False)
    finally:
        consumer.close()


def test_a_cutover_waits_for_an_open_transaction_to_end(kafka_cluster, tmp_path):
    suffix = uuid.uuid4().hex[:8]
    topic = f"txn-cutover-{suffix}"
    create_topic(kafka_cluster, topic, 1)
    config = proxy_config(
        kafka_cluster, tmp_path, f"txn-{suffix}", "zone-a", suffix, free_port_block(8),
        cutover_hold_ms=60_000,
    )  # fmt: skip
    with ProxyThread(parse_config(config)) as proxy:
        wait_owned([proxy], 2)
        tiering = proxy.proxy.tiering
        producer = Producer(
            {"bootstrap.servers": proxy.bootstrap, "transactional.id": f"tx-{suffix}"}
        )
        producer.init_transactions(30)
        producer.begin_transaction()
        for n in range(IN_TRANSACTION):
            producer.produce(topic, f"txn-{n}".encode(), partition=0)
        assert producer.flush(30) == 0
        high, stable = (
            _watermarks(kafka_cluster.bootstrap, topic, i)[1]
            for i in ("read_uncommitted", "read_committed")
        )
        assert (high, stable) == (IN_TRANSACTION, 0)  # open: Kafka's LSO is at its start

        assert topics_command("tier", topic, tiering.peer_port).returncode == 0
        stream = stream_id(tiered_topic_id(proxy, topic), 0)
        time.sleep(3.0)  # every proxy reports the topic drained within a heartbeat or two
        assert tiering.state(stream).stream(stream) is None, "cut over inside a transaction"

        producer.commit_transaction(30)  # the marker goes to Kafka, at offset 5
        wait_until(lambda: tiering.state(stream).stream(stream) is not None, 30, "cut over")
        cutover = tiering.state(stream).cutover(stream)
        assert cutover == IN_TRANSACTION + 1  # after the commit marker
        assert _watermarks(kafka_cluster.bootstrap, topic, "read_committed")[1] == cutover

        after = Producer({"bootstrap.servers": proxy.bootstrap, "enable.idempotence": True})
        for n in range(AFTER):
            after.produce(topic, f"after-{n}".encode(), partition=0)
        assert after.flush(30) == 0
        consumer = Consumer(
            {
                "bootstrap.servers": proxy.bootstrap,
                "group.id": f"r-{uuid.uuid4().hex}",
                "isolation.level": "read_committed",
                "auto.offset.reset": "earliest",
            }
        )
        consumer.assign([TopicPartition(topic, 0, 0)])
        got: list[tuple[int, bytes]] = []
        try:
            deadline = time.monotonic() + 60
            while len(got) < IN_TRANSACTION + AFTER and time.monotonic() < deadline:
                msg = consumer.poll(0.5)
                if msg is not None:
                    assert msg.error() is None, msg.error()
                    got.append((msg.offset(), msg.value()))
        finally:
            consumer.close()
        assert got == [(n, f"txn-{n}".encode()) for n in range(IN_TRANSACTION)] + [
            (cutover + n, f"after-{n}".encode()) for n in range(AFTER)
        ]
        # Kafka's log still ends at the cutover: nothing of the stream's went there
        assert _watermarks(kafka_cluster.bootstrap, topic, "read_uncommitted")[1] == cutover
