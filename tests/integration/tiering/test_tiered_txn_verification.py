"""KIP-890 partition verification on a tiered partition (docs/tiering.md, "Transactions":
verification): a zombie transactional batch is refused as Kafka refuses it, and the
partition's last stable offset does not hang.

A librdkafka transactional producer writes one record to a tiered partition and one to
a passthrough partition through the proxy, then aborts. A raw Produce (v10, then v11)
then sends a transactional batch of that producer id and epoch, with the transactional
id, as a zombie would (sent before the abort, arriving after its marker). Kafka, the
oracle, refuses it on the passthrough partition: INVALID_TXN_STATE "Partition was not
added to the transaction" at v10, TRANSACTION_ABORTABLE at v11. The tiered partition's
owner asks the coordinator the same question and answers the same. Without the
verification the batch would open a transaction no marker ends, and a read_committed
consumer would stop before it for ever; here a later transaction commits and a
read_committed consumer reads it, the aborted record not.
"""

from __future__ import annotations

import asyncio
import datetime
import uuid

import pytest
from aiokafka import AIOKafkaClient
from aiokafka import TopicPartition as AioPartition
from aiokafka.protocol.fetch import FetchRequest
from confluent_kafka import Consumer, Producer, TopicPartition
from cutover_load import create_topic, one_proxy
from kio.schema.errors import ErrorCode
from kio.schema.metadata.v12.request import MetadataRequest, MetadataRequestTopic
from kio.schema.metadata.v12.response import MetadataResponse
from kio.schema.produce.v10 import request as produce10
from kio.schema.produce.v10.response import ProduceResponse as ProduceResponse10
from kio.schema.produce.v11 import request as produce11
from kio.schema.produce.v11.response import ProduceResponse as ProduceResponse11
from kio.schema.types import TopicName, TransactionalId
from kio.static.primitive import i16, i32
from raw_kafka import call
from tiered_topic import TieredTopic

from proxy.records.batches import iter_batches
from tests.support.batches import build_batch
from tests.support.clients import watermarks
from tests.support.waiting import wait_for, wait_until

pytestmark = pytest.mark.kafka

PER_ROUND = 5
TIMEOUT_S = 30.0
PRODUCE = {10: (produce10, ProduceResponse10), 11: (produce11, ProduceResponse11)}


def _address(bootstrap: str) -> tuple[str, int]:
    host, port = bootstrap.split(",")[0].rsplit(":", 1)
    return host, int(port)


def leader_address(bootstrap: str, topic: str) -> tuple[str, int]:
    """The address partition 0 of `topic` is produced to, as `bootstrap` tells it."""
    request = MetadataRequest(
        topics=(MetadataRequestTopic(topic_id=None, name=TopicName(topic)),),
        allow_auto_topic_creation=False,
        include_topic_authorized_operations=False,
    )
    answer = call(_address(bootstrap), request, MetadataResponse)
    ((partition,),) = [[p for p in t.partitions if p.partition_index == 0] for t in answer.topics]
    (broker,) = [b for b in answer.brokers if b.node_id == partition.leader_id]
    return broker.host, int(broker.port)


def raw_produce(address, version: int, txn_id: str, topic: str, records: bytes):
    """(error code, error message) of partition 0 in a Produce of `version`, acks=-1."""
    module, response_type = PRODUCE[version]
    request = module.ProduceRequest(
        transactional_id=TransactionalId(txn_id),
        acks=i16(-1),
        timeout=datetime.timedelta(seconds=10),
        topic_data=(
            module.TopicProduceData(
                name=TopicName(topic),
                partition_data=(module.PartitionProduceData(index=i32(0), records=records),),
            ),
        ),
    )
    answer = call(address, request, response_type)
    ((part,),) = [t.partition_responses for t in answer.responses]
    return part.error_code.value, part.error_message


def read_committed(bootstrap: str, topic: str, until: bytes) -> list[bytes]:
    """Every value a read_committed consumer reads from partition 0 up to `until`."""
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": f"g-{uuid.uuid4().hex}",
         "isolation.level": "read_committed", "enable.auto.commit": False}
    )  # fmt: skip
    values: list[bytes] = []
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])

        def more() -> bool:
            message = consumer.poll(0.5)
            if message is not None and message.error() is None:
                values.append(message.value())
            return until in values

        wait_until(more, TIMEOUT_S, f"{until!r} read_committed")
    finally:
        consumer.close()
    return values


