"""Producer state below the log start survives a restart, as Kafka keeps it (KIP-360;
docs/sequencer.md, "Producer state below the log start"). Kafka is the oracle.

A real `tierproxy run` (`TieredFleet`) on the shared Kafka and MinIO; a tiered
one-partition topic (cutover 0) and a passthrough twin, given the same operations
through the proxy:

1. a transactional producer commits one record to both (Kafka's log of the tiered
   partition holds the COMMIT marker; the stream holds its copy);
2. an idempotent producer (raw Produce v9: the test chooses the sequences) writes one
   batch of 3 records to each;
3. DeleteRecords to the high watermark on both: every batch of both producers is below
   the log start;
4. the proxy stops and starts again (its partition rebuilt from the metadata);
5. the idempotent producer sends its last batch again, then a batch after a gap, then
   its next batch; the transactional producer starts again (a new epoch) and commits
   one more record to both (AddPartitionsToTxn makes the owner catch up with Kafka's
   markers first).

Every answer of the tiered topic equals the twin's: the retry a duplicate with its
first offsets, the gap OUT_OF_ORDER_SEQUENCE_NUMBER, the next batch and the new
transaction's record at the same offsets; the watermarks and what a read_committed
consumer reads from the earliest offset are the same. Before: the rebuild started
empty at the log start, so the retry was written a second time, the gap was accepted,
and the marker follower, starting again at the cutover with no marker expected,
appended the old COMMIT marker again (one offset more than Kafka's log).

Beside it, against the same twin: a producer with batches on both sides of the log start
keeps them all, and markers Kafka's own retention dropped while the owner was away do not
stop the marker follower (each test says what it did before).
"""

from __future__ import annotations

import time
import uuid

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from raw_kafka import init_producer_id, leader_address, produce_v9
from tieredfleet import TieredFleet, topic_id_of

from tests.support.batches import build_batch
from tests.support.clients import delete_records, watermarks
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.kafka, pytest.mark.minio]


def _answer(bootstrap: str, topic: str, pid: int, epoch: int, seq: int) -> tuple[str, int]:
    """(error, base offset) of Produce v9 of a 3-record batch at sequence `seq`."""
    now = int(time.time() * 1000)
    batch = build_batch(
        [b"idem-%d" % (seq + n) for n in range(3)],
        timestamps=[now] * 3,
        producer_id=pid,
        producer_epoch=epoch,
        base_sequence=seq,
    )
    part = produce_v9(leader_address(bootstrap, topic), topic, 0, batch)
    return part.error_code.name, int(part.base_offset)


def _commit_one(bootstrap: str, txn_id: str, topics: list[str], value: bytes) -> dict[str, int]:
    """One transaction writing `value` to partition 0 of each topic: the offsets."""
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": txn_id})
    producer.init_transactions(60)
    producer.begin_transaction()
    offsets: dict[str, int] = {}

    def delivered(err, msg) -> None:
        assert err is None, err
        offsets[msg.topic()] = msg.offset()

    for topic in topics:
        producer.produce(topic, value, partition=0, on_delivery=delivered)
    producer.commit_transaction(60)
    producer.flush(30)
    return offsets


def _wait_for_markers(bootstrap: str, topics: list[str], end: int) -> None:
    """Until each topic's high watermark is `end`, the transaction's markers written."""
    for topic in topics:
        wait_for(lambda t=topic: watermarks(bootstrap, t)[1], lambda e: e == end, f"{topic} end")


def _read_committed(bootstrap: str, topic: str, count: int) -> list[tuple[int, bytes]]:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"below-{uuid.uuid4().hex}",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )
    consumer.assign([TopicPartition(topic, 0)])
    read: list[tuple[int, bytes]] = []
    deadline = time.monotonic() + 60
    try:
        while len(read) < count and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None and msg.error() is None:
                read.append((msg.offset(), msg.value()))
    finally:
        consumer.close()
    return read


