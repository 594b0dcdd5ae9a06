"""SASL passes through the proxy on the client's own upstream connection.

The proxy holds no credentials: each client connection gets its own connection to the
broker it stands for, and the client's SaslHandshake and SaslAuthenticate travel on it
untouched. Against a Kafka SASL_PLAINTEXT listener, PLAIN, SCRAM-SHA-256 and
SCRAM-SHA-512 clients produce and consume through the proxy, a wrong password is
refused with an authentication error, and the proxy starts although its own Metadata
request, unauthenticated, is refused.
"""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient

pytestmark = pytest.mark.kafka

LISTENER = "SASL_PLAINTEXT"
MECHANISMS = ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]
SASL_HANDSHAKE, SASL_AUTHENTICATE = 17, 36


def sasl_conf(bootstrap: str, mechanism: str, user: str, password: str) -> dict:
    return {
        "bootstrap.servers": bootstrap,
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": mechanism,
        "sasl.username": user,
        "sasl.password": password,
    }


def test_proxy_starts_without_credentials_and_learns_brokers_from_clients(
    secured_cluster, start_proxy, compat
):
    proxy = start_proxy(secured_cluster, LISTENER)
    state = proxy.thread.proxy
    assert state is not None
    ranges = state.api_ranges()
    assert SASL_HANDSHAKE in ranges and SASL_AUTHENTICATE in ranges, ranges
    assert state.brokers.brokers() == []  # its unauthenticated Metadata was refused

    conf = sasl_conf(proxy.bootstrap, "PLAIN", "alice", "alice-secret")
    metadata = AdminClient(conf).list_topics(timeout=30)
    assert {b.id: (b.host, b.port) for b in metadata.brokers.values()} == {
        1: ("127.0.0.1", proxy.broker_port(1))
    }
    [learnt] = state.brokers.brokers()
    assert (learnt.node_id, learnt.port) == (1, secured_cluster.nodes[0].extra_ports[LISTENER])


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_sasl_client_produces_and_consumes_through_the_proxy(
    secured_cluster, start_proxy, compat, mechanism
):
    proxy = start_proxy(secured_cluster, LISTENER)
    conf = sasl_conf(proxy.bootstrap, mechanism, "bob", "bob-secret")
    topic = compat.create_topic(conf, partitions=2, replication=1)
    records = compat.records(f"sasl-{mechanism}", 2000)
    compat.produce(conf, topic, records)
    compat.assert_exactly_once(compat.read_all(conf, topic, len(records), partitions=2), records)


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_wrong_password_is_refused_through_the_proxy(secured_cluster, start_proxy, mechanism):
    proxy = start_proxy(secured_cluster, LISTENER)
    errors: list[KafkaError] = []
    conf = sasl_conf(proxy.bootstrap, mechanism, "alice", "not-alice-secret")
    admin = AdminClient({**conf, "error_cb": errors.append})
    with pytest.raises(KafkaException):
        admin.list_topics(timeout=2)
    admin.poll(1)  # serves error_cb
    codes = {error.code() for error in errors}
    assert KafkaError._AUTHENTICATION in codes, [str(error) for error in errors]


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_proxy_with_its_own_credentials_learns_brokers_at_start(
    secured_cluster, start_proxy, compat, mechanism
):
    """With `upstream.sasl`, the proxy's control connection authenticates, so it knows
    the brokers (and opens their listeners) before any client comes."""
    sasl = {"mechanism": mechanism, "username": "alice", "password": "alice-secret"}
    proxy = start_proxy(secured_cluster, LISTENER, upstream_sasl=sasl)
    state = proxy.thread.proxy
    assert state is not None
    [learnt] = state.brokers.brokers()
    assert (learnt.node_id, learnt.port) == (1, secured_cluster.nodes[0].extra_ports[LISTENER])
    # clients still authenticate as themselves, here as another user
    conf = sasl_conf(proxy.bootstrap, "PLAIN", "bob", "bob-secret")
    topic = compat.create_topic(conf, partitions=1, replication=1)
    records = compat.records(f"own-{mechanism}", 200)
    compat.produce(conf, topic, records)
    compat.assert_exactly_once(compat.read_all(conf, topic, len(records), partitions=1), records)


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_refused_proxy_credentials_stop_the_start_with_a_clear_error(secured_cluster, mechanism):
    from proxy.config import parse_config
    from proxy.devstack.paths import free_port, free_port_block
    from proxy.devstack.proxy_thread import ProxyThread
    from proxy.server.control import SaslFailed

    config = parse_config(
        {
            "upstream": {
                "bootstrap": secured_cluster.listener_bootstrap(LISTENER),
                "sasl": {"mechanism": mechanism, "username": "alice", "password": "wrong-pw"},
            },
            "listeners": {"bootstrap_port": free_port(), "broker_port_base": free_port_block(2)},
        }
    )
    thread = ProxyThread(config)
    with pytest.raises(SaslFailed) as refused:
        thread.start()
    thread.stop()
    message = str(refused.value)
    assert mechanism in message and "'alice'" in message
    assert "wrong-pw" not in message
