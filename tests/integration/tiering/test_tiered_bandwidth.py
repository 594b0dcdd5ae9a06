"""Bandwidth by priority on a proxy (proxy/objects/bandwidth.py, proxy/objects/ratelimit.py).

A proxy limited to RATE bytes a second owns a tiered topic of which ~1.5 MB is committed
to objects. A consumer replays it from offset 0 (catch-up reads) while a producer writes
to it through the same proxy. Checked: the replay gets every record once and in order;
catch-up reads were made to wait for the bandwidth; produce never waited, though it took
its share of the same bandwidth; the counts are on /metrics. A compaction pass afterwards
waits at its own priority. How much produce latency a read storm adds is measured in
benchmarks/tiered_read.py, not here.
"""

from __future__ import annotations

import threading
import uuid
from dataclasses import asdict

import pytest
from cutover_load import create_topic, proxy_config, wait_owned
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from tiered_topic import TieredTopic

from proxy.config import parse_config
from proxy.devstack.paths import free_port_block
from proxy.devstack.proxy_thread import ProxyThread
from proxy.objects.ratelimit import Priority

pytestmark = pytest.mark.kafka

PARTITIONS = 2
PER_ROUND = 250  # records per partition and round
PAD = 1000  # value bytes beyond the record's name
ROUNDS = 3
RATE = 512 * 1024
BURST = 64 * 1024


def _metric(registry, name: str) -> dict[str, float]:
    """priority -> value of a tierproxy_bandwidth_* counter, as /metrics serves it."""
    text = generate_latest(registry).decode()
    for family in text_string_to_metric_families(text):
        if family.name == name:
            return {s.labels["priority"]: s.value for s in family.samples if "priority" in s.labels}
    raise AssertionError(f"{name} not on /metrics")


def test_catch_up_reads_wait_for_bandwidth_and_produce_never_does(kafka_cluster, tmp_path):
    suffix = uuid.uuid4().hex[:8]
    topic = f"bandwidth-{suffix}"
    create_topic(kafka_cluster, topic, PARTITIONS)
    config = proxy_config(
        kafka_cluster,
        tmp_path,
        f"bandwidth-{suffix}",
        "zone-a",
        suffix,
        free_port_block(8),
        upload_interval_s=3600.0,
        compaction_interval_s=3600.0,
        compaction_min_objects=2,
        bandwidth_bytes_per_s=RATE,
        bandwidth_burst_bytes=BURST,
    )
    with ProxyThread(parse_config(config)) as proxy:
        wait_owned([proxy], 2)
        t = TieredTopic(proxy, topic, PARTITIONS, PER_ROUND, PAD)
        for n in range(ROUNDS):
            t.round(f"r{n}")
        limiter = t.tiering.bandwidth.limiter
        committed = sum(r.object_size for p in range(PARTITIONS) for r in t.ranges(p))
        assert committed > 3 * RATE  # a replay longer than the burst allows at once
        before = {p: asdict(limiter.stats[p]) for p in Priority}

        expected = {p: list(records) for p, records in t.acked.items()}
        writer = threading.Thread(target=t.produce, args=("during",))
        writer.start()
        got = t.read_all(timeout_s=120)
        writer.join(120)
        assert not writer.is_alive()
        ends = {p: records[-1][0] + 1 for p, records in expected.items()}
        assert {p: records[: len(expected[p])] for p, records in got.items()} == expected, ends

        catch_up, produce = limiter.stats[Priority.CATCHUP_READ], limiter.stats[Priority.PRODUCE]
        read_bytes = catch_up.bytes_granted - before[Priority.CATCHUP_READ]["bytes_granted"]
        value_bytes = sum(len(v) for records in expected.values() for _, v in records)
        assert read_bytes >= value_bytes * (ROUNDS / (ROUNDS + 1))  # the objects' part
        assert catch_up.waits > before[Priority.CATCHUP_READ]["waits"]
        assert catch_up.seconds_waited > before[Priority.CATCHUP_READ]["seconds_waited"]
        assert produce.bytes_granted > before[Priority.PRODUCE]["bytes_granted"]
        assert produce.waits == 0  # produce takes its bytes at once, reads pay the debt

        registry = proxy.proxy.metrics.registry
        granted = _metric(registry, "tierproxy_bandwidth_bytes")
        assert granted["catchup_read"] == catch_up.bytes_granted
        assert granted["produce"] == produce.bytes_granted
        assert _metric(registry, "tierproxy_bandwidth_waits")["produce"] == 0

        # compaction's GETs and PUTs take the same bandwidth, at their own priority
        results = proxy.run(lambda: t.tiering.compactor.run_once())
        assert sum(len(r.written) for r in results) >= 1
        compaction = limiter.stats[Priority.COMPACTION]
        assert compaction.bytes_granted >= sum(r.bytes_written for r in results)
        t.read_matches_acked()
