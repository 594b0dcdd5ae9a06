"""A tiered topic's config changed through the fleet takes effect on the next produce, on
every proxy, as Kafka's leader applies it (tiered/config_changes.py; docs/tiering.md, "A
topic's configs changed"): Kafka is the oracle.

Two proxies in two zones own a metadata shard each, so one of them owns the tiered
partition and the other hands its produces off. A one-partition topic is tiered beside its
passthrough twin; a producer in each zone writes a record with a timestamp an hour old to
both, so that both proxies hold the topics' configs (they keep them a minute). Then
`message.timestamp.type` is changed to LogAppendTime with IncrementalAlterConfigs through
one proxy, and back to CreateTime with AlterConfigs through the other; after each change
(once Kafka describes it) both producers write again. Every record of the tiered topic
must carry the timestamp type of its twin's record, and the same timestamp where that
is the producer's. Before, a proxy applied a change up to a minute late: the records
after the first change kept their CreateTime.
"""

from __future__ import annotations

import contextlib
import time
import uuid

import pytest
from confluent_kafka import (
    TIMESTAMP_CREATE_TIME,
    TIMESTAMP_LOG_APPEND_TIME,
    Consumer,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource
from cutover_load import (
    create_topic,
    proxy_config,
    started,
    tiered_topic_id,
    topics_command,
    wait_owned,
)

from proxy.config import parse_config
from proxy.devstack.paths import free_port_block
from proxy.devstack.proxy_thread import ProxyThread
from proxy.metadata.streams import stream_id
from tests.support.waiting import wait_until

pytestmark = pytest.mark.kafka

SHARDS = 2
HOUR_MS = 3_600_000


def _client(proxy: ProxyThread, name: str) -> dict:
    zone = proxy.proxy.config.fleet.zone
    return {"bootstrap.servers": proxy.bootstrap, "client.id": f"{name},tierproxy_az={zone}"}


def _produce(proxy: ProxyThread, topics: list[str], value: bytes, timestamp: int) -> None:
    producer = Producer({**_client(proxy, "w"), "enable.idempotence": True})
    errors: list[str] = []
    for topic in topics:
        producer.produce(
            topic, value, partition=0, timestamp=timestamp,
            on_delivery=lambda err, msg: err is not None and errors.append(str(err)),
        )  # fmt: skip
    assert producer.flush(30) == 0
    assert errors == []


def _read(proxy: ProxyThread, topic: str, count: int) -> list[tuple[bytes, int, int]]:
    """The topic's first `count` records: (value, timestamp type, timestamp)."""
    consumer = Consumer({**_client(proxy, "r"), "group.id": f"g-{uuid.uuid4().hex[:6]}"})
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        got: list[tuple[bytes, int, int]] = []
        deadline = time.monotonic() + 60
        while len(got) < count and time.monotonic() < deadline:
            msg = consumer.poll(0.2)
            if msg is not None:
                assert msg.error() is None, msg.error()
                kind, timestamp = msg.timestamp()
                got.append((msg.value(), kind, timestamp))
        return got
    finally:
        consumer.close()


def _described(cluster, topics: list[str], value: str) -> bool:
    """Kafka describes `message.timestamp.type` of every topic as `value`, three times in
    a row (each broker applies a change from the metadata log in its own time, and each
    describe goes to any of them)."""
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    resources = [ConfigResource("topic", t) for t in topics]
    for _ in range(3):
        answers = admin.describe_configs(resources)
        if any(answers[r].result(30)["message.timestamp.type"].value != value for r in resources):
            return False
    return True


def _owned_shards(proxy: ProxyThread) -> int:
    assignment = proxy.proxy.tiering.assignment
    return sum(assignment.owner(k) is not None for k in range(SHARDS))  # owned here


def test_a_config_changed_through_one_proxy_is_applied_by_every_proxy_at_once(
    kafka_cluster, tmp_path
):
    suffix = uuid.uuid4().hex[:8]
    topic, twin = f"cfg-{suffix}", f"cfg-{suffix}-plain"
    create_topic(kafka_cluster, topic, 1)
    create_topic(kafka_cluster, twin, 1)
    base = free_port_block(16)
    with contextlib.ExitStack() as stack:
        proxies: list[ProxyThread] = []
        for n, zone in enumerate(("zone-a", "zone-b")):
            config = proxy_config(
                kafka_cluster, tmp_path, f"c{n}-{suffix}", zone, suffix, base + 8 * n
            )
            proxies.append(stack.enter_context(ProxyThread(parse_config(config))))
            if n == 0:
                wait_owned(proxies, SHARDS)
        wait_until(lambda: all(_owned_shards(p) == 1 for p in proxies), 60, "shards shared")
        a, b = proxies
        assert topics_command("tier", topic, a.proxy.tiering.peer_port).returncode == 0
        stream = stream_id(tiered_topic_id(b, topic), 0)
        owner = a if a.proxy.tiering.owned_here(stream) else b
        wait_until(lambda: started(owner.proxy.tiering, stream), 30, "cut over")
        both = [topic, twin]

        old = int(time.time() * 1000) - HOUR_MS
        written = 0

        def write_through_both(tag: str) -> None:
            nonlocal written
            for proxy in proxies:
                _produce(proxy, both, f"{tag}-{proxy.proxy.config.fleet.zone}".encode(), old)
                written += 1

        write_through_both("before")  # both proxies now hold the topics' configs
        changed_at = int(time.time() * 1000)
        admin = AdminClient(_client(a, "admin"))
        for name in both:
            entry = ConfigEntry(
                "message.timestamp.type", "LogAppendTime",
                incremental_operation=AlterConfigOpType.SET,
            )  # fmt: skip
            resource = ConfigResource("topic", name, incremental_configs=[entry])
            admin.incremental_alter_configs([resource])[resource].result(30)
        wait_until(lambda: _described(kafka_cluster, both, "LogAppendTime"), 10, "applied")
        write_through_both("append-time")

        admin = AdminClient(_client(b, "admin"))
        for name in both:
            resource = ConfigResource(
                "topic", name, set_config={"message.timestamp.type": "CreateTime"}
            )
            with pytest.warns(DeprecationWarning):  # the API a Kafka 2.2 client sends
                answer = admin.alter_configs([resource])
            answer[resource].result(30)
        wait_until(lambda: _described(kafka_cluster, both, "CreateTime"), 10, "applied")
        write_through_both("create-time")

        tiered, plain = _read(a, topic, written), _read(b, twin, written)
        assert len(plain) == written == 6
        assert [(v, kind) for v, kind, _ in tiered] == [(v, kind) for v, kind, _ in plain]
        for records in (tiered, plain):
            kinds = [kind for _, kind, _ in records]
            assert (
                kinds
                == [TIMESTAMP_CREATE_TIME] * 2
                + [TIMESTAMP_LOG_APPEND_TIME] * 2
                + [TIMESTAMP_CREATE_TIME] * 2
            ), records
            for _, kind, timestamp in records:
                if kind == TIMESTAMP_CREATE_TIME:
                    assert timestamp == old
                else:
                    assert timestamp >= changed_at
