"""A tiered partition whose log start lies inside a batch is served again after every
kind of rebuild (docs/sequencer.md, "A log start inside a batch"; issue 15, bug 3).

Real `tierproxy run` processes (`TieredFleet`) on the shared Kafka and MinIO. An empty
one-partition topic is tiered (cutover 0) and gets ONE idempotent batch of 100 records
through the proxy (aiokafka's `send_batch`: one batch for sure); DeleteRecords through the
proxy moves the log start to 50, inside that batch, as Kafka Streams' purges do. Then:

- a clean stop (SIGTERM) and a restart under the same name (local WAL);
- a kill (SIGKILL) with a tail only in the S3 WAL (`wal.mode: s3`), then a restart;
- a clean stop, the WAL directory removed, a restart: the rebuild reads the objects only;
- a hand-over: the owner stops, the other proxy takes the shard, then hands it back;
- retention first moves the log start (a batch of old timestamps expires), then
  DeleteRecords moves it inside the next batch, then a restart.

After each: /readyz is 200 (every assigned shard owned), ListOffsets answers the log
start inside the batch and the high watermark, a new batch is appended after the old
ones, and a consumer from the earliest offset reads every record from the log start on,
once and in order. Before the fix the claim failed for good with "offsets [50, 0) are
missing before the objects batch at 0" and /readyz stayed 503.
"""

from __future__ import annotations

import asyncio
import shutil
import time
import uuid

import pytest
from aiokafka import AIOKafkaProducer
from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from test_tiered_retention import _earliest_latest, _read_from_earliest
from tieredfleet import TieredFleet, TieredProxy, topic_id_of, wait_for

from proxy.metadata.streams import shard_of, stream_id

pytestmark = [pytest.mark.kafka, pytest.mark.minio]

BATCH = 100
INSIDE = 50
HOUR_MS = 3_600_000
Records = list[tuple[int, bytes]]  # (offset, value)


def _one_batch(bootstrap: str, topic: str, prefix: str, count: int, ts: int | None) -> Records:
    """`count` records as one idempotent batch (timestamps `ts` on, or the clock's)."""

    async def send() -> Records:
        producer = AIOKafkaProducer(
            bootstrap_servers=bootstrap,
            enable_idempotence=True,
            acks="all",
            max_batch_size=1 << 20,
            request_timeout_ms=30000,
        )
        await producer.start()
        try:
            batch = producer.create_batch()
            values = [f"{prefix}-{n}".encode() for n in range(count)]
            for n, value in enumerate(values):
                stamp = None if ts is None else ts + n
                assert batch.append(key=None, value=value, timestamp=stamp) is not None
            metadata = await (await producer.send_batch(batch, topic, partition=0))
            return [(metadata.offset + n, value) for n, value in enumerate(values)]
        finally:
            await producer.stop()

    return asyncio.run(send())


def _delete_records(bootstrap: str, topic: str, offset: int) -> int:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    [future] = admin.delete_records([TopicPartition(topic, 0, offset)], request_timeout=60).values()
    return future.result().low_watermark


def _wait_ready(proxy: TieredProxy, timeout: float = 60.0) -> None:
    wait_for(proxy.ready, lambda answer: answer[0], f"{proxy.name} ready", timeout, 0.5)


class Scenario:
    """The fleet, the tiered topic and what was acknowledged, in offset order."""

    def __init__(self, kafka_cluster, s3_server, tmp_path, zones, **tiering) -> None:
        settings = {"upload_interval_s": 0.5, **tiering}
        self.fleet = TieredFleet(
            kafka_cluster.bootstrap,
            s3_server,
            tmp_path,
            zones=zones,
            shard_count=2,
            tiering=settings,
        )
        self.kafka = kafka_cluster.bootstrap
        self.acked: Records = []

    def start(self, topic_config: dict[str, str] | None = None) -> None:
        fleet = self.fleet
        fleet.start()
        fleet.wait_until_owned()
        admin = AdminClient({"bootstrap.servers": self.kafka})
        self.topic = f"logstart-{fleet.suffix}"
        new = NewTopic(self.topic, 1, 3, config=topic_config or {})
        admin.create_topics([new])[self.topic].result(30)
        self.topic_id = wait_for(lambda: topic_id_of(admin, self.topic), bool, "topic known")
        fleet.tier(self.topic)
        assert fleet.wait_for_cutover(self.topic_id, 1) == {0: 0}
        self.stream = stream_id(self.topic_id, 0)
        self.shard = shard_of(self.stream, fleet.shard_count)

    def produce(self, prefix: str, count: int = BATCH, ts: int | None = None) -> None:
        records = _one_batch(self.fleet.bootstrap(), self.topic, prefix, count, ts)
        expected = self.acked[-1][0] + 1 if self.acked else 0
        assert records[0][0] == expected, (records[0], expected)
        self.acked += records

    def info(self):
        return self.fleet.states()[self.shard].stream(self.stream)

    def wait_log_start(self, offset: int) -> None:
        wait_for(lambda: self.info().log_start_offset, lambda s: s == offset, f"log start {offset}")

    def one_batch_then_delete_inside(self) -> None:
        """Tiered, one batch of BATCH records, DeleteRecords to INSIDE."""
        self.start()
        self.produce("a")
        self.delete_inside(INSIDE)

    def delete_inside(self, offset: int) -> None:
        assert _delete_records(self.fleet.bootstrap(), self.topic, offset) == offset
        self.wait_log_start(offset)

    def owner(self) -> TieredProxy:
        return self.fleet.by_name(self.fleet.stream_owner(self.topic_id, 0))

    def check_served(self, proxy: TieredProxy, log_start: int) -> None:
        """Ready; the log start and end as written; a new batch after them; every record
        from the log start on read once, in order, through `proxy` (a WAL tail the
        restarted owner recovered too, not uploaded yet: its log cache holds it)."""
        _wait_ready(proxy)
        end = self.acked[-1][0] + 1
        assert _earliest_latest(proxy.bootstrap, self.topic) == (log_start, end)
        self.produce(f"after-{uuid.uuid4().hex[:6]}", 10)
        kept = [(o, v) for o, v in self.acked if o >= log_start]
        assert _read_from_earliest(proxy.bootstrap, self.topic, len(kept)) == kept

    def close(self) -> None:
        self.fleet.close()


