"""DescribeProducers on a tiered topic answers what Kafka answers on a passthrough twin
(proxy/tiered/producers.py; docs/tiering.md, "Describing producers").

Two proxies (zone-a, zone-b); a tiered topic whose partitions' streams have different
owners, and a passthrough twin with as many partitions. The same producers write the same
records (explicit timestamps) to both, before and after the cutover: an idempotent
producer, a transaction committed and one left open. Kafka's own tool
(`kafka-transactions.sh describe-producers`, the Java Admin client) then describes every
partition of both topics, through both proxies (for the tiered one, the proxy that owns a
partition's stream and the one that asks the owner over the peer protocol). Each
producer's row must be Kafka's on the twin: epoch, last sequence, last timestamp,
coordinator epoch and open transaction's start offset. A committed transaction ends in
a marker each topic's log stamps itself: that row's last timestamp is compared with the
timestamp of the marker in the tiered topic's log, as Kafka's is with its own.

Without the tiered path Kafka answers the tiered partition from its log, which ends at
the cutover: the producer's sequence of the cutover and no open transaction.
"""

from __future__ import annotations

import datetime
import shutil
import subprocess
import uuid

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from kio.schema.fetch.v12.request import FetchPartition, FetchRequest, FetchTopic
from kio.schema.fetch.v12.response import FetchResponse
from kio.schema.metadata.v12.request import MetadataRequest, MetadataRequestTopic
from kio.schema.metadata.v12.response import MetadataResponse
from kio.schema.types import TopicName
from kio.static.primitive import i32, i64
from raw_kafka import call
from tieredfleet import TieredFleet

from proxy.devstack.paths import kafka_libs
from proxy.records.batches import iter_batches
from tests.support.clients import watermarks
from tests.support.waiting import wait_for, wait_until

pytestmark = [pytest.mark.kafka, pytest.mark.minio]

PARTITIONS = 3
TIMEOUT_S = 30.0
BASE_TS = 1_700_000_000_000
Row = tuple[int, int, int, int, int, int]  # id, epoch, coordinator epoch, seq, ts, txn start


def describe_producers(bootstrap: str, topic: str, partition: int) -> dict[int, Row]:
    """`kafka-transactions.sh describe-producers`: its rows by producer id."""
    argv = [
        shutil.which("java") or "java",
        "-Xmx256m",
        "-cp",
        f"{kafka_libs()}/*",
        "org.apache.kafka.tools.TransactionsCommand",
        "--bootstrap-server",
        bootstrap,
        "describe-producers",
        "--topic",
        topic,
        "--partition",
        str(partition),
    ]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, (done.stdout, done.stderr)
    lines = [line.split() for line in done.stdout.splitlines() if line.strip()]
    header, rows = lines[0], lines[1:]
    assert header[:2] == ["ProducerId", "ProducerEpoch"], done.stdout
    out: dict[int, Row] = {}
    for row in rows:
        start = -1 if row[5] == "None" else int(row[5])
        out[int(row[0])] = (int(row[0]), int(row[1]), int(row[2]), int(row[3]), int(row[4]), start)
    return out


def _produce(producer: Producer, topics: tuple[str, str], partition: int, n: int, ts: int):
    for topic in topics:
        for i in range(n):
            producer.produce(topic, b"v%d" % i, partition=partition, timestamp=ts + i)
    assert producer.flush(TIMEOUT_S) == 0


def _last_marker_timestamp(bootstrap: str, topic: str, partition: int) -> int:
    """The max timestamp of the last control batch of `topic`-`partition`, read through
    `bootstrap` from its leader with Fetch v12 (record batches as written, markers too)."""
    host, port = bootstrap.split(",")[0].rsplit(":", 1)
    request = MetadataRequest(
        topics=(MetadataRequestTopic(topic_id=None, name=TopicName(topic)),),
        allow_auto_topic_creation=False,
        include_topic_authorized_operations=False,
    )
    metadata = call((host, int(port)), request, MetadataResponse)
    ((leader,),) = [
        [p.leader_id for p in t.partitions if p.partition_index == partition]
        for t in metadata.topics
    ]
    (broker,) = [b for b in metadata.brokers if b.node_id == leader]
    markers, at, end = [], 0, None
    while end is None or at < end:  # an answer may stop at a batch: fetch on from there
        asked = FetchPartition(
            partition=i32(partition), fetch_offset=i64(at), partition_max_bytes=i32(1 << 20)
        )
        fetch = FetchRequest(
            max_wait=datetime.timedelta(0),
            min_bytes=i32(0),
            max_bytes=i32(1 << 20),
            topics=(FetchTopic(topic=topic, partitions=(asked,)),),
            forgotten_topics_data=(),
            rack_id="",
        )
        answer = call((broker.host, int(broker.port)), fetch, FetchResponse)
        (data,) = answer.responses[0].partitions
        assert int(data.error_code) == 0, data.error_code
        end = int(data.high_watermark)
        for header, _ in iter_batches(data.records or b""):
            at = header.next_offset
            if header.is_control:
                markers.append(header.max_timestamp)
    assert markers, f"no transaction marker in {topic}-{partition}"
    return markers[-1]


