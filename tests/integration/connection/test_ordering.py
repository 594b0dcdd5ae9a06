"""Many requests in flight on one connection: answers in request order; acks=0 unanswered.

The proxy answers ApiVersions itself, at once, while the requests it forwards wait for
the broker; answers must still leave in the order the requests came. A Produce with
acks=0 gets no answer from Kafka, so the proxy must expect none.
"""

from __future__ import annotations

import random
import time
import uuid

import pytest
from confluent_kafka import Consumer, TopicPartition

pytestmark = pytest.mark.kafka

IN_FLIGHT = 200
LONG_POLL_MS = 300  # a Fetch at the end of the log the broker holds this long


def test_pipelined_answers_come_back_in_request_order(proxy, raw, kafka, wire):
    topic = kafka.create_topic("order")
    client = raw(proxy.broker_address(kafka.leader(topic, 0)))
    rng = random.Random(20240521)
    builders = {
        "api_versions": (wire.api_versions, ("api_versions", 3)),  # answered by the proxy
        "metadata": (lambda cid: wire.metadata(cid, topic), ("metadata", 12)),  # rewritten
        "list_offsets": (lambda cid: wire.list_offsets(cid, topic), ("list_offsets", 7)),
        "long_poll": (  # forwarded, answered LONG_POLL_MS later
            lambda cid: wire.fetch(cid, topic, 0, 1 << 20, max_wait_ms=LONG_POLL_MS),
            ("fetch", 12),
        ),
    }
    kinds = ["api_versions", "metadata", "list_offsets"] * ((IN_FLIGHT - 3) // 3)
    kinds += ["long_poll"] * (IN_FLIGHT - len(kinds))
    rng.shuffle(kinds)
    kinds[0] = "long_poll"  # everything answered locally must wait behind it
    sent = rng.sample(range(1, 2**31 - 1), IN_FLIGHT)  # not sorted: order is the sending

    client.send(*(builders[kind][0](cid) for kind, cid in zip(kinds, sent, strict=True)))
    frames = [client.read_frame() for _ in range(IN_FLIGHT)]

    received = [wire.size.unpack_from(frame)[0] for frame in frames]
    assert received == sent
    assert client.nothing_within(0.3), "more answers than requests"
    ports = {proxy.broker_port_base + node for node in (1, 2, 3)}
    for kind, frame in zip(kinds, frames, strict=True):
        _, answer = wire.decode(frame, wire.response_type(*builders[kind][1]))
        if kind == "api_versions":
            assert answer.error_code == 0 and answer.api_keys
        elif kind == "metadata":
            assert {broker.port for broker in answer.brokers} <= ports
            assert answer.topics[0].name == topic and answer.topics[0].error_code == 0
        elif kind == "list_offsets":
            partition = answer.topics[0].partitions[0]
            assert (partition.error_code, partition.offset) == (0, 0)
        else:
            partition = answer.responses[0].partitions[0]
            assert (partition.error_code, partition.high_watermark) == (0, 0)


@pytest.mark.parametrize("version", [3, 9], ids=["produce-v3", "produce-v9-flexible"])
def test_produce_with_acks_0_gets_no_answer(proxy, raw, kafka, wire, version):
    topic = kafka.create_topic("acks0")
    client = raw(proxy.broker_address(kafka.leader(topic, 0)))
    unacked = f"unacked-{uuid.uuid4().hex}".encode()

    client.send(wire.produce(1, version, topic, [unacked], acks=0), wire.metadata(2, topic))
    correlation_id, metadata = client.read_answer(wire.response_type("metadata", 12))
    assert correlation_id == 2, "the first answer must be the Metadata one"
    assert metadata.topics[0].name == topic
    assert client.nothing_within(0.5), "something answered the acks=0 Produce"

    # The control: the same request with acks=1 is answered, on the same connection.
    client.send(wire.produce(3, version, topic, [b"acked"], acks=1))
    correlation_id, produced = client.read_answer(wire.response_type("produce", version))
    partition = produced.responses[0].partition_responses[0]
    assert (correlation_id, partition.error_code, partition.base_offset) == (3, 0, 1)

    bootstrap = proxy.thread.bootstrap
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "unused"})
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        values = []
        deadline = time.monotonic() + 30
        while len(values) < 2 and time.monotonic() < deadline:
            for message in consumer.consume(10, timeout=0.5):
                assert message.error() is None, message.error()
                values.append(message.value())
    finally:
        consumer.close()
    assert values == [unacked, b"acked"]


def test_requests_after_the_first_are_forwarded_by_the_relay_and_counted(own_proxy, raw, wire):
    """Requests that need nothing but forwarding, behind the first (which the loop
    reads, to learn the client id), go from the reader's callback and are counted as
    relayed; ApiVersions, answered here, never is."""
    proxy = own_proxy

    def counts() -> dict[str, float]:
        return {
            d: proxy.metric("tierproxy_relayed_frames_total", direction=d)
            for d in ("request", "answer")
        }

    relayed = counts()
    client = raw(proxy.address)
    client.send(wire.metadata(1))
    assert wire.size.unpack_from(client.read_frame())[0] == 1
    pipelined = list(range(2, 12))
    client.send(*(wire.metadata(cid) for cid in pipelined), wire.api_versions(12))
    answers = [wire.size.unpack_from(client.read_frame())[0] for _ in range(11)]
    assert answers == [*pipelined, 12]
    deadline = time.monotonic() + 5  # the relay's counts reach the metrics within 0.1 s
    now = dict(relayed)
    while time.monotonic() < deadline and (
        now["request"] < relayed["request"] + 10 or now["answer"] < relayed["answer"] + 10
    ):
        time.sleep(0.02)
        now = counts()
    assert now["request"] == relayed["request"] + 10
    # the answers to requests 2-11 (and perhaps the first's); never ApiVersions'
    assert relayed["answer"] + 10 <= now["answer"] <= relayed["answer"] + 11
