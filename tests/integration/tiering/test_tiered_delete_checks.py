"""DeleteRecords on a tiered topic through either proxy of a fleet answers and deletes as
Kafka does (proxy/tiered/deletes.py, trims.py; docs/tiering.md "DeleteRecords").

Two proxies (zone-a, zone-b); a topic whose partitions' streams have different owners,
so each partition is asked through the proxy that owns its stream and the one that does
not (the trim then goes to the owner over the peer protocol):

- an offset past the high watermark is OFFSET_OUT_OF_RANGE and deletes nothing, Kafka's
  part below the cutover included (Kafka checks the offset before deleting anything):
  3 records, tier, 3 more, delete before 9; and 1 record, cutover at 1, delete before 2.
  EARLIEST stays 0 and a consumer reads every record from 0;
- an offset below Kafka's own log start, moved there by a DeleteRecords sent to Kafka
  directly (as Kafka's retention moves it): Kafka's log start is the low watermark, as
  Kafka answers (the proxy answered the offset); EARLIEST is Kafka's log start;
- an offset between the cutover and the high watermark, through the proxy that does not
  own the stream: 5 records, tier, 5 more, delete before 7 answers low watermark 7, as
  Kafka does; EARLIEST is 7 through both proxies and a consumer reads 7, 8, 9;
- deletes to 8, 9 and the high watermark through the owner: each is answered once the
  other proxy has read the trim (tiered/shard_reads.py), so a client asking it at once
  finds the new log start.
"""

from __future__ import annotations

import uuid

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from tieredfleet import TieredFleet

from tests.support.clients import delete_records, watermarks

pytestmark = [pytest.mark.kafka, pytest.mark.minio]

OFFSET_OUT_OF_RANGE = 1
BEFORE, AFTER = {0: 5, 1: 3, 2: 1}, {0: 5, 1: 3, 2: 0}  # records per partition


def _produce(bootstrap: str, topic: str, counts: dict[int, int], prefix: str) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    for partition, count in counts.items():
        for n in range(count):
            producer.produce(topic, b"%s-%d" % (prefix.encode(), n), partition=partition)
    assert producer.flush(60) == 0


def _delete(bootstrap: str, topic: str, partition: int, offset: int) -> int:
    """The low watermark answered, or minus the error code."""
    answer = delete_records(bootstrap, {(topic, partition): offset})[topic, partition]
    return answer if isinstance(answer, int) else -answer.code()


def _read(bootstrap: str, topic: str, partition: int, offset: int, end: int) -> list[int]:
    """The offsets a consumer reads from `offset` to `end` (no offset reset allowed)."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"r-{uuid.uuid4().hex}",
            "auto.offset.reset": "error",
            "enable.partition.eof": True,
        }
    )
    consumer.assign([TopicPartition(topic, partition, offset)])
    got: list[int] = []
    try:
        for _ in range(240):
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            if msg.error() is not None:
                assert msg.error().code() == KafkaError._PARTITION_EOF, msg.error()
                if not got or got[-1] + 1 >= end:
                    return got
                continue
            got.append(msg.offset())
            if msg.offset() + 1 >= end:
                return got
    finally:
        consumer.close()
    raise AssertionError(f"{topic}-{partition}: read {got} from {offset}, not to {end}")


def test_deletes_through_either_proxy_check_then_delete_as_kafka(
    kafka_cluster, s3_server, tmp_path
):
    fleet = TieredFleet(kafka_cluster.bootstrap, s3_server, tmp_path)
    try:
        fleet.start()
        fleet.wait_until_owned()
        topic, topic_id = fleet.create_spread_topic(len(BEFORE))
        _produce(fleet.bootstrap(), topic, BEFORE, "kafka")
        fleet.tier(topic)
        assert fleet.wait_for_cutover(topic_id, len(BEFORE)) == BEFORE
        _produce(fleet.bootstrap(), topic, AFTER, "stream")
        ends = {p: BEFORE[p] + AFTER[p] for p in BEFORE}
        by_name = {proxy.name: proxy for proxy in fleet.proxies.values()}
        owner = {p: by_name[fleet.stream_owner(topic_id, p)] for p in BEFORE}
        other = {p: next(x for x in by_name.values() if x is not owner[p]) for p in BEFORE}
        assert len({o.name for o in owner.values()}) > 1, owner

        # past the high watermark: refused, nothing deleted (neither part)
        for p, past in ((1, 9), (2, 2)):
            for proxy in (other[p], owner[p]):
                assert _delete(proxy.bootstrap, topic, p, past) == -OFFSET_OUT_OF_RANGE
            for proxy in (other[p], owner[p]):
                assert watermarks(proxy.bootstrap, topic, p) == (0, ends[p])
                assert _read(proxy.bootstrap, topic, p, 0, ends[p]) == list(range(ends[p]))

        # Kafka's own log start moved past the offset (a DeleteRecords sent to Kafka
        # directly, as its retention would move it): Kafka answers a delete below its log
        # start with its log start, and so must the tiered topic (it answered the offset)
        assert _delete(kafka_cluster.bootstrap, topic, 1, 2) == 2
        for proxy in (other[1], owner[1]):
            assert _delete(proxy.bootstrap, topic, 1, 1) == 2
            assert watermarks(proxy.bootstrap, topic, 1) == (2, ends[1])
            assert _read(proxy.bootstrap, topic, 1, 2, ends[1]) == list(range(2, ends[1]))

        # between the cutover and the high watermark, through the proxy not owning it
        assert _delete(other[0].bootstrap, topic, 0, 7) == 7
        for proxy in (other[0], owner[0]):
            assert watermarks(proxy.bootstrap, topic, 0) == (7, ends[0])
            assert _read(proxy.bootstrap, topic, 0, 7, ends[0]) == [7, 8, 9]

        # answered once every proxy has read the trim, as Kafka answers once every replica
        # moved its log start: the other proxy, asked at once by a client connected
        # before, already says the new log start
        admin = AdminClient({"bootstrap.servers": owner[0].bootstrap})
        asker = Consumer({"bootstrap.servers": other[0].bootstrap, "group.id": "w"})
        tp = TopicPartition(topic, 0)
        try:
            assert asker.get_watermark_offsets(tp, timeout=30, cached=False) == (7, ends[0])
            for offset in (8, 9, ends[0]):
                asked = [TopicPartition(topic, 0, offset)]
                [future] = admin.delete_records(asked, request_timeout=60).values()
                assert future.result().low_watermark == offset
                seen = asker.get_watermark_offsets(tp, timeout=30, cached=False)
                assert seen == (offset, ends[0])
        finally:
            asker.close()
    finally:
        fleet.close()
