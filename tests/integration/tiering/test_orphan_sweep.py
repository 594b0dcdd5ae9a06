"""The orphan sweep and S3-WAL deletion on the real Kafka and MinIO (proxy/server/
orphan_sweep.py, proxy/handoff/gc.py; docs/reliability.md, "Orphans").

Each test's fleet writes to a bucket of its own: the sweep judges every key of the object
layout in its bucket, and other tests' objects in the shared bucket are none of its
business.

1. One proxy owning both shards, a tiny `orphan_grace_s`: an object PUT straight into
   the bucket (an upload whose commit never came) goes once older than the grace; one
   younger stays; committed objects stay and read back; an offload job's object (id with
   the top bit set) outlives the short grace; an S3-WAL object no one released goes after
   `s3wal_retention_s` (a younger one stays until then); a key of neither layout is never
   touched. A commit past its objects' `commit_by` is refused by the service, shard by shard.
2. Two proxies, `notify: s3`: the one that does not own a partition hands its batches
   over through S3-WAL objects; once the owner answered every append in one, its writer
   deletes it: none is left, without waiting for the retention.
"""

from __future__ import annotations

import time
import uuid

import botocore.session
import pytest
from cutover_load import proxy_config, topics_command, wait_owned, wait_until
from tiered_topic import TieredTopic, create_spread_topic, produce, read_all
from tieredfleet import s3_settings

from proxy.config import parse_config
from proxy.devstack.paths import free_port_block
from proxy.devstack.proxy_thread import ProxyThread
from proxy.handoff.objects import wal_object_key
from proxy.metadata.records import OffsetRange
from proxy.metadata.streams import OFFLOAD_ID_BIT
from proxy.objects.keys import ObjectKind, object_key
from proxy.upload.uploader import CommitRefused, UploadedObject

pytestmark = [pytest.mark.kafka, pytest.mark.minio]

GRACE_S = 4.0  # the checks made within it take a moment on a loaded machine
SHARDS = 2


def own_bucket(server) -> dict:
    """tiering.object_store for a new bucket of this test's on `server`."""
    bucket = f"orphans-{uuid.uuid4().hex[:12]}"
    client = botocore.session.get_session().create_client("s3", **server.client_kwargs())
    try:
        client.create_bucket(Bucket=bucket)
    finally:
        client.close()
    return {**s3_settings(server), "bucket": bucket}


def keys(proxy: ProxyThread, prefix: str = "") -> dict[str, float]:
    store = proxy.proxy.tiering.store

    async def listing():
        return {info.key: info.last_modified async for info in store.list(prefix)}

    return proxy.run(listing)


def put(proxy: ProxyThread, key: str, data: bytes = b"not committed") -> None:
    proxy.run(lambda: proxy.proxy.tiering.store.put(key, data))