def _fleet(kafka_cluster, s3_server, tmp_path) -> TieredFleet:
    return TieredFleet(
        kafka_cluster.bootstrap,
        s3_server,
        tmp_path,
        zones=("zone-a",),
        shard_count=2,
        tiering={"upload_interval_s": 0.5},
    )


def _tiered_and_twin(fleet: TieredFleet, kafka_cluster, prefix: str) -> tuple[str, str]:
    """Two one-partition topics, the first tiered (cutover 0), the second passthrough."""
    admin = AdminClient({"bootstrap.servers": kafka_cluster.bootstrap})
    tiered, twin = f"{prefix}-{fleet.suffix}", f"{prefix}-{fleet.suffix}-plain"
    for name in (tiered, twin):
        admin.create_topics([NewTopic(name, 1, 3)])[name].result(30)
    topic_id = wait_for(lambda: topic_id_of(admin, tiered), bool, "topic known")
    fleet.tier(tiered)
    assert fleet.wait_for_cutover(topic_id, 1) == {0: 0}
    return tiered, twin


def test_a_restart_keeps_the_producers_and_markers_the_log_start_passed(
    kafka_cluster, s3_server, tmp_path
):
    fleet = _fleet(kafka_cluster, s3_server, tmp_path)
    with fleet:
        tiered, twin = _tiered_and_twin(fleet, kafka_cluster, "below")
        both = [tiered, twin]
        bootstrap = fleet.bootstrap()
        txn_id = f"below-{uuid.uuid4().hex}"

        first = _commit_one(bootstrap, txn_id, both, b"txn-1")
        assert first[tiered] == first[twin] == 0
        _wait_for_markers(bootstrap, both, 2)  # the coordinator writes them after EndTxn
        pid, epoch = init_producer_id(leader_address(bootstrap, tiered))
        answers = {name: _answer(bootstrap, name, pid, epoch, 0) for name in both}
        assert answers[tiered] == answers[twin] == ("none", 2)  # after the marker at 1
        ends = {name: watermarks(bootstrap, name)[1] for name in both}
        assert ends[tiered] == ends[twin] == 5
        assert delete_records(bootstrap, {(name, 0): 5 for name in both}) == {
            (name, 0): 5 for name in both
        }

        fleet.stop()
        fleet.start()
        fleet.wait_until_owned()
        bootstrap = fleet.bootstrap()
        steps = [
            (0, ("none", 2)),  # the last batch again: a duplicate, its first offset
            (9, ("out_of_order_sequence_number", -1)),  # a gap
            (3, ("none", 5)),  # the next batch
        ]
        for seq, kafkas in steps:
            got = {name: _answer(bootstrap, name, pid, epoch, seq) for name in both}
            assert got[twin] == kafkas, (seq, got)  # what the test expects of Kafka holds
            assert got[tiered] == got[twin], (seq, got)

        second = _commit_one(bootstrap, txn_id, both, b"txn-2")
        assert second[tiered] == second[twin] == 8, second
        _wait_for_markers(bootstrap, both, 10)
        assert watermarks(bootstrap, tiered) == watermarks(bootstrap, twin) == (5, 10)
        reads = {name: _read_committed(bootstrap, name, 4) for name in both}
        assert reads[tiered] == reads[twin]
        assert [v for _, v in reads[twin]] == [b"idem-3", b"idem-4", b"idem-5", b"txn-2"]


