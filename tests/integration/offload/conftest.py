"""Fixtures of the offload tests: topics produced once per session into the shared Kafka
(see offloaddata.py for what they hold), and a proxy fleet per test module."""

from __future__ import annotations

import uuid

import pytest
from offloaddata import CODECS, PARTITIONS, Topic, create_topic, position, produce

from tests.integration.tiering.tieredfleet import TieredFleet


@pytest.fixture(scope="session")
def mixed_topic(kafka_cluster) -> Topic:
    bootstrap = kafka_cluster.bootstrap
    topic = Topic(f"offload-mixed-{uuid.uuid4().hex[:8]}", PARTITIONS)
    create_topic(bootstrap, topic.name, topic.partitions, {"min.insync.replicas": "2"})
    for codec in CODECS:
        produce(bootstrap, topic, codec, 400)
    produce(bootstrap, topic, "lz4", 200, transactional=True)
    topic.records.sort(key=position)
    return topic


@pytest.fixture(scope="session")
def compacted_topic(kafka_cluster) -> Topic:
    bootstrap = kafka_cluster.bootstrap
    topic = Topic(f"offload-compacted-{uuid.uuid4().hex[:8]}", 1)
    config = {"cleanup.policy": "compact", "segment.ms": "100",
              "min.cleanable.dirty.ratio": "0.01", "min.compaction.lag.ms": "0"}  # fmt: skip
    create_topic(bootstrap, topic.name, topic.partitions, config)
    produce(bootstrap, topic, "zstd", 600, keyed=True)
    produce(bootstrap, topic, "none", 600, keyed=True)
    topic.records.sort(key=position)
    return topic


@pytest.fixture(scope="module")
def fleet(kafka_cluster, s3_server, tmp_path_factory):
    """One `tierproxy run` proxy (zone-a) over the shared Kafka and MinIO, 2 shards."""
    base = tmp_path_factory.mktemp("fleet")
    with TieredFleet(
        kafka_cluster.bootstrap, s3_server, base, zones=("zone-a",), shard_count=2
    ) as fleet:
        yield fleet