def test_the_sweep_deletes_only_unnamed_objects_past_their_grace(
    kafka_cluster, s3_server, tmp_path
):
    suffix = uuid.uuid4().hex[:8]
    topic = create_spread_topic(kafka_cluster, f"orphans-{suffix}", 2, SHARDS)
    config = proxy_config(
        kafka_cluster,
        tmp_path,
        f"orphans-{suffix}",
        "zone-a",
        suffix,
        free_port_block(8),
        upload_interval_s=3600.0,
        object_store=own_bucket(s3_server),
        orphan_grace_s=GRACE_S,
        offload_orphan_grace_s=3600.0,
        s3wal_retention_s=GRACE_S,
        orphan_sweep_interval_s=3600.0,  # rounds run when the test says
    )
    with ProxyThread(parse_config(config)) as proxy:
        wait_owned([proxy], SHARDS)
        t = TieredTopic(proxy, topic, 2, 20)
        t.round("r0")
        t.round("r1")
        committed = {r.object_key for p in range(2) for r in t.ranges(p)}
        assert len(committed) == 2
        # the service refuses, shard by shard, a commit past the object's `commit_by`
        end = t.ranges(0)[-1].end_offset
        late = UploadedObject(
            0x7FFF_0000_0009,
            ObjectKind.STREAM_SET,
            100,
            (OffsetRange(t.streams[0], end, end + 1),),
            commit_by=time.monotonic() - 0.001,
        )
        with pytest.raises(CommitRefused, match="too old to commit"):
            proxy.run(lambda: t.tiering._commit([late]))
        assert t.owner_state(0).object_commit(late.object_id) is None
        orphan = object_key(0x7FFF_0000_0001, ObjectKind.STREAM_SET)
        compaction_orphan = object_key(0x7FFF_0000_0002, ObjectKind.STREAM)
        offload = object_key(OFFLOAD_ID_BIT | 0x1234_5678, ObjectKind.STREAM)
        dead_writer = wal_object_key("proxy-gone-1700000000000-deadbeef", 0)
        foreign = "exports/orders/part-0.parquet"
        for key in (orphan, compaction_orphan, offload, dead_writer, foreign):
            put(proxy, key)
        time.sleep(GRACE_S + 1.5)  # MinIO stamps LastModified (to the second)
        young = object_key(0x7FFF_0000_0003, ObjectKind.STREAM_SET)
        young_wal = wal_object_key("proxy-gone-1700000000000-deadbeef", 1)
        put(proxy, young)
        put(proxy, young_wal)
        before = keys(proxy)
        assert before[young] > before[orphan]

        result = proxy.run(lambda: t.tiering.orphans.run_once())

        assert result is not None
        assert sorted(result.deleted) == sorted([orphan, compaction_orphan, dead_writer])
        left = set(keys(proxy))
        assert left == committed | {offload, young, young_wal, foreign}
        metrics = t.tiering.orphans.metrics
        assert metrics.value("tierproxy_orphan_objects_swept_total", kind="stream") == 2
        assert metrics.value("tierproxy_orphan_objects_swept_total", kind="s3wal") == 1
        assert metrics.value("tierproxy_orphan_bytes_swept_total", kind="stream") == 2 * len(
            b"not committed"
        )
        t.read_matches_acked()  # the committed objects still serve every record

        # the young one is an orphan too, once old enough; the rest stays
        time.sleep(GRACE_S + 0.5)
        result = proxy.run(lambda: t.tiering.orphans.run_once())
        assert result is not None and sorted(result.deleted) == sorted([young, young_wal])
        assert set(keys(proxy)) == committed | {offload, foreign}
        t.read_matches_acked()


def test_s3wal_objects_go_once_their_owner_answered(kafka_cluster, s3_server, tmp_path):
    suffix = uuid.uuid4().hex[:8]
    topic = create_spread_topic(kafka_cluster, f"s3wal-{suffix}", 4, SHARDS)
    bucket = own_bucket(s3_server)
    base = free_port_block(16)
    configs = [
        proxy_config(
            kafka_cluster,
            tmp_path,
            f"p{n}-{suffix}",
            zone,
            suffix,
            base + 8 * n,
            notify="s3",
            object_store=bucket,
            cutover_hold_ms=20_000,
            s3wal_retention_s=3600.0,  # only the writer's own deletes can clear them
        )
        for n, zone in enumerate(("zone-a", "zone-b"))
    ]
    with ProxyThread(parse_config(configs[0])) as a, ProxyThread(parse_config(configs[1])) as b:
        wait_owned([a, b], SHARDS)

        def owns_one(p: ProxyThread) -> bool:
            return any(p.proxy.tiering.assignment.owner(k) is not None for k in range(SHARDS))

        wait_until(lambda: owns_one(a) and owns_one(b), 60, "each proxy owns a shard")
        assert topics_command("tier", topic, a.proxy.tiering.peer_port).returncode == 0
        wait_until(lambda: b.proxy.tiering.topics.topic(topic) is not None, 30, "tiered at b")
        acked = produce(b.bootstrap, topic, 4, "via-b", 50)
        writer = b.proxy.tiering.s3wal
        puts = writer.metrics.value("tierproxy_s3wal_puts_total", outcome="ok")
        assert puts > 0, "no batch went through an S3-WAL object"

        def deleted() -> bool:  # the counter moves once the delete's answer is read
            gone = writer.metrics.value("tierproxy_s3wal_objects_deleted_total") == puts
            return gone and not keys(b, "wal/")

        wait_until(deleted, 30, "the released S3-WAL objects deleted")
        assert writer.releases.held == 0
        ends = {p: records[-1][0] + 1 for p, records in acked.items()}
        assert read_all(b.bootstrap, topic, ends) == acked
