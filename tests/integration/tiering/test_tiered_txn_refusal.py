"""Transactional producers meeting a tiered topic (proxy/tiered/txn_refusal.py).

A one-partition topic has records through Kafka, is tiered (cutover at PER_ROUND), and
gets more records through the proxy. Then a transactional producer of each client sends
to it through the proxy: the proxy answers the client's AddPartitionsToTxn itself, with
TOPIC_AUTHORIZATION_FAILED for the tiered partition, so Kafka's transaction coordinator
never adds it and never writes a marker into Kafka's log of it: that log still ends at
the cutover, checked against the brokers. The client surfaces the error naming the topic,
aborts, and commits a transaction to a passthrough topic through the same proxy; a
read_committed consumer reads exactly that record. The proxy warns once per
transactional id, however many times it refuses it.

A raw AddPartitionsToTxn naming a tiered and a passthrough partition, with a producer id
Kafka never gave, is answered TOPIC_AUTHORIZATION_FAILED and OPERATION_NOT_ATTEMPTED:
Kafka would have answered the producer id, so nothing of it went upstream.
"""

from __future__ import annotations

import logging
import socket
import struct
import uuid

import pytest
import txn_clients
from confluent_kafka import Consumer, TopicPartition
from cutover_load import create_topic, proxy_config, wait_owned
from kio.schema.add_partitions_to_txn.v3.request import (
    AddPartitionsToTxnRequest,
    AddPartitionsToTxnTopic,
)
from kio.schema.add_partitions_to_txn.v3.response import AddPartitionsToTxnResponse
from kio.schema.errors import ErrorCode
from tiered_topic import TieredTopic

from proxy.config import parse_config
from proxy.devstack.paths import free_port_block
from proxy.devstack.proxy_thread import ProxyThread
from proxy.kafka.messages import decode_response, encode_request

pytestmark = pytest.mark.kafka

PER_ROUND = 20
LOGGER = "tierproxy.transactions"


class Tiered:
    def __init__(self, cluster, proxy: ProxyThread, topic: str) -> None:
        self.cluster, self.proxy, self.topic = cluster, proxy, topic
        self.tiered = TieredTopic(proxy, topic, 1, PER_ROUND)
        self.tiered.round("r0")  # records past the cutover, in an object
        self.cutover = PER_ROUND
        self.end = self.tiered.acked[0][-1][0] + 1

    def plain_topic(self, name: str) -> str:
        plain = f"{name}-{uuid.uuid4().hex[:8]}"
        create_topic(self.cluster, plain, 1)
        return plain

    def check_kafka_and_proxy_logs(self) -> None:
        """Kafka's log of the tiered partition ends at the cutover (no marker past it), and
        the partition through the proxy is as it was."""
        assert _watermarks(self.cluster.bootstrap, self.topic) == (0, self.cutover)
        assert _watermarks(self.proxy.bootstrap, self.topic) == (0, self.end)


@pytest.fixture(scope="module")
def tiered(kafka_cluster, tmp_path_factory):
    suffix = uuid.uuid4().hex[:8]
    topic = f"txn-refused-{suffix}"
    create_topic(kafka_cluster, topic, 1)
    tmp = tmp_path_factory.mktemp("txn-refusal")
    config = proxy_config(
        kafka_cluster, tmp, f"txnref-{suffix}", "zone-a", suffix, free_port_block(8),
        upload_interval_s=3600.0,
    )  # fmt: skip
    with ProxyThread(parse_config(config)) as proxy:
        wait_owned([proxy], 2)
        yield Tiered(kafka_cluster, proxy, topic)


def _watermarks(bootstrap: str, topic: str, isolation: str = "read_uncommitted"):
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": f"w-{uuid.uuid4().hex}",
         "isolation.level": isolation}
    )  # fmt: skip
    try:
        return consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=30, cached=False)
    finally:
        consumer.close()


def _committed_values(bootstrap: str, topic: str) -> list[bytes]:
    """Every record a read_committed consumer reads from partition 0, through the proxy."""
    end = _watermarks(bootstrap, topic, "read_committed")[1]
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": f"r-{uuid.uuid4().hex}",
         "isolation.level": "read_committed", "enable.partition.eof": True}
    )  # fmt: skip
    consumer.assign([TopicPartition(topic, 0, 0)])
    values: list[bytes] = []
    try:
        for _ in range(120):
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            if msg.error() is not None:
                assert msg.error().code() == msg.error()._PARTITION_EOF, msg.error()
                if msg.offset() >= end:
                    return values
                continue
            values.append(msg.value())
    finally:
        consumer.close()
    raise AssertionError(f"no end of {topic} after {values}")


def _warnings(caplog, txn_id: str) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == LOGGER and r.levelno == logging.WARNING and repr(txn_id) in r.getMessage()
    ]


def _check_refused(tiered: Tiered, caplog, txn_id: str, refused_before: int, rounds: int):
    refusals = tiered.proxy.proxy.tiering.txn_refusals
    assert refusals.count >= refused_before + rounds
    (warning,) = _warnings(caplog, txn_id)
    assert f"tiered topic {tiered.topic} " in warning
    tiered.check_kafka_and_proxy_logs()


