"""What Kafka refuses or rewrites on produce, on a tiered topic as on a passthrough one
(produce_rules.py, docs/tiering.md "What a tiered partition refuses"): the same Produce
requests, raw (Produce v9: the whole partition answer, record errors included) and
through librdkafka and aiokafka, to a passthrough and a tiered topic created with the same
configs, through a two-proxy fleet. Kafka is the oracle: the answers must be equal."""

from __future__ import annotations

import asyncio
import re
import time
import uuid

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.errors import KafkaError
from confluent_kafka import TIMESTAMP_LOG_APPEND_TIME, Consumer, KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewTopic
from kio.schema.metadata.v12.request import MetadataRequest, MetadataRequestTopic
from kio.schema.metadata.v12.response import MetadataResponse
from kio.schema.types import TopicName
from raw_kafka import call, produce_v9
from tieredfleet import TieredFleet

from tests.support.batches import build_batch, patched
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.kafka, pytest.mark.minio]

HOUR = 3_600_000
ZONE = "zone-a"
ZONES = ("zone-a", "zone-b")
CLIENT_ID = f"produce-rules,tierproxy_az={ZONE}"


@pytest.fixture(scope="module")
def fleet(kafka_cluster, s3_server, tmp_path_factory):
    with TieredFleet(
        kafka_cluster.bootstrap,
        s3_server,
        tmp_path_factory.mktemp("produce-rules"),
        zones=("zone-a", "zone-b"),
        shard_count=2,
    ) as fleet:
        yield fleet


def topics(fleet: TieredFleet, kafka_cluster, config: dict[str, str] | None = None):
    """A passthrough and a tiered topic (one partition each) with the same configs."""
    tag = uuid.uuid4().hex[:8]
    names = (f"rules-pass-{tag}", f"rules-tier-{tag}")
    admin = AdminClient({"bootstrap.servers": kafka_cluster.bootstrap})
    futures = admin.create_topics([NewTopic(n, 1, 3, config=config or {}) for n in names])
    for future in futures.values():
        future.result(30)
    fleet.tier(names[1])
    return names


# -- raw Produce v9 ---------------------------------------------------------------------


def _leader(fleet: TieredFleet, topic: str, zone: str) -> tuple[str, int]:
    """The address the zone's proxy gives for the partition's leader (its own listener)."""
    host, port = fleet[zone].bootstrap.rsplit(":", 1)
    request = MetadataRequest(
        topics=(MetadataRequestTopic(topic_id=None, name=TopicName(topic)),),
        allow_auto_topic_creation=False,
        include_topic_authorized_operations=False,
    )

    def leader():
        answer = call((host, int(port)), request, MetadataResponse)
        brokers = {int(b.node_id): (b.host, int(b.port)) for b in answer.brokers}
        partitions = [p for t in answer.topics for p in t.partitions if int(t.error_code) == 0]
        return brokers.get(int(partitions[0].leader_id)) if partitions else None

    return wait_for(leader, lambda found: found is not None, f"a leader for {topic}")


def produce_raw(fleet: TieredFleet, topic: str, records: bytes, zone: str = ZONE):
    """The partition's answer to Produce v9 (acks=all) of `records`, as comparable data:
    (error, base offset, log append time, record errors, error message)."""
    part = produce_v9(_leader(fleet, topic, zone), topic, 0, records)
    append_time = part.log_append_time
    return (
        part.error_code.name,
        int(part.base_offset),
        None if append_time is None else round(append_time.timestamp() * 1000),
        tuple((int(e.batch_index), e.batch_index_error_message) for e in part.record_errors),
        part.error_message,
    )


def batch(timestamps, *, codec: int = 0, keys=None, value: bytes = b"v" * 20) -> bytes:
    keys = [b"k%d" % n for n in range(len(timestamps))] if keys is None else keys
    return build_batch([value] * len(timestamps), keys=keys, timestamps=timestamps, codec=codec)


def same_answers(fleet, names, records: bytes, what: str, *, message: bool = True, zones=(ZONE,)):
    """Kafka's answer, and the tiered topic's through the proxy of each of `zones` (its
    stream's owner or not) equal to it. `message`: compare the top-level error message too
    (the sequencer's refusals say why where Kafka says nothing: docs/tiering.md)."""
    passthrough = produce_raw(fleet, names[0], records)
    kafka = _alike(passthrough, names)
    if not message:
        assert kafka[4] is None, what
    for zone in zones:
        ours = _alike(produce_raw(fleet, names[1], records, zone), names)
        if message:
            assert ours == kafka, (what, zone)
        else:
            assert ours[:4] == kafka[:4], (what, zone)
    return passthrough


