"""Transaction markers of a tiered partition: Kafka's coordinator writes them into Kafka's
own log of the partition, past the cutover; the owner's marker follower appends each to
the stream (proxy/markers/), and AddPartitionsToTxn is answered only once the markers
before it are in the stream (proxy/tiered/txn.py: forward first, catch up after).

A one-partition topic is tiered; a librdkafka transactional producer writes to it
through the proxy and commits, then aborts, then commits again, keeping its producer id
and epoch (transactions v1). A raw read_uncommitted Fetch of the stream through the proxy
then shows every data batch and the three markers, dense, each marker right after its
transaction's data and before the next transaction's, with the producer id, epoch and
commit/abort Kafka wrote; Kafka's own log past the cutover holds exactly the markers.

With the background follow stopped, the catch-ups of AddPartitionsToTxn alone still put
each transaction's marker before the next transaction's data: the ordering rule.
"""

from __future__ import annotations

import asyncio
import uuid

import pytest
from aiokafka import AIOKafkaClient, TopicPartition
from aiokafka.protocol.fetch import FetchRequest
from confluent_kafka import Producer
from tiered_topic import one_partition_tiered
from txn_clients import transaction

from proxy.records.batches import BatchHeader, whole_batches
from proxy.records.markers import read_marker
from tests.support.clients import watermarks
from tests.support.waiting import wait_until

pytestmark = pytest.mark.kafka

PER_ROUND = 10
TIMEOUT_S = 30.0


async def _read_stream(bootstrap: str, topic: str, end: int) -> list[tuple[BatchHeader, bytes]]:
    """Every batch of partition 0 below `end`, as raw read_uncommitted Fetches through
    the proxy answer them (control batches included)."""
    client = AIOKafkaClient(bootstrap_servers=bootstrap)
    await client.bootstrap()
    try:
        await client.set_topics([topic])
        leader = client.cluster.leader_for_partition(TopicPartition(topic, 0))
        out: list[tuple[BatchHeader, bytes]] = []
        position = 0
        for _ in range(100):
            if position >= end:
                break
            request = FetchRequest(100, 1, 1 << 20, 0, [(topic, [(0, position, 1 << 20)])])
            response = await client.send(leader, request)
            ((_, partitions),) = response.topics
            ((_, error_code, _, *rest),) = partitions
            assert error_code == 0, error_code
            batches, _ = whole_batches(rest[-1] or b"")
            for header, batch in batches:
                if header.last_offset >= position:
                    out.append((header, bytes(batch)))
                    position = header.next_offset
        return out
    finally:
        await client.close()


@pytest.fixture
def tiered(kafka_cluster, tmp_path):
    with one_partition_tiered(kafka_cluster, tmp_path, "txn-markers", PER_ROUND) as topic:
        yield topic


def test_markers_land_in_the_stream_dense_and_in_order(kafka_cluster, tiered):
    proxy, topic = tiered.proxy, tiered.topic
    tiered.produce("plain")  # idempotent records past the cutover
    start = tiered.acked[0][-1][0] + 1
    producer = Producer(
        {"bootstrap.servers": proxy.bootstrap, "transactional.id": f"t-{uuid.uuid4().hex}",
         "linger.ms": 5, "message.timeout.ms": int(TIMEOUT_S * 1000)}
    )  # fmt: skip
    producer.init_transactions(TIMEOUT_S)
    transaction(producer, topic, [b"one-a", b"one-b", b"one-c"], commit=True)
    transaction(producer, topic, [b"two-a", b"two-b"], commit=False)
    transaction(producer, topic, [b"three-a"], commit=True)

    # Kafka's log of the partition past the cutover: the three markers and nothing else
    # (EndTxn is answered before the coordinator writes the markers: the last one comes)
    cutover = tiered.tiering.state(tiered.streams[0]).cutover(tiered.streams[0])
    marks = lambda: watermarks(kafka_cluster.bootstrap, topic)  # noqa: E731
    wait_until(lambda: marks() == (0, cutover + 3), 30, "Kafka's last marker")
    # the last marker is appended by the follow (no AddPartitionsToTxn after it)
    end = start + 3 + 2 + 1 + 3
    wait_until(lambda: watermarks(proxy.bootstrap, topic)[1] == end, 30, "the last marker")
    batches = asyncio.run(_read_stream(proxy.bootstrap, topic, end))
    assert batches[0][0].base_offset == 0
    for (before, _), (after, _) in zip(batches, batches[1:], strict=False):
        assert after.base_offset == before.next_offset  # dense
    tail = [(h, b) for h, b in batches if h.base_offset >= start]
    shape = [("marker" if h.is_control else "data", h.base_offset, h.last_offset) for h, _ in tail]
    data = [s for s in shape if s[0] == "data"]
    markers = [s for s in shape if s[0] == "marker"]
    assert [m[1] for m in markers] == [start + 3, start + 6, start + 8], shape
    assert sum(last - base + 1 for _, base, last in data) == 6
    read = [read_marker(b) for h, b in tail if h.is_control]
    assert [m.commit for m in read] == [True, False, True]
    data_producers = {(h.producer_id, h.producer_epoch) for h, _ in tail if not h.is_control}
    assert len(data_producers) == 1  # one producer id and epoch across the transactions
    assert {(m.producer_id, m.producer_epoch) for m in read} == data_producers
    assert all(h.is_transactional for h, _ in tail)
    producer.flush(TIMEOUT_S)


def test_the_catch_up_alone_puts_each_marker_before_the_next_transaction(tiered):
    proxy, topic = tiered.proxy, tiered.topic
    markers = tiered.tiering.markers
    proxy.run(lambda: markers.stop_following())
    start = tiered.acked[0][-1][0] + 1
    producer = Producer(
        {"bootstrap.servers": proxy.bootstrap, "transactional.id": f"t-{uuid.uuid4().hex}",
         "linger.ms": 5, "message.timeout.ms": int(TIMEOUT_S * 1000)}
    )  # fmt: skip
    producer.init_transactions(TIMEOUT_S)
    transaction(producer, topic, [b"one-a", b"one-b"], commit=True)
    transaction(producer, topic, [b"two-a"], commit=False)
    transaction(producer, topic, [b"three-a"], commit=True)
    # the last marker has no AddPartitionsToTxn after it: not in the stream without the follow
    end = start + 2 + 1 + 1 + 1 + 1
    assert watermarks(proxy.bootstrap, topic)[1] == end
    batches = asyncio.run(_read_stream(proxy.bootstrap, topic, end))
    tail = [h for h, _ in batches if h.base_offset >= start]
    assert [(h.is_control, h.base_offset) for h in tail if h.is_control] == [
        (True, start + 2),
        (True, start + 4),
    ]
    assert tail[-1].base_offset == start + 5 and not tail[-1].is_control
    producer.flush(TIMEOUT_S)
