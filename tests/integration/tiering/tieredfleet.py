"""A tiered fleet of `tierproxy run` processes, for the tests that kill (SIGKILL), pause
(SIGSTOP) and restart proxies, and the readers that check what it committed.

`TieredFleet` runs one proxy per zone on 127.0.0.1, each on ports of its own that stay the
same across restarts (bootstrap, brokers, metrics, peer), with tiering on, an object
store in the session's MinIO and `notify: s3`. A restarted proxy keeps its `fleet.name`
and WAL directory, so it is the same member. Clients say their zone in their client.id
(`tierproxy_az=`).

The fleet follows the metadata topic on an event loop of its own (a thread), so a test can
look at it whenever it wants: `states()`, `records(shard)` and `committed(...)`, which
reads back, from the objects, every record the metadata says is committed.

The producers (`produce_librdkafka`, `produce_aiokafka`, `JavaProducer`) are idempotent
with acks=all and write values that name the producer and a sequence number
(`<producer>:<n>:` then padding; the Java tool writes `<prefix>.<n>`), so the committed
records tell which producer wrote them and in which order.
"""

from __future__ import annotations

import asyncio
import base64
import copy
import json
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.record.default_records import DefaultRecordBatch
from confluent_kafka import KafkaException, Producer, TopicCollection
from confluent_kafka.admin import AdminClient, NewTopic

from proxy.devstack.paths import free_port_block, kafka_libs, repo_root
from proxy.devstack.process import ManagedProcess
from proxy.metadata.codec import decode
from proxy.metadata.reader import ShardReader
from proxy.metadata.state import MetadataState
from proxy.metadata.streams import shard_of, stream_id
from proxy.objects.format import find_entries, read_block, read_object
from proxy.objects.s3 import S3Store
from proxy.objects.s3config import S3Config
from proxy.objects.store import ObjectNotFound
from proxy.records.batches import iter_batches
from proxy.wal.fs import OsFilesystem
from proxy.wal.segments import backlog_bytes
from tests.support.waiting import wait_for

HEARTBEAT_S = 0.5
MEMBER_TIMEOUT_S = 3.0
PORTS_PER_PROXY = 10  # brokers at base + node id (1..3), then bootstrap, metrics, peer, admin
_READY = "proxy ready at"

# reads of the shards and their objects before a missing object is an error (`committed`)
CHANGED_READS = 3


def s3_settings(server: Any) -> dict[str, Any]:
    """tiering.object_store for the session's MinIO (or the external S3)."""
    kwargs = server.client_kwargs()
    return {
        "kind": "s3",
        "bucket": server.bucket,
        "endpoint_url": kwargs["endpoint_url"],
        "region": kwargs["region_name"],
        "access_key_id": kwargs["aws_access_key_id"],
        "secret_access_key": kwargs["aws_secret_access_key"],
        "path_style": True,
    }


def wal_backlog(directory: Path) -> int:
    """WAL bytes past the trim checkpoint, from the files alone (the proxy may be running
    or paused): what it acknowledged and has not committed yet, as far as the disk says."""
    return backlog_bytes(OsFilesystem(), str(directory))


@dataclass
class TieredProxy:
    name: str
    zone: str
    base_port: int
    wal_dir: Path
    process: ManagedProcess

    @property
    def port(self) -> int:
        return self.base_port + 5

    @property
    def metrics_port(self) -> int:
        return self.base_port + 6

    @property
    def peer_port(self) -> int:
        return self.base_port + 7

    @property
    def admin_port(self) -> int:
        return self.base_port + 8

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def ready(self) -> tuple[bool, str]:
        """GET /readyz of the admin API: (ready, the answer's body, or why none came)."""
        url = f"http://127.0.0.1:{self.admin_port}/readyz"
        try:
            with urllib.request.urlopen(url, timeout=5) as answer:
                return answer.status == 200, answer.read().decode()
        except urllib.error.HTTPError as exc:  # 503: not ready, with each check's reason
            return False, exc.read().decode()
        except OSError as exc:
            return False, repr(exc)

    def metric(self, name: str, **labels: str) -> float:
        """The sum of a metric's samples matching these labels (0 if none)."""
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as answer:
            text = answer.read().decode()
        total = 0.0
        for line in text.splitlines():
            sample, _, value = line.rpartition(" ")
            if sample.split("{")[0] == name and all(
                f'{key}="{wanted}"' in sample for key, wanted in labels.items()
            ):
                total += float(value)
        return total

    def log(self, after: int = 0) -> str:
        return self.process.log_path.read_bytes()[after:].decode(errors="replace")

    def log_size(self) -> int:
        path = self.process.log_path
        return path.stat().st_size if path.exists() else 0


