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

import shutil
import subprocess
import time
import uuid

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from raw_kafka import fetch_v12, leader_address
from tieredfleet import TieredFleet, topic_id_of

from proxy.devstack.paths import kafka_libs
from proxy.records.batches import iter_batches
from tests.support.clients import watermarks
from tests.support.waiting import wait_for, wait_until

pytestmark = [pytest.mark.kafka, pytest.mark.minio]

PARTITIONS = 3
TIMEOUT_S = 30.0
# the records' timestamps: an hour ago. Kafka's own retention (7 days, checked every few
# minutes) rolls and drops segments older than that, and dropped a fixed 2023 timestamp's
# records from the passthrough topic in the middle of a comparison
BASE_TS = (int(time.time()) - 3600) * 1000
Row = tuple[int, int, int, int, int, int]  # id, epoch, coordinator epoch, seq, ts, txn start


def transactions_command(bootstrap: str, *args: str) -> str:
    """`kafka-transactions.sh` (Kafka's TransactionsCommand, the Java Admin client): its
    output, once it succeeded."""
    argv = [
        shutil.which("java") or "java",
        "-Xmx256m",
        "-cp",
        f"{kafka_libs()}/*",
        "org.apache.kafka.tools.TransactionsCommand",
        "--bootstrap-server",
        bootstrap,
        *args,
    ]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, (args, done.stdout, done.stderr)
    return done.stdout


def describe_producers(bootstrap: str, topic: str, partition: int) -> dict[int, Row]:
    """`kafka-transactions.sh describe-producers`: its rows by producer id."""
    stdout = transactions_command(
        bootstrap, "describe-producers", "--topic", topic, "--partition", str(partition)
    )
    lines = [line.split() for line in stdout.splitlines() if line.strip()]
    header, rows = lines[0], lines[1:]
    assert header[:2] == ["ProducerId", "ProducerEpoch"], stdout
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
    address = leader_address(bootstrap.split(",")[0], topic, partition)
    markers, at, end = [], 0, None
    while end is None or at < end:  # an answer may stop at a batch: fetch on from there
        data = fetch_v12(address, topic, partition, at)
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


def _committed_values(bootstrap: str, topic: str) -> list[bytes]:
    """What a read_committed consumer reads of partition 0, to its end."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"abort-{uuid.uuid4().hex[:8]}",
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
            "enable.auto.commit": False,
        }
    )
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        values: list[bytes] = []
        while True:
            msg = consumer.poll(TIMEOUT_S)
            assert msg is not None, f"{topic}: no end of partition in {TIMEOUT_S} s"
            if msg.error() is None:
                values.append(msg.value())
            elif msg.error().code() == KafkaError._PARTITION_EOF:
                return values
            else:
                raise AssertionError(f"{topic}: {msg.error()}")
    finally:
        consumer.close()


def test_an_open_transaction_aborted_by_the_admin_tool_ends_as_on_kafka(
    kafka_cluster, s3_server, tmp_path
):
    """`kafka-transactions.sh abort --start-offset` (the operator's cure for a hanging
    transaction): the tool finds the producer by DescribeProducers (the owner's state on
    the tiered topic) and sends WriteTxnMarkers to the partition's leader, which writes the
    abort marker in Kafka's log; the marker follower carries it into the stream. Both
    topics then read the same to read_committed consumers, without the aborted records,
    also once the producer, which never learnt of it, commits."""
    fleet = TieredFleet(kafka_cluster.bootstrap, s3_server, tmp_path)
    producers: list[Producer] = []
    try:
        fleet.start()
        fleet.wait_until_owned()
        tiered = f"abort-tiered-{uuid.uuid4().hex[:8]}"
        plain = f"abort-plain-{uuid.uuid4().hex[:8]}"
        admin = AdminClient({"bootstrap.servers": kafka_cluster.bootstrap})
        for name in (tiered, plain):
            admin.create_topics([NewTopic(name, 1, 3)])[name].result(30)
        both = (tiered, plain)
        bootstrap = fleet.bootstrap()
        config = {"bootstrap.servers": bootstrap, "linger.ms": 5}
        plain_producer = Producer(config)
        producers.append(plain_producer)
        _produce(plain_producer, both, 0, 3, BASE_TS)  # before the cutover
        topic_id = wait_for(lambda: topic_id_of(admin, tiered), bool, f"{tiered} known")
        fleet.tier(tiered)
        assert fleet.wait_for_cutover(topic_id, 1) == {0: 3}
        _produce(plain_producer, both, 0, 2, BASE_TS + 10_000)  # the stream's, committed

        opened = Producer({**config, "transactional.id": f"pa-{uuid.uuid4().hex}"})
        producers.append(opened)
        opened.init_transactions(TIMEOUT_S)
        opened.begin_transaction()
        for topic in both:
            for i in range(4):
                opened.produce(topic, b"aborted-%d" % i, partition=0, timestamp=BASE_TS + i)
        assert opened.flush(TIMEOUT_S) == 0
        for topic in both:  # the open transaction, at the same offset of each topic
            rows = describe_producers(bootstrap, topic, 0)
            assert [r[5] for r in rows.values() if r[5] >= 0] == [5], (topic, rows)
            transactions_command(
                bootstrap, "abort", "--topic", topic, "--partition", "0", "--start-offset", "5"
            )
        for topic in both:  # on the tiered topic once the follower carried the marker
            wait_for(
                lambda t=topic: describe_producers(bootstrap, t, 0),
                lambda rows: all(r[5] == -1 for r in rows.values()),
                f"{topic}: the transaction aborted",
                timeout=TIMEOUT_S,
            )
        rows = {t: describe_producers(bootstrap, t, 0) for t in both}
        # the rows but the last timestamp: each log stamps its own marker
        assert {k: v[:4] + v[5:] for k, v in rows[tiered].items()} == {
            k: v[:4] + v[5:] for k, v in rows[plain].items()
        }
        expected = [b"v0", b"v1", b"v2", b"v0", b"v1"]
        assert _committed_values(bootstrap, tiered) == _committed_values(bootstrap, plain)
        assert _committed_values(bootstrap, plain) == expected

        # the producer never learnt: its commit ends a transaction the partitions no
        # longer hold open (Kafka appends the marker, which commits nothing)
        ends = {t: watermarks(bootstrap, t)[1] for t in both}
        opened.commit_transaction(TIMEOUT_S)
        for topic in both:
            wait_until(lambda t=topic: watermarks(bootstrap, t)[1] > ends[t], TIMEOUT_S, topic)
        assert _committed_values(bootstrap, tiered) == _committed_values(bootstrap, plain)
        assert _committed_values(bootstrap, plain) == expected
        rows = {t: describe_producers(bootstrap, t, 0) for t in both}
        assert {k: v[:4] + v[5:] for k, v in rows[tiered].items()} == {
            k: v[:4] + v[5:] for k, v in rows[plain].items()
        }
    finally:
        for producer in producers:
            producer.flush(0)
        fleet.close()