@pytest.fixture
def scenario(request, kafka_cluster, s3_server, tmp_path):
    zones, tiering = request.param
    if "wal" in tiering:  # a local directory that must stay unused
        tiering = {**tiering, "wal": {**tiering["wal"], "directory": str(tmp_path / "disk")}}
    made = Scenario(kafka_cluster, s3_server, tmp_path, zones, **tiering)
    try:
        yield made
    finally:
        made.close()


ONE = (("zone-a",), {})
TWO = (("zone-a", "zone-b"), {})


@pytest.mark.parametrize("scenario", [ONE], indirect=True)
def test_a_clean_restart_serves_a_log_start_inside_a_batch(scenario):
    s = scenario
    s.one_batch_then_delete_inside()
    s.fleet.stop()
    s.fleet.start()
    s.check_served(s.fleet["zone-a"], INSIDE)


S3_WAL = (("zone-a",), {"upload_interval_s": 600.0, "wal": {"mode": "s3"}})


@pytest.mark.parametrize("scenario", [S3_WAL], indirect=True)
def test_a_killed_proxy_with_an_s3_wal_tail_serves_a_log_start_inside_a_batch(scenario, tmp_path):
    s = scenario
    s.one_batch_then_delete_inside()  # uploads the batch first: no trim passes the commits
    s.produce("tail", 10)  # only in the S3 WAL: no upload for 10 minutes
    assert s.info().end_offset == BATCH
    s.fleet.kill("zone-a")
    assert not (tmp_path / "disk").exists()
    s.fleet.start()
    s.check_served(s.fleet["zone-a"], INSIDE)
    assert s.info().end_offset == BATCH  # the tail was read before any upload


@pytest.mark.parametrize("scenario", [ONE], indirect=True)
def test_a_rebuild_from_the_objects_alone_serves_a_log_start_inside_a_batch(scenario):
    s = scenario
    s.one_batch_then_delete_inside()
    s.produce("b", 10)
    s.fleet.stop()  # a clean stop uploads what the WAL holds
    proxy = s.fleet["zone-a"]
    shutil.rmtree(proxy.wal_dir)
    s.fleet.start()
    s.check_served(proxy, INSIDE)


@pytest.mark.parametrize("scenario", [TWO], indirect=True)
def test_a_hand_over_and_back_serves_a_log_start_inside_a_batch(scenario):
    s = scenario
    s.one_batch_then_delete_inside()
    first = s.owner()
    other = next(p for p in s.fleet.proxies.values() if p is not first)
    s.fleet.stop(first.zone)
    s.fleet.wait_until_owned({other.name})
    s.check_served(other, INSIDE)
    s.fleet.start(first.zone)
    s.fleet.wait_until_owned()
    _wait_ready(first)
    s.check_served(s.owner(), INSIDE)


RETENTION = (("zone-a",), {"retention_check_interval_s": 1.0})


@pytest.mark.parametrize("scenario", [RETENTION], indirect=True)
def test_after_retention_a_log_start_inside_a_batch_survives_a_restart(scenario):
    s = scenario
    s.start({"retention.ms": str(HOUR_MS)})
    s.produce("old", ts=int(time.time() * 1000) - 2 * HOUR_MS)  # expired once uploaded
    s.wait_log_start(BATCH)  # retention dropped the range: a batch boundary
    s.produce("a")
    wait_for(lambda: s.info().end_offset, lambda end: end == 2 * BATCH, "uploaded")
    s.delete_inside(BATCH + INSIDE)
    s.fleet.stop()
    s.fleet.start()
    s.check_served(s.fleet["zone-a"], BATCH + INSIDE)
    assert s.info().log_start_offset == BATCH + INSIDE  # retention keeps that batch
