"""`wal.mode: s3` (proxy/wal/s3log.py): the owner's WAL is objects under
walog/<fleet.name>/ in the bucket, and a produce is answered once its group's PUT returns,
so a proxy whose machine and disk are gone loses nothing it acknowledged.

One `tierproxy run` process on real Kafka and MinIO, uploads every 10 minutes (so what is
produced stays in the WAL only): an idempotent producer (acks=all) writes to a tiered
topic, the proxy is killed (SIGKILL), its local WAL directory removed, and it is started
again under the same name. Its partitions come back at the acknowledged ends from the
bucket alone; a clean stop then uploads and commits everything, which deletes the walog
objects but the newest (kept so the log's offsets never start over, docs/wal.md, "Late
PUTs"), and every acknowledged record reads back exactly once, in order, through the
proxy started once more (which replays that object and skips what is committed).
"""

from __future__ import annotations

import asyncio
import re
import shutil

import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from tieredfleet import TieredFleet, produce_librdkafka, s3_settings, topic_id_of

from proxy.objects.s3 import S3Store
from proxy.objects.s3config import S3Config
from proxy.wal.s3log_objects import log_prefix
from tests.support.clients import watermarks
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.kafka, pytest.mark.minio]

PARTITIONS = 2
RECORDS = 1200  # of 1,000 bytes: about 1.2 MB in all
SIZE = 1000


def walog_keys(s3_server, prefix: str) -> list[str]:
    async def listing() -> list[str]:
        settings = {k: v for k, v in s3_settings(s3_server).items() if k != "kind"}
        store = await S3Store.open(S3Config(**settings))
        try:
            return [info.key async for info in store.list(prefix)]
        finally:
            await store.close()

    return asyncio.run(listing())


def delete_keys(s3_server, keys: list[str]) -> None:
    async def delete() -> None:
        settings = {k: v for k, v in s3_settings(s3_server).items() if k != "kind"}
        store = await S3Store.open(S3Config(**settings))
        try:
            await store.delete(keys)
        finally:
            await store.close()

    asyncio.run(delete())


def high_watermarks(bootstrap: str, topic: str) -> dict[int, int]:
    """Each partition's high watermark. Right after a restart the partitions are rebuilt
    once their shard is claimed, and a ListOffsets before that is answered
    NOT_LEADER_OR_FOLLOWER, as a broker's is while its leadership moves: asked again
    (`watermarks`), as an application does."""
    return {p: watermarks(bootstrap, topic, p)[1] for p in range(PARTITIONS)}


def read_all(bootstrap: str, topic: str, ends: dict[int, int]) -> dict[int, list[tuple]]:
    """Every record of the topic, from offset 0 to `ends`, per partition."""
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "check", "enable.auto.commit": False}
    )
    found: dict[int, list[tuple]] = {p: [] for p in range(PARTITIONS)}
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
        wait_for(
            lambda: [
                found[m.partition()].append((m.offset(), m.value()))
                for m in consumer.consume(500, timeout=1.0)
                if m.error() is None
            ],
            lambda _: all(len(found[p]) >= ends[p] for p in found),
            "every record read",
            timeout=60,
        )
    finally:
        consumer.close()
    return found


def test_acknowledged_records_survive_the_loss_of_the_proxys_disk(
    kafka_cluster, s3_server, tmp_path
):
    disk = tmp_path / "disk" / "wal"
    fleet = TieredFleet(
        kafka_cluster.bootstrap,
        s3_server,
        tmp_path,
        zones=("zone-a",),
        shard_count=2,
        tiering={"upload_interval_s": 600.0, "wal": {"mode": "s3", "directory": str(disk)}},
    )
    proxy = fleet["zone-a"]
    prefix = log_prefix(proxy.name)
    try:
        fleet.start()
        fleet.wait_until_owned()
        admin = AdminClient({"bootstrap.servers": kafka_cluster.bootstrap})
        topic = f"s3wal-{fleet.suffix}"
        admin.create_topics([NewTopic(topic, PARTITIONS, 3)])[topic].result(30)
        topic_id = wait_for(lambda: topic_id_of(admin, topic), bool, f"{topic} known")
        fleet.tier(topic)
        fleet.wait_for_cutover(topic_id, PARTITIONS)

        produced = produce_librdkafka(
            fleet.bootstrap(), topic, "zone-a", "p", RECORDS, PARTITIONS, SIZE, timeout_s=60
        )
        assert not produced.errors and len(produced.acked) == RECORDS
        acked_ends = {p: RECORDS // PARTITIONS for p in range(PARTITIONS)}
        assert {
            p: 1 + max(o for q, o in produced.acked.values() if q == p) for p in range(PARTITIONS)
        } == acked_ends
        assert len(walog_keys(s3_server, prefix)) > 0
        assert proxy.metric("tierproxy_wal_fsyncs_total") > 0  # PUTs, one per group
        assert not disk.exists()  # nothing of the WAL went to the local disk

        fleet.kill("zone-a")
        committed = fleet.committed(topic_id, PARTITIONS)
        assert all(not records for records in committed.records.values())  # all in the WAL
        shutil.rmtree(tmp_path / "disk", ignore_errors=True)  # the machine is gone

        logged = proxy.log_size()
        fleet.start()
        fleet.wait_until_owned()
        assert high_watermarks(fleet.bootstrap(), topic) == acked_ends
        recovered = re.search(r"S3 WAL walog/\S+: recovered (\d+) objects", proxy.log(logged))
        assert recovered is not None and int(recovered[1]) > 0, proxy.log(logged)[-3000:]

        fleet.stop()  # a clean stop uploads and commits what the WAL holds, then trims
        assert len(walog_keys(s3_server, prefix)) == 1  # the newest object stays
        committed = fleet.committed(topic_id, PARTITIONS)
        expected = {p: [] for p in range(PARTITIONS)}
        for value, (p, offset) in produced.acked.items():
            expected[p].append((offset, value))
        assert {p: committed.records.get(p, []) for p in expected} == {
            p: sorted(records) for p, records in expected.items()
        }

        fleet.start()
        fleet.wait_until_owned()
        found = read_all(fleet.bootstrap(), topic, acked_ends)
        assert found == {p: sorted(records) for p, records in expected.items()}
        assert [int(v.split(b":")[1]) for _, v in found[0]] == list(range(0, RECORDS, 2))
    finally:
        try:
            fleet.close()
        finally:
            leftover = walog_keys(s3_server, prefix)
            if leftover:
                delete_keys(s3_server, leftover)
