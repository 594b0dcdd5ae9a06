"""ListOffsets on a tiered partition answers exactly what Kafka answers for the same log
(proxy/tiered/offsets.py), Kafka itself being the oracle.

The same batches go to a passthrough topic and to a tiered one, through one proxy: two
gzip batches before the cutover (Kafka's part), then, tiered, a zstd, an lz4 and a snappy
batch uploaded to objects, then an uncompressed and a gzip batch only the owner's log
cache holds. Each batch holds several records whose timestamps are out of order, and one
batch is older than the batches before it. Both topics have the same offsets, so every
answer must be equal: earliest, latest, MAX_TIMESTAMP and a timestamp at, just before and
just after every record's, asked with librdkafka (consumer and admin), kafka-python and
aiokafka; then again after DeleteRecords to an offset inside a batch of Kafka's part, and
after DeleteRecords inside a compressed batch of the objects (Kafka's copy of the
partition deleted to its cutover). A consumer seeking to a timestamp's answer then reads
from it: never OFFSET_OUT_OF_RANGE below the log start.

Then the migrated case (docs/offload.md): Kafka's part copied into objects with the offload
jobs' writer and committed as `tierproxy migrate` commits it, then deleted from Kafka.

Leader epochs are compared too: an answer from Kafka's part carries Kafka's epoch, one at
or past the cutover the partition's current leader epoch, as Kafka's epoch cache answers
(every epoch since the cutover starts there).
"""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest
from aiokafka import AIOKafkaConsumer
from aiokafka import TopicPartition as AioTopicPartition
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec
from cutover_load import (
    create_topic,
    one_proxy,
    started,
    tiered_topic_id,
    topics_command,
)

from offload_jobs.cluster_reader import read_batches
from proxy.metadata.streams import offload_object_id, stream_id
from proxy.objects.format import ObjectKind
from proxy.objects.format_writer import ObjectWriter
from proxy.peer.clients import PeerClients
from tests.support.clients import delete_records
from tests.support.kafka_python import KafkaConsumer
from tests.support.kafka_python import TopicPartition as KpTopicPartition
from tests.support.waiting import wait_until

pytestmark = pytest.mark.kafka

T0 = (int(time.time() * 1000) - 3_600_000) // 1000 * 1000
# (codec, timestamps relative to T0) of each batch, in offset order
KAFKA_PART = [("gzip", (30, 10, 50, 20, 40)), ("gzip", (130, 110, 150, 120, 140))]
OBJECTS = [
    ("zstd", (230, 210, 250, 220, 240)),
    ("lz4", (60, 70, 65)),  # older than the batches before it
    ("snappy", (330, 310, 350, 320, 340)),
]
TAIL = [("none", (430, 410, 450, 420, 440)), ("gzip", (530, 510, 900, 520, 540))]
ALL = KAFKA_PART + OBJECTS + TAIL
CUTOVER = sum(len(ts) for _, ts in KAFKA_PART)  # 10
MID_KAFKA = 2  # inside the first batch
MID_OBJECTS = CUTOVER + 2  # inside the zstd batch


def _targets() -> list[int]:
    stamps = {T0 + t for _, ts in ALL for t in ts}
    near = {s + d for s in stamps for d in (-1, 0, 1)}
    return sorted(near | {T0 - 10_000, T0 + 5_000})


def _produce(bootstrap: str, topics: list[str], batches) -> None:
    """Each batch as one producer batch (records queued, then one flush) to each topic."""
    for codec, stamps in batches:
        producer = Producer(
            {
                "bootstrap.servers": bootstrap,
                "compression.type": codec,
                "linger.ms": 5_000,
                "enable.idempotence": True,
            }
        )
        errors: list[str] = []

        def delivered(err, _msg, errors=errors) -> None:
            if err is not None:
                errors.append(str(err))

        for topic in topics:
            for n, t in enumerate(stamps):
                producer.produce(
                    topic,
                    b"%s-%d-%d" % (codec.encode(), t, n) * 10,
                    partition=0,
                    timestamp=T0 + t,
                    on_delivery=delivered,
                )
        assert producer.flush(60) == 0 and not errors, errors