@pytest.fixture
def topics(kafka_cluster, tmp_path):
    suffix = uuid.uuid4().hex[:8]
    tiered, plain = f"txn-verify-{suffix}", f"txn-verify-plain-{suffix}"
    create_topic(kafka_cluster, tiered, 1)
    create_topic(kafka_cluster, plain, 1)
    with one_proxy(kafka_cluster, tmp_path, f"txnv-{suffix}", upload_interval_s=3600.0) as proxy:
        yield TieredTopic(proxy, tiered, 1, PER_ROUND), plain


def test_a_zombie_transactional_batch_is_refused_as_kafka_refuses_it(kafka_cluster, topics):
    tiered, plain = topics
    proxy, topic = tiered.proxy, tiered.topic
    txn_id = f"t-{uuid.uuid4().hex}"
    producer = Producer(
        {"bootstrap.servers": proxy.bootstrap, "transactional.id": txn_id, "linger.ms": 5,
         "message.timeout.ms": int(TIMEOUT_S * 1000)}
    )  # fmt: skip
    producer.init_transactions(TIMEOUT_S)
    producer.begin_transaction()
    producer.produce(topic, b"aborted", partition=0)
    producer.produce(plain, b"aborted", partition=0)
    assert producer.flush(TIMEOUT_S) == 0
    producer.abort_transaction(TIMEOUT_S)
    # the abort's marker in the stream (data + marker past the records before it)
    end = PER_ROUND + 2
    wait_until(lambda: watermarks(proxy.bootstrap, topic)[1] == end, 30, "the abort marker")

    # the zombie: the aborted transaction's producer id and epoch, its next sequence
    raw = wait_for(
        lambda: _raw_batch_of(kafka_cluster.bootstrap, plain), lambda b: b is not None, "batch"
    )
    header = next(h for h, _ in iter_batches(raw))
    assert header.is_transactional and header.producer_id >= 0
    zombie = build_batch(
        [b"zombie"],
        producer_id=header.producer_id,
        producer_epoch=header.producer_epoch,
        base_sequence=header.base_sequence + 1,
        transactional=True,
    )
    oracle = leader_address(kafka_cluster.bootstrap, plain)
    owner = leader_address(proxy.bootstrap, topic)
    verifier = tiered.tiering.txn_verifier
    assert verifier is not None
    for version, expected in (
        (10, ErrorCode.invalid_txn_state),
        (11, ErrorCode.transaction_abortable),
    ):
        # while the coordinator still writes the abort's markers it answers
        # CONCURRENT_TRANSACTIONS, which a producer is told as NOT_ENOUGH_REPLICAS
        kafka = wait_for(
            lambda v=version: raw_produce(oracle, v, txn_id, plain, zombie),
            lambda a: a[0] != ErrorCode.not_enough_replicas.value,
            "Kafka's verdict",
        )
        ours = raw_produce(owner, version, txn_id, topic, zombie)
        assert kafka[0] == expected.value, kafka
        assert ours == kafka, (version, ours, kafka)
    assert watermarks(proxy.bootstrap, topic)[1] == end  # nothing appended
    refused = verifier.metrics.refused
    assert refused.labels("INVALID_TXN_STATE")._value.get() >= 1
    assert refused.labels("TRANSACTION_ABORTABLE")._value.get() >= 1

    # a normal transaction is unaffected, and read_committed consumers are not blocked
    producer.begin_transaction()
    for value in (b"committed-a", b"committed-b"):
        producer.produce(topic, value, partition=0)
    assert producer.flush(TIMEOUT_S) == 0
    producer.commit_transaction(TIMEOUT_S)
    values = read_committed(proxy.bootstrap, topic, b"committed-b")
    assert b"committed-a" in values and b"aborted" not in values and b"zombie" not in values
    assert verifier.metrics.verifications._value.get() >= 3  # the zombie twice, the commit
    producer.flush(TIMEOUT_S)


def _raw_batch_of(bootstrap: str, topic: str) -> bytes | None:
    """The first batches of partition 0 of `topic` in Kafka's log, as bytes."""

    async def fetch() -> bytes | None:
        client = AIOKafkaClient(bootstrap_servers=bootstrap)
        await client.bootstrap()
        try:
            await client.set_topics([topic])
            leader = client.cluster.leader_for_partition(AioPartition(topic, 0))
            request = FetchRequest(100, 1, 1 << 20, 0, [(topic, [(0, 0, 1 << 20)])])
            response = await client.send(leader, request)
            ((_, partitions),) = response.topics
            ((_, error_code, _, *rest),) = partitions
            return (rest[-1] or None) if error_code == 0 else None
        finally:
            await client.close()

    return asyncio.run(fetch())