@pytest.mark.parametrize("kafka_log_start", [1, 2], ids=["one-dropped", "both-dropped"])
def test_markers_kafka_dropped_while_the_owner_was_away_stop_no_later_transaction(
    kafka_cluster, s3_server, tmp_path, kafka_log_start
):
    """Kafka's own log of a tiered partition holds only its markers, and Kafka's retention
    deletes them as any other records (DeleteRecords on Kafka stands for it here: the same
    move of Kafka's log start). A restart rebuilds the stream with the markers it holds
    past the follower's committed place (none here: no trim wrote a snapshot) and expects
    to meet them upstream first (the resume rule); Kafka no longer has them. Before, the
    follower waited for them for ever and skipped every later marker: the next
    transaction never ended in the stream (its record never read committed, the high
    watermark one short of Kafka's). Now the expected markers Kafka dropped are dropped
    from the list (`Resume.resync`: the first one Kafka still holds found by reading
    its log from its new start, or none), and the twin's answers are the tiered topic's.
    Kafka's log start moved past the first marker, or past both."""
    fleet = _fleet(kafka_cluster, s3_server, tmp_path)
    with fleet:
        tiered, twin = _tiered_and_twin(fleet, kafka_cluster, "dropped")
        both = [tiered, twin]
        bootstrap = fleet.bootstrap()
        txn_id = f"dropped-{uuid.uuid4().hex}"
        for n, end in ((1, 2), (2, 4)):
            offsets = _commit_one(bootstrap, txn_id, both, b"txn-%d" % n)
            assert offsets[tiered] == offsets[twin] == end - 2
            _wait_for_markers(bootstrap, both, end)
        # Kafka's log of the tiered partition: the two markers, nothing else
        assert watermarks(kafka_cluster.bootstrap, tiered) == (0, 2)

        fleet.stop()
        dropped = {(tiered, 0): kafka_log_start}
        assert delete_records(kafka_cluster.bootstrap, dropped) == dropped
        fleet.start()
        fleet.wait_until_owned()
        bootstrap = fleet.bootstrap()

        third = _commit_one(bootstrap, txn_id, both, b"txn-3")
        assert third[tiered] == third[twin] == 4, third
        _wait_for_markers(bootstrap, [twin], 6)
        wait_for(
            lambda: watermarks(bootstrap, tiered)[1],
            lambda end: end >= 6,
            "the third transaction's marker in the stream",
            30,
        )
        assert watermarks(bootstrap, tiered) == watermarks(bootstrap, twin) == (0, 6)
        reads = {name: _read_committed(bootstrap, name, 3) for name in both}
        assert reads[tiered] == reads[twin] == [(0, b"txn-1"), (2, b"txn-2"), (4, b"txn-3")]


def test_a_producer_with_batches_on_both_sides_of_the_log_start_keeps_them_all(
    kafka_cluster, s3_server, tmp_path
):
    """Kafka keeps a producer's last five batches whatever its log start (KIP-360): after
    DeleteRecords between two batches of one idempotent producer and a restart, a retry
    of the first (in flight across both) is a duplicate with its first offset, on the
    tiered topic as on the twin. Before, the trim's snapshot kept the producer without
    its batches and the replay from the log start gave back only the second: the retry
    was answered OUT_OF_ORDER_SEQUENCE_NUMBER."""
    fleet = _fleet(kafka_cluster, s3_server, tmp_path)
    with fleet:
        tiered, twin = _tiered_and_twin(fleet, kafka_cluster, "sides")
        both = [tiered, twin]
        bootstrap = fleet.bootstrap()
        pid, epoch = init_producer_id(leader_address(bootstrap, tiered))
        for seq, offset in ((0, 0), (3, 3)):
            answers = {name: _answer(bootstrap, name, pid, epoch, seq) for name in both}
            assert answers[tiered] == answers[twin] == ("none", offset)
        trim = {(name, 0): 3 for name in both}
        assert delete_records(bootstrap, trim) == trim

        fleet.stop()
        fleet.start()
        fleet.wait_until_owned()
        bootstrap = fleet.bootstrap()
        for seq, kafkas in ((0, ("none", 0)), (3, ("none", 3)), (6, ("none", 6))):
            got = {name: _answer(bootstrap, name, pid, epoch, seq) for name in both}
            assert got[twin] == kafkas, (seq, got)  # what the test expects of Kafka holds
            assert got[tiered] == got[twin], (seq, got)
        assert watermarks(bootstrap, tiered) == watermarks(bootstrap, twin) == (3, 9)
