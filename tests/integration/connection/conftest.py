"""Connection semantics against the real Kafka through a real proxy: the fixtures.

- `proxy` / `small_frames_proxy`: a proxy on a background thread of this process (so a
  test can read its metrics) in front of the shared 3-broker cluster;
- `raw`: a blocking socket client that writes frames as given and reads answers one by
  one, so a test can pipeline, stall, and send what no real client would;
- `proxy_process`: `tierproxy run --config` as a process of its own, whose memory
  (/proc/<pid>/status) and reads (/proc/<pid>/io) a test can measure;
- `kafka`: small helpers that talk to the cluster directly (topics, leaders).

Helpers are handed out by fixtures: test files do not import each other.
"""

from __future__ import annotations

import contextlib
import datetime
import importlib
import io
import signal
import socket
import struct
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from confluent_kafka.admin import AdminClient, NewTopic
from kio.records.schema import NewRecordBatch, Record
from kio.records.writers import write_new_batch
from kio.schema.api_versions.v3.request import ApiVersionsRequest
from kio.schema.list_offsets.v7.request import (
    ListOffsetsPartition,
    ListOffsetsRequest,
    ListOffsetsTopic,
)
from kio.schema.metadata.v12.request import MetadataRequest, MetadataRequestTopic
from kio.schema.types import BrokerId
from kio.static.constants import EntityType
from kio.static.primitive import i8, i16, i32, i64

from proxy.config import parse_config
from proxy.devstack.paths import free_port, free_port_block
from proxy.devstack.proxy_thread import ProxyThread
from proxy.kafka.messages import decode_response, encode_request

LOOPBACK = "127.0.0.1"
BROKERS = 3
SIZE = struct.Struct(">i")


def proxy_settings(upstream: str, **limits: int) -> dict[str, Any]:
    """The YAML settings of a proxy in front of `upstream`, on free loopback ports."""
    settings: dict[str, Any] = {
        "upstream": {"bootstrap": upstream},
        "listeners": {
            "bootstrap_port": free_port(),
            "broker_port_base": free_port_block(BROKERS + 1),
        },
        "log_level": "warning",
    }
    if limits:
        settings["limits"] = limits
    return settings


# -- proxies on a thread -----------------------------------------------------------


@dataclass
class RunningProxy:
    thread: ProxyThread
    broker_port_base: int
    upstream_opened: list[tuple[str, int]]  # every upstream connection it opened

    @property
    def proxy(self):
        assert self.thread.proxy is not None
        return self.thread.proxy

    @property
    def address(self) -> tuple[str, int]:
        host, _, port = self.thread.bootstrap.rpartition(":")
        return host, int(port)

    def broker_address(self, node_id: int) -> tuple[str, int]:
        return LOOPBACK, self.broker_port_base + node_id

    def metric(self, name: str, **labels: str) -> float:
        value = self.proxy.metrics.registry.get_sample_value(name, labels)
        return 0.0 if value is None else value

    def rejected(self, reason: str) -> float:
        return self.metric("tierproxy_rejected_frames_total", reason=reason)


@contextlib.contextmanager
def running_proxy(upstream: str, **limits: int) -> Iterator[RunningProxy]:
    settings = proxy_settings(upstream, **limits)
    thread = ProxyThread(parse_config(settings)).start()
    proxy = thread.proxy
    assert proxy is not None
    opened: list[tuple[str, int]] = []
    open_upstream = proxy.open_upstream

    async def counting_open_upstream(host: str, port: int):
        opened.append((host, port))
        return await open_upstream(host, port)

    proxy.open_upstream = counting_open_upstream  # the proxy thread only reads the attribute
    try:
        yield RunningProxy(thread, settings["listeners"]["broker_port_base"], opened)
    finally:
        thread.stop()


@pytest.fixture(scope="module")
def proxy(kafka_cluster) -> Iterator[RunningProxy]:
    """A proxy with the default limits (100 MiB frames, 1000 in flight, 1 MiB buffers)."""
    with running_proxy(kafka_cluster.bootstrap) as running:
        yield running


@pytest.fixture
def own_proxy(kafka_cluster) -> Iterator[RunningProxy]:
    """A proxy no other test's clients talk to, for counting exactly: the module's proxy
    may still relay the answers to an earlier test's long polls after its client left."""
    with running_proxy(kafka_cluster.bootstrap) as running:
        yield running


