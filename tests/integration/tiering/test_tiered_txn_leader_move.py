"""Transactions on a tiered partition whose leader in Kafka moves (the fault suite's lost
commits, docs/tiering.md "Transactions").

The ordering rule puts each transaction's marker in the stream before the next
transaction's data: AddPartitionsToTxn is answered only once the owner has read Kafka's
log of the partition up to its high watermark and appended the markers found. When the
partition's leader moves (a broker restart, a preferred election), the owner's metadata
still names the old leader for a while. That broker is a follower of the partition now,
and a Fetch of version 11 or later (rack-aware fetch, KIP-392) is served by a follower:
up to the follower's own high watermark, which lags the leader's. The catch-up then read
an old copy of the log, missed the marker the coordinator had just written, and said it
was done; the next transaction's records went into the stream before the marker, and
with transactions v1 (one producer id and epoch for every transaction) the late ABORT of
a transaction aborted the committed ones after it. The fault suite lost transactions
72 and 73 that way at a broker restart.

Here, on the shared cluster: a one-partition topic is tiered, the background follow is
stopped (only the catch-ups put markers in the stream, so every marker's place is
decided by one of them), one transaction makes the owner learn the leader, then the
leader is moved to another broker, which stays in the ISR. Rounds of an aborted and a
committed transaction follow, the same on a passthrough twin topic: a read_committed
consumer must read exactly what Kafka's twin answers, every committed record once.
"""

from __future__ import annotations

import time
import uuid

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from cutover_load import create_topic
from tiered_topic import one_partition_tiered
from txn_clients import transaction

from tests.support.leaders import leader_of, move_leader

pytestmark = pytest.mark.kafka

ROUNDS = 40
TIMEOUT_S = 30.0


def _producer(bootstrap: str) -> Producer:
    producer = Producer(
        {"bootstrap.servers": bootstrap, "transactional.id": f"t-{uuid.uuid4().hex}",
         "linger.ms": 0, "message.timeout.ms": int(TIMEOUT_S * 1000)}
    )  # fmt: skip
    producer.init_transactions(TIMEOUT_S)
    return producer


def _read_committed(bootstrap: str, topic: str) -> list[bytes]:
    """The values a read_committed consumer reads from offset 0 up to the last stable
    offset (ListOffsets LATEST read_committed, asked once at the start)."""
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": f"g-{uuid.uuid4().hex[:8]}",
         "isolation.level": "read_committed", "enable.auto.commit": False}
    )  # fmt: skip
    try:
        tp = TopicPartition(topic, 0, 0)
        _, stable = consumer.get_watermark_offsets(tp, TIMEOUT_S, cached=False)
        consumer.assign([tp])
        values: list[bytes] = []
        deadline = time.monotonic() + TIMEOUT_S
        while consumer.position([tp])[0].offset < stable:
            assert time.monotonic() < deadline, f"read {len(values)} records, not up to {stable}"
            for msg in consumer.consume(100, 0.5):
                assert msg.error() is None, msg.error()
                values.append(msg.value())
        return values
    finally:
        consumer.close()


@pytest.fixture
def tiered(kafka_cluster, tmp_path):
    with one_partition_tiered(kafka_cluster, tmp_path, "txn-leader", 5) as topic:
        yield topic


def test_a_moved_leader_keeps_each_marker_before_the_next_transaction(kafka_cluster, tiered):
    proxy, topic = tiered.proxy, tiered.topic
    twin = f"{topic}-twin"
    create_topic(kafka_cluster, twin, 1)
    markers = tiered.tiering.markers
    proxy.run(lambda: markers.stop_following())
    producer = _producer(proxy.bootstrap)
    twin_producer = _producer(proxy.bootstrap)
    transaction(producer, topic, [b"first"], commit=True)  # the owner learns the leader
    transaction(twin_producer, twin, [b"first"], commit=True)

    admin = AdminClient({"bootstrap.servers": kafka_cluster.bootstrap})
    old = leader_of(admin, topic)
    move_leader(kafka_cluster, topic, 0, old % 3 + 1)  # the old leader stays, a follower

    for n in range(ROUNDS):
        for p, t in ((producer, topic), (twin_producer, twin)):
            transaction(p, t, [b"aborted-%d-a" % n, b"aborted-%d-b" % n], commit=False)
            transaction(p, t, [b"committed-%d-a" % n, b"committed-%d-b" % n], commit=True)
    # the last commit's marker comes with the next AddPartitionsToTxn (the follow is off)
    for p, t in ((producer, topic), (twin_producer, twin)):
        p.begin_transaction()
        p.produce(t, b"open", partition=0)
        assert p.flush(TIMEOUT_S) == 0

    committed = [b"first"] + [
        b"committed-%d-%s" % (n, s) for n in range(ROUNDS) for s in (b"a", b"b")
    ]
    from_kafka = _read_committed(proxy.bootstrap, twin)
    assert from_kafka == committed  # the oracle
    below_cutover = [value for _, value in tiered.acked[0]]  # written before the tiering
    from_stream = _read_committed(proxy.bootstrap, topic)
    assert from_stream[: len(below_cutover)] == below_cutover
    from_stream = from_stream[len(below_cutover) :]
    assert from_stream == from_kafka, (
        f"missing: {sorted(set(from_kafka) - set(from_stream))}, "
        f"not committed: {sorted(set(from_stream) - set(from_kafka))}"
    )
    for p in (producer, twin_producer):
        p.abort_transaction(TIMEOUT_S)
