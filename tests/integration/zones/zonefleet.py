"""A three-zone deployment: the shared 3-broker Kafka (racks zone-a/b/c) and two proxies
per zone, each a `tierproxy run` process of its own on a loopback address of its zone
(127.0.1.x for zone-a, 127.0.2.x for zone-b, 127.0.3.x for zone-c), all on the same
ports, so an address says which zone a proxy is in.

Every client connection a proxy accepts is written to its access log with the proxy's
zone, the client.id and the zone resolved for the client (`tierproxy.access`); the tests
read those logs to check where each client went.
"""

from __future__ import annotations

import re
import socket
import struct
import sys
import time
import urllib.request
import uuid
from dataclasses import dataclass
from pathlib import Path

import yaml
from kio.schema.metadata.v12.request import MetadataRequest
from kio.schema.metadata.v12.response import MetadataResponse

from proxy.devstack.paths import free_port_block
from proxy.devstack.process import ManagedProcess
from proxy.kafka.messages import decode_response, encode_request

ZONES = ("zone-a", "zone-b", "zone-c")
CIDR_ZONES = {"10.1.0.0/16": "zone-a", "10.2.0.0/16": "zone-b", "10.3.0.0/16": "zone-c"}
HEARTBEAT_S = 0.5
MEMBER_TIMEOUT_S = 3.0
_ACCESS = re.compile(
    r"tierproxy\.access: client (?P<peer>.+?) on (?P<proxy>[^/]+)/(?P<listener>\S+) "
    r"(?P<proxy_zone>\S+): client\.id=(?P<client_id>.*) zone=(?P<zone>\S+) \(from (?P<source>\w+)\)"
)


def zone_host(zone: str, index: int) -> str:
    return f"127.0.{ZONES.index(zone) + 1}.{index}"


@dataclass(frozen=True)
class Access:
    proxy: str
    proxy_zone: str
    listener: str
    client_id: str | None
    zone: str
    source: str


@dataclass
class FleetProxy:
    name: str
    zone: str
    host: str
    port: int
    metrics_port: int
    process: ManagedProcess

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    def metric(self, name: str, **labels: str) -> float:
        """The sum of a metric's samples matching these labels (0 if none)."""
        url = f"http://{self.host}:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as answer:
            text = answer.read().decode()
        total = 0.0
        for line in text.splitlines():
            sample, _, value = line.rpartition(" ")
            if sample.split("{")[0] != name:
                continue
            if all(f'{key}="{wanted}"' in sample for key, wanted in labels.items()):
                total += float(value)
        return total

    def access(self) -> list[Access]:
        records = []
        for match in _ACCESS.finditer(self.process.log_path.read_text(errors="replace")):
            client_id = match["client_id"]
            records.append(
                Access(
                    match["proxy"],
                    match["proxy_zone"],
                    match["listener"],
                    None if client_id == "None" else client_id.strip("'\""),
                    match["zone"],
                    match["source"],
                )
            )
        return records