def _alike(answer, names):
    """An answer with the topic's name and the clock's bounds left out of its messages
    (the two topics are written a few ms apart)."""
    error, base, append, record_errors, message = answer

    def rename(text):
        if text is None:
            return None
        text = text.replace(names[0], "<topic>").replace(names[1], "<topic>")
        return re.sub(r"within \[-?\d+, -?\d+\]", "within [<now>]", text)

    return error, base, append, tuple((i, rename(m)) for i, m in record_errors), rename(message)


def test_refused_batches_get_kafkas_answer_and_write_nothing(fleet, kafka_cluster):
    names = topics(fleet, kafka_cluster, {"max.message.bytes": "3000"})
    now = int(time.time() * 1000)
    good = batch([now, now + 1])
    cases = {
        "a record 2 h ahead": batch([now, now + 2 * HOUR, now + 5], codec=1),
        "two batches": good + good,
        "magic 1": patched(good, 16, ">b", 1),
        "base offset 5": patched(good, 0, ">q", 5),
        "above max.message.bytes": batch([now], value=b"x" * 4000),
    }
    for what, records in cases.items():
        error, *_ = same_answers(fleet, names, records, what, zones=ZONES)
        assert error != "none", what
    sequencers = {  # refused by the owner's sequencer, with a message Kafka does not send
        "a wrong CRC": patched(good, 17, ">I", 1, fix_crc=False),
        "a count that is not the offset delta + 1": patched(good, 57, ">i", 7),
    }
    for what, records in sequencers.items():
        error, *_ = same_answers(fleet, names, records, what, message=False, zones=ZONES)
        assert error != "none", what
    error, base, *_ = same_answers(fleet, names, good, "a good batch after them")
    assert (error, base) == ("none", 0)


def test_a_compacted_topic_refuses_records_without_keys(fleet, kafka_cluster):
    names = topics(fleet, kafka_cluster, {"cleanup.policy": "compact"})
    now = int(time.time() * 1000)
    null_keys = batch([now] * 5, keys=[b"a", None, b"b", None, b""])
    error, *_ = same_answers(fleet, names, null_keys, "null keys", zones=ZONES)
    assert error == "invalid_record"
    assert same_answers(fleet, names, batch([now], keys=[b"a"]), "a key")[:2] == ("none", 0)


def test_a_log_append_time_topic_answers_its_append_time(fleet, kafka_cluster):
    names = topics(fleet, kafka_cluster, {"message.timestamp.type": "LogAppendTime"})
    before = int(time.time() * 1000)
    answers = [produce_raw(fleet, name, batch([before - 5 * HOUR, before])) for name in names]
    after = int(time.time() * 1000)
    for error, base, append_time, _, _ in answers:
        assert (error, base) == ("none", 0)
        assert before <= append_time <= after
    # a producer may not say LogAppendTime itself
    stamped = patched(batch([before]), 21, ">h", 0x08)
    same_answers(fleet, names, stamped, "a producer's LogAppendTime", zones=ZONES)


# -- clients ----------------------------------------------------------------------------


def librdkafka_produce(
    fleet, topic: str, timestamps: list[int], *, batch_each: bool = False
) -> list[tuple]:
    """(error name or offset, timestamp type) per record, in one batch as librdkafka
    makes it (its batching is its own: a record may go alone), or with `batch_each` each
    record in a batch of its own (flushed before the next)."""
    answers: list[tuple] = []

    def delivered(err, msg):
        kind = msg.timestamp()[0]
        answers.append((err.name() if err else msg.offset(), kind == TIMESTAMP_LOG_APPEND_TIME))

    producer = Producer(
        {
            "bootstrap.servers": fleet.bootstrap(),
            "client.id": CLIENT_ID,
            "linger.ms": 50,
            "message.timeout.ms": 30000,
            "retries": 0,
        }
    )
    for n, ts in enumerate(timestamps):
        producer.produce(topic, b"v%d" % n, b"k", partition=0, timestamp=ts, on_delivery=delivered)
        if batch_each:
            assert producer.flush(60) == 0
    assert producer.flush(60) == 0
    return answers


