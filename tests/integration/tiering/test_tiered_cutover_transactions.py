"""A transaction open while its topic is cut over is carried across, whole
(docs/tiering.md, Transactions; TXN.md: "carried across, not held").

A transactional producer writes records to a passthrough topic through the proxy and
leaves its transaction open; the topic is tiered and cut over meanwhile (Kafka's last
stable offset is then the transaction's first offset, below the cutover). The same
transaction writes more records, now into the tiered stream, and commits (or aborts):
the coordinator's marker lands in Kafka's log past the cutover, where the partition's
owner finds it and appends it to the stream. A read_committed consumer through the proxy
reads the whole transaction (or none of it), then what was produced after; Kafka's log
ends at the cutover plus that one marker.
"""

from __future__ import annotations

import uuid

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from cutover_load import create_topic, one_proxy, started, tiered_topic_id, topics_command

from proxy.metadata.streams import stream_id
from tests.support.clients import watermarks
from tests.support.waiting import wait_for, wait_until

pytestmark = pytest.mark.kafka

BELOW, ABOVE, AFTER = 5, 4, 3  # records of the transaction below / past the cutover, after it


@pytest.mark.parametrize("end", ["commit", "abort"])
def test_a_transaction_open_at_the_cutover_ends_whole(kafka_cluster, tmp_path, end):
    suffix = uuid.uuid4().hex[:8]
    topic = f"txn-cutover-{suffix}"
    create_topic(kafka_cluster, topic, 1)
    with one_proxy(kafka_cluster, tmp_path, f"txn-{suffix}") as proxy:
        tiering = proxy.proxy.tiering
        producer = Producer(
            {"bootstrap.servers": proxy.bootstrap, "transactional.id": f"tx-{suffix}"}
        )
        producer.init_transactions(30)
        producer.begin_transaction()
        for n in range(BELOW):
            producer.produce(topic, f"txn-{n}".encode(), partition=0)
        assert producer.flush(30) == 0
        assert watermarks(kafka_cluster.bootstrap, topic, isolation="read_committed") == (0, 0)

        assert topics_command("tier", topic, tiering.peer_port).returncode == 0
        stream = stream_id(tiered_topic_id(proxy, topic), 0)
        wait_until(lambda: started(tiering, stream), 60,
                   "cut over with the transaction open")  # fmt: skip
        cutover = tiering.state(stream).cutover(stream)
        assert cutover == BELOW
        # through the proxy: the transaction is still open, nothing of it stable
        assert watermarks(proxy.bootstrap, topic, isolation="read_committed")[1] == 0

        for n in range(BELOW, BELOW + ABOVE):  # into the tiered stream, same transaction
            producer.produce(topic, f"txn-{n}".encode(), partition=0)
        assert producer.flush(30) == 0
        (producer.commit_transaction if end == "commit" else producer.abort_transaction)(30)
        high = BELOW + ABOVE + 1  # the marker after the records in the stream
        wait_for(lambda: watermarks(proxy.bootstrap, topic, isolation="read_committed")[1],
                 lambda stable: stable == high, "the transaction decided")  # fmt: skip
        # Kafka's log: the records below the cutover, then the coordinator's marker
        assert watermarks(kafka_cluster.bootstrap, topic) == (0, cutover + 1)

        after = Producer({"bootstrap.servers": proxy.bootstrap, "enable.idempotence": True})
        for n in range(AFTER):
            after.produce(topic, f"after-{n}".encode(), partition=0)
        assert after.flush(30) == 0

        in_txn = [(n, f"txn-{n}".encode()) for n in range(BELOW + ABOVE)]
        later = [(high + n, f"after-{n}".encode()) for n in range(AFTER)]
        committed = (in_txn if end == "commit" else []) + later
        assert _read(proxy.bootstrap, topic, "read_committed", len(committed)) == committed
        assert _read(proxy.bootstrap, topic, "read_uncommitted", len(in_txn) + AFTER) == (
            in_txn + later
        )


def _read(bootstrap: str, topic: str, isolation: str, count: int) -> list[tuple[int, bytes]]:
    """`count` records from offset 0, then nothing more up to the end (EOF)."""
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": f"r-{uuid.uuid4().hex}",
         "isolation.level": isolation, "auto.offset.reset": "error",
         "enable.partition.eof": True}
    )  # fmt: skip
    consumer.assign([TopicPartition(topic, 0, 0)])
    got: list[tuple[int, bytes]] = []

    def at_end() -> bool:
        msg = consumer.poll(0.2)
        if msg is None:
            return False
        if msg.error() is not None:
            assert msg.error().code() == msg.error()._PARTITION_EOF, msg.error()
            return len(got) >= count
        got.append((msg.offset(), msg.value()))
        return False

    try:
        wait_until(at_end, 60, f"{count} records of {topic}, then its end")
    finally:
        consumer.close()
    return got