def test_java_producer_is_refused_then_aborts_and_commits_elsewhere(tiered, tmp_path, caplog):
    plain, txn_id = tiered.plain_topic("txn-plain-java"), f"java-{uuid.uuid4().hex[:8]}"
    before = tiered.proxy.proxy.tiering.txn_refusals.count
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        steps = txn_clients.java(tiered.proxy.bootstrap, txn_id, tiered.topic, plain, tmp_path)
    assert steps["send_tiered"] == (
        "org.apache.kafka.common.errors.TopicAuthorizationException: "
        f"Not authorized to access topics: [{tiered.topic}]"
    ), steps
    assert steps["commit_tiered"] is not None  # the transaction is abortable, not committable
    assert (steps["abort"], steps["commit_plain"]) == (None, None), steps
    _check_refused(tiered, caplog, txn_id, before, 1)
    assert _committed_values(tiered.proxy.bootstrap, plain) == [b"java-committed"]


def test_aiokafka_producer_is_refused_then_aborts_and_commits_elsewhere(tiered, caplog):
    plain, txn_id = tiered.plain_topic("txn-plain-aio"), f"aio-{uuid.uuid4().hex[:8]}"
    before = tiered.proxy.proxy.tiering.txn_refusals.count
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        steps = txn_clients.aiokafka(tiered.proxy.bootstrap, txn_id, tiered.topic, plain, rounds=2)
    assert steps["send_tiered"] is not None, steps
    assert steps["commit_tiered"] == (
        f"TopicAuthorizationFailedError: [Error 29] TopicAuthorizationFailedError: "
        f"{{'{tiered.topic}'}}"
    ), steps
    assert (steps["abort"], steps["commit_plain"]) == (None, None), steps
    _check_refused(tiered, caplog, txn_id, before, 2)
    assert _committed_values(tiered.proxy.bootstrap, plain) == [b"aiokafka-committed"]


def test_librdkafka_producer_is_refused_then_aborts_and_commits_elsewhere(tiered, caplog):
    plain, txn_id = tiered.plain_topic("txn-plain-rdk"), f"rdk-{uuid.uuid4().hex[:8]}"
    before = tiered.proxy.proxy.tiering.txn_refusals.count
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        steps = txn_clients.librdkafka(
            tiered.proxy.bootstrap, txn_id, tiered.topic, plain, rounds=2, plain_first=True
        )
    assert steps["commit_tiered"] is not None and steps["commit_tiered"].startswith(
        "TOPIC_AUTHORIZATION_FAILED (abortable): Failed to add partition(s) to transaction"
    ), steps
    assert "Topic authorization failed" in steps["commit_tiered"]
    assert (steps["abort"], steps["commit_plain"]) == (None, None), steps
    _check_refused(tiered, caplog, txn_id, before, 2)
    assert _committed_values(tiered.proxy.bootstrap, plain) == [b"librdkafka-committed"]


def _call(bootstrap: str, request, response_type):
    host, port = bootstrap.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(encode_request(request, 11, "txn-refusal-test"))
        with sock.makefile("rb") as answer:  # buffered: each read returns all it asks
            (size,) = struct.unpack(">i", answer.read(4))
            return decode_response(answer.read(size), response_type)[1]


def test_a_request_naming_a_tiered_partition_never_reaches_kafka(tiered, caplog):
    plain = tiered.plain_topic("txn-plain-raw")
    request = AddPartitionsToTxnRequest(
        v3_and_below_transactional_id=f"raw-{uuid.uuid4().hex[:8]}",
        v3_and_below_producer_id=987_654_321,  # never given by Kafka
        v3_and_below_producer_epoch=0,
        v3_and_below_topics=(
            AddPartitionsToTxnTopic(name=plain, partitions=(0,)),
            AddPartitionsToTxnTopic(name=tiered.topic, partitions=(0,)),
        ),
    )
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        answer = _call(tiered.proxy.bootstrap, request, AddPartitionsToTxnResponse)
    results = {
        (t.name, p.partition_index): p.partition_error_code
        for t in answer.results_by_topic_v3_and_below
        for p in t.results_by_partition
    }
    assert results == {
        (plain, 0): ErrorCode.operation_not_attempted,
        (tiered.topic, 0): ErrorCode.topic_authorization_failed,
    }
    assert len(_warnings(caplog, request.v3_and_below_transactional_id)) == 1
    # the same request without the tiered topic goes to Kafka, which knows no such producer
    alone = AddPartitionsToTxnRequest(
        v3_and_below_transactional_id=request.v3_and_below_transactional_id,
        v3_and_below_producer_id=987_654_321,
        v3_and_below_producer_epoch=0,
        v3_and_below_topics=(AddPartitionsToTxnTopic(name=plain, partitions=(0,)),),
    )
    answer = _call(tiered.proxy.bootstrap, alone, AddPartitionsToTxnResponse)
    (topic,) = answer.results_by_topic_v3_and_below
    (partition,) = topic.results_by_partition
    assert partition.partition_error_code not in (
        ErrorCode.none,
        ErrorCode.topic_authorization_failed,
        ErrorCode.operation_not_attempted,
    )
