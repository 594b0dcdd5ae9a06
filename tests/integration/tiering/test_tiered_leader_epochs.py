"""OffsetForLeaderEpoch on a tiered partition (proxy/tiered/epochs.py).

A tiered partition's latest epoch goes on past Kafka's log end, the cutover. Asked where
that epoch ends, Kafka says the cutover; the proxy says the stream's high watermark (the
committed objects and the tail only the owner's WAL holds), so a consumer whose position
is past the cutover does not take the answer for a truncated log. Asked in one request
with a partition of a plain topic, the proxy passes that one's answer on as it came.
"""

from __future__ import annotations

import uuid

import pytest
from cutover_load import create_topic, proxy_config, wait_owned
from raw_kafka import epoch_ends, leaders
from tiered_topic import TieredTopic, produce

from proxy.config import parse_config
from proxy.devstack.paths import free_port_block
from proxy.devstack.proxy_thread import ProxyThread

pytestmark = pytest.mark.kafka

PER_ROUND = 40


def test_the_latest_epoch_of_a_tiered_partition_ends_at_its_high_watermark(kafka_cluster, tmp_path):
    suffix = uuid.uuid4().hex[:8]
    topic, plain = f"epochs-{suffix}", f"epochs-plain-{suffix}"
    create_topic(kafka_cluster, topic, 1)
    create_topic(kafka_cluster, plain, 1)
    base = free_port_block(8)
    config = proxy_config(
        kafka_cluster, tmp_path, f"epochs-{suffix}", "zone-a", suffix, base,
        upload_interval_s=3600.0,
    )  # fmt: skip
    with ProxyThread(parse_config(config)) as proxy:
        wait_owned([proxy], 2)
        t = TieredTopic(proxy, topic, 1, PER_ROUND)
        t.round("objects")
        t.produce("tail")  # in the owner's WAL only
        produce(proxy.bootstrap, plain, 1, "plain", 5)
        high_watermark = t.acked[0][-1][0] + 1
        assert high_watermark == 3 * PER_ROUND

        host, port = kafka_cluster.bootstrap.split(",")[0].rsplit(":", 1)
        found = leaders((host, int(port)), [topic, plain])
        brokers = {b.node_id: b for b in kafka_cluster.nodes}
        for key, (leader, epoch) in found.items():
            direct = epoch_ends(("127.0.0.1", brokers[leader].port), {key: epoch})[key]
            # the proxy shows broker N at broker_port_base + N
            proxied = epoch_ends(("127.0.0.1", base + leader), {key: epoch})[key]
            if key[0] == topic:
                assert direct == (0, epoch, PER_ROUND)  # Kafka's log ends at the cutover
                assert proxied == (0, epoch, high_watermark)
            else:
                assert proxied == direct == (0, epoch, 5)
        if found[topic, 0][0] == found[plain, 0][0]:  # one request naming both
            leader, epoch = found[topic, 0]
            both = epoch_ends(
                ("127.0.0.1", base + leader), {(topic, 0): epoch, (plain, 0): found[plain, 0][1]}
            )
            assert both == {
                (topic, 0): (0, epoch, high_watermark),
                (plain, 0): (0, found[plain, 0][1], 5),
            }