def test_a_tiered_topics_producers_are_described_as_kafka_describes_them(
    kafka_cluster, s3_server, tmp_path
):
    fleet = TieredFleet(kafka_cluster.bootstrap, s3_server, tmp_path)
    producers: list[Producer] = []
    try:
        fleet.start()
        fleet.wait_until_owned()
        tiered, topic_id = fleet.create_spread_topic(PARTITIONS)
        plain = f"producers-plain-{uuid.uuid4().hex[:8]}"
        admin = AdminClient({"bootstrap.servers": kafka_cluster.bootstrap})
        admin.create_topics([NewTopic(plain, PARTITIONS, 3)])[plain].result(30)
        both = (tiered, plain)
        bootstrap = fleet.bootstrap()
        config = {"bootstrap.servers": bootstrap, "linger.ms": 5}
        idempotent = Producer({**config, "enable.idempotence": True})
        producers.append(idempotent)
        _produce(idempotent, both, 0, 3, BASE_TS)  # before the cutover: Kafka's log
        fleet.tier(tiered)
        fleet.wait_for_cutover(topic_id, PARTITIONS)
        _produce(idempotent, both, 0, 4, BASE_TS + 10_000)  # the stream's
        _produce(idempotent, both, 2, 2, BASE_TS + 20_000)

        committed = Producer({**config, "transactional.id": f"pc-{uuid.uuid4().hex}"})
        producers.append(committed)
        committed.init_transactions(TIMEOUT_S)
        committed.begin_transaction()
        _produce(committed, both, 1, 2, BASE_TS + 30_000)
        committed.commit_transaction(TIMEOUT_S)
        opened = Producer({**config, "transactional.id": f"po-{uuid.uuid4().hex}"})
        producers.append(opened)
        opened.init_transactions(TIMEOUT_S)
        opened.begin_transaction()
        _produce(opened, both, 2, 3, BASE_TS + 40_000)
        # the commit's marker is in each topic's log (data + marker on partition 1)
        for topic in both:
            wait_until(lambda t=topic: watermarks(bootstrap, t, 1)[1] == 3, TIMEOUT_S, topic)

        by_name = {proxy.name: proxy for proxy in fleet.proxies.values()}
        owners = {fleet.stream_owner(topic_id, p) for p in range(PARTITIONS)}
        assert len(owners) > 1, owners  # some partitions are asked of the other proxy
        marker_ts = {t: _last_marker_timestamp(bootstrap, t, 1) for t in both}
        for p in range(PARTITIONS):
            kafka = describe_producers(by_name[next(iter(owners))].bootstrap, plain, p)
            assert kafka, f"Kafka keeps no producer of {plain}-{p}"
            if p == 1:  # the committed transaction ended with the plain log's own marker
                assert {row[4] for row in kafka.values()} == {marker_ts[plain]}
            for proxy in fleet.proxies.values():
                ours = describe_producers(proxy.bootstrap, tiered, p)
                if p == 1:  # ... and the tiered log's own marker
                    assert {row[4] for row in ours.values()} == {marker_ts[tiered]}
                    ours = {k: (*v[:4], marker_ts[plain], v[5]) for k, v in ours.items()}
                assert ours == kafka, (p, proxy.name, ours, kafka)
        # the open transaction is the tiered partition's own, at the stream's offsets
        (open_row,) = [r for r in describe_producers(bootstrap, tiered, 2).values() if r[5] >= 0]
        assert open_row[5] == 2 and open_row[3] == 2
        opened.abort_transaction(TIMEOUT_S)
        wait_for(
            lambda: describe_producers(bootstrap, tiered, 2),
            lambda rows: all(r[5] == -1 for r in rows.values()),
            "the aborted transaction closed",
            timeout=TIMEOUT_S,
        )
    finally:
        for producer in producers:
            producer.flush(0)
        fleet.close()
