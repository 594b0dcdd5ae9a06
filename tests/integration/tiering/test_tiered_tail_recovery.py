"""A restarted owner serves at once the WAL tail it recovered, acknowledged and not
uploaded yet (issue 15: a tiered topic answers as Kafka does, and Kafka serves every
record below its high watermark).

Real `tierproxy run` processes (`TieredFleet`, two zones) on the shared Kafka and MinIO,
with `upload_interval_s` 600: nothing is uploaded during the test. A tiered one-partition
topic gets its records through the proxies (an idempotent librdkafka producer); then the
partition's owner is killed (SIGKILL) or stopped (SIGTERM) and started again under the
same name. Consumers (librdkafka and aiokafka) from the first offset, through the owner
and through the other proxy (which asks the owner for the tail over the peer protocol),
must read every acknowledged record, once and in order, within READ_S: far below the
upload interval. Before the fix, the owner's log cache started empty and the consumers
saw a high watermark they could not read up to until the next upload.

Variants: the local WAL; the local WAL with a log cache smaller than the tail (the rebuild
loads the newest part, the rest is read from the WAL); the S3 WAL (`wal.mode: s3`); and a
clean stop, whose hand-over uploads the tail (then the objects serve it).
"""

from __future__ import annotations

import asyncio
import time

import pytest
from confluent_kafka.admin import AdminClient, NewTopic
from test_tiered_beyond_cutover import _aiokafka
from test_tiered_retention import _read_from_earliest
from tieredfleet import TieredFleet, TieredProxy, produce_librdkafka, topic_id_of, wait_for

from proxy.metadata.streams import shard_of, stream_id

pytestmark = [pytest.mark.kafka, pytest.mark.minio]

MiB = 1 << 20
READ_S = 30.0  # a consumer reads the whole tail within this (the upload interval is 600 s)


def _ready(proxy: TieredProxy) -> None:
    wait_for(proxy.ready, lambda answer: answer[0], f"{proxy.name} ready", 60, 0.5)


LOCAL = {}
SMALL_CACHE = {"log_cache_bytes": MiB}
S3_WAL = {"wal": {"mode": "s3"}}


@pytest.mark.parametrize(
    ("ending", "tiering", "count", "size"),
    [
        ("kill", LOCAL, 400, 200),
        ("kill", SMALL_CACHE, 3000, 1024),  # a 3 MiB tail: most of it read from the WAL
        ("kill", S3_WAL, 400, 200),
        ("stop", LOCAL, 400, 200),
    ],
    ids=["kill-local-wal", "kill-small-log-cache", "kill-s3-wal", "clean-stop"],
)
def test_a_restarted_owner_serves_its_recovered_tail_at_once(
    kafka_cluster, s3_server, tmp_path, ending, tiering, count, size
):
    settings = {"upload_interval_s": 600.0, "upload_bytes": 256 * MiB, **tiering}
    if "wal" in tiering:  # a local directory that must stay unused
        settings["wal"] = {**tiering["wal"], "directory": str(tmp_path / "disk")}
    fleet = TieredFleet(
        kafka_cluster.bootstrap, s3_server, tmp_path, shard_count=2, tiering=settings
    )
    try:
        fleet.start()
        fleet.wait_until_owned()
        admin = AdminClient({"bootstrap.servers": kafka_cluster.bootstrap})
        topic = f"tail-{fleet.suffix}"
        admin.create_topics([NewTopic(topic, 1, 3)])[topic].result(30)
        topic_id = wait_for(lambda: topic_id_of(admin, topic), bool, "topic known")
        fleet.tier(topic)
        assert fleet.wait_for_cutover(topic_id, 1) == {0: 0}
        stream = stream_id(topic_id, 0)
        shard = shard_of(stream, fleet.shard_count)

        produced = produce_librdkafka(fleet.bootstrap(), topic, "zone-a", "p", count, 1, size)
        assert produced.errors == [] and len(produced.acked) == count
        acked = sorted((offset, value) for value, (_, offset) in produced.acked.items())
        assert [offset for offset, _ in acked] == list(range(count))
        assert fleet.states()[shard].stream(stream).end_offset == 0  # nothing uploaded

        owner = fleet.by_name(fleet.stream_owner(topic_id, 0))
        other = next(p for p in fleet.proxies.values() if p is not owner)
        if ending == "kill":
            fleet.kill(owner.zone)
        else:
            fleet.stop(owner.zone)
        fleet.start(owner.zone)
        fleet.wait_until_owned()
        if ending == "kill":
            assert fleet.stream_owner(topic_id, 0) == owner.name  # its shards waited for it
        else:  # handed over: the assignor may leave the shard with the other proxy
            owner = fleet.by_name(fleet.stream_owner(topic_id, 0))
            other = next(p for p in fleet.proxies.values() if p is not owner)
        _ready(owner)
        _ready(other)
        uploaded = fleet.states()[shard].stream(stream).end_offset
        assert uploaded == (0 if ending == "kill" else count)

        for proxy in (owner, other):
            started = time.monotonic()
            assert _read_from_earliest(proxy.bootstrap, topic, count) == acked, proxy.name
            assert time.monotonic() - started < READ_S, proxy.name
            started = time.monotonic()
            assert asyncio.run(_aiokafka(proxy.bootstrap, topic, count)) == acked, proxy.name
            assert time.monotonic() - started < READ_S + 2, proxy.name  # + its 1.5 s check
        # served from the recovered tail: still nothing more uploaded
        assert fleet.states()[shard].stream(stream).end_offset == uploaded
    finally:
        fleet.close()