def _lookups(bootstrap: str, topic: str, targets: list[int]) -> dict[int, tuple[int, int]]:
    """librdkafka's offsets_for_times: target -> (offset, leader epoch)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"lo-{uuid.uuid4().hex}"})
    try:
        answers = {}
        for target in targets:
            [found] = consumer.offsets_for_times([TopicPartition(topic, 0, target)], 30)
            assert found.error is None, (target, found.error)
            answers[target] = (found.offset, found.leader_epoch)
        return answers
    finally:
        consumer.close()


def _specials(bootstrap: str, topic: str) -> dict[str, tuple[int, int, int]]:
    """librdkafka's admin list_offsets: spec -> (offset, timestamp, leader epoch)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    specs = {
        "earliest": OffsetSpec.earliest(),
        "latest": OffsetSpec.latest(),
        "max_timestamp": OffsetSpec.max_timestamp(),
    }
    answers = {}
    for name, spec in specs.items():
        [(_, future)] = admin.list_offsets({TopicPartition(topic, 0): spec}).items()
        got = future.result(30)
        answers[name] = (got.offset, got.timestamp, got.leader_epoch)
    return answers


def _kafka_python(bootstrap: str, topic: str, targets: list[int]) -> dict[int, tuple[int, int]]:
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, request_timeout_ms=30_000)
    try:
        tp = KpTopicPartition(topic, 0)
        answers = {}
        for target in targets:
            found = consumer.offsets_for_times({tp: target})[tp]
            answers[target] = (-1, -1) if found is None else (found.offset, found.timestamp)
        return answers
    finally:
        consumer.close()


def _aiokafka(bootstrap: str, topic: str, targets: list[int]) -> dict[int, tuple[int, int]]:
    async def run() -> dict[int, tuple[int, int]]:
        consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap)
        await consumer.start()
        try:
            tp = AioTopicPartition(topic, 0)
            answers = {}
            for target in targets:
                found = (await consumer.offsets_for_times({tp: target}))[tp]
                answers[target] = (-1, -1) if found is None else (found.offset, found.timestamp)
            return answers
        finally:
            await consumer.stop()

    return asyncio.run(run())


