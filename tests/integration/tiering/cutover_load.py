"""Helpers for the tiered cutover and object store outage tests: proxy configs, the admin
command, paced idempotent producers that note every acknowledgement, and the log put
back together from Kafka (below each partition's cutover) and the committed objects
(from it on).

Values are `<producer>:<sequence>:<padding>`, so a record names who wrote it and in what
order, whatever offset it landed at.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from aiokafka.record.default_records import DefaultRecordBatch
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from proxy.config import parse_config
from proxy.devstack.paths import free_port, free_port_block
from proxy.devstack.proxy_thread import ProxyThread
from proxy.metadata.state import MetadataState
from proxy.metadata.store import ShardReader
from proxy.metadata.streams import shard_of, stream_id
from proxy.objects.format import find_entries, read_block, read_object
from proxy.objects.store import ObjectStore
from proxy.records.batches import iter_batches
from tests.support.waiting import wait_until


def proxy_config(
    cluster, tmp_path, name: str, zone: str, suffix: str, base: int, **tiering
) -> dict:
    """A proxy of fleet `fleet-<suffix>` with metadata topic `meta-<suffix>` (2 shards)."""
    settings = {
        "metadata_topic": f"meta-{suffix}",
        "shard_count": 2,
        "session_timeout_ms": 6000,
        "wal": {"directory": str(tmp_path / name / "wal")},
        "object_store": {"directory": str(tmp_path / "objects")},
        "upload_interval_s": 0.2,
    }
    settings.update(tiering)
    return {
        "upstream": {"bootstrap": cluster.bootstrap},
        "listeners": {"bootstrap_port": free_port(), "broker_port_base": base},
        "fleet": {"name": name, "zone": zone, "topic": f"fleet-{suffix}"},
        "tiering": settings,
    }


@contextmanager
def one_proxy(cluster, tmp_path, name: str, **tiering) -> Iterator[ProxyThread]:
    """One proxy (zone-a, in this process) on `cluster`, with metadata and fleet topics of
    its own, started and owning both metadata shards; stopped on the way out."""
    suffix = uuid.uuid4().hex[:8]
    config = proxy_config(cluster, tmp_path, name, "zone-a", suffix, free_port_block(8), **tiering)
    with ProxyThread(parse_config(config)) as proxy:
        wait_owned([proxy], 2)
        yield proxy


def create_topic(cluster, topic: str, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 3)])[topic].result(30)


def _command(op: str, topic: str, peer_port: int) -> list[str]:
    peer = f"127.0.0.1:{peer_port}"
    return [sys.executable, "-m", "proxy.cli", "topics", op, topic, "--peer", peer]


def topics_command(op: str, topic: str, peer_port: int) -> subprocess.CompletedProcess:
    """`tierproxy topics <op> <topic> --peer 127.0.0.1:<peer_port>`, as an operator runs it."""
    return subprocess.run(
        _command(op, topic, peer_port), capture_output=True, text=True, timeout=60
    )


def start_topics_command(op: str, topic: str, peer_port: int) -> subprocess.Popen:
    """The same, running: `communicate()` for its output."""
    return subprocess.Popen(
        _command(op, topic, peer_port), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def wait_owned(proxies, shard_count: int, timeout_s: float = 30.0) -> None:
    """Until every metadata shard has an owner among `proxies`: before that, an admin
    command answers NOT_COORDINATOR ("metadata shard k has no live owner right now")."""

    def owned() -> bool:
        assignments = [p.proxy.tiering.assignment for p in proxies]
        return all(any(a.owner(k) is not None for a in assignments) for k in range(shard_count))

    wait_until(owned, timeout_s, "every metadata shard owned")


def tiered_topic_id(proxy, topic: str, timeout_s: float = 30.0) -> uuid.UUID:
    """The topic's id once `proxy` has read it is tiered (the admin command returns when
    the shard's owner wrote the mode; each proxy's readers see it a little later)."""
    topics = proxy.proxy.tiering.topics
    wait_until(lambda: topics.topic(topic) is not None, timeout_s, f"{topic} tiered")
    return topics.topic(topic).topic_id


def started(tiering, stream: int) -> bool:
    """The stream's partition is started by its owner here and this proxy's own metadata
    readers (the ones Fetch and ListOffsets use) have read its cutover: the owner's
    reader may read the StreamCutover a little before them."""
    return (
        tiering.partitions.get(stream) is not None
        and tiering.state(stream).stream(stream) is not None
    )


@dataclass(frozen=True, slots=True)
class Ack:
    partition: int
    offset: int
    value: bytes
    sent_at: float  # time.monotonic() when handed to the client
    acked_at: float  # when the delivery report came
    acked_wall_ms: int  # the same on the wall clock, to set against metadata timestamps


@dataclass
class LoadProducer:
    """An idempotent producer (acks=all) in a thread of its own, writing `rate` records a
    second round robin over the partitions until `stop()`; `acks` and `errors` as its
    delivery reports give them (its own retries show only in `client_log`)."""

    name: str
    bootstrap: str
    topic: str
    partitions: int
    rate: float
    zone: str
    value_bytes: int = 100
    settings: dict = field(default_factory=dict)
    acks: list[Ack] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    client_log: list[str] = field(default_factory=list)  # librdkafka's log lines
    sent: int = 0

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"producer {self.name}")
        self._lock = threading.Lock()
        self.flushed: int | None = None  # messages left after the final flush
        self._flush_timeout_s = 120.0

    def start(self) -> LoadProducer:
        self._thread.start()
        return self

    def stop(self, flush_timeout_s: float = 120.0) -> None:
        self._flush_timeout_s = flush_timeout_s
        self._stop.set()
        self._thread.join(flush_timeout_s + 30)
        assert not self._thread.is_alive(), f"producer {self.name} did not stop"

    def acked_count(self) -> int:
        with self._lock:
            return len(self.acks)

    def _logger(self) -> logging.Logger:
        """The client's log lines, kept in `client_log` (and not printed)."""
        logger = logging.getLogger(f"cutover_load.{self.name}.{id(self)}")
        logger.propagate = False
        logger.setLevel(logging.DEBUG)
        lines = self.client_log

        class Keep(logging.Handler):
            def emit(self, record: logging.LogRecord) -> None:
                lines.append(record.getMessage())

        logger.addHandler(Keep())
        return logger

    def _delivered(self, sent_at: float):
        def report(err, msg) -> None:
            now = time.monotonic()
            with self._lock:
                if err is not None:
                    self.errors.append(f"{msg.partition()}: {err}")
                else:
                    ack = Ack(msg.partition(), msg.offset(), msg.value(), sent_at, now, _wall_ms())
                    self.acks.append(ack)

        return report

    def _run(self) -> None:
        config = {
            "bootstrap.servers": self.bootstrap,
            "client.id": f"{self.name},tierproxy_az={self.zone}",
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 5,
            "compression.type": "none",
            "message.timeout.ms": 120_000,
        }
        config.update(self.settings)
        producer = Producer(config, logger=self._logger())
        padding = b"x" * max(0, self.value_bytes - 24)
        started = time.monotonic()
        while not self._stop.is_set():
            due = started + self.sent / self.rate
            now = time.monotonic()
            if due > now:
                producer.poll(min(due - now, 0.05))
                continue
            value = f"{self.name}:{self.sent}:".encode() + padding
            try:
                producer.produce(
                    self.topic,
                    value,
                    partition=self.sent % self.partitions,
                    on_delivery=self._delivered(now),
                )
            except BufferError:  # the client's queue is full: the proxy holds produce
                producer.poll(0.1)
                continue
            self.sent += 1
            producer.poll(0)
        self.flushed = producer.flush(self._flush_timeout_s)


