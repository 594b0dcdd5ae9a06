"""Produce to a tiered topic through proxies, end to end: real Kafka, real clients.

Two proxies in two zones share the fleet and the metadata; a topic is tiered with the
admin command, then an idempotent producer writes through the proxy of its zone. What it
was acknowledged must be in the objects the owners committed, each offset once, with the
offsets continuing the upstream log where the cutover read it.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import uuid

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from proxy.config import parse_config
from proxy.devstack.paths import free_port, free_port_block
from proxy.devstack.proxy_thread import ProxyThread
from proxy.metadata.store import ShardReader
from proxy.metadata.streams import stream_id
from proxy.objects.format import find_entries, read_block, read_object
from proxy.objects.local import LocalDirectoryStore
from proxy.records.batches import iter_batches

pytestmark = pytest.mark.kafka
RECORDS = 3000


def _config(cluster, tmp_path, name: str, zone: str, suffix: str, notify: str, base: int) -> dict:
    return {
        "upstream": {"bootstrap": cluster.bootstrap},
        "listeners": {"bootstrap_port": free_port(), "broker_port_base": base},
        "fleet": {"name": name, "zone": zone, "topic": f"fleet-{suffix}"},
        "tiering": {
            "metadata_topic": f"meta-{suffix}",
            "shard_count": 2,
            "session_timeout_ms": 6000,
            "notify": notify,
            "wal": {"directory": str(tmp_path / name / "wal")},
            "object_store": {"directory": str(tmp_path / "objects")},
            "upload_interval_s": 0.2,
            "cutover_hold_ms": 20000,
        },
    }


def _create_topic(cluster, topic: str, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 3)])[topic].result(30)


def _tier(peer_port: int, topic: str) -> str:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "proxy.cli",
            "topics",
            "tier",
            topic,
            "--peer",
            f"127.0.0.1:{peer_port}",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr + done.stdout
    return done.stdout


def _produce(
    bootstrap: str, topic: str, partitions: int, zone: str
) -> list[tuple[int, int, bytes]]:
    """Idempotent, acks=all: (partition, offset, value) of every acknowledged record."""
    acked: list[tuple[int, int, bytes]] = []
    errors: list[str] = []

    def delivered(err, msg) -> None:
        if err is not None:
            errors.append(str(err))
        else:
            acked.append((msg.partition(), msg.offset(), msg.value()))

    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "client.id": f"smoke,tierproxy_az={zone}",
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 5,
            "message.timeout.ms": 60000,
        }
    )
    for n in range(RECORDS):
        producer.produce(topic, f"v{n}".encode(), partition=n % partitions, on_delivery=delivered)
        producer.poll(0)
    assert producer.flush(90) == 0
    assert not errors, errors[:5]
    return acked


async def _committed(
    cluster, suffix, topic_id, partitions, objects_dir
) -> dict[int, dict[int, bytes]]:
    """Every record the metadata says is committed, read from the objects: partition ->
    offset -> the record batch's bytes it sits in (one entry per batch's first offset)."""
    kafka = {"bootstrap_servers": cluster.bootstrap}
    found: dict[int, dict[int, int]] = {}
    async with LocalDirectoryStore(objects_dir) as store:
        for shard in range(2):
            reader = ShardReader(kafka, f"meta-{suffix}", shard, 2)
            await reader.start()
            try:
                await reader.read_to_end()
                state = reader.state
                for partition in range(partitions):
                    stream = stream_id(topic_id, partition)
                    if state.stream(stream) is None:
                        continue
                    offsets = found.setdefault(partition, {})
                    for r in state.committed_ranges(stream):
                        data = await store.get(r.object_key)
                        _, index = read_object(data, r.object_key)
                        for entry in find_entries(index, stream, r.start_offset):
                            for header, _ in iter_batches(read_block(data, entry, r.object_key)):
                                for offset in range(header.base_offset, header.next_offset):
                                    assert offset not in offsets, f"offset {offset} twice"
                                    offsets[offset] = header.base_offset
            finally:
                await reader.close()
    return found


@pytest.mark.parametrize("notify", ["direct", "s3"])
def test_tiered_produce_through_two_zones(kafka_cluster, tmp_path, notify):
    suffix = uuid.uuid4().hex[:8]
    topic = f"tiered-{suffix}"
    partitions = 4
    _create_topic(kafka_cluster, topic, partitions)
    base = free_port_block(16)  # one block, split: two calls could return the same one
    configs = [
        _config(kafka_cluster, tmp_path, f"p{n}-{suffix}", zone, suffix, notify, base + 8 * n)
        for n, zone in enumerate(("zone-a", "zone-b"))
    ]
    with (
        ProxyThread(parse_config(configs[0])) as a,
        ProxyThread(parse_config(configs[1])) as b,
    ):
        assert "tiered" in _tier(a.proxy.tiering.peer_port, topic)
        acked = {}
        for proxy, zone in ((a, "zone-a"), (b, "zone-b")):
            for partition, offset, value in _produce(proxy.bootstrap, topic, partitions, zone):
                assert (partition, offset) not in acked, "one offset acknowledged twice"
                acked[(partition, offset)] = value
        topic_id = a.proxy.tiering.topics.topic(topic).topic_id
    # both proxies stopped: each handed its shards over with everything uploaded
    committed = asyncio.run(
        _committed(kafka_cluster, suffix, topic_id, partitions, tmp_path / "objects")
    )
    assert len(acked) == 2 * RECORDS
    for (partition, offset), _ in acked.items():
        assert offset in committed.get(partition, {}), (
            f"{partition}/{offset} acknowledged, not committed"
        )
    for partition in range(partitions):
        offsets = sorted(committed.get(partition, {}))
        assert offsets == list(range(offsets[0], offsets[0] + len(offsets))), "a gap"