class _Loop:
    """An event loop in a thread of its own, for the fleet's Kafka and S3 clients."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, Any], timeout: float = 60.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.run_until_complete(self.loop.shutdown_asyncgens())
        self.loop.close()


class TieredFleet:
    def __init__(
        self,
        kafka_bootstrap: str,
        s3_server: Any,
        base_dir: Path,
        *,
        zones: tuple[str, ...] = ("zone-a", "zone-b"),
        shard_count: int = 4,
        tiering: dict[str, Any] | None = None,
    ) -> None:
        self.kafka_bootstrap = kafka_bootstrap
        self.suffix = uuid.uuid4().hex[:8]
        self.metadata_topic = f"meta-{self.suffix}"
        self.shard_count = shard_count
        self.base_dir = base_dir
        self._s3 = s3_settings(s3_server)
        self._tiering = tiering or {}
        self.proxies: dict[str, TieredProxy] = {}
        for zone in zones:
            name = f"{zone[-1]}-{self.suffix}"  # a-1234abcd, b-1234abcd
            base = free_port_block(PORTS_PER_PROXY)
            config = base_dir / f"{name}.yaml"
            wal_dir = base_dir / name / "wal"
            config.write_text(yaml.safe_dump(self._config(name, zone, base, wal_dir)))
            process = ManagedProcess(
                f"proxy-{name}",
                [sys.executable, "-m", "proxy.cli", "run", "--config", str(config)],
                log_path=base_dir / f"{name}.log",
                cwd=repo_root(),
            )
            self.proxies[zone] = TieredProxy(name, zone, base, wal_dir, process)
        self._loop = _Loop()
        self._readers: list[ShardReader] | None = None
        self._store: S3Store | None = None

    def _config(self, name: str, zone: str, base: int, wal_dir: Path) -> dict:
        tiering = {
            "metadata_topic": self.metadata_topic,
            "shard_count": self.shard_count,
            "session_timeout_ms": 6000,
            "notify": "s3",
            "upload_interval_s": 0.5,
            "s3wal_max_delay_ms": 50,
            "peer_port": base + 7,
            "cutover_hold_ms": 20000,
            "wal": {"directory": str(wal_dir)},
            "object_store": self._s3,
        }
        tiering.update(self._tiering)
        return {
            "upstream": {"bootstrap": self.kafka_bootstrap, "metadata_refresh_s": 5},
            "listeners": {"bootstrap_port": base + 5, "broker_port_base": base},
            "fleet": {
                "name": name,
                "zone": zone,
                "topic": f"fleet-{self.suffix}",
                "heartbeat_interval_s": HEARTBEAT_S,
                "member_timeout_s": MEMBER_TIMEOUT_S,
            },
            "metrics": {"port": base + 6},
            "admin": {"port": base + 8},
            "tiering": tiering,
            "logging": {"format": "text"},  # faultsteps reads " WARNING " lines
        }

    def __getitem__(self, zone: str) -> TieredProxy:
        return self.proxies[zone]

    def by_name(self, name: str) -> TieredProxy:
        return next(p for p in self.proxies.values() if p.name == name)

    def bootstrap(self) -> str:
        """Every proxy: a client that loses one still finds the others."""
        return ",".join(p.bootstrap for p in self.proxies.values())

    # -- processes -----------------------------------------------------------------------

    def start(self, *zones: str, timeout: float = 60.0) -> None:
        chosen = [self.proxies[z] for z in zones or self.proxies]
        logged = {p.name: p.log_size() for p in chosen}
        for proxy in chosen:
            proxy.process.start()
        for proxy in chosen:
            wait_for_log(proxy, _READY, timeout, after=logged[proxy.name])

    def stop(self, *zones: str) -> None:
        """SIGTERM in parallel: each hands its shards over, everything uploaded."""
        chosen = [self.proxies[z] for z in zones or self.proxies]
        for proxy in chosen:
            proxy.process.signal(signal.SIGCONT)  # a paused one would not hear SIGTERM
            proxy.process.terminate()
        for proxy in chosen:
            proxy.process.stop(timeout=60)

    def kill(self, zone: str) -> None:
        self.proxies[zone].process.kill()

    def pause(self, zone: str) -> None:
        self.proxies[zone].process.signal(signal.SIGSTOP)

    def resume(self, zone: str) -> None:
        self.proxies[zone].process.signal(signal.SIGCONT)

    def __enter__(self) -> TieredFleet:
        """Started, every metadata shard owned (a fixture's fleet); closed on the way out
        even when the start fails halfway."""
        try:
            self.start()
            self.wait_until_owned()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop the proxies, delete from the bucket the objects this fleet's metadata
        names and its S3-WAL objects, and close the fleet's own clients."""
        self.stop()
        try:
            self._loop.run(self._close_clients(), timeout=120)
        finally:
            self._loop.close()

    async def _close_clients(self) -> None:
        try:
            if self._readers is not None:
                store = await self._open_store()
                named = set()
                for state in await self._states():
                    named.update(commit.key for commit in state.garbage_objects())
                    for stream in state.stream_ids():
                        named.update(r.object_key for r in state.committed_ranges(stream))
                wal = [info.key async for info in store.list("wal/") if self.suffix in info.key]
                await store.delete(sorted(named) + wal)
        finally:
            if self._readers is not None:
                await asyncio.gather(*(reader.close() for reader in self._readers))
            if self._store is not None:
                await self._store.close()

    def tier(self, topic: str) -> str:
        peer = next(p for p in self.proxies.values() if p.process.running())
        done = subprocess.run(
            [sys.executable, "-m", "proxy.cli", "topics", "tier", topic, "--peer"]
            + [f"127.0.0.1:{peer.peer_port}"],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=repo_root(),
        )
        assert done.returncode == 0, done.stderr + done.stdout
        return done.stdout

    # -- the metadata ----------------------------------------------------------------------

    def states(self) -> list[MetadataState]:
        """Every shard's state as of now (read to the end), copied."""
        return self._loop.run(self._states())

    async def _states(self) -> list[MetadataState]:
        if self._readers is None:
            kafka = {"bootstrap_servers": self.kafka_bootstrap}
            topic, count = self.metadata_topic, self.shard_count
            readers = [ShardReader(kafka, topic, k, count) for k in range(count)]
            await asyncio.gather(*(reader.start() for reader in readers))
            self._readers = readers
        await asyncio.gather(*(reader.read_to_end() for reader in self._readers))
        return [copy.deepcopy(reader.state) for reader in self._readers]

    def owners(self) -> dict[int, tuple[str, int, bool]]:
        """shard -> (last claim's owner, its epoch, released)."""
        return {s.shard: (s.owner, s.epoch, s.released) for s in self.states()}

    def wait_until_owned(self, names: set[str] | None = None, timeout: float = 60.0) -> None:
        """Until every shard is claimed and not released, the claims naming exactly
        `names` (default: every running proxy)."""
        if names is None:
            names = {p.name for p in self.proxies.values() if p.process.running()}
        wait_for(
            self.owners,
            lambda owners: (
                all(owner and not released for owner, _, released in owners.values())
                and {owner for owner, _, _ in owners.values()} == names
            ),
            f"every shard owned by {sorted(names)}",
            timeout,
        )

    def records(self, shard: int, isolation: str = "read_committed") -> list[tuple[int, Any]]:
        """(offset, decoded record) of every record of a shard's partition: the committed
        ones, or with "read_uncommitted" also those of open and aborted transactions."""
        return self._loop.run(self._records(shard, isolation))

    async def _records(self, shard: int, isolation: str) -> list[tuple[int, Any]]:
        consumer = AIOKafkaConsumer(
            bootstrap_servers=self.kafka_bootstrap,
            group_id=None,
            enable_auto_commit=False,
            isolation_level=isolation,
        )
        await consumer.start()
        try:
            tp = TopicPartition(self.metadata_topic, shard)
            consumer.assign([tp])
            await consumer.seek_to_beginning(tp)
            end = (await consumer.end_offsets([tp]))[tp]
            found = []
            while await consumer.position(tp) < end:
                for record in (await consumer.getmany(tp, timeout_ms=1000)).get(tp, ()):
                    found.append((record.offset, decode(record.key or b"", record.value)))
            return found
        finally:
            await consumer.stop()

    def wait_for_cutover(self, topic_id: uuid.UUID, partitions: int, timeout: float = 60.0):
        """Until every partition of the topic is a stream; {partition: cutover offset}."""

        def cutovers() -> dict[int, int]:
            states = self.states()
            found = {}
            for partition in range(partitions):
                stream = stream_id(topic_id, partition)
                cutover = states[shard_of(stream, self.shard_count)].cutover(stream)
                if cutover is not None:
                    found[partition] = cutover
            return found

        return wait_for(cutovers, lambda found: len(found) == partitions, "cutover", timeout)

    def create_spread_topic(self, partitions: int) -> tuple[str, uuid.UUID]:
        """A new topic whose partitions' streams fall in the shards of more than one
        proxy (topic ids are random: a topic whose streams all landed with one owner is
        deleted and another made). Call it once the shards are owned."""
        admin = AdminClient({"bootstrap.servers": self.kafka_bootstrap})
        owners = self.owners()

        def shards_of(topic_id: uuid.UUID) -> set[int]:
            return {shard_of(stream_id(topic_id, p), self.shard_count) for p in range(partitions)}

        return create_topic_over(
            admin,
            f"tiered-{self.suffix}",
            partitions,
            lambda topic_id: len({owners[shard][0] for shard in shards_of(topic_id)}) > 1,
            f"one proxy's shards: {owners}",
        )

    def tiered_spread_topic(self, partitions: int) -> tuple[str, uuid.UUID]:
        """`create_spread_topic`, tiered, every partition cut over (empty)."""
        topic, topic_id = self.create_spread_topic(partitions)
        self.tier(topic)
        self.wait_for_cutover(topic_id, partitions)
        return topic, topic_id

    def stream_owner(self, topic_id: uuid.UUID, partition: int) -> str:
        stream = stream_id(topic_id, partition)
        return self.states()[shard_of(stream, self.shard_count)].owner

    # -- what is committed -----------------------------------------------------------------

    def committed(self, topic_id: uuid.UUID, partitions: int) -> Committed:
        """What the shards name for the topic, read from its objects. The fleet runs on:
        an object compacted away and deleted (after `object_delete_grace_s`) between the
        read of the shards and its GET is not an error, the shards are read again; one
        still named after `CHANGED_READS` reads is."""
        for attempt in range(1, CHANGED_READS + 1):
            try:
                return self._loop.run(self._committed(topic_id, partitions), timeout=300)
            except ObjectNotFound:
                if attempt == CHANGED_READS:
                    raise
        raise AssertionError("unreachable")

    def object_sizes(self, keys: list[str]) -> dict[str, int]:
        """Each object's size as the store reports it (HEAD)."""

        async def sizes() -> dict[str, int]:
            store = await self._open_store()
            return dict(zip(keys, await asyncio.gather(*map(store.size, keys)), strict=True))

        return self._loop.run(sizes())

    async def _open_store(self) -> S3Store:
        if self._store is None:
            settings = {k: v for k, v in self._s3.items() if k != "kind"}
            self._store = await S3Store.open(S3Config(**settings))
        return self._store

    async def _committed(self, topic_id: uuid.UUID, partitions: int) -> Committed:
        store = await self._open_store()
        states = await self._states()
        committed = Committed()
        cache: dict[str, bytes] = {}
        for partition in range(partitions):
            stream = stream_id(topic_id, partition)
            state = states[shard_of(stream, self.shard_count)]
            info = state.stream(stream)
            if info is None:
                continue
            committed.cutover[partition] = info.cutover_offset
            committed.end[partition] = info.end_offset
            records = committed.records.setdefault(partition, [])
            batches = committed.batches.setdefault(partition, [])
            for r in state.committed_ranges(stream):
                committed.objects[r.object_key] = state.shard
                if r.object_key not in cache:
                    cache[r.object_key] = await store.get(r.object_key)
                data = cache[r.object_key]
                _, index = read_object(data, r.object_key)
                for entry in find_entries(index, stream, r.start_offset):
                    block = read_block(data, entry, r.object_key)
                    for header, batch in iter_batches(block):
                        if r.start_offset <= header.base_offset < r.end_offset:
                            batches.append((header.base_offset, header.last_offset))
                        for record in DefaultRecordBatch(bytes(batch)):
                            if r.start_offset <= record.offset < r.end_offset:
                                records.append((record.offset, bytes(record.value or b"")))
            records.sort()
            batches.sort()
        return committed


def create_topic_over(
    admin: AdminClient,
    prefix: str,
    partitions: int,
    accept: Callable[[uuid.UUID], bool],
    refused: str = "the shards wanted",
) -> tuple[str, uuid.UUID]:
    """A new topic (`prefix`-n) whose topic id `accept` takes, for the metadata shards its
    streams (or its mode record) fall in. Topic ids are random, and so are those shards:
    a topic refused is deleted and another made (a test that needs partitions in more
    than one shard would otherwise fail one run in 2 ** (partitions - 1))."""
    for attempt in range(20):
        name = f"{prefix}-{attempt}"
        admin.create_topics([NewTopic(name, partitions, 3)])[name].result(30)
        topic_id = wait_for(
            lambda name=name: topic_id_of(admin, name),
            lambda found: found is not None,
            f"{name} known",
        )
        if accept(topic_id):
            return name, topic_id
        admin.delete_topics([name])[name].result(30)
    raise AssertionError(f"20 topics, each with every stream in {refused}")


def topic_id_of(admin: AdminClient, name: str) -> uuid.UUID | None:
    """The topic's id, or None while the broker asked does not know the topic yet."""
    try:
        described = admin.describe_topics(TopicCollection([name]))[name].result(30)
    except KafkaException:
        return None
    return uuid.UUID(bytes=base64.b64decode(str(described.topic_id) + "=="))


@dataclass
class Committed:
    """What the metadata says is committed, read from the objects."""

    records: dict[int, list[tuple[int, bytes]]] = field(default_factory=dict)  # offset, value
    cutover: dict[int, int] = field(default_factory=dict)
    end: dict[int, int] = field(default_factory=dict)
    objects: dict[str, int] = field(default_factory=dict)  # object key -> shard naming it
    # (base offset, last offset) of each batch whose base a range holds
    batches: dict[int, list[tuple[int, int]]] = field(default_factory=dict)

    def locations(self) -> dict[bytes, list[tuple[int, int]]]:
        """value -> every (partition, offset) holding it."""
        found: dict[bytes, list[tuple[int, int]]] = {}
        for partition, records in self.records.items():
            for offset, value in records:
                found.setdefault(value, []).append((partition, offset))
        return found


# -- producers ---------------------------------------------------------------------------


def make_value(producer: str, n: int, size: int) -> bytes:
    return f"{producer}:{n}:".encode().ljust(size, b"x")


_JAVA_VALUE = re.compile(rb"(\d+)\.(\d+)")


def parse_value(value: bytes) -> tuple[str, int]:
    """(producer, sequence number) of a value `make_value` or the Java tool wrote."""
    java = _JAVA_VALUE.fullmatch(value)
    if java is not None:
        return f"java-{java[1].decode()}", int(java[2])
    producer, n, _ = value.split(b":", 2)
    return producer.decode(), int(n)


@dataclass
class Produced:
    """What one producer was told: value -> (partition, offset) for each acknowledged
    record, and the delivery errors (each a string)."""

    name: str
    acked: dict[bytes, tuple[int, int]] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    fatal: list[str] = field(default_factory=list)
    sent: int = 0
    seconds: float = 0.0  # from the first send to the last answer


def produce_librdkafka(
    bootstrap: str,
    topic: str,
    zone: str,
    name: str,
    count: int,
    partitions: int,
    size: int,
    *,
    rate: float | None = None,
    stop: threading.Event | None = None,
    timeout_s: float = 120.0,
    into: Produced | None = None,
    timestamp_ms: int = 0,
) -> Produced:
    """An idempotent confluent_kafka producer; record n goes to partition n % partitions.
    At most `rate` records a second if given; stops early once `stop` is set. `into`:
    the Produced to fill as answers come (others may look at it meanwhile).
    `timestamp_ms`: every record's CreateTime (0: the time it is sent)."""
    produced = into if into is not None else Produced(name)
    started = time.monotonic()

    def delivered(err, msg) -> None:
        if err is not None:
            produced.errors.append(str(err))
            if err.fatal():
                produced.fatal.append(str(err))
        else:
            produced.acked[msg.value()] = (msg.partition(), msg.offset())

    def error(err) -> None:
        if err.fatal():
            produced.fatal.append(str(err))

    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "client.id": f"{name},tierproxy_az={zone}",
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 10,
            "message.timeout.ms": int(timeout_s * 1000),
            "error_cb": error,
            "log_level": 2,  # a proxy that is down is expected here: no connect noise
        }
    )
    for n in range(count):
        if stop is not None and stop.is_set():
            break
        if rate is not None:
            while (wait := started + n / rate - time.monotonic()) > 0:
                producer.poll(min(wait, 0.1))
        while True:
            try:
                producer.produce(
                    topic,
                    make_value(name, n, size),
                    partition=n % partitions,
                    on_delivery=delivered,
                    timestamp=timestamp_ms,
                )
                break
            except BufferError:  # the local queue is full: let deliveries drain it
                producer.poll(0.05)
        produced.sent += 1
        producer.poll(0)
    left = producer.flush(timeout_s + 30)
    if left:
        produced.errors.append(f"{left} records not delivered at the end")
    produced.seconds = time.monotonic() - started
    return produced