async def aiokafka_produce(fleet, topic: str, timestamps: list[int]) -> list[tuple]:
    producer = AIOKafkaProducer(
        bootstrap_servers=fleet.bootstrap(), client_id=CLIENT_ID, linger_ms=50
    )
    await producer.start()
    try:
        sent = [
            await producer.send(topic, b"v%d" % n, b"k", partition=0, timestamp_ms=ts)
            for n, ts in enumerate(timestamps)
        ]
        answers = []
        for future in sent:
            try:
                meta = await future
                answers.append((meta.offset, meta.timestamp_type == 1))
            except KafkaError as exc:
                answers.append((type(exc).__name__, None))
        return answers
    finally:
        await producer.stop()


def librdkafka_read(fleet, topic: str, count: int) -> list[tuple]:
    consumer = Consumer(
        {
            "bootstrap.servers": fleet.bootstrap(),
            "client.id": CLIENT_ID,
            "group.id": f"rules-{uuid.uuid4().hex[:8]}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([topic])
    out: list[tuple] = []
    deadline = time.monotonic() + 60
    try:
        while len(out) < count and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            if msg.error():
                raise KafkaException(msg.error())
            kind, ts = msg.timestamp()
            out.append((msg.offset(), msg.value(), int(kind == TIMESTAMP_LOG_APPEND_TIME), ts))
    finally:
        consumer.close()
    return out


async def aiokafka_read(fleet, topic: str, count: int) -> list[tuple]:
    consumer = AIOKafkaConsumer(bootstrap_servers=fleet.bootstrap(), client_id=CLIENT_ID)
    await consumer.start()
    try:
        tp = TopicPartition(topic, 0)
        consumer.assign([tp])
        await consumer.seek_to_beginning(tp)
        out: list[tuple] = []
        while len(out) < count:
            batch = await asyncio.wait_for(consumer.getmany(tp, timeout_ms=1000), 60)
            out += [(r.offset, r.value, r.timestamp_type, r.timestamp) for r in batch.get(tp, [])]
        return out
    finally:
        await consumer.stop()


def test_clients_see_the_same_refusal_of_a_future_timestamp(fleet, kafka_cluster):
    names = topics(fleet, kafka_cluster)
    now = int(time.time() * 1000)
    # each record a batch of its own: how librdkafka batches three records is its timing's
    # (a fresh run had them in one batch for one topic and in two for the other)
    rdkafka = [
        librdkafka_produce(fleet, n, [now, now + 2 * HOUR, now + 1], batch_each=True) for n in names
    ]
    assert rdkafka[0] == rdkafka[1]
    assert [answer for answer, _ in rdkafka[0]] == [0, "INVALID_TIMESTAMP", 1]
    aio = [asyncio.run(aiokafka_produce(fleet, n, [now + 2, now + 3 * HOUR])) for n in names]
    assert aio[0] == aio[1]
    assert aio[0][1][0] == "InvalidTimestampError"
    # nothing of either refused batch was written: the next offsets are the same
    assert librdkafka_produce(fleet, names[0], [now]) == librdkafka_produce(fleet, names[1], [now])


def test_clients_read_log_append_times_as_from_kafka(fleet, kafka_cluster):
    names = topics(fleet, kafka_cluster, {"message.timestamp.type": "LogAppendTime"})
    past = int(time.time() * 1000) - 5 * HOUR
    before = int(time.time() * 1000)
    for name in names:
        acked = librdkafka_produce(fleet, name, [past, past + 1, past + 2])
        assert acked == [(0, True), (1, True), (2, True)], name
        acked = asyncio.run(aiokafka_produce(fleet, name, [past + 3, past + 4]))
        assert acked == [(3, True), (4, True)], name
    after = int(time.time() * 1000)
    readers = {
        "librdkafka": lambda n: librdkafka_read(fleet, n, 5),
        "aiokafka": lambda n: asyncio.run(aiokafka_read(fleet, n, 5)),
    }
    for client, read in readers.items():
        for name in names:
            records = read(name)
            assert [(r[0], r[1]) for r in records] == [(n, b"v%d" % m) for n, m in OFFSETS], client
            assert all(r[2] == 1 and before <= r[3] <= after for r in records), (client, records)
            # each batch has one append time, all its records' timestamp
            assert records[0][3] == records[1][3] == records[2][3], (client, records)
            assert records[3][3] == records[4][3], (client, records)


OFFSETS = [(0, 0), (1, 1), (2, 2), (3, 0), (4, 1)]  # (offset, n of its producer's value)
