"""Consumers of a tiered topic read it across its cutover, with every client.

One proxy owns every metadata shard. A topic gets records through Kafka (passthrough),
is tiered, gets records the uploader then commits to objects, and a tail that stays in
the owner's log cache (uploads only on demand here). librdkafka, aiokafka, kafka-python
and Java's VerifiableConsumer each read it from the beginning in a group of their own:
every record once, at the offset its producer was told, in order per partition: below
the cutover from Kafka, above it from the objects and the log cache. librdkafka's group
then resumes from its committed offsets, and a consumer at the end sees a new record
within its max wait.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import subprocess
import time
import uuid
import warnings

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from cutover_load import create_topic, proxy_config, tiered_topic_id, topics_command, wait_owned

from proxy.config import parse_config
from proxy.devstack.paths import free_port_block, kafka_libs
from proxy.devstack.proxy_thread import ProxyThread
from proxy.metadata.streams import stream_id
from tests.support.waiting import wait_until

pytestmark = pytest.mark.kafka

PARTITIONS = 3
SHARDS = 2
BEFORE, MIDDLE, TAIL = 1500, 1500, 600  # records: through Kafka, uploaded, log cache only
TIMESTAMPS: dict[tuple[int, int], int] = {}


def _produce(bootstrap: str, topic: str, prefix: str, count: int) -> dict[bytes, tuple[int, int]]:
    """value -> (partition, offset) of each acknowledged record (idempotent, acks=all);
    TIMESTAMPS gets each one's (partition, offset) -> timestamp."""
    acked: dict[bytes, tuple[int, int]] = {}
    errors: list[str] = []

    def delivered(err, msg) -> None:
        if err is not None:
            errors.append(str(err))
        else:
            acked[msg.value()] = (msg.partition(), msg.offset())
            TIMESTAMPS[msg.partition(), msg.offset()] = msg.timestamp()[1]

    producer = Producer(
        {"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5}
    )
    for n in range(count):
        producer.produce(topic, f"{prefix}-{n}".encode(), partition=n % PARTITIONS,
                         on_delivery=delivered)  # fmt: skip
        producer.poll(0)
    assert producer.flush(60) == 0
    assert not errors, errors[:5]
    return acked


def _by_partition(acked: dict[bytes, tuple[int, int]]) -> dict[int, list[tuple[int, bytes]]]:
    out: dict[int, list[tuple[int, bytes]]] = {p: [] for p in range(PARTITIONS)}
    for value, (partition, offset) in acked.items():
        out[partition].append((offset, value))
    return {p: sorted(v) for p, v in out.items()}


def _librdkafka(bootstrap: str, topic: str, group: str, want: int, commit_after: int | None = None):
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([topic])
    got: list[tuple[int, int, bytes]] = []
    deadline = time.monotonic() + 90
    try:
        while len(got) < want and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            assert msg.error() is None, msg.error()
            got.append((msg.partition(), msg.offset(), msg.value()))
            if commit_after is not None and len(got) == commit_after:
                consumer.commit(asynchronous=False)
                break
    finally:
        consumer.close()
    return got


async def _aiokafka(bootstrap: str, topic: str, group: str, want: int):
    from aiokafka import AIOKafkaConsumer

    consumer = AIOKafkaConsumer(
        topic, bootstrap_servers=bootstrap, group_id=group, auto_offset_reset="earliest"
    )
    await consumer.start()
    got: list[tuple[int, int, bytes]] = []
    try:
        deadline = time.monotonic() + 90
        while len(got) < want and time.monotonic() < deadline:
            batches = await consumer.getmany(timeout_ms=500)
            for records in batches.values():
                got.extend((r.partition, r.offset, r.value) for r in records)
    finally:
        await consumer.stop()
    return got


def _kafka_python(bootstrap: str, topic: str, group: str, want: int):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from kafka import KafkaConsumer

        consumer = KafkaConsumer(
            topic, bootstrap_servers=bootstrap, group_id=group, auto_offset_reset="earliest"
        )
        got: list[tuple[int, int, bytes]] = []
        try:
            deadline = time.monotonic() + 90
            while len(got) < want and time.monotonic() < deadline:
                for records in consumer.poll(timeout_ms=500).values():
                    got.extend((r.partition, r.offset, r.value) for r in records)
        finally:
            consumer.close()
    return got


def _java(bootstrap: str, topic: str, group: str, want: int, tmp_path):
    argv = [
        shutil.which("java") or "java",
        *("-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1"),
        "-Djava.net.preferIPv4Stack=true",
        *("-cp", f"{kafka_libs()}/*", "org.apache.kafka.tools.VerifiableConsumer"),
        *("--bootstrap-server", bootstrap, "--topic", topic, "--group-id", group),
        *("--max-messages", str(want), "--reset-policy", "earliest", "--verbose"),
    ]
    errors = tmp_path / "java-consumer.err"
    with open(errors, "wb") as err:
        done = subprocess.run(argv, capture_output=False, stdout=subprocess.PIPE, stderr=err,
                              stdin=subprocess.DEVNULL, text=True, timeout=180)  # fmt: skip
    assert done.returncode == 0, errors.read_text(errors="replace")[-3000:]
    got = []
    for line in done.stdout.splitlines():
        if line.startswith("{"):
            event = json.loads(line)
            if event["name"] == "record_data":
                got.append((event["partition"], event["offset"], event["value"].encode()))
    return got


def _check(client: str, got, expected: dict[int, list[tuple[int, bytes]]]) -> None:
    for partition, records in expected.items():
        read = [(offset, value) for p, offset, value in got if p == partition]
        pairs = enumerate(zip(read, records, strict=False))
        differs = next((i for i, (a, b) in pairs if a != b), None)
        assert read == records, (
            f"{client}, partition {partition}: read {len(read)} records, expected "
            f"{len(records)}; first difference at {differs}"
        )


def test_every_client_reads_a_tiered_topic_across_the_cutover(kafka_cluster, tmp_path):
    suffix = uuid.uuid4().hex[:8]
    topic = f"read-{suffix}"
    create_topic(kafka_cluster, topic, PARTITIONS)
    base = free_port_block(8)
    config = proxy_config(
        kafka_cluster, tmp_path, f"r-{suffix}", "zone-a", suffix, base, upload_interval_s=3600.0
    )
    with ProxyThread(parse_config(config)) as proxy:
        wait_owned([proxy], SHARDS)
        tiering = proxy.proxy.tiering
        acked = _produce(proxy.bootstrap, topic, "before", BEFORE)
        assert topics_command("tier", topic, tiering.peer_port).returncode == 0
        topic_id = tiered_topic_id(proxy, topic)
        streams = [stream_id(topic_id, p) for p in range(PARTITIONS)]
        deadline = time.monotonic() + 30
        while any(tiering.partitions.get(s) is None for s in streams):
            assert time.monotonic() < deadline, "the partitions did not start"
            time.sleep(0.1)
        cutover = {p: tiering.state(s).cutover(s) for p, s in enumerate(streams)}
        assert sum(cutover.values()) == BEFORE
        acked |= _produce(proxy.bootstrap, topic, "middle", MIDDLE)
        proxy.run(lambda: tiering.uploader.flush())
        # flush() returns once the shards' owner wrote the commits; the service's own
        # metadata readers (what `state` is) apply them when they read them, a moment on
        wait_until(
            lambda: all(tiering.state(s).stream_end(s) > cutover[p] for p, s in enumerate(streams)),
            30,
            "the uploads' commits read by the service",
        )
        acked |= _produce(proxy.bootstrap, topic, "tail", TAIL)
        total = BEFORE + MIDDLE + TAIL
        assert len(acked) == total
        for value, (partition, offset) in acked.items():
            phase = value.split(b"-")[0]
            assert (offset < cutover[partition]) == (phase == b"before"), (value, offset)
        expected = _by_partition(acked)

        _check("librdkafka", _librdkafka(proxy.bootstrap, topic, f"g1-{suffix}", total), expected)
        got = asyncio.run(_aiokafka(proxy.bootstrap, topic, f"g2-{suffix}", total))
        _check("aiokafka", sorted(got), expected)
        _check("kafka-python", sorted(_kafka_python(proxy.bootstrap, topic, f"g3-{suffix}", total)),
               expected)  # fmt: skip
        _check("java", sorted(_java(proxy.bootstrap, topic, f"g4-{suffix}", total, tmp_path)),
               expected)  # fmt: skip
        # the objects and the log cache both served reads
        assert tiering.block_cache.misses > 0 and tiering.block_cache.hits > 0
        assert tiering.log_cache.hits > 0

        # ListOffsets: earliest from Kafka, latest and timestamps answered by the proxy
        _check_offsets(proxy.bootstrap, topic, expected, cutover)

        # a group resumes from its committed offsets
        group = f"g5-{suffix}"
        first = _librdkafka(proxy.bootstrap, topic, group, total, commit_after=total // 2)
        rest = _librdkafka(proxy.bootstrap, topic, group, total - len(first))
        _check("librdkafka resumed", sorted(first + rest), expected)

        took = _tail(proxy.bootstrap, proxy.bootstrap, topic, 0, len(expected[0]))
        print(f"a consumer at the end got a new record {took:.3f} s after it was sent")


def _check_offsets(bootstrap: str, topic: str, expected, cutover: dict[int, int]) -> None:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"offsets-{topic}"})
    try:
        for partition, records in expected.items():
            tp = TopicPartition(topic, partition)
            assert consumer.get_watermark_offsets(tp, timeout=30) == (0, len(records))
            # a record of each part: Kafka's, the objects', the log cache's
            for offset in (cutover[partition] // 2, cutover[partition] + 10, len(records) - 5):
                stamp = TIMESTAMPS[partition, offset]
                first = min(o for o, _ in records if TIMESTAMPS[partition, o] >= stamp)
                [found] = consumer.offsets_for_times([TopicPartition(topic, partition, stamp)], 30)
                assert found.offset == first, (partition, offset, stamp, found.offset, first)
            late = TopicPartition(topic, partition, max(TIMESTAMPS.values()) + 60_000)
            [found] = consumer.offsets_for_times([late], 30)
            assert found.offset == -1  # no record that late: Kafka answers -1 too
    finally:
        consumer.close()


def test_a_proxy_not_owning_a_partition_serves_its_tail_from_the_owner(kafka_cluster, tmp_path):
    """Two proxies in two zones own a metadata shard each; nothing is uploaded (uploads on
    demand only). A consumer reads, through its zone's proxy, a partition the other proxy
    owns: the whole tail comes from the owner's log cache over the peer protocol, with the
    owner's high watermark, and a consumer parked at the end wakes on a new record. Then,
    uploaded, the same records come from the objects, read in the consumer's zone."""
    suffix = uuid.uuid4().hex[:8]
    topic = f"tail-{suffix}"
    create_topic(kafka_cluster, topic, 4)
    base = free_port_block(16)
    proxies = []
    with contextlib.ExitStack() as stack:
        for n, zone in enumerate(("zone-a", "zone-b")):
            config = proxy_config(
                kafka_cluster, tmp_path, f"t{n}-{suffix}", zone, suffix, base + 8 * n,
                upload_interval_s=3600.0,
            )  # fmt: skip
            proxies.append(stack.enter_context(ProxyThread(parse_config(config))))
            if n == 0:
                wait_owned(proxies, SHARDS)
        a, b = proxies
        deadline = time.monotonic() + 60
        while not all(_owned_shards(p) == 1 for p in proxies):
            assert time.monotonic() < deadline, "the shards were not shared"
            time.sleep(0.2)
        assert topics_command("tier", topic, a.proxy.tiering.peer_port).returncode == 0
        topic_id = tiered_topic_id(b, topic)
        partition, stream = 0, stream_id(topic_id, 0)
        owner, reader = (a, b) if a.proxy.tiering.owned_here(stream) else (b, a)
        owner_zone, reader_zone = owner.proxy.config.fleet.zone, reader.proxy.config.fleet.zone
        deadline = time.monotonic() + 30
        while owner.proxy.tiering.partitions.get(stream) is None:
            assert time.monotonic() < deadline, "the partition did not start"
            time.sleep(0.1)
        assert reader.proxy.tiering.partitions.get(stream) is None

        values = [f"v-{n}".encode() for n in range(500)]
        producer = Producer(
            {"bootstrap.servers": owner.bootstrap, "enable.idempotence": True,
             "client.id": f"w,tierproxy_az={owner_zone}"}
        )  # fmt: skip
        for value in values:
            producer.produce(topic, value, partition=partition)
        assert producer.flush(30) == 0
        assert reader.proxy.tiering.state(stream).stream_end(stream) == 0, "uploaded already"

        def read_elsewhere(group: str, values: list[bytes]) -> list[bytes]:
            consumer = Consumer(
                {"bootstrap.servers": reader.bootstrap, "group.id": group,
                 "client.id": f"r,tierproxy_az={reader_zone}"}
            )  # fmt: skip
            try:
                tp = TopicPartition(topic, partition)
                assert consumer.get_watermark_offsets(tp, timeout=30) == (0, len(values))
                consumer.assign([TopicPartition(topic, partition, 0)])
                got: list[bytes] = []
                deadline = time.monotonic() + 60
                while len(got) < len(values) and time.monotonic() < deadline:
                    msg = consumer.poll(0.2)
                    if msg is not None:
                        assert msg.error() is None, msg.error()
                        assert msg.offset() == len(got)
                        got.append(msg.value())
                return got
            finally:
                consumer.close()

        before = _peer_bytes(reader, "tail_answer")
        assert read_elsewhere(f"g1-{suffix}", values) == values
        assert _peer_bytes(reader, "tail_answer") - before > sum(map(len, values))

        zones = (reader_zone, owner_zone)
        end = _tail(reader.bootstrap, owner.bootstrap, topic, partition, len(values), zones)
        print(f"a consumer at the end, not on the owner, got a new record {end:.3f} s later")

        owner.run(lambda: owner.proxy.tiering.uploader.flush())
        deadline = time.monotonic() + 30
        while (reader.proxy.tiering.state(stream).stream_end(stream) or 0) < len(values) + 1:
            assert time.monotonic() < deadline, "the reader did not read the commit"
            time.sleep(0.1)
        before, gets = _peer_bytes(reader, "tail_answer"), reader.proxy.tiering.block_cache.gets
        values.append(b"new")
        assert read_elsewhere(f"g2-{suffix}", values) == values
        # what still went to the owner: its high watermark and long polls at the end,
        # answers without records
        from_owner = _peer_bytes(reader, "tail_answer") - before
        assert from_owner < sum(map(len, values)), "read from the owner"
        assert reader.proxy.tiering.block_cache.gets > gets


def _owned_shards(proxy: ProxyThread) -> int:
    assignment = proxy.proxy.tiering.assignment
    return sum(assignment.owner(k) is not None for k in range(SHARDS))


def _peer_bytes(proxy: ProxyThread, direction: str) -> float:
    total = 0.0
    for metric in proxy.proxy.metrics.registry.collect():
        for sample in metric.samples:
            if (
                sample.name == "tierproxy_peer_bytes_total"
                and sample.labels.get("direction") == direction
            ):
                total += sample.value
    return total


def _tail(
    bootstrap: str,
    producer_bootstrap: str,
    topic: str,
    partition: int,
    end: int,
    zones: tuple[str, str] = ("zone-a", "zone-a"),
):
    """Seconds from sending a record (through `producer_bootstrap`) to a consumer parked
    at the partition's end (through `bootstrap`) getting it; `zones`: the consumer's and
    the producer's."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"tail-{bootstrap}-{topic}",
            "fetch.wait.max.ms": 500,
            "client.id": f"t,tierproxy_az={zones[0]}",
        }
    )
    producer = Producer(
        {
            "bootstrap.servers": producer_bootstrap,
            "enable.idempotence": True,
            "client.id": f"p,tierproxy_az={zones[1]}",
        }
    )
    try:
        consumer.assign([TopicPartition(topic, partition, end)])
        parked = time.monotonic() + 2
        while time.monotonic() < parked:
            assert consumer.poll(0.2) is None, "a record before the new one"
        sent = time.monotonic()
        producer.produce(topic, b"new", partition=partition)
        assert producer.flush(30) == 0
        while time.monotonic() < sent + 30:
            msg = consumer.poll(0.1)
            if msg is not None:
                assert msg.error() is None, msg.error()
                assert (msg.value(), msg.offset()) == (b"new", end)
                return time.monotonic() - sent
        raise AssertionError("the new record never came")
    finally:
        consumer.close()
