"""Fetch v16+ (KIP-951) through the proxy: Kafka 4.1's Java consumer (Fetch v17) and
librdkafka read a passthrough topic and a tiered one, every record once and in order.

The proxy's buffer is made small (limits.buffer_bytes 4096) so that nearly every answer
with records is larger than it: those are walked as they stream and only their trailing
tagged fields held back (fetch_stream.py), the path a production buffer of 1 MiB takes
for large answers.
"""

from __future__ import annotations

import uuid

import pytest
from confluent_kafka import Consumer, TopicPartition
from cutover_load import (
    create_topic,
    proxy_config,
    tiered_topic_id,
    topics_command,
    wait_owned,
)
from test_tiered_fetch import _java
from tiered_topic import produce

from proxy.config import parse_config
from proxy.devstack.paths import free_port_block
from proxy.devstack.proxy_thread import ProxyThread

pytestmark = pytest.mark.kafka

PARTITIONS = 2
BEFORE, AFTER = 300, 300


def _librdkafka(bootstrap: str, topic: str, want: int) -> list[tuple[int, int, bytes]]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"g-{uuid.uuid4().hex}"})
    consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
    got = []
    try:
        for _ in range(600):
            if len(got) >= want:
                break
            for msg in consumer.consume(500, 0.2):
                assert msg.error() is None, msg.error()
                got.append((msg.partition(), msg.offset(), msg.value()))
    finally:
        consumer.close()
    return sorted(got)


def test_fetch_v17_reads_passthrough_and_tiered_topics(kafka_cluster, tmp_path):
    suffix = uuid.uuid4().hex[:8]
    plain, tiered = f"v17-plain-{suffix}", f"v17-tiered-{suffix}"
    for topic in (plain, tiered):
        create_topic(kafka_cluster, topic, PARTITIONS)
    config = proxy_config(kafka_cluster, tmp_path, f"v-{suffix}", "zone-a", suffix,
                          free_port_block(8))  # fmt: skip
    config["limits"] = {"buffer_bytes": 4096}
    with ProxyThread(parse_config(config)) as proxy:
        assert proxy.proxy.api_ranges()[1][1] >= 17  # Kafka 4.1's Fetch, offered whole
        wait_owned([proxy], 2)
        acked = {plain: produce(proxy.bootstrap, plain, PARTITIONS, "p", BEFORE + AFTER, 200)}
        acked[tiered] = produce(proxy.bootstrap, tiered, PARTITIONS, "b", BEFORE, 200)
        assert topics_command("tier", tiered, proxy.proxy.tiering.peer_port).returncode == 0
        tiered_topic_id(proxy, tiered)
        after = produce(proxy.bootstrap, tiered, PARTITIONS, "a", AFTER, 200)
        for p in range(PARTITIONS):
            acked[tiered][p] += after[p]
        for topic, records in acked.items():
            expected = sorted((p, o, v) for p, pairs in records.items() for o, v in pairs)
            assert len(expected) == PARTITIONS * (BEFORE + AFTER)
            assert _librdkafka(proxy.bootstrap, topic, len(expected)) == expected, topic
            got = _java(proxy.bootstrap, topic, f"j-{uuid.uuid4().hex}", len(expected), tmp_path)
            assert sorted(got) == expected, topic
