"""Transactions through the proxy: a committed batch is read, an aborted one is not.

A transactional producer (librdkafka) commits one batch, aborts a second, commits a
third. A read_committed consumer must see the two committed batches exactly once and
none of the aborted records; a read_uncommitted consumer sees all three, which proves
the aborted records did reach the log and were filtered, not lost on the way.
"""

from __future__ import annotations

import uuid

import pytest
from confluent_kafka import Producer

pytestmark = pytest.mark.kafka

PARTITIONS = 3


def test_read_committed_consumer_sees_committed_transactions_only(bootstrap, compat):
    conf = {"bootstrap.servers": bootstrap}
    topic = compat.create_topic(conf, partitions=PARTITIONS)
    first = compat.records("tx-first", 2000)
    aborted = compat.records("tx-aborted", 2000)
    last = compat.records("tx-last", 1000)

    producer = Producer({**conf, "transactional.id": f"compat-tx-{uuid.uuid4().hex[:8]}"})
    producer.init_transactions(30)
    for records, commit in ((first, True), (aborted, False), (last, True)):
        producer.begin_transaction()
        for key, value in records:
            while True:
                try:
                    producer.produce(topic, key=key, value=value)
                    break
                except BufferError:
                    producer.poll(0.1)
        assert producer.flush(30) == 0  # in the log before the commit or abort marker
        if commit:
            producer.commit_transaction(30)
        else:
            producer.abort_transaction(30)

    committed_view = compat.read_all(
        {**conf, "isolation.level": "read_committed"}, topic, len(first) + len(last), PARTITIONS
    )
    compat.assert_exactly_once(committed_view, first + last)

    everything = first + aborted + last
    uncommitted_view = compat.read_all(
        {**conf, "isolation.level": "read_uncommitted"}, topic, len(everything), PARTITIONS
    )
    compat.assert_exactly_once(uncommitted_view, everything)
