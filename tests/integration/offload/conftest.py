"""Session fixtures of the offload tests: topics produced once into the shared Kafka
(see offloaddata.py for what they hold)."""

from __future__ import annotations

import uuid

import pytest
from offloaddata import CODECS, PARTITIONS, Topic, create_topic, position, produce


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