@pytest.fixture(scope="module")
def small_frames_proxy(kafka_cluster) -> Iterator[RunningProxy]:
    """A proxy that refuses request frames over 1 MiB."""
    with running_proxy(kafka_cluster.bootstrap, max_frame_bytes=1 << 20) as running:
        yield running


# -- the raw client ----------------------------------------------------------------


class RawClient:
    """One blocking connection; frames go out exactly as given."""

    def __init__(
        self, address: tuple[str, int], rcvbuf: int | None = None, sndbuf: int | None = None
    ) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        # Before connect, so the window is small from the start (and not autotuned).
        if rcvbuf is not None:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        if sndbuf is not None:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, sndbuf)
        self.sock.settimeout(30)
        self.sock.connect(address)
        host, port = self.sock.getsockname()
        self.local = f"{host}:{port}"  # as the proxy names this client in its logs

    def send(self, *frames: bytes) -> None:
        self.sock.sendall(b"".join(frames))

    def read_frame(self, timeout: float = 30.0) -> bytes:
        """The next answer, without its size prefix."""
        self.sock.settimeout(timeout)
        (size,) = SIZE.unpack(self._read_exactly(4))
        return self._read_exactly(size)

    def read_answer(self, response_type: type, timeout: float = 30.0) -> tuple[int, Any]:
        """(correlation id, response) of the next answer."""
        return decode_response(self.read_frame(timeout), response_type)

    def nothing_within(self, seconds: float) -> bool:
        """True if no byte arrives within `seconds` (and the connection is still open)."""
        self.sock.settimeout(seconds)
        try:
            self.sock.recv(1, socket.MSG_PEEK)
        except TimeoutError:
            return True
        return False  # a byte came, or the connection closed (b"")

    def closed_by_peer(self, timeout: float = 10.0) -> bool:
        """True if the proxy closes the connection within `timeout`, reading and dropping
        anything that arrives before the close."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.sock.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                if not self.sock.recv(65536):
                    return True
            except TimeoutError:
                return False
            except ConnectionResetError:
                return True
        return False

    def _read_exactly(self, n: int) -> bytes:
        view = memoryview(bytearray(n))
        got = 0
        while got < n:
            count = self.sock.recv_into(view[got:])
            if not count:
                raise ConnectionError(f"closed by the proxy after {got} of {n} bytes")
            got += count
        return bytes(view)

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def raw() -> Iterator[Any]:
    """raw(address, rcvbuf=None, sndbuf=None) -> a connected RawClient, closed when the
    test ends."""
    clients: list[RawClient] = []

    def connect(
        address: tuple[str, int], rcvbuf: int | None = None, sndbuf: int | None = None
    ) -> RawClient:
        client = RawClient(address, rcvbuf, sndbuf)
        clients.append(client)
        return client

    yield connect
    for client in clients:
        client.close()


def request(message: Any, correlation_id: int, client_id: str = "connection-test") -> bytes:
    """A framed request for a kio request message."""
    return encode_request(message, correlation_id, client_id)


def record_batch(values: list[bytes]) -> bytes:
    """A v2 record batch of these values (no producer id, no compression)."""
    now = datetime.datetime.now(datetime.UTC)
    records = tuple(
        Record(attributes=i8(0), timestamp=now, offset=i64(n), key=None, value=v, headers=())
        for n, v in enumerate(values)
    )
    batch = NewRecordBatch(
        producer_id=i64(-1),
        producer_epoch=i16(-1),
        base_sequence=i32(-1),
        records=records,
        attributes=i16(0),
    )
    out = io.BytesIO()
    write_new_batch(out, batch)
    return out.getvalue()


def _schema(api: str, version: int, kind: str) -> Any:
    return importlib.import_module(f"kio.schema.{api}.v{version}.{kind}")


class Wire:
    """Request frames and answer types the tests use (handed out by the `wire` fixture)."""

    size = SIZE
    request = staticmethod(request)
    decode = staticmethod(decode_response)  # (frame without size, type) -> (cid, answer)
    record_batch = staticmethod(record_batch)

    @staticmethod
    def api_versions(correlation_id: int) -> bytes:
        return request(
            ApiVersionsRequest(client_software_name="conn-test", client_software_version="1"),
            correlation_id,
        )

    @staticmethod
    def metadata(correlation_id: int, topic: str | None = None) -> bytes:
        topics = () if topic is None else (MetadataRequestTopic(topic_id=None, name=topic),)
        message = MetadataRequest(
            topics=topics,
            allow_auto_topic_creation=False,
            include_topic_authorized_operations=False,
        )
        return request(message, correlation_id)

    @staticmethod
    def list_offsets(correlation_id: int, topic: str, timestamp: int = -1) -> bytes:
        partition = ListOffsetsPartition(partition_index=i32(0), timestamp=i64(timestamp))
        message = ListOffsetsRequest(
            replica_id=BrokerId(-1),
            isolation_level=i8(0),
            topics=(ListOffsetsTopic(name=topic, partitions=(partition,)),),
        )
        return request(message, correlation_id)

    @staticmethod
    def fetch(
        correlation_id: int,
        topic: str,
        offset: int,
        max_bytes: int,
        max_wait_ms: int = 0,
        version: int = 12,
        topic_id: uuid.UUID | None = None,
    ) -> bytes:
        """Fetch of partition 0 from `offset`, at most `max_bytes` (whole batches); from
        v13 the topic is named by its id."""
        module = _schema("fetch", version, "request")
        partition = module.FetchPartition(
            partition=i32(0), fetch_offset=i64(offset), partition_max_bytes=i32(max_bytes)
        )
        named = {"topic": topic} if version < 13 else {"topic_id": topic_id}
        message = module.FetchRequest(
            max_wait=datetime.timedelta(milliseconds=max_wait_ms),
            min_bytes=i32(1),
            max_bytes=i32(max_bytes),
            topics=(module.FetchTopic(**named, partitions=(partition,)),),
            forgotten_topics_data=(),
            rack_id="",
        )
        return request(message, correlation_id)

    @staticmethod
    def produce(correlation_id: int, version: int, topic: str, values: list[bytes], acks: int):
        module = _schema("produce", version, "request")
        data = module.PartitionProduceData(index=i32(0), records=record_batch(values))
        message = module.ProduceRequest(
            acks=i16(acks),
            timeout=datetime.timedelta(seconds=30),
            topic_data=(module.TopicProduceData(name=topic, partition_data=(data,)),),
        )
        return request(message, correlation_id)

    @staticmethod
    def response_type(api: str, version: int) -> type:
        """The kio response class of this API (its module name) and version."""
        module = _schema(api, version, "response")
        return next(
            value
            for value in vars(module).values()
            if getattr(value, "__type__", None) is EntityType.response
        )


@pytest.fixture(scope="session")
def wire() -> type[Wire]:
    return Wire


# -- the cluster, directly -----------------------------------------------------------


class Kafka:
    def __init__(self, bootstrap: str) -> None:
        self.bootstrap = bootstrap
        self.admin = AdminClient({"bootstrap.servers": bootstrap})
        self.created: list[str] = []

    def create_topic(self, prefix: str, partitions: int = 1, replication: int = 3) -> str:
        """A new topic whose partition 0 leader already serves requests."""
        name = f"{prefix}-{uuid.uuid4().hex[:10]}"
        for future in self.admin.create_topics([NewTopic(name, partitions, replication)]).values():
            future.result(30)
        self.created.append(name)
        self._await_leadership(name)
        return name

    def leader(self, topic: str, partition: int, timeout: float = 30.0) -> int:
        deadline = time.monotonic() + timeout
        while True:
            meta = self.admin.list_topics(topic, timeout=10).topics[topic]
            found = meta.partitions.get(partition)
            if meta.error is None and found is not None and found.leader >= 0:
                return found.leader
            assert time.monotonic() < deadline, f"{topic}/{partition} has no leader: {meta}"
            time.sleep(0.2)

    def _await_leadership(self, topic: str, timeout: float = 30.0) -> None:
        """Until partition 0's leader answers ListOffsets without error: metadata can
        name a leader before it acts as one, and acks=0 errors close the connection."""
        deadline = time.monotonic() + timeout
        leader = self.leader(topic, 0)
        answer_type = Wire.response_type("list_offsets", 7)
        while True:
            client = self.connect(leader)
            try:
                client.send(Wire.list_offsets(1, topic))
                _, answer = client.read_answer(answer_type)
            finally:
                client.close()
            error = answer.topics[0].partitions[0].error_code
            if error == 0:
                return
            assert time.monotonic() < deadline, f"{topic}/0 leader {leader}: error {error}"
            time.sleep(0.1)

    def broker_address(self, node_id: int) -> tuple[str, int]:
        broker = self.admin.list_topics(timeout=10).brokers[node_id]
        return broker.host, broker.port

    def connect(self, node_id: int) -> RawClient:
        """A raw connection straight to a broker, no proxy in between (caller closes)."""
        return RawClient(self.broker_address(node_id))

    def delete_created_topics(self) -> None:
        if self.created:
            for future in self.admin.delete_topics(self.created).values():
                future.result(30)


@pytest.fixture(scope="module")
def kafka(kafka_cluster) -> Iterator[Kafka]:
    """The cluster, directly; the topics a module creates are deleted after it."""
    cluster = Kafka(kafka_cluster.bootstrap)
    yield cluster
    cluster.delete_created_topics()


# -- a proxy process of its own ------------------------------------------------------


class ProxyProcess:
    """`tierproxy run --config` in a process of its own, measured through /proc."""

    def __init__(self, upstream: str, workdir: Path, **limits: int) -> None:
        self.settings = proxy_settings(upstream, **limits)
        config = workdir / f"proxy-{uuid.uuid4().hex[:6]}.yaml"
        config.write_text(yaml.safe_dump(self.settings))
        self.log_path = config.with_suffix(".log")
        self._log = self.log_path.open("wb")
        tierproxy = Path(sys.executable).with_name("tierproxy")
        self.proc = subprocess.Popen(
            [str(tierproxy), "run", "--config", str(config)],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        self.pid = self.proc.pid
        deadline = time.monotonic() + 60
        while b"proxy ready at" not in self.log_path.read_bytes():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"proxy did not start:\n{self.log_path.read_text()}")
            time.sleep(0.05)

    @property
    def bootstrap_address(self) -> tuple[str, int]:
        return LOOPBACK, self.settings["listeners"]["bootstrap_port"]

    def broker_address(self, node_id: int) -> tuple[str, int]:
        return LOOPBACK, self.settings["listeners"]["broker_port_base"] + node_id

    def memory(self) -> dict[str, int]:
        """VmRSS and VmHWM (peak RSS) in bytes."""
        out = {}
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                out[key] = int(value.split()[0]) * 1024
        return out

    def bytes_read(self) -> int:
        """Bytes the process has read through read(2) and friends: its sockets included."""
        for line in Path(f"/proc/{self.pid}/io").read_text().splitlines():
            key, _, value = line.partition(":")
            if key == "rchar":
                return int(value)
        raise AssertionError("no rchar in /proc/<pid>/io")

    def cpu_ticks(self) -> int:
        """User plus system CPU time of the process, in clock ticks."""
        fields = Path(f"/proc/{self.pid}/stat").read_text().rpartition(")")[2].split()
        return int(fields[11]) + int(fields[12])  # utime, stime: fields 14 and 15

    def reads_settle(self, quiet_s: float = 1.5, timeout: float = 60.0) -> int:
        """Wait until the process has neither read nor run for `quiet_s` (a busy proxy
        may not read for a while yet not be done); its bytes read then."""
        deadline = time.monotonic() + timeout
        last = (self.bytes_read(), self.cpu_ticks())
        quiet_since = time.monotonic()
        while time.monotonic() < deadline:
            time.sleep(0.1)
            now = (self.bytes_read(), self.cpu_ticks())
            if now != last:
                last, quiet_since = now, time.monotonic()
            elif time.monotonic() - quiet_since >= quiet_s:
                return now[0]
        raise AssertionError(f"the proxy kept reading or running for {timeout} s")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._log.close()


@pytest.fixture
def proxy_process(kafka_cluster, tmp_path) -> Iterator[Any]:
    """proxy_process(**limits) -> a started ProxyProcess, stopped when the test ends."""
    started: list[ProxyProcess] = []

    def start(**limits: int) -> ProxyProcess:
        process = ProxyProcess(kafka_cluster.bootstrap, tmp_path, **limits)
        started.append(process)
        return process

    yield start
    for process in started:
        process.stop()