class ZoneFleet:
    def __init__(self, kafka_bootstrap: str, base_dir: Path) -> None:
        self.kafka_bootstrap = kafka_bootstrap
        self.topic = f"__tierproxy_fleet_{uuid.uuid4().hex[:8]}"
        self.heartbeat_s = HEARTBEAT_S
        base = free_port_block(8)
        self.broker_port_base, self.port, self.metrics_port = base, base + 5, base + 6
        self.proxies: dict[str, FleetProxy] = {}
        for zone in ZONES:
            for index in (1, 2):
                name = f"{zone[-1]}{index}"  # a1, a2, b1, ...
                host = zone_host(zone, index)
                config = base_dir / f"{name}.yaml"
                config.write_text(yaml.safe_dump(self._config(name, zone, host)))
                process = ManagedProcess(
                    f"proxy-{name}",
                    [sys.executable, "-m", "proxy.cli", "run", "--config", str(config)],
                    log_path=base_dir / f"{name}.log",
                )
                self.proxies[name] = FleetProxy(
                    name, zone, host, self.port, self.metrics_port, process
                )

    def _config(self, name: str, zone: str, host: str) -> dict:
        return {
            "upstream": {"bootstrap": self.kafka_bootstrap, "metadata_refresh_s": 5},
            "listeners": {
                "bind_host": host,
                "bootstrap_port": self.port,
                "broker_port_base": self.broker_port_base,
                "proxy_protocol": "optional",
            },
            "fleet": {
                "name": name,
                "zone": zone,
                "topic": self.topic,
                "heartbeat_interval_s": HEARTBEAT_S,
                "member_timeout_s": MEMBER_TIMEOUT_S,
            },
            "routing": {"cidr_zones": CIDR_ZONES},
            "metrics": {"bind_host": host, "port": self.metrics_port},
            "logging": {"format": "text", "access": True},  # the access lines read here
        }

    def start(self, *names: str) -> None:
        chosen = [self.proxies[name] for name in names or self.proxies]
        logged = {}
        for proxy in chosen:
            path = proxy.process.log_path
            logged[proxy.name] = path.stat().st_size if path.exists() else 0
            proxy.process.start()
        for proxy in chosen:
            wait_for_log(proxy.process, "proxy ready at", 60, after=logged[proxy.name])

    def stop(self) -> None:
        for proxy in self.proxies.values():
            proxy.process.stop()

    def kill(self, name: str) -> None:
        self.proxies[name].process.kill()

    def in_zone(self, zone: str) -> list[FleetProxy]:
        return [proxy for proxy in self.proxies.values() if proxy.zone == zone]

    def bootstrap(self, zone: str) -> str:
        return ",".join(proxy.bootstrap for proxy in self.in_zone(zone))

    def running(self) -> list[FleetProxy]:
        return [proxy for proxy in self.proxies.values() if proxy.process.running()]

    def wait_until_members(self, count: int, timeout: float = 30.0) -> None:
        """Until every running proxy sees `count` live members."""
        deadline = time.monotonic() + timeout
        while True:
            seen = {p.name: p.metric("tierproxy_fleet_live_members") for p in self.running()}
            if all(value == count for value in seen.values()):
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"live members seen by each proxy: {seen}, want {count}")
            time.sleep(0.2)

    def access(self) -> list[Access]:
        return [record for proxy in self.proxies.values() for record in proxy.access()]


def wait_for_log(process: ManagedProcess, text: str, timeout: float, after: int = 0) -> None:
    """Until `text` is in the process's log past byte `after` (a restart appends)."""
    deadline = time.monotonic() + timeout
    while text.encode() not in process.log_path.read_bytes()[after:]:
        if not process.running():
            raise AssertionError(f"{process.name} exited:\n{process.tail(30)}")
        if time.monotonic() > deadline:
            raise AssertionError(f"{process.name}: no {text!r} in {timeout} s:\n{process.tail(30)}")
        time.sleep(0.1)


def metadata_brokers(
    address: str, client_id: str, preamble: bytes = b"", fetch_first: bytes = b""
) -> dict[int, tuple[str, int]]:
    """Ask one proxy for Metadata on a connection that may first send a PROXY header
    (`preamble`) and other framed requests (`fetch_first`, their answers read and
    dropped): {node id: (host, port)} as that proxy shows the brokers to this client."""
    host, port = address.rsplit(":", 1)
    request = MetadataRequest(
        topics=(), allow_auto_topic_creation=False, include_topic_authorized_operations=False
    )
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(preamble + fetch_first)
        if fetch_first:
            _read_frame(sock)
        sock.sendall(encode_request(request, correlation_id=7, client_id=client_id))
        _, response = decode_response(_read_frame(sock), MetadataResponse)
    return {int(b.node_id): (b.host, int(b.port)) for b in response.brokers}


def _read_frame(sock: socket.socket) -> bytes:
    (size,) = struct.unpack(">i", _recv(sock, 4))
    return _recv(sock, size)


def _recv(sock: socket.socket, n: int) -> bytes:
    data = bytearray()
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError(f"closed after {len(data)} of {n} bytes")
        data += chunk
    return bytes(data)
