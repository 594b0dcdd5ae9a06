"""The conformance suite's shared fleet and clients (issue 15): one tiered fleet of two
proxies (zone-a, zone-b, two metadata shards, the session's Kafka and MinIO) for the
session, one runner per client, and the harness of the tiering tests on the path."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

# tieredfleet.py, raw_kafka.py: the tiering tests' fleet and raw requests
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "integration" / "tiering"))

from clients_aiokafka import Aiokafka  # noqa: E402
from clients_java import Java  # noqa: E402
from clients_librdkafka import Librdkafka  # noqa: E402
from scenario import Runner  # noqa: E402
from tieredfleet import TieredFleet  # noqa: E402


@pytest.fixture(scope="session")
def conformance_clients(tmp_path_factory):
    clients = {
        "librdkafka": Librdkafka(),
        "aiokafka": Aiokafka(),
        "java": Java(tmp_path_factory.mktemp("conformance-java")),
    }
    yield clients
    for client in clients.values():
        client.close()


@pytest.fixture(scope="session")
def conformance_fleet(kafka_cluster, s3_server, tmp_path_factory):
    with TieredFleet(
        kafka_cluster.bootstrap,
        s3_server,
        tmp_path_factory.mktemp("conformance-fleet"),
        zones=("zone-a", "zone-b"),
        shard_count=2,
    ) as fleet:
        yield fleet


@pytest.fixture(scope="session")
def conformance(conformance_fleet, conformance_clients, kafka_cluster) -> Runner:
    return Runner(conformance_fleet, kafka_cluster.bootstrap, conformance_clients)