def _first_read(bootstrap: str, topic: str, offset: int, leader_epoch: int | None = None) -> int:
    """The offset of the first record a consumer gets from `offset` (no reset allowed);
    with `leader_epoch`, librdkafka first validates the position with OffsetForLeaderEpoch
    (a log that ends below it would be a truncation)."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"seek-{uuid.uuid4().hex}",
            "auto.offset.reset": "error",
        }
    )
    epoch = {} if leader_epoch is None else {"leader_epoch": leader_epoch}
    consumer.assign([TopicPartition(topic, 0, offset, **epoch)])
    try:
        for _ in range(120):
            msg = consumer.poll(0.5)
            if msg is not None:
                assert msg.error() is None, (offset, msg.error())
                return msg.offset()
    finally:
        consumer.close()
    raise AssertionError(f"nothing read from {topic} at {offset}")


def _compare(bootstrap: str, plain: str, tiered: str, log_start: int) -> None:
    """Every answer equal on both topics, leader epochs included."""
    targets = _targets()
    want, got = _lookups(bootstrap, plain, targets), _lookups(bootstrap, tiered, targets)
    diverged = {t: (want[t], got[t]) for t in targets if want[t] != got[t]}
    assert not diverged, f"target: (Kafka's (offset, epoch), the tiered topic's): {diverged}"
    assert all(o == -1 or o >= log_start for o, _ in got.values())
    want_s, got_s = _specials(bootstrap, plain), _specials(bootstrap, tiered)
    assert want_s == got_s
    assert want_s["earliest"][0] == log_start
    assert want_s["latest"][0] == sum(len(ts) for _, ts in ALL)
    assert want_s["max_timestamp"][:2] == (30, T0 + 900)
    some = targets[:: max(1, len(targets) // 25)]
    assert _kafka_python(bootstrap, plain, some) == _kafka_python(bootstrap, tiered, some)
    assert _aiokafka(bootstrap, plain, some) == _aiokafka(bootstrap, tiered, some)


def test_tiered_list_offsets_answer_as_kafka_does(kafka_cluster, tmp_path):
    suffix = uuid.uuid4().hex[:8]
    plain, tiered = f"lo-plain-{suffix}", f"lo-tiered-{suffix}"
    for topic in (plain, tiered):
        create_topic(kafka_cluster, topic, 1)
    with one_proxy(kafka_cluster, tmp_path, f"lo-{suffix}", upload_interval_s=3600.0) as proxy:
        tiering = proxy.proxy.tiering
        _produce(proxy.bootstrap, [plain, tiered], KAFKA_PART)
        assert topics_command("tier", tiered, tiering.peer_port).returncode == 0
        stream = stream_id(tiered_topic_id(proxy, tiered), 0)
        wait_until(lambda: started(tiering, stream), 30, "owned")
        assert tiering.state(stream).cutover(stream) == CUTOVER
        _produce(proxy.bootstrap, [plain, tiered], OBJECTS)
        proxy.run(lambda: tiering.uploader.flush())
        objects_end = CUTOVER + sum(len(ts) for _, ts in OBJECTS)
        wait_until(lambda: tiering.state(stream).stream_end(stream) == objects_end, 30, "upload")
        _produce(proxy.bootstrap, [plain, tiered], TAIL)  # the owner's log cache only

        _compare(proxy.bootstrap, plain, tiered, 0)
        # seek with the epoch answered, in Kafka's part, the objects and the tail: the
        # position is validated and read, never truncated or reset
        for stamp in (T0 + 130, T0 + 230, T0 + 330, T0 + 430, T0 + 900):
            [(offset, epoch)] = _lookups(proxy.bootstrap, tiered, [stamp]).values()
            assert epoch is not None and epoch >= 0, (stamp, offset, epoch)
            assert _first_read(proxy.bootstrap, tiered, offset, epoch) == offset

        # inside a batch of Kafka's part: Kafka's log start there, the stream's follows
        for topic in (plain, tiered):
            assert delete_records(proxy.bootstrap, {(topic, 0): MID_KAFKA}) == {
                (topic, 0): MID_KAFKA
            }
        wait_until(
            lambda: tiering.state(stream).stream(stream).log_start_offset == MID_KAFKA, 30, "trim"
        )
        _compare(proxy.bootstrap, plain, tiered, MID_KAFKA)

        # inside the zstd batch in the objects: answered from the objects alone
        for topic in (plain, tiered):
            assert delete_records(proxy.bootstrap, {(topic, 0): MID_OBJECTS}) == {
                (topic, 0): MID_OBJECTS
            }
        wait_until(
            lambda: tiering.state(stream).stream(stream).log_start_offset == MID_OBJECTS, 30, "trim"
        )
        _compare(proxy.bootstrap, plain, tiered, MID_OBJECTS)
        # the zstd batch's first record at or after 225 is offset 10 (230), below the log start
        [found] = _lookups(proxy.bootstrap, tiered, [T0 + 225]).values()
        assert found[0] == MID_OBJECTS
        assert _first_read(proxy.bootstrap, tiered, found[0]) == MID_OBJECTS

        # past the batch of the largest timestamp, inside a later one: Kafka counts the
        # segment holding its log start whole, the deleted record included, and so does
        # the stream the object range holding its log start (the delete uploads the tail
        # and the batch in one object)
        _produce(proxy.bootstrap, [plain, tiered], [("lz4", (610, 605, 620))])
        later = sum(len(ts) for _, ts in ALL) + 1  # inside the lz4 batch
        for topic in (plain, tiered):
            assert delete_records(proxy.bootstrap, {(topic, 0): later}) == {(topic, 0): later}
        wait_until(
            lambda: tiering.state(stream).stream(stream).log_start_offset == later, 30, "trim"
        )
        (holding,) = tiering.state(stream).objects_for(stream, later, limit=1)
        assert holding.start_offset <= 30 < later  # the largest timestamp's record, deleted
        want_s, got_s = _specials(proxy.bootstrap, plain), _specials(proxy.bootstrap, tiered)
        assert want_s["max_timestamp"][:2] == (30, T0 + 900)
        assert want_s == got_s


def test_kafka_answers_past_the_cutover_are_clamped_and_noted(kafka_cluster, tmp_path):
    """Records written to a broker directly, past a tiered partition's cutover, are not the
    partition's: no ListOffsets answer comes from them (timestamps, MAX_TIMESTAMP). Such
    answers are not counted (tierproxy_kafka_beyond_cutover): a ListOffsets answer cannot
    tell them from transaction markers, which are expected there."""
    suffix = uuid.uuid4().hex[:8]
    topic = f"lo-beyond-{suffix}"
    create_topic(kafka_cluster, topic, 1)
    with one_proxy(kafka_cluster, tmp_path, f"lob-{suffix}", upload_interval_s=3600.0) as proxy:
        tiering = proxy.proxy.tiering
        _produce(proxy.bootstrap, [topic], [("gzip", (10, 30, 20, 50, 40))])  # offsets 0-4
        assert topics_command("tier", topic, tiering.peer_port).returncode == 0
        stream = stream_id(tiered_topic_id(proxy, topic), 0)
        wait_until(lambda: started(tiering, stream), 30, "owned")
        assert tiering.state(stream).cutover(stream) == 5
        _produce(proxy.bootstrap, [topic], [("zstd", (100, 110, 120, 130, 140))])  # 5-9
        _produce(kafka_cluster.bootstrap, [topic], [("none", (10_000, 10_001))])  # Kafka's 5-6

        before = tiering.beyond_cutover.counts.get("list_offsets", 0)
        answers = _lookups(proxy.bootstrap, topic, [T0 + 5_000, T0 + 120, T0 + 35])
        assert [offset for offset, _ in answers.values()] == [-1, 7, 3]
        specials = _specials(proxy.bootstrap, topic)
        assert specials["max_timestamp"][:2] == (9, T0 + 140)
        assert specials["earliest"][0] == 0 and specials["latest"][0] == 10
        assert tiering.beyond_cutover.counts.get("list_offsets", 0) == before == 0


def _backfill(proxy, bootstrap: str, topic: str, stream: int, end: int) -> None:
    """What `tierproxy migrate --from-cluster` does, without Spark: Kafka's batches of
    [0, end) in one stream object (the offload jobs' writer, so with the time index),
    uploaded, and committed through the owner's peer listener."""
    batches = list(read_batches(bootstrap, topic, 0, 0, end))
    object_id = offload_object_id(stream, 0, end)
    writer = ObjectWriter(object_id, ObjectKind.STREAM)
    writer.add_batches(stream, b"".join(b.data for b in batches), max_block_bytes=200)
    built = writer.build()
    assert len(built.index) > 1 and all(e.max_timestamp is not None for e in built.index)
    tiering = proxy.proxy.tiering
    proxy.run(lambda: tiering.store.put(built.key, built.to_bytes()))

    async def commit() -> tuple[int, str]:
        clients = PeerClients()
        try:
            address = ("127.0.0.1", tiering.peer_port)
            return await clients.backfill(address, object_id, built.size, stream, 0, end)
        finally:
            await clients.close()

    assert asyncio.run(commit())[0] == 0
    wait_until(lambda: not tiering.state(stream).backfill_gaps(stream), 30, "backfilled")


def test_migrated_ranges_answer_from_the_objects_once_kafkas_copy_is_gone(kafka_cluster, tmp_path):
    """Kafka's part moved into objects (as `tierproxy migrate` does), then deleted from
    Kafka: timestamps and MAX_TIMESTAMP in the migrated range are answered from the
    objects, exactly as Kafka answered them while it held the records."""
    suffix = uuid.uuid4().hex[:8]
    topic = f"lo-migrated-{suffix}"
    create_topic(kafka_cluster, topic, 1)
    migrated = [
        ("gzip", (30, 10, 50, 20, 40)),
        ("snappy", (130, 110, 900, 120, 140)),  # the log's largest timestamp
        ("lz4", (60, 70, 65)),
        ("zstd", (230, 210, 250, 220, 240)),
    ]
    cutover = sum(len(ts) for _, ts in migrated)
    with one_proxy(kafka_cluster, tmp_path, f"lom-{suffix}", upload_interval_s=3600.0) as proxy:
        tiering = proxy.proxy.tiering
        _produce(proxy.bootstrap, [topic], migrated)
        assert topics_command("tier", topic, tiering.peer_port).returncode == 0
        stream = stream_id(tiered_topic_id(proxy, topic), 0)
        wait_until(lambda: started(tiering, stream), 30, "owned")
        assert tiering.state(stream).cutover(stream) == cutover
        _produce(proxy.bootstrap, [topic], [("zstd", (330, 310, 350))])  # the stream's
        stamps = sorted({T0 + t + d for _, ts in migrated for t in ts for d in (-1, 0, 1)})
        kafkas = _lookups(kafka_cluster.bootstrap, topic, stamps)
        kafkas_specials = _specials(kafka_cluster.bootstrap, topic)
        kafkas_max = kafkas_specials["max_timestamp"]
        assert kafkas_max[:2] == (7, T0 + 900)

        _backfill(proxy, kafka_cluster.bootstrap, topic, stream, cutover)
        admin = AdminClient({"bootstrap.servers": kafka_cluster.bootstrap})
        [deleted] = admin.delete_records([TopicPartition(topic, 0, cutover)]).values()
        assert deleted.result(60).low_watermark == cutover

        got = _lookups(proxy.bootstrap, topic, stamps)
        in_kafkas_part = {t: kafkas[t] for t in stamps if 0 <= kafkas[t][0] < cutover}
        assert {t: got[t] for t in in_kafkas_part} == in_kafkas_part
        specials = _specials(proxy.bootstrap, topic)
        assert specials["max_timestamp"] == kafkas_max
        assert specials["earliest"] == kafkas_specials["earliest"]  # the batch's epoch
        assert specials["earliest"][0] == 0 and specials["latest"][0] == cutover + 3
