"""Apache Kafka in KRaft mode, from the released jars in the cache.

Every node runs as broker and controller in one JVM (`process.roles=broker,controller`),
so a three-node cluster is three processes and survives the loss of any one of them.
Nodes carry `broker.rack` when racks are given: the zone tests use zone-a/b/c.
"""

from __future__ import annotations

import base64
import os
import shutil
import socket
import struct
import subprocess
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from kio.schema.metadata.v12.request import MetadataRequest
from kio.schema.metadata.v12.response import MetadataResponse

from proxy.devstack.paths import DevstackError, free_port, kafka_libs
from proxy.devstack.process import ManagedProcess
from proxy.kafka.messages import decode_response, encode_request

_LOG4J2 = """\
status = error
appender.out.type = Console
appender.out.name = OUT
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.out.ref = OUT
logger.state.name = state.change.logger
logger.state.level = WARN
logger.request.name = kafka.request.logger
logger.request.level = WARN
"""

DEFAULT_HEAP = "-Xms256m -Xmx1g"


@dataclass
class KafkaNode:
    node_id: int
    port: int
    controller_port: int
    rack: str | None
    data_dir: Path
    process: ManagedProcess
    extra_ports: dict[str, int] = field(default_factory=dict)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"


class KafkaCluster:
    """A KRaft cluster of `size` combined nodes on free loopback ports.

    `extra_listeners` maps a listener name to its security protocol (e.g.
    {"SASL_PLAINTEXT": "SASL_PLAINTEXT"}); each gets its own port per node, exposed as
    `listener_bootstrap(name)`. `extra_config` is added to every node's properties and
    `format_args` to the storage format command (e.g. `--add-scram ...`).
    """

    def __init__(
        self,
        size: int = 1,
        racks: list[str] | None = None,
        base_dir: Path | None = None,
        extra_config: dict[str, str] | None = None,
        extra_listeners: dict[str, str] | None = None,
        format_args: list[str] | None = None,
        heap: str | None = None,
        name: str = "kafka",
    ) -> None:
        if racks is not None and len(racks) != size:
            raise ValueError(f"racks: {len(racks)} names given for {size} nodes")
        self.size = size
        self.name = name
        self.extra_config = dict(extra_config or {})
        self.extra_listeners = dict(extra_listeners or {})
        self.format_args = list(format_args or [])
        self.heap = heap or os.environ.get("TIERPROXY_KAFKA_HEAP", DEFAULT_HEAP)
        self._owns_dir = base_dir is None
        self.base_dir = Path(base_dir or tempfile.mkdtemp(prefix=f"tierproxy-{name}-"))
        # a data folder formatted before keeps its id: Kafka refuses to start on the
        # meta.properties of another cluster (`tierproxy dev --data-dir` started twice)
        self.cluster_id = formatted_cluster_id(self.base_dir, size) or _kafka_uuid()
        self.nodes = [
            KafkaNode(
                node_id=i + 1,
                port=free_port(),
                controller_port=free_port(),
                rack=racks[i] if racks else None,
                data_dir=self.base_dir / f"node-{i + 1}",
                process=None,  # type: ignore[arg-type]  # set just below
                extra_ports={listener: free_port() for listener in self.extra_listeners},
            )
            for i in range(size)
        ]
        for node in self.nodes:
            node.process = ManagedProcess(
                f"{name}-{node.node_id}",
                self._java_argv("kafka.Kafka", str(node.data_dir / "server.properties")),
                log_path=self.base_dir / f"node-{node.node_id}.log",
            )

    # -- addresses -------------------------------------------------------------------

    @property
    def bootstrap(self) -> str:
        return ",".join(node.address for node in self.nodes)

    def listener_bootstrap(self, listener: str) -> str:
        return ",".join(f"127.0.0.1:{node.extra_ports[listener]}" for node in self.nodes)

    def node(self, node_id: int) -> KafkaNode:
        return self.nodes[node_id - 1]

    # -- lifecycle -------------------------------------------------------------------

    def start(self, timeout: float = 120.0) -> KafkaCluster:
        try:
            for node in self.nodes:
                self._write_config(node)
            self._format_storage()
            for node in self.nodes:
                node.process.start()
            self.wait_ready(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        for node in self.nodes:  # all at once: one by one, the last waits for a lost quorum
            node.process.terminate()
        for node in self.nodes:
            node.process.stop(timeout=10)
        if self._owns_dir:
            shutil.rmtree(self.base_dir, ignore_errors=True)

    def stop_node(self, node_id: int) -> None:
        self.node(node_id).process.stop()

    def kill_node(self, node_id: int) -> None:
        self.node(node_id).process.kill()

    def start_node(self, node_id: int, timeout: float = 90.0) -> None:
        self.node(node_id).process.start()
        self.wait_ready(timeout)

    def __enter__(self) -> KafkaCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def wait_ready(self, timeout: float = 120.0) -> None:
        """Until every running node answers Metadata listing every running node."""
        deadline = time.monotonic() + timeout
        expected = {node.node_id for node in self.nodes if node.process.running()}
        last_error = "no answer yet"
        while time.monotonic() < deadline:
            for node in self.nodes:
                if node.process.returncode() is not None and node.node_id in expected:
                    raise DevstackError(
                        f"{node.process.name} exited with {node.process.returncode()}:\n"
                        + node.process.tail()
                    )
            try:
                seen = {
                    frozenset(describe_brokers("127.0.0.1", node.port))
                    for node in self.nodes
                    if node.node_id in expected
                }
                if all(ids >= expected for ids in seen):
                    return
                last_error = f"brokers seen {sorted(map(sorted, seen))}, want {sorted(expected)}"
            except OSError as exc:
                last_error = str(exc)
            time.sleep(0.3)
        raise DevstackError(f"Kafka not ready after {timeout}s ({last_error}):\n" + self.tails())

    def tails(self, lines: int = 30) -> str:
        return "\n".join(
            f"--- {node.process.name} ({node.process.log_path}) ---\n{node.process.tail(lines)}"
            for node in self.nodes
        )

    def log_files(self) -> list[Path]:
        return [node.process.log_path for node in self.nodes]

    # -- internals -------------------------------------------------------------------

    def _java_argv(self, main_class: str, *args: str) -> list[str]:
        libs = kafka_libs()
        return [
            shutil.which("java") or "java",
            *self.heap.split(),
            "-XX:+UseG1GC",
            "-XX:MaxGCPauseMillis=20",
            "-Djava.awt.headless=true",
            "-Djava.net.preferIPv4Stack=true",
            f"-Dlog4j2.configurationFile={self.base_dir / 'log4j2.properties'}",
            "-cp",
            f"{libs}/*",
            main_class,
            *args,
        ]

    def _write_config(self, node: KafkaNode) -> None:
        node.data_dir.mkdir(parents=True, exist_ok=True)
        (self.base_dir / "log4j2.properties").write_text(_LOG4J2)
        voters = ",".join(f"{n.node_id}@127.0.0.1:{n.controller_port}" for n in self.nodes)
        replicas = min(3, self.size)
        listeners = [f"PLAINTEXT://127.0.0.1:{node.port}"]
        listeners += [f"{name}://127.0.0.1:{port}" for name, port in node.extra_ports.items()]
        protocols = ["PLAINTEXT:PLAINTEXT", "CONTROLLER:PLAINTEXT"]
        protocols += [f"{name}:{proto}" for name, proto in self.extra_listeners.items()]
        props = {
            "process.roles": "broker,controller",
            "node.id": str(node.node_id),
            "controller.quorum.voters": voters,
            "listeners": ",".join([*listeners, f"CONTROLLER://127.0.0.1:{node.controller_port}"]),
            "advertised.listeners": ",".join(listeners),
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": ",".join(protocols),
            "log.dirs": str(node.data_dir / "logs"),
            "metadata.log.dir": str(node.data_dir / "meta"),
            "num.partitions": "1",
            "default.replication.factor": str(replicas),
            "min.insync.replicas": str(min(2, self.size)),
            "offsets.topic.replication.factor": str(replicas),
            "offsets.topic.num.partitions": "10",
            "transaction.state.log.replication.factor": str(replicas),
            "transaction.state.log.min.isr": str(min(2, self.size)),
            "transaction.state.log.num.partitions": "5",
            "share.coordinator.state.topic.replication.factor": str(replicas),
            "share.coordinator.state.topic.min.isr": str(min(2, self.size)),
            "group.initial.rebalance.delay.ms": "0",
            "auto.create.topics.enable": "true",
            "delete.topic.enable": "true",
            "log.flush.interval.messages": "9223372036854775807",
            "num.network.threads": "2",
            "num.io.threads": "4",
        }
        if node.rack:
            props["broker.rack"] = node.rack
        props.update(self.extra_config)
        text = "".join(f"{key}={value}\n" for key, value in props.items())
        (node.data_dir / "server.properties").write_text(text)

    def _format_storage(self) -> None:
        formats = [
            subprocess.Popen(
                self._java_argv(
                    "kafka.tools.StorageTool",
                    "format",
                    "--cluster-id",
                    self.cluster_id,
                    "--config",
                    str(node.data_dir / "server.properties"),
                    "--ignore-formatted",
                    *self.format_args,
                ),
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
            for node in self.nodes
        ]
        for node, proc in zip(self.nodes, formats, strict=True):
            out, _ = proc.communicate(timeout=120)
            if proc.returncode != 0:
                raise DevstackError(
                    f"formatting storage of node {node.node_id} failed:\n{out.decode()}"
                )


def formatted_cluster_id(base_dir: Path, size: int) -> str | None:
    """The cluster id the storage tool wrote under `base_dir` before, if it did."""
    for node_id in range(1, size + 1):
        meta = base_dir / f"node-{node_id}" / "meta" / "meta.properties"
        try:
            lines = meta.read_text().splitlines()
        except FileNotFoundError:
            continue
        for line in lines:
            key, _, value = line.partition("=")
            if key.strip() == "cluster.id" and value.strip():
                return value.strip()
    return None


def _kafka_uuid() -> str:
    """A cluster id the way Kafka prints them: url-safe base64 of 16 random bytes, drawn
    again when it starts with "-" (the storage tool would read it as an option)."""
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not text.startswith("-"):
            return text


def describe_brokers(host: str, port: int, timeout: float = 3.0) -> dict[int, tuple[str, int]]:
    """Ask one broker for Metadata v12 (no topics): {node_id: (host, port)} of live brokers."""
    request = MetadataRequest(
        topics=(), allow_auto_topic_creation=False, include_topic_authorized_operations=False
    )
    with socket.create_connection((host, port), timeout=timeout) as sock:
        sock.sendall(encode_request(request, correlation_id=1, client_id="tierproxy-devstack"))
        size = struct.unpack(">i", _recv_exactly(sock, 4))[0]
        _, response = decode_response(_recv_exactly(sock, size), MetadataResponse)
    return {int(b.node_id): (b.host, int(b.port)) for b in response.brokers}


def _recv_exactly(sock: socket.socket, size: int) -> bytes:
    chunks = bytearray()
    while len(chunks) < size:
        chunk = sock.recv(size - len(chunks))
        if not chunk:
            raise ConnectionError("broker closed the connection")
        chunks += chunk
    return bytes(chunks)
