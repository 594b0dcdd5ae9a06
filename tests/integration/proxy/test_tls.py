"""TLS on the proxy's client listeners and on its connections to upstream.

A CA made for the test run signs a certificate for 127.0.0.1. The proxy serves TLS to
clients with it (in front of the shared plaintext cluster), speaks TLS to a Kafka SSL
listener that presents it (trusting only that CA), and does both at once. Each time a
librdkafka client produces and consumes through it, and a client that does not trust
the test CA is refused.
"""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient

pytestmark = pytest.mark.kafka


def listener_tls(tls_files) -> dict:
    return {"enabled": True, "cert_file": str(tls_files.server_cert),
            "key_file": str(tls_files.server_key)}  # fmt: skip


def upstream_tls(tls_files) -> dict:
    return {"enabled": True, "ca_file": str(tls_files.ca_cert)}


def ssl_conf(bootstrap: str, tls_files) -> dict:
    return {
        "bootstrap.servers": bootstrap,
        "security.protocol": "SSL",
        "ssl.ca.location": str(tls_files.ca_cert),
    }


def roundtrip(compat, conf: dict, replication: int) -> None:
    topic = compat.create_topic(conf, partitions=3, replication=replication)
    records = compat.records(f"tls-{topic}", 3000)
    compat.produce(conf, topic, records)
    compat.assert_exactly_once(compat.read_all(conf, topic, len(records), partitions=3), records)


def test_clients_speak_tls_to_the_proxy(kafka_cluster, start_proxy, tls_files, compat):
    proxy = start_proxy(kafka_cluster, listener_tls=listener_tls(tls_files))
    roundtrip(compat, ssl_conf(proxy.bootstrap, tls_files), replication=3)

    errors: list[KafkaError] = []
    untrusting = AdminClient(
        {
            "bootstrap.servers": proxy.bootstrap,
            "security.protocol": "SSL",
            "error_cb": errors.append,
        }
    )
    with pytest.raises(KafkaException):
        untrusting.list_topics(timeout=3)
    untrusting.poll(1)
    assert any("certificate verify failed" in error.str() for error in errors), [
        error.str() for error in errors
    ]


def test_proxy_speaks_tls_to_upstream(secured_cluster, start_proxy, tls_files, compat):
    proxy = start_proxy(secured_cluster, "SSL", upstream_tls=upstream_tls(tls_files))
    roundtrip(compat, {"bootstrap.servers": proxy.bootstrap}, replication=1)


def test_tls_on_both_sides(secured_cluster, start_proxy, tls_files, compat):
    proxy = start_proxy(
        secured_cluster,
        "SSL",
        listener_tls=listener_tls(tls_files),
        upstream_tls=upstream_tls(tls_files),
    )
    roundtrip(compat, ssl_conf(proxy.bootstrap, tls_files), replication=1)
