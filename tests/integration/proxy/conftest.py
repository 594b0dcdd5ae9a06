"""Fixtures of the compatibility suite: real clients, real Kafka, the proxy in between.

Every proxy started here runs with a tap recording each byte it sends to clients. When
it stops, the fixture asserts that no upstream broker address appears in those bytes
(the issue: "no upstream host:port appears in any response"), and that the proxy's own
broker addresses do, encoded the same way, so the check cannot pass by seeing nothing.

`TIERPROXY_COMPAT_TARGETS=direct,proxy` also runs the client scenarios straight against
Kafka: a baseline telling a proxy fault from a test or client fault. The default is
`proxy` alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import struct
import subprocess
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from proxy.config import parse_config
from proxy.devstack import KafkaCluster
from proxy.devstack.kafka import describe_brokers
from proxy.devstack.paths import free_port, free_port_block

if TYPE_CHECKING:
    from proxy.devstack.proxy_thread import ProxyThread

TARGETS = os.environ.get("TIERPROXY_COMPAT_TARGETS", "proxy").split(",")
LOOPBACK = "127.0.0.1"

SASL_USERS = {"alice": "alice-secret", "bob": "bob-secret"}
SCRAM_MECHANISMS = ("SCRAM-SHA-256", "SCRAM-SHA-512")


# -- the tap and the leak check ------------------------------------------------------


class ResponseTap:
    """Everything the proxy wrote to clients, one byte stream per writing task.

    The proxy calls the tap on its own thread, once per write: a whole answer, or one
    buffer of an answer it passes through as it arrives. Writes of different client
    connections interleave, so they are kept apart by the asyncio task that made them:
    each answer's bytes are then contiguous, and nothing can hide across a boundary.
    """

    def __init__(self) -> None:
        self._streams: dict[object, list[bytes]] = {}

    def __call__(self, data: bytes) -> None:
        try:
            writer = asyncio.current_task()
        except RuntimeError:  # not called from a task
            writer = None
        self._streams.setdefault(writer, []).append(bytes(data))

    def streams(self) -> list[bytes]:
        return [b"".join(chunks) for chunks in list(self._streams.values())]


def address_encodings(host: str, port: int) -> dict[bytes, str]:
    """The ways a broker address is spelt in Kafka responses and in text.

    Every response naming a broker (Metadata, FindCoordinator, DescribeCluster,
    ShareGroupHeartbeat, ...) writes the host string, compact or not, immediately
    followed by the port as int32; the length prefix comes before the host, so the
    host bytes followed by the port bytes find both encodings.
    """
    raw = host.encode()
    return {
        raw + struct.pack(">i", port): "host then int32 port",
        raw + struct.pack(">H", port): "host then uint16 port",
        f"{host}:{port}".encode(): "host:port text",
    }


def find_addresses(data: bytes, addresses: list[tuple[str, int]]) -> list[str]:
    found = []
    for host, port in addresses:
        for pattern, how in address_encodings(host, port).items():
            at = data.find(pattern)
            if at >= 0:
                context = data[max(0, at - 24) : at + len(pattern) + 8]
                found.append(f"{host}:{port} as {how} at byte {at}: ...{context!r}...")
    return found


def upstream_addresses(cluster) -> list[tuple[str, int]]:
    """Every address an upstream node listens on (any listener, controllers too)."""
    nodes = getattr(cluster, "nodes", None)
    if nodes is None:  # an external cluster: ask it
        host, _, port = cluster.bootstrap.split(",")[0].rpartition(":")
        return sorted(set(describe_brokers(host, int(port)).values()))
    return [
        (LOOPBACK, port)
        for node in nodes
        for port in (node.port, node.controller_port, *node.extra_ports.values())
    ]


# -- proxies -------------------------------------------------------------------------


@dataclass
class TappedProxy:
    thread: ProxyThread
    tap: ResponseTap
    upstream: list[tuple[str, int]]
    broker_port_base: int

    @property
    def bootstrap(self) -> str:
        return self.thread.bootstrap

    def broker_port(self, node_id: int) -> int:
        return self.broker_port_base + node_id

    def check_no_upstream_address_leaked(self) -> None:
        streams = self.tap.streams()
        leaks = [leak for data in streams for leak in find_addresses(data, self.upstream)]
        assert not leaks, "upstream addresses sent to clients:\n" + "\n".join(leaks)
        proxy = self.thread.proxy
        assert proxy is not None
        # The control: the same search finds the addresses the proxy put in their place
        # (none when no client got that far, e.g. every client failed to authenticate).
        told = [(LOOPBACK, self.broker_port(b.node_id)) for b in proxy.brokers.brokers()]
        missing = [
            address
            for address in told
            if not any(find_addresses(data, [address]) for data in streams)
        ]
        assert not missing, (
            f"the tap ({sum(map(len, streams))} bytes) never saw the proxy's own broker addresses "
            f"{missing}: the leak check above proves nothing"
        )


@contextlib.contextmanager
def tapped_proxy(
    upstream_bootstrap: str,
    upstream: list[tuple[str, int]],
    brokers: int,
    listener_tls: dict | None = None,
    upstream_tls: dict | None = None,
    upstream_sasl: dict | None = None,
) -> Iterator[TappedProxy]:
    """A proxy in front of `upstream_bootstrap`; on exit, the leak check."""
    base = free_port_block(brokers + 2)  # room for a broker learnt late
    config = parse_config(
        {
            "upstream": {
                "bootstrap": upstream_bootstrap,
                "tls": upstream_tls or {},
                "sasl": upstream_sasl or {},
            },
            "listeners": {
                "bootstrap_port": free_port(),
                "broker_port_base": base,
                "tls": listener_tls or {},
            },
        }
    )
    from proxy.devstack.proxy_thread import ProxyThread  # here: direct runs need no proxy

    tap = ResponseTap()
    thread = ProxyThread(config, tap=tap).start()
    running = TappedProxy(thread, tap, upstream, base)
    try:
        yield running
    finally:
        thread.stop(timeout=30)  # raises if the proxy did not stop
    running.check_no_upstream_address_leaked()


@pytest.fixture(scope="module")
def proxy(kafka_cluster):
    """One proxy per test module in front of the shared 3-broker cluster."""
    with tapped_proxy(kafka_cluster.bootstrap, upstream_addresses(kafka_cluster), 3) as running:
        yield running


@pytest.fixture
def start_proxy():
    """start_proxy(cluster, listener=None, listener_tls=None, upstream_tls=None,
    upstream_sasl=None): a proxy in front of the cluster's `listener` (PLAINTEXT by
    default), stopped and checked for leaks when the test ends."""
    with contextlib.ExitStack() as stack:

        def start(
            cluster, listener=None, listener_tls=None, upstream_tls=None, upstream_sasl=None
        ) -> TappedProxy:
            bootstrap = cluster.listener_bootstrap(listener) if listener else cluster.bootstrap
            addresses = upstream_addresses(cluster)
            brokers = getattr(cluster, "size", 3)
            return stack.enter_context(
                tapped_proxy(
                    bootstrap, addresses, brokers, listener_tls, upstream_tls, upstream_sasl
                )
            )

        yield start


@pytest.fixture(params=TARGETS)
def bootstrap(request, kafka_cluster) -> str:
    """Where clients connect: the proxy (or, as a baseline, Kafka itself)."""
    if request.param == "direct":
        return kafka_cluster.bootstrap
    return request.getfixturevalue("proxy").bootstrap


# -- TLS material ----------------------------------------------------------------------


@dataclass(frozen=True)
class TlsFiles:
    ca_cert: Path
    server_cert: Path
    server_key: Path  # PKCS#8, unencrypted
    server_keystore: Path  # key then certificate chain, for Kafka's PEM keystore


def _openssl(*args: str, cwd: Path) -> None:
    openssl = shutil.which("openssl")
    assert openssl, "the openssl command is needed to make the test CA"
    subprocess.run([openssl, *args], cwd=cwd, check=True, capture_output=True, timeout=60)


@pytest.fixture(scope="session")
def tls_files(tmp_path_factory) -> TlsFiles:
    """A self-signed CA and a server certificate for 127.0.0.1/localhost signed by it."""
    d = tmp_path_factory.mktemp("tls")
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
             "-subj", "/CN=tierproxy test CA", "-keyout", "ca.key", "-out", "ca.pem",
             cwd=d)  # fmt: skip
    (d / "server.ext").write_text(
        "subjectAltName=IP:127.0.0.1,DNS:localhost\n"
        "basicConstraints=CA:FALSE\n"
        "keyUsage=digitalSignature,keyEncipherment\n"
        "extendedKeyUsage=serverAuth\n"
    )
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=localhost",
             "-keyout", "server.key", "-out", "server.csr", cwd=d)  # fmt: skip
    _openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
             "-CAcreateserial", "-days", "2", "-extfile", "server.ext", "-out", "server.pem",
             cwd=d)  # fmt: skip
    _openssl("pkcs8", "-topk8", "-nocrypt", "-in", "server.key", "-out", "server-pk8.key", cwd=d)
    keystore = d / "server-keystore.pem"
    keystore.write_text((d / "server-pk8.key").read_text() + (d / "server.pem").read_text())
    return TlsFiles(d / "ca.pem", d / "server.pem", d / "server-pk8.key", keystore)


# -- a dedicated cluster with SASL and TLS listeners -----------------------------------


def _jaas(module: str, options: str = "") -> str:
    return f"org.apache.kafka.common.security.{module} required{options};"


@pytest.fixture(scope="session")
def secured_cluster(tls_files):
    """One node with a SASL_PLAINTEXT listener (PLAIN, SCRAM-SHA-256/512) and an SSL one.

    One cluster serves both the SASL and the TLS tests: a Kafka takes 5-15 s to start.
    Brokers talk to each other and to the controller on the PLAINTEXT listener.
    """
    plain_users = "".join(f' user_{name}="{secret}"' for name, secret in SASL_USERS.items())
    config = {
        "sasl.enabled.mechanisms": "PLAIN," + ",".join(SCRAM_MECHANISMS),
        "listener.name.sasl_plaintext.plain.sasl.jaas.config": _jaas(
            "plain.PlainLoginModule", plain_users
        ),
        "listener.name.ssl.ssl.keystore.type": "PEM",
        "listener.name.ssl.ssl.keystore.location": str(tls_files.server_keystore),
        "listener.name.ssl.ssl.client.auth": "none",
    }
    for mechanism in SCRAM_MECHANISMS:
        key = f"listener.name.sasl_plaintext.{mechanism.lower()}.sasl.jaas.config"
        config[key] = _jaas("scram.ScramLoginModule")
    format_args = [
        arg
        for mechanism in SCRAM_MECHANISMS
        for name, secret in SASL_USERS.items()
        for arg in ("--add-scram", f"{mechanism}=[name={name},password={secret}]")
    ]
    cluster = KafkaCluster(
        size=1,
        name="kafka-secured",
        extra_listeners={"SASL_PLAINTEXT": "SASL_PLAINTEXT", "SSL": "SSL"},
        extra_config=config,
        format_args=format_args,
        heap="-Xms128m -Xmx512m",
    )
    with cluster:
        yield cluster


# -- helpers the scenario files share (as a fixture: test files do not import each other)


class Compat:
    """Records, the exactly-once check, the address search, and confluent-kafka calls."""

    find_addresses = staticmethod(find_addresses)
    upstream_addresses = staticmethod(upstream_addresses)

    @staticmethod
    def records(prefix: str, count: int) -> list[tuple[bytes, bytes]]:
        """Distinct (key, value) pairs."""
        return [
            (f"{prefix}-key-{i}".encode(), f"{prefix}-value-{i}".encode()) for i in range(count)
        ]

    @staticmethod
    def assert_exactly_once(
        got: list[tuple[bytes, bytes]], expected: list[tuple[bytes, bytes]]
    ) -> None:
        counts = Counter(got)
        duplicated = sorted(record for record, n in counts.items() if n > 1)
        missing = sorted(set(expected) - counts.keys())
        unexpected = sorted(counts.keys() - set(expected))
        assert not (duplicated or missing or unexpected), (
            f"{len(got)} records read for {len(expected)} expected: {len(duplicated)} duplicated "
            f"{duplicated[:3]}, {len(missing)} missing {missing[:3]}, "
            f"{len(unexpected)} unexpected {unexpected[:3]}"
        )

    @staticmethod
    def create_topic(conf: dict, partitions: int = 6, replication: int = 3) -> str:
        name = f"compat-{uuid.uuid4().hex[:10]}"
        admin = AdminClient(conf)
        for future in admin.create_topics([NewTopic(name, partitions, replication)]).values():
            try:
                future.result(30)
            except KafkaException as exc:
                # The name is new: "already exists" is this request itself, retried by
                # the broker that forwarded it when the KRaft controller moved meanwhile.
                if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                    raise
        deadline = time.monotonic() + 30
        while True:  # until the broker answering metadata knows every partition's leader
            topic = admin.list_topics(name, timeout=10).topics[name]
            if topic.error is None and sorted(
                p.id for p in topic.partitions.values() if p.leader >= 0
            ) == list(range(partitions)):
                return name
            assert time.monotonic() < deadline, f"{name} has no leaders in metadata: {topic}"
            time.sleep(0.2)

    @staticmethod
    def produce(
        conf: dict, topic: str, records: list[tuple[bytes, bytes]]
    ) -> list[tuple[int, int]]:
        """Idempotent, acks=all; returns each acknowledged record's (partition, offset)."""
        producer = Producer({"enable.idempotence": True, "acks": "all", "linger.ms": 5, **conf})
        acked: list[tuple[int, int]] = []
        failed: list[str] = []

        def delivered(err, msg) -> None:
            if err is None:
                acked.append((msg.partition(), msg.offset()))
            else:
                failed.append(str(err))

        for key, value in records:
            while True:
                try:
                    producer.produce(topic, key=key, value=value, on_delivery=delivered)
                    break
                except BufferError:  # the local queue is full: let deliveries drain it
                    producer.poll(0.1)
            producer.poll(0)
        assert producer.flush(60) == 0, "records still unacknowledged after 60 s"
        assert failed == [], failed[:5]
        assert len(set(acked)) == len(records)
        return acked

    @staticmethod
    def read_all(
        conf: dict, topic: str, count: int, partitions: int = 6, timeout: float = 60.0
    ) -> list[tuple[bytes, bytes]]:
        """Every record of every partition from offset 0 (no group), until `count`
        records came and a second passed with nothing more."""
        consumer = Consumer(
            {"group.id": "unused", "enable.auto.commit": False, "auto.offset.reset": "earliest"}
            | conf
        )
        consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        got: list[tuple[bytes, bytes]] = []
        deadline = time.monotonic() + timeout
        quiet_since = time.monotonic()
        try:
            while time.monotonic() < deadline:
                batch = consumer.consume(1000, timeout=0.2)
                for msg in batch:
                    if msg.error() is not None:
                        raise KafkaException(msg.error())
                    got.append((msg.key(), msg.value()))
                if batch:
                    quiet_since = time.monotonic()
                elif len(got) >= count and time.monotonic() - quiet_since > 1.0:
                    return got
        finally:
            consumer.close()
        raise AssertionError(f"read {len(got)} of {count} records in {timeout} s")


@pytest.fixture(scope="session")
def compat() -> Compat:
    return Compat()
