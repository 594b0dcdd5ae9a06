"""A failed S3-WAL PUT between two that go through: no 45 reaches the client, no
duplicate reaches the log (issue 18; docs/sequencer.md, "Gaps the proxy made").

Two proxies in two zones (`notify: s3`, objects in MinIO, real Kafka). A librdkafka
idempotent producer (5 requests in flight, one record each) writes through zone-a's proxy
to partitions zone-b's proxy owns: each request's batch goes into an S3-WAL object of
zone-a, PUT, then handed to the owner. The object store of zone-a's S3-WAL writer is
wrapped to fail the next PUT on demand once a later one went through (a fault-injecting
twin of the real store), so one request of the producer fails (56) while its next one,
in a later object, reaches the owner with a gap in the sequence; the test goes on until
the owner has seen 3 such gaps. Before the fix the owner answered that
gap 45, and librdkafka bumps its epoch on it. Now the owner answers NOT_LEADER_OR_FOLLOWER
(the gap is one the proxy made: the hand-off names the dropped batch), librdkafka resends
in order, and every record is in the log once.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import uuid
from contextlib import suppress

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from cutover_load import tiered_topic_id, topics_command, wait_owned
from test_tiered_produce import _config as produce_config
from tieredfleet import create_topic_over, s3_settings

from proxy.config import parse_config
from proxy.devstack.paths import free_port_block
from proxy.devstack.proxy_thread import ProxyThread
from proxy.metadata.streams import shard_of, stream_id
from proxy.objects.store import ObjectStoreError
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.kafka, pytest.mark.minio]

PARTITIONS = 4
SHARDS = 2
GAPS = 3  # proxy-made gaps to see explained
LATENCY_S = 0.05
HOLD_S = 5.0
QUEUED = 100  # records the producer holds not acknowledged yet


class FailNextPut:
    """The real store with S3's latency (every PUT takes `LATENCY_S` more), except that
    `arm()` makes the next PUT fail as S3 would after its retries (a retryable
    ObjectStoreError), without sending it, once a later PUT has gone through (at most
    `HOLD_S` later): one request of the producer fails while its next one succeeds."""

    def __init__(self, store) -> None:
        self._store = store
        self._armed = threading.Event()
        self.failed = 0
        self.failed_after_a_later_put = 0
        self._later: asyncio.Event | None = None  # set by a PUT ending while one is held

    def __getattr__(self, name: str):
        return getattr(self._store, name)

    def arm(self) -> None:
        self._armed.set()

    def disarmed(self) -> bool:
        return not self._armed.is_set()

    async def put(self, key, data, *args, **kwargs):
        if self._armed.is_set():
            self._armed.clear()
            self._later = asyncio.Event()
            with suppress(TimeoutError):
                async with asyncio.timeout(HOLD_S):
                    await self._later.wait()
            self.failed += 1
            self.failed_after_a_later_put += self._later.is_set()
            raise ObjectStoreError(key, "PutObject", "injected: the next PUT fails")
        await asyncio.sleep(LATENCY_S)
        result = await self._store.put(key, data, *args, **kwargs)
        if self._later is not None:
            self._later.set()
        return result


def _config(cluster, s3_server, tmp_path, name: str, zone: str, suffix: str, base: int) -> dict:
    config = produce_config(cluster, tmp_path, name, zone, suffix, "s3", base)
    config["tiering"]["object_store"] = s3_settings(s3_server)
    config["tiering"]["s3wal_max_delay_ms"] = 2  # one produce request per S3-WAL object
    return config


def test_a_failed_s3_wal_put_between_two_good_ones_is_no_45_and_no_duplicate(
    kafka_cluster, s3_server, tmp_path, caplog
):
    suffix = uuid.uuid4().hex[:8]
    admin = AdminClient({"bootstrap.servers": kafka_cluster.bootstrap})
    # partitions in both shards: each proxy owns one, so zone-b's owns some partitions
    topic, _ = create_topic_over(
        admin,
        f"gaps-{suffix}",
        PARTITIONS,
        lambda topic_id: (
            len({shard_of(stream_id(topic_id, p), SHARDS) for p in range(PARTITIONS)}) == SHARDS
        ),
    )
    base = free_port_block(16)
    configs = [
        _config(kafka_cluster, s3_server, tmp_path, f"g{n}-{suffix}", zone, suffix, base + 8 * n)
        for n, zone in enumerate(("zone-a", "zone-b"))
    ]
    caplog.set_level(logging.WARNING, logger="proxy.partition.owner")
    with (
        ProxyThread(parse_config(configs[0])) as a,
        ProxyThread(parse_config(configs[1])) as b,
    ):
        wait_owned([a, b], SHARDS)
        done = topics_command("tier", topic, a.proxy.tiering.peer_port)
        assert done.returncode == 0, done.stderr + done.stdout
        topic_id = tiered_topic_id(a, topic)
        b_name = b.proxy.config.fleet.name

        def owner(partition: int) -> str:
            stream = stream_id(topic_id, partition)
            return a.proxy.tiering.readers[shard_of(stream, SHARDS)].state.owner

        # the shards spread over both proxies (b joined after a took them all)
        wait_until(
            lambda: (
                any(owner(p) == b_name for p in range(PARTITIONS))
                and all(owner(p) for p in range(PARTITIONS))
            ),
            60,
            "zone-b's proxy owns some of the partitions",
        )
        remote = [p for p in range(PARTITIONS) if owner(p) == b_name]
        wait_until(
            lambda: all(b.proxy.tiering.partitions.get(stream_id(topic_id, p)) for p in remote),
            60,
            "zone-b's partitions started",
        )

        store = FailNextPut(a.proxy.tiering.s3wal.store)
        a.call(lambda: setattr(a.proxy.tiering.s3wal, "store", store))

        acked: dict[tuple[int, int], bytes] = {}
        errors: list[str] = []
        stop = threading.Event()

        def delivered(err, msg) -> None:
            if err is not None:
                errors.append(str(err))
            else:
                acked[(msg.partition(), msg.offset())] = msg.value()

        producer = Producer(
            {
                "bootstrap.servers": a.bootstrap,
                "client.id": "gaps,tierproxy_az=zone-a",
                "enable.idempotence": True,
                "acks": "all",
                "max.in.flight.requests.per.connection": 5,
                "linger.ms": 0,
                "batch.num.messages": 1,  # one record a request: 5 requests in flight
                "message.timeout.ms": 300_000,
            }
        )

        def produce() -> None:
            n = 0
            while not stop.is_set():
                if n - len(acked) - len(errors) >= QUEUED:  # a short queue, always full
                    producer.poll(0.01)
                    continue
                for partition in remote:
                    value = f"r{n}".encode()
                    try:
                        producer.produce(topic, value, partition=partition, on_delivery=delivered)
                    except BufferError:
                        producer.poll(0.05)
                        continue
                    n += 1
                producer.poll(0)

        thread = threading.Thread(target=produce, daemon=True)
        thread.start()
        try:
            wait_until(lambda: len(acked) > 100, 60, "the load is acknowledged")
            holes = b.proxy.tiering.holes
            for _ in range(10):
                if holes.explained >= GAPS:
                    break
                acks = len(acked)
                store.arm()
                wait_until(store.disarmed, 30, "the armed PUT failed")
                wait_until(lambda n=acks: len(acked) > n + 50, 60, "the producer goes on")
            assert holes.explained >= GAPS, (
                f"{store.failed} PUTs failed ({store.failed_after_a_later_put} after a later "
                f"one went through), {holes.explained} gaps explained"
            )
            time.sleep(1.0)
        finally:
            stop.set()
            thread.join(30)
        assert producer.flush(120) == 0
        assert not errors, errors[:5]

        answered = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
        assert not [m for m in answered if m.endswith("answered 45")], answered[:5]
        assert any(m.endswith("answered 6") for m in answered), answered[:5]

        # every acknowledged record once in the log, at the offset its producer was told
        consumer = Consumer(
            {
                "bootstrap.servers": a.bootstrap,
                "client.id": "gaps-reader,tierproxy_az=zone-a",
                "group.id": f"g-{suffix}",
                "enable.auto.commit": False,
                "auto.offset.reset": "error",
            }
        )
        consumer.assign([TopicPartition(topic, p, 0) for p in remote])
        seen: dict[tuple[int, int], bytes] = {}
        values: dict[bytes, list[tuple[int, int]]] = {}
        deadline = time.monotonic() + 120
        try:
            while not set(acked) <= set(seen) and time.monotonic() < deadline:
                for msg in consumer.consume(500, 1.0):
                    assert msg.error() is None, msg.error()
                    seen[(msg.partition(), msg.offset())] = msg.value()
                    values.setdefault(msg.value(), []).append((msg.partition(), msg.offset()))
        finally:
            consumer.close()
        assert {k: v for k, v in acked.items() if seen.get(k) != v} == {}
        twice = {v: at for v, at in values.items() if len(at) > 1}
        assert twice == {}, f"{len(twice)} records in the log twice: {list(twice.items())[:3]}"
