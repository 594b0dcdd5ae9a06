"""Session-wide real components: one 3-broker Kafka (racks zone-a/b/c), one MinIO, one Spark.

Each is started once per test session, on first use, and stopped at the end whatever
happened. A failing test gets the tail of every running component's log in its report.
Set TIERPROXY_TEST_BOOTSTRAP / TIERPROXY_TEST_S3_ENDPOINT to use external services instead.
"""

from __future__ import annotations

import pytest

from proxy.devstack import KafkaCluster, MinioServer
from proxy.devstack.external import external_kafka, external_s3
from proxy.devstack.process import tracked_processes

ZONES = ["zone-a", "zone-b", "zone-c"]


@pytest.fixture(scope="session")
def kafka_cluster():
    """The shared 3-broker cluster. Tests that stop brokers start their own."""
    external = external_kafka()
    if external is not None:
        yield external
        return
    with KafkaCluster(size=3, racks=ZONES, name="kafka-shared") as cluster:
        yield cluster


@pytest.fixture(scope="session")
def s3_server():
    external = external_s3()
    if external is not None:
        yield external
        return
    with MinioServer(name="minio-shared") as server:
        yield server


@pytest.fixture(scope="session")
def spark():
    from proxy.devstack.spark import spark_session

    session = spark_session("tierproxy-tests")
    yield session
    session.stop()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.failed:
        for proc in tracked_processes():
            report.sections.append(
                (f"log tail: {proc.name} ({proc.log_path})", proc.tail(40) or "(empty)")
            )
