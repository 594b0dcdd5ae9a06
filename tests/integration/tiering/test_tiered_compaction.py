"""Compaction of a tiered topic on MinIO, run by its owner (proxy/upkeep/compactor.py).

One proxy owns both metadata shards. A three-partition topic gets a few records per
partition through Kafka, is tiered, then gets ROUNDS rounds of records, each uploaded as
one stream set object holding all three partitions (so each object spans both shards). A
compaction pass then rewrites each partition's ranges into one stream object. Checked:
every partition's committed ranges are one stream object covering [cutover, end); the
stream set objects hold no range in either shard and leave MinIO after the grace (not
before the other shard's part is compacted too); a consumer from the beginning reads
every record once, in order, Kafka's part and the compacted part alike; writes after the
pass continue the stream, and a second pass rewrites them too.
"""

from __future__ import annotations

import time
import uuid

import pytest
from cutover_load import proxy_config, wait_owned, wait_until
from tiered_topic import TieredTopic, create_spread_topic
from tieredfleet import s3_settings

from proxy.config import parse_config
from proxy.devstack.paths import free_port_block
from proxy.devstack.proxy_thread import ProxyThread
from proxy.objects.keys import ObjectKind

pytestmark = pytest.mark.kafka

PARTITIONS = 3
SHARDS = 2
ROUNDS = 4
PER_ROUND = 25  # records per partition and round
GRACE_S = 15.0  # the checks made within it take a few seconds on a loaded machine


def test_compaction_rewrites_stream_set_objects_into_stream_objects_and_reads_stay_exact(
    kafka_cluster, s3_server, tmp_path
):
    started = time.monotonic()
    suffix = uuid.uuid4().hex[:8]
    topic = create_spread_topic(kafka_cluster, f"compact-{suffix}", PARTITIONS, SHARDS)
    config = proxy_config(
        kafka_cluster,
        tmp_path,
        f"compact-{suffix}",
        "zone-a",
        suffix,
        free_port_block(8),
        upload_interval_s=3600.0,
        object_store=s3_settings(s3_server),
        compaction_interval_s=3600.0,  # passes run when the test says
        compaction_min_objects=2,
        object_delete_grace_s=GRACE_S,
    )
    with ProxyThread(parse_config(config)) as proxy:
        wait_owned([proxy], SHARDS)
        t = TieredTopic(proxy, topic, PARTITIONS, PER_ROUND)
        assert len({t.tiering.state(s).shard for s in t.streams}) == SHARDS
        for n in range(ROUNDS):
            t.round(f"r{n}")
        before = {p: t.ranges(p) for p in range(PARTITIONS)}
        sources = {r.object_id: r.object_key for p in before for r in before[p]}
        assert all(len(before[p]) == ROUNDS for p in before)
        assert all(r.object_kind is ObjectKind.STREAM_SET for p in before for r in before[p])
        assert len(sources) == ROUNDS  # each round's object holds all three partitions
        t.read_matches_acked()

        results = proxy.run(lambda: t.tiering.compactor.run_once())
        compacted_at = time.monotonic()
        assert sorted(r.shard for r in results) == list(range(SHARDS))
        assert sum(len(r.written) for r in results) == PARTITIONS
        # the owners wrote the commits; this proxy's readers of the shards apply them next
        wait_until(lambda: all(len(t.ranges(p)) == 1 for p in range(PARTITIONS)), 30, "read")
        for p in range(PARTITIONS):
            [merged] = t.ranges(p)
            assert merged.object_kind is ObjectKind.STREAM
            assert (merged.start_offset, merged.end_offset) == (
                before[p][0].start_offset,
                before[p][-1].end_offset,
            )
            assert t.exists(merged.object_key)
        # both shards' parts were rewritten: the stream set objects are garbage in both
        for p in range(PARTITIONS):
            assert sorted(c.object_id for c in t.owner_state(p).garbage_objects()) == sorted(
                sources
            )
        # readers that planned from the old objects may still read them within the grace
        assert all(t.exists(key) for key in sources.values())
        assert time.monotonic() - compacted_at < GRACE_S  # else the check above proves less
        t.read_matches_acked()

        def deleted() -> bool:
            return all(not t.owner_state(p).garbage_objects() for p in range(PARTITIONS))

        wait_until(deleted, 10 * GRACE_S, "replaced objects deleted")
        assert time.monotonic() - compacted_at >= GRACE_S
        assert not any(t.exists(key) for key in sources.values())
        assert not any(t.tiering.block_cache.has_index(key) for key in sources.values())
        t.read_matches_acked()

        # writes go on after the pass; a second pass rewrites them into stream objects
        # once that lowers each shard's object count (a shard of two streams holds two
        # stream objects and needs three more stream set objects for that)
        for n in range(3):
            t.round(f"after-{n}")
        assert all(len(t.ranges(p)) == 4 for p in range(PARTITIONS))
        proxy.run(lambda: t.tiering.compactor.run_once())

        def only_stream_objects() -> bool:
            return all({r.object_kind for r in t.ranges(p)} == {ObjectKind.STREAM}
                       for p in range(PARTITIONS))  # fmt: skip

        wait_until(only_stream_objects, 30, "second pass read")
        for p in range(PARTITIONS):
            assert t.ranges(p)[-1].end_offset == t.acked[p][-1][0] + 1
        t.read_matches_acked()
    print(f"compaction test took {time.monotonic() - started:.1f} s")
