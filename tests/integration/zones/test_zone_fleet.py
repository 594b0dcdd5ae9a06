"""A three-zone fleet in front of the 3-broker Kafka: clients stay in their zone.

Two `tierproxy run` processes per zone, membership through a Kafka topic. Real clients
(librdkafka, kafka-python) declare their zone by a client.id key, by the Fetch rack id
(`client.rack`), or not at all (the zone of the proxy they reach); raw requests check the
source-CIDR map behind PROXY protocol v1/v2 headers and the fallback for a zone with no
proxy. The test that kills a proxy runs last and brings it back.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import uuid
from datetime import timedelta

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic
from kio.schema.fetch.v12.request import FetchRequest
from kio.static.primitive import i8, i32, i32Timedelta
from zonefleet import ZONES, metadata_brokers, zone_host

from proxy.kafka.messages import encode_request
from proxy.kafka.proxy_header import encode_v1, encode_v2
from tests.support.kafka_python import KafkaConsumer, KafkaProducer

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(600)]
BROKERS = {1, 2, 3}


def zone_of_host(host: str) -> str:
    return ZONES[int(host.split(".")[2]) - 1]


def hosts_for(brokers: dict[int, tuple[str, int]]) -> set[str]:
    return {host for host, _ in brokers.values()}


def create_topic(kafka_bootstrap: str, partitions: int = 6) -> str:
    topic = f"zones-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 3)])[topic].result(30)
    return topic


def fleet_status(fleet) -> dict:
    out = subprocess.run(
        [sys.executable, "-m", "proxy.cli", "fleet", "status", "--json"]
        + ["--bootstrap", fleet.kafka_bootstrap, "--topic", fleet.topic],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return json.loads(out.stdout)


# -- what each proxy tells each zone ---------------------------------------------------


def test_each_zone_is_shown_its_own_proxies_the_same_by_every_member(zone_fleet):
    for zone in ZONES:
        answers = [
            metadata_brokers(proxy.bootstrap, f"probe,tierproxy_az={zone}")
            for proxy in zone_fleet.proxies.values()
        ]
        assert set(answers[0]) == BROKERS
        # every member of the fleet, in any zone, gives a client of `zone` the same map
        assert all(answer == answers[0] for answer in answers), answers
        assert {zone_of_host(host) for host in hosts_for(answers[0])} == {zone}
        # spread over both proxies of the zone, each broker at its own port
        assert hosts_for(answers[0]) == {zone_host(zone, 1), zone_host(zone, 2)}
        assert all(port == zone_fleet.broker_port_base + b for b, (_, port) in answers[0].items())


@pytest.mark.parametrize(
    "client_id",
    ["tierproxy_az=zone-c", "app,automq_az=zone-c", "ws_az=zone-c;app", "x|warpstream_az=zone-c"]
    + ["zone=zone-c"],
)
def test_client_id_keys_of_other_systems_are_understood(zone_fleet, client_id):
    brokers = metadata_brokers(zone_fleet.proxies["a1"].bootstrap, client_id)
    assert {zone_of_host(host) for host in hosts_for(brokers)} == {"zone-c"}


def test_zone_from_source_address_behind_a_proxy_protocol_header(zone_fleet):
    a1 = zone_fleet.proxies["a1"]
    destination = (a1.host, a1.port)
    v1 = encode_v1(("10.2.0.9", 40000), destination)
    v2 = encode_v2(("10.3.7.1", 40001), destination, tlvs=[(0x04, b"noop")])
    assert {zone_of_host(h) for h in hosts_for(metadata_brokers(a1.bootstrap, "app", v1))} == {
        "zone-b"
    }
    assert {zone_of_host(h) for h in hosts_for(metadata_brokers(a1.bootstrap, "app", v2))} == {
        "zone-c"
    }
    # a client.id key is stronger than the source network
    brokers = metadata_brokers(a1.bootstrap, "app,tierproxy_az=zone-a", v2)
    assert {zone_of_host(host) for host in hosts_for(brokers)} == {"zone-a"}
    sources = {(r.client_id, r.zone, r.source) for r in a1.access()}
    assert ("app", "zone-c", "cidr") in sources
    assert ("app", "zone-b", "cidr") in sources


def test_zone_from_the_fetch_rack_id(zone_fleet):
    fetch = FetchRequest(
        replica_id=i32(-1),
        max_wait=i32Timedelta.parse(timedelta(milliseconds=0)),
        min_bytes=i32(0),
        max_bytes=i32(1 << 20),
        isolation_level=i8(0),
        session_id=i32(0),
        session_epoch=i32(-1),
        topics=(),
        forgotten_topics_data=(),
        rack_id="zone-b",
    )
    b2 = zone_fleet.proxies["a2"]
    frame = encode_request(fetch, correlation_id=3, client_id="rack-consumer")
    before = metadata_brokers(b2.bootstrap, "rack-consumer")
    after = metadata_brokers(b2.bootstrap, "rack-consumer", fetch_first=frame)
    assert {zone_of_host(host) for host in hosts_for(before)} == {"zone-a"}  # proxy's zone
    assert {zone_of_host(host) for host in hosts_for(after)} == {"zone-b"}


def test_a_zone_without_proxies_falls_back_and_says_so(zone_fleet, kafka_cluster):
    b1 = zone_fleet.proxies["b1"]
    before = b1.metric("tierproxy_zone_fallbacks_total", client_zone="zone-d")
    topic = create_topic(kafka_cluster.bootstrap, partitions=2)
    producer = KafkaProducer(
        bootstrap_servers=b1.bootstrap, client_id="tierproxy_az=zone-d", acks="all"
    )
    for i in range(50):
        producer.send(topic, key=str(i).encode(), value=b"v")
    producer.flush(30)
    producer.close()
    consumer = KafkaConsumer(
        topic,
        bootstrap_servers=b1.bootstrap,
        client_id="tierproxy_az=zone-d",
        group_id=f"g-{topic}",
        auto_offset_reset="earliest",
        consumer_timeout_ms=10000,
    )
    keys = {message.key for message in consumer}
    consumer.close()
    assert keys == {str(i).encode() for i in range(50)}
    assert b1.metric("tierproxy_zone_fallbacks_total", client_zone="zone-d") > before
    # served by the zone of the proxy it reached, and only there
    d_access = [r for r in zone_fleet.access() if r.client_id == "tierproxy_az=zone-d"]
    assert d_access and {r.proxy_zone for r in d_access} == {"zone-b"}


# -- real clients in every zone ------------------------------------------------------------

CLIENTS = {
    # client.id: (zone, how it says so)
    "orders-a,tierproxy_az=zone-a": ("zone-a", "client_id"),
    "reader-a": ("zone-a", "fetch_rack"),
    "automq_az=zone-b,orders-b": ("zone-b", "client_id"),
    "reader-b": ("zone-b", "proxy"),
    "orders-c;ws_az=zone-c": ("zone-c", "client_id"),
    "reader-c": ("zone-c", "fetch_rack"),
}
PER_PRODUCER = 2000


def _produce_librdkafka(bootstrap: str, client_id: str, topic: str, prefix: str) -> int:
    producer = Producer(
        {"bootstrap.servers": bootstrap, "client.id": client_id, "enable.idempotence": True}
    )
    acked = []
    for i in range(PER_PRODUCER):
        producer.produce(
            topic, key=f"{prefix}-{i}", value=b"x" * 100, on_delivery=lambda e, m: acked.append(e)
        )
        producer.poll(0)
    assert producer.flush(60) == 0
    assert all(error is None for error in acked)
    return len(acked)


def _produce_kafka_python(bootstrap: str, client_id: str, topic: str, prefix: str) -> int:
    producer = KafkaProducer(bootstrap_servers=bootstrap, client_id=client_id, acks="all")
    futures = [
        producer.send(topic, key=f"{prefix}-{i}".encode(), value=b"x" * 100)
        for i in range(PER_PRODUCER)
    ]
    producer.flush(60)
    producer.close()
    return sum(1 for future in futures if future.succeeded())


def _consume_librdkafka(bootstrap: str, client_id: str, topic: str, rack: str, want: int) -> int:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "client.id": client_id,
            "client.rack": rack,
            "group.id": f"g-{client_id}-{topic}",
            "auto.offset.reset": "earliest",
        }
    )
    consumer.subscribe([topic])
    seen = set()
    deadline = time.monotonic() + 90
    while len(seen) < want and time.monotonic() < deadline:
        message = consumer.poll(0.5)
        if message is not None and message.error() is None:
            seen.add(message.key())
    consumer.close()
    return len(seen)


def _consume_kafka_python(bootstrap: str, client_id: str, topic: str, want: int) -> int:
    consumer = KafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        client_id=client_id,
        group_id=f"g-{client_id}-{topic}",
        auto_offset_reset="earliest",
        consumer_timeout_ms=15000,
    )
    seen = set()
    for message in consumer:
        seen.add(message.key)
        if len(seen) >= want:
            break
    consumer.close()
    return len(seen)


def test_clients_in_every_zone_never_leave_it(zone_fleet, kafka_cluster):
    topic = create_topic(kafka_cluster.bootstrap)
    time.sleep(2 * zone_fleet.heartbeat_s)  # earlier tests' counts reach the heartbeats
    crossing_before = fleet_status(zone_fleet)["client_proxy_cross_zone_bytes"]
    bootstrap = {zone: zone_fleet.bootstrap(zone) for zone in ZONES}
    acked = [
        _produce_librdkafka(bootstrap["zone-a"], "orders-a,tierproxy_az=zone-a", topic, "a"),
        _produce_kafka_python(bootstrap["zone-b"], "automq_az=zone-b,orders-b", topic, "b"),
        _produce_librdkafka(bootstrap["zone-c"], "orders-c;ws_az=zone-c", topic, "c"),
    ]
    assert acked == [PER_PRODUCER] * 3
    total = 3 * PER_PRODUCER
    results = {}
    readers = [
        threading.Thread(
            target=lambda: results.__setitem__(
                "a", _consume_librdkafka(bootstrap["zone-a"], "reader-a", topic, "zone-a", total)
            )
        ),
        threading.Thread(
            target=lambda: results.__setitem__(
                "b", _consume_kafka_python(bootstrap["zone-b"], "reader-b", topic, total)
            )
        ),
        threading.Thread(
            target=lambda: results.__setitem__(
                "c", _consume_librdkafka(bootstrap["zone-c"], "reader-c", topic, "zone-c", total)
            )
        ),
    ]
    for reader in readers:
        reader.start()
    for reader in readers:
        reader.join(180)
    assert results == {"a": total, "b": total, "c": total}

    # every connection of every client was accepted by a proxy of its own zone
    records = [r for r in zone_fleet.access() if r.client_id in CLIENTS]
    seen_clients = {r.client_id for r in records}
    assert seen_clients == set(CLIENTS), f"no connections logged for {set(CLIENTS) - seen_clients}"
    strays = [r for r in records if r.proxy_zone != CLIENTS[r.client_id][0]]
    assert not strays, strays
    for client_id, (zone, source) in CLIENTS.items():
        mine = [r for r in records if r.client_id == client_id]
        assert {r.zone for r in mine} == {zone}, mine
        assert source in {r.source for r in mine}, mine
    # both proxies of each zone took connections (brokers are spread over them)
    assert {r.proxy for r in records} == set(zone_fleet.proxies)

    # the fleet's own accounting agrees: no client byte crossed a zone to reach a proxy
    time.sleep(2 * zone_fleet.heartbeat_s)  # the counters travel with the heartbeats
    status = fleet_status(zone_fleet)
    assert status["client_proxy_cross_zone_bytes"] == crossing_before
    produced = 3 * PER_PRODUCER * 100
    assert status["total_bytes"] > 2 * produced  # produced once, consumed three times
    assert {m["name"] for m in status["members"] if m["live"]} == set(zone_fleet.proxies)


# -- a proxy dies, then comes back ------------------------------------------------------------


def test_killing_a_proxy_moves_its_clients_to_the_other_proxy_of_the_zone(
    zone_fleet, kafka_cluster
):
    topic = create_topic(kafka_cluster.bootstrap)
    client_id = "steady,tierproxy_az=zone-a"
    producer = Producer(
        {
            "bootstrap.servers": zone_fleet.bootstrap("zone-a"),
            "client.id": client_id,
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 5,
        }
    )
    acked: list[bytes] = []
    failed: list[str] = []

    def delivered(error, message) -> None:
        if error is None:
            acked.append(message.key())
        else:
            failed.append(str(error))

    killed_at = None
    sent = 0
    start = time.monotonic()
    while time.monotonic() - start < 14:
        producer.produce(topic, key=f"k{sent}".encode(), value=b"v" * 200, on_delivery=delivered)
        sent += 1
        producer.poll(0.002)
        if killed_at is None and time.monotonic() - start > 3:
            zone_fleet.kill("a1")
            killed_at = time.monotonic()
    assert producer.flush(120) == 0
    assert not failed, failed[:5]
    assert len(acked) == sent

    # the survivor stopped showing a1 once its heartbeats stopped
    zone_fleet.wait_until_members(5)
    brokers = metadata_brokers(zone_fleet.proxies["a2"].bootstrap, client_id)
    assert hosts_for(brokers) == {zone_host("zone-a", 2)}
    # the producer's connections all stayed in zone-a, and went on through a2
    records = [r for r in zone_fleet.access() if r.client_id == client_id]
    assert {r.proxy_zone for r in records} == {"zone-a"}
    assert "a2" in {r.proxy for r in records}

    # every acknowledged record is there, once
    consumer = Consumer(
        {
            "bootstrap.servers": zone_fleet.bootstrap("zone-a"),
            "client.id": "verify,tierproxy_az=zone-a",
            "group.id": f"verify-{topic}",
            "auto.offset.reset": "earliest",
        }
    )
    consumer.subscribe([topic])
    keys: list[bytes] = []
    deadline = time.monotonic() + 90
    while len(keys) < len(acked) and time.monotonic() < deadline:
        message = consumer.poll(0.5)
        if message is not None and message.error() is None:
            keys.append(message.key())
    consumer.close()
    assert sorted(keys) == sorted(acked)

    # a1 comes back and is used again
    zone_fleet.start("a1")
    zone_fleet.wait_until_members(6)
    brokers = metadata_brokers(zone_fleet.proxies["a2"].bootstrap, client_id)
    assert hosts_for(brokers) == {zone_host("zone-a", 1), zone_host("zone-a", 2)}