def _wall_ms() -> int:
    return time.time_ns() // 1_000_000


def parse_value(value: bytes) -> tuple[str, int]:
    name, sequence, _ = value.split(b":", 2)
    return name.decode(), int(sequence)


# -- reading back ---------------------------------------------------------------------------


async def metadata_states(bootstrap: str, meta_topic: str, shard_count: int) -> list[MetadataState]:
    """Every shard's state, read to the end of the metadata topic."""
    states = []
    for shard in range(shard_count):
        reader = ShardReader({"bootstrap_servers": bootstrap}, meta_topic, shard, shard_count)
        await reader.start()
        try:
            await reader.read_to_end()
            states.append(reader.state)
        finally:
            await reader.close()
    return states


async def committed_records(
    store: ObjectStore, states: list[MetadataState], topic_id: uuid.UUID, partitions: int
) -> dict[int, dict[int, bytes]]:
    """partition -> offset -> value of every record the metadata says is committed, read
    from the objects. An offset found twice fails."""
    found: dict[int, dict[int, bytes]] = {}
    for partition in range(partitions):
        stream = stream_id(topic_id, partition)
        state = states[shard_of(stream, len(states))]
        records = found.setdefault(partition, {})
        for r in state.committed_ranges(stream):
            data = await store.get(r.object_key)
            _, index = read_object(data, r.object_key)
            for entry in find_entries(index, stream, r.start_offset):
                for header, batch in iter_batches(read_block(data, entry, r.object_key)):
                    if header.next_offset <= r.start_offset or header.base_offset >= r.end_offset:
                        continue
                    for record in DefaultRecordBatch(bytes(batch)):
                        assert record.offset not in records, f"{partition}/{record.offset} twice"
                        records[record.offset] = record.value
    return found


def kafka_records(bootstrap: str, topic: str, ends: dict[int, int]) -> dict[int, dict[int, bytes]]:
    """partition -> offset -> value of Kafka's log, from its start up to `ends[partition]`
    (exclusive), read with a plain consumer."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"reader-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )
    found: dict[int, dict[int, bytes]] = {p: {} for p in ends}
    try:
        wanted = [TopicPartition(topic, p, 0) for p, end in ends.items() if end > 0]
        if not wanted:
            return found
        consumer.assign(wanted)
        left = {tp.partition for tp in wanted}
        deadline = time.monotonic() + 60
        while left:
            assert time.monotonic() < deadline, f"Kafka read of {sorted(left)} did not end"
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            if msg.error() is not None:
                raise KafkaException(msg.error())
            partition, offset = msg.partition(), msg.offset()
            if offset < ends[partition]:
                found[partition][offset] = msg.value()
            if offset >= ends[partition] - 1:
                left.discard(partition)
    finally:
        consumer.close()
    return found


def kafka_ends(bootstrap: str, topic: str, partitions: int) -> dict[int, tuple[int, int]]:
    """partition -> (log start, high watermark) in Kafka."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "ends"})
    try:
        return {
            p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
            for p in range(partitions)
        }
    finally:
        consumer.close()
