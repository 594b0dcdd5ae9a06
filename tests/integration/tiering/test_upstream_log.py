"""Kafka's log below a cutover read raw, as a rebuild reads it for the producers it seeds
(proxy/markers/upstream_log.py), against a real Kafka (the session's 3 brokers): every
batch header in order, and Kafka's log start as its Fetch answers give it, which is what
tells the tail read a log start from a compacted topic's cleaned batches (the unit tests
in tests/unit/tiering/test_upstream_tail.py take it as given).

A one-partition topic gets 60 records from an idempotent producer, flushed every 2
(librdkafka may still send them one a batch), then a DeleteRecords to 17 sent to Kafka.
The headers from 0 begin at the batch holding 17 (Kafka's answer to a read below its log
start) and cover every batch to the end once, the log start read is 17, and the tail of
a cutover at the end, asked to reach a transaction at 5, is those same headers and warns
that Kafka's log starts past 5.
"""

from __future__ import annotations

import logging
import uuid

import pytest
from confluent_kafka import Producer
from cutover_load import create_topic

from proxy.markers.upstream_log import UpstreamLog
from tests.support.clients import delete_records, watermarks

pytestmark = pytest.mark.kafka

BATCHES, PER_BATCH, DELETED_TO = 30, 2, 17


def _produce(bootstrap: str, topic: str) -> None:
    producer = Producer(
        {"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 0}
    )
    for n in range(BATCHES):
        for k in range(PER_BATCH):
            producer.produce(topic, b"%d-%d" % (n, k), partition=0)
        assert producer.flush(30) == 0


async def test_the_headers_and_kafkas_log_start_are_read_as_kafka_answers(kafka_cluster, caplog):
    topic = f"upstream-{uuid.uuid4().hex[:8]}"
    create_topic(kafka_cluster, topic, 1)
    _produce(kafka_cluster.bootstrap, topic)
    end = BATCHES * PER_BATCH
    assert watermarks(kafka_cluster.bootstrap, topic, 0) == (0, end)
    answered = delete_records(kafka_cluster.bootstrap, {(topic, 0): DELETED_TO})
    assert answered == {(topic, 0): DELETED_TO}

    upstream = UpstreamLog({"bootstrap_servers": kafka_cluster.bootstrap})
    try:
        found, log_start = await upstream.headers(topic, 0, 0, end)
        assert log_start == DELETED_TO
        # from the batch holding 17 (its base may lie below it), every batch once, in
        # order, to the end; one producer from offset 0: its sequences are the offsets
        assert found[0].base_offset <= DELETED_TO < found[0].next_offset
        assert [h.next_offset for h in found[:-1]] == [h.base_offset for h in found[1:]]
        assert found[-1].next_offset == end
        assert len({h.producer_id for h in found}) == 1 and found[0].producer_id >= 0
        assert [h.base_sequence for h in found] == [h.base_offset for h in found]

        found_above, log_start = await upstream.headers(topic, 0, 40, end)  # past the start
        assert log_start == DELETED_TO
        assert found_above == [h for h in found if h.next_offset > 40]

        with caplog.at_level(logging.WARNING, "tierproxy.transactions"):
            tail = await upstream.tail(topic, 0, end, lowest=5)
        assert tail == found
        assert "Kafka's log starts past 5" in caplog.text
    finally:
        await upstream.close()