async def produce_aiokafka(
    bootstrap: str, topic: str, zone: str, name: str, count: int, partitions: int, size: int
) -> Produced:
    """An idempotent aiokafka producer, at most 2,000 records waiting at a time."""
    produced = Produced(name)
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap,
        client_id=f"{name},tierproxy_az={zone}",
        enable_idempotence=True,
        acks="all",
        linger_ms=10,
        max_batch_size=256 * 1024,  # one batch in flight per partition: make it count
        request_timeout_ms=60000,
    )
    await producer.start()
    started = time.monotonic()
    try:
        window: list[tuple[bytes, asyncio.Future]] = []

        async def settle() -> None:
            for value, future in window:
                try:
                    metadata = await future
                except Exception as exc:
                    produced.errors.append(repr(exc))
                else:
                    produced.acked[value] = (metadata.partition, metadata.offset)
            window.clear()

        for n in range(count):
            value = make_value(name, n, size)
            window.append((value, await producer.send(topic, value, partition=n % partitions)))
            produced.sent += 1
            if len(window) >= 2000:
                await settle()
        await settle()
        produced.seconds = time.monotonic() - started
    finally:
        await producer.stop()
    return produced


class JavaProducer:
    """Kafka's VerifiableProducer (an idempotent Java producer, acks=all), values
    `<prefix>.<n>`, one JSON line per acknowledgement."""

    def __init__(
        self, bootstrap: str, topic: str, zone: str, prefix: int, count: int, workdir: Path
    ) -> None:
        self.name = f"java-{prefix}"
        config = workdir / f"{self.name}.properties"
        config.write_text(
            "enable.idempotence=true\nacks=all\nretries=2147483647\nlinger.ms=10\nbatch.size=262144\n"
            f"delivery.timeout.ms=120000\nclient.id={self.name},tierproxy_az={zone}\n"
        )
        self.stderr = workdir / f"{self.name}.err"
        argv = [
            shutil.which("java") or "java",
            "-Xmx256m",
            "-XX:+UseSerialGC",
            "-XX:TieredStopAtLevel=1",
            "-Djava.net.preferIPv4Stack=true",
            "-cp",
            f"{kafka_libs()}/*",
            "org.apache.kafka.tools.VerifiableProducer",
            *("--bootstrap-server", bootstrap, "--topic", topic),
            *("--max-messages", str(count), "--value-prefix", str(prefix)),
            *("--producer.config", str(config)),
        ]
        with open(self.stderr, "wb") as errors:
            self.process = subprocess.Popen(
                argv, stdout=subprocess.PIPE, stderr=errors, stdin=subprocess.DEVNULL, text=True
            )

    def wait(self, timeout: float = 180.0) -> Produced:
        produced = Produced(self.name)
        times = []
        try:
            out, _ = self.process.communicate(timeout=timeout)
        finally:
            if self.process.poll() is None:
                self.process.kill()
                self.process.wait(10)
        assert self.process.returncode == 0, self.stderr.read_text(errors="replace")[-3000:]
        for line in out.splitlines():
            if not line.startswith("{"):
                continue
            event = json.loads(line)
            times.append(event["timestamp"])
            if event["name"] == "producer_send_success":
                value = event["value"].encode()
                produced.acked[value] = (event["partition"], event["offset"])
                produced.sent += 1
            elif event["name"] == "producer_send_error":
                produced.errors.append(event.get("message", line))
                produced.sent += 1
        produced.seconds = (max(times) - min(times)) / 1000 if times else 0.0
        return produced


# -- waiting -----------------------------------------------------------------------------


def wait_for_log(proxy: TieredProxy, text: str, timeout: float, after: int = 0) -> int:
    """Until `text` is in the proxy's log past byte `after`; returns where it is."""
    deadline = time.monotonic() + timeout
    while (at := proxy.process.log_path.read_bytes().find(text.encode(), after)) < 0:
        if not proxy.process.running():
            raise AssertionError(f"{proxy.name} exited:\n{proxy.process.tail(30)}")
        if time.monotonic() > deadline:
            raise AssertionError(
                f"{proxy.name}: no {text!r} in {timeout} s:\n{proxy.process.tail(30)}"
            )
        time.sleep(0.1)
    return at
