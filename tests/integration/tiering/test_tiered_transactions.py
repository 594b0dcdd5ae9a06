"""Transactions on tiered topics through the proxy, each client's (Kafka's Java producer,
librdkafka, aiokafka), Kafka as the oracle: every scenario runs on a tiered topic and on
a passthrough twin (the same records through Kafka first, the tiered one then tiered),
and what consumers read must be the same, offsets included (the markers take the same
offsets in the stream as in Kafka's log).

- commit and abort: read_committed reads exactly the committed records, read_uncommitted
  all of them; Kafka's log of the tiered partition past the cutover holds only the
  markers the coordinator wrote there;
- fencing: a second producer with the same transactional.id fences the first, whose
  next send and commit fail as Kafka fails them; the fenced transaction is aborted. Also
  on a proxy whose background marker follow is stopped: the abort marker Kafka's
  coordinator wrote before it answered the second InitProducerId is in the stream before
  that answer reaches the client (the catch-up after InitProducerId, not the follow's
  luck), so the first producer's next send is refused as Kafka refuses it;
- read-process-write: a tiered input, a tiered and a passthrough output and the
  group's offsets (sendOffsetsToTransaction) commit all or nothing, and a new instance
  of the group resumes past what was committed (nothing processed twice);
- a transaction left open past transaction.timeout.ms is aborted by the coordinator:
  read_committed consumers never see it and move on to what was committed after it.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

import pytest
import txn_clients
from confluent_kafka import Consumer, Producer, TopicPartition
from cutover_load import create_topic, one_proxy, started, tiered_topic_id, topics_command

from proxy.devstack.proxy_thread import ProxyThread
from proxy.metadata.streams import stream_id
from tests.support.clients import watermarks
from tests.support.waiting import wait_for, wait_until

pytestmark = pytest.mark.kafka

BEFORE = 6  # records through Kafka before the cutover
TIMEOUT_S = 60.0
Read = tuple[list[tuple[int, bytes]], int]  # (offset, value) in order, the end reached


@dataclass
class Pair:
    """A passthrough topic and a tiered one, each with BEFORE records below the tiered
    one's cutover."""

    passthrough: str
    tiered: str
    cutover: int

    @property
    def topics(self) -> tuple[str, str]:
        return (self.passthrough, self.tiered)


class Proxied:
    def __init__(self, cluster, proxy: ProxyThread) -> None:
        self.cluster, self.proxy = cluster, proxy
        self.bootstrap = proxy.bootstrap

    def topic(self, name: str) -> str:
        topic = f"{name}-{uuid.uuid4().hex[:8]}"
        create_topic(self.cluster, topic, 1)
        return topic

    def tier(self, topic: str) -> int:
        """`tierproxy topics tier`, then the partition's cutover once written."""
        tiering = self.proxy.proxy.tiering
        assert topics_command("tier", topic, tiering.peer_port).returncode == 0
        stream = stream_id(tiered_topic_id(self.proxy, topic), 0)
        wait_until(lambda: started(tiering, stream), 60, "cut over")
        return tiering.state(stream).cutover(stream)

    def pair(self, name: str) -> Pair:
        topics = [self.topic(f"{name}-pass"), self.topic(f"{name}-tier")]
        for topic in topics:
            produce(self.cluster.bootstrap, topic, [b"before-%d" % n for n in range(BEFORE)])
        cutover = self.tier(topics[1])
        assert cutover == BEFORE
        return Pair(topics[0], topics[1], cutover)


@pytest.fixture(scope="module")
def proxied(kafka_cluster, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("txn")
    with one_proxy(kafka_cluster, tmp, f"txn-{uuid.uuid4().hex[:8]}") as proxy:
        yield Proxied(kafka_cluster, proxy)


@pytest.fixture(scope="module")
def unfollowed(kafka_cluster, tmp_path_factory):
    """A proxy of its own whose marker follower does not follow in the background: only
    catch-ups (after AddPartitionsToTxn, after InitProducerId) put markers in streams."""
    tmp = tmp_path_factory.mktemp("txn-unfollowed")
    with one_proxy(kafka_cluster, tmp, f"txnu-{uuid.uuid4().hex[:8]}") as proxy:
        markers = proxy.proxy.tiering.markers
        proxy.run(lambda: markers.stop_following())
        yield Proxied(kafka_cluster, proxy)


def produce(bootstrap: str, topic: str, values: list[bytes]) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    for value in values:
        producer.produce(topic, value, partition=0)
    assert producer.flush(30) == 0


def read(bootstrap: str, topic: str, isolation: str, until: int | None = None) -> Read:
    """Partition 0 from offset 0 to its end (read_committed: the last stable offset), or
    until `until` records are read."""
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": f"r-{uuid.uuid4().hex}",
         "isolation.level": isolation, "enable.partition.eof": True,
         "auto.offset.reset": "error", "enable.auto.commit": False}
    )  # fmt: skip
    consumer.assign([TopicPartition(topic, 0, 0)])
    got: list[tuple[int, bytes]] = []
    try:
        wait_for(lambda: _poll(consumer, got, until), bool, f"the end of {topic}", TIMEOUT_S)
        return got, consumer.position([TopicPartition(topic, 0)])[0].offset
    finally:
        consumer.close()


def _poll(consumer: Consumer, got: list, until: int | None) -> bool:
    msg = consumer.poll(0.2)
    if msg is None:
        return False
    if msg.error() is not None:
        assert msg.error().code() == msg.error()._PARTITION_EOF, msg.error()
        return until is None
    got.append((msg.offset(), msg.value()))
    return until is not None and len(got) >= until


def same_shape(pair: Pair, reads: dict[str, Read]) -> Read:
    """The tiered topic's read equals the passthrough's, its name for the other's in the
    values (transactional ids are `<topic>-tx`); the passthrough's read."""
    passthrough, tiered = reads[pair.passthrough], reads[pair.tiered]
    renamed = [
        (o, v.replace(pair.tiered.encode(), pair.passthrough.encode())) for o, v in tiered[0]
    ]
    assert (renamed, tiered[1]) == passthrough, f"tiered {tiered} != passthrough {passthrough}"
    return passthrough


def wait_decided(bootstrap: str, topic: str, high: int | None = None) -> None:
    """Until nothing in the partition is open (its last stable offset is its high
    watermark), and that is `high` if given: Kafka's coordinator writes the markers
    after it answers EndTxn, and the tiered partition's owner follows Kafka's log."""

    def ends() -> tuple[int, int]:
        rc = watermarks(bootstrap, topic, isolation="read_committed")[1]
        return watermarks(bootstrap, topic)[1], rc

    wait_for(ends, lambda e: e[0] == e[1] and high in (None, e[0]),
             f"{topic} decided up to {high}", TIMEOUT_S)  # fmt: skip


BEFORE_VALUES = [b"before-%d" % n for n in range(BEFORE)]


@pytest.mark.parametrize("client", txn_clients.CLIENTS)
def test_commits_and_aborts_read_as_on_kafka(proxied, client, tmp_path):
    pair = proxied.pair(f"txn-{client[:4]}")
    plan = [("commit", 7), ("abort", 5), ("commit", 3), ("abort", 2), ("commit", 1)]
    for topic in pair.topics:
        steps = txn_clients.plan(client, proxied.bootstrap, f"{topic}-tx", topic, plan, tmp_path)
        assert steps == {f"txn{t}": None for t in range(len(plan))}, (topic, steps)
        wait_decided(proxied.bootstrap, topic, BEFORE + sum(n for _, n in plan) + len(plan))
    committed = [
        v for t, (end, n) in enumerate(plan) if end == "commit"
        for v in txn_clients.values(f"{pair.passthrough}-tx", t, n)
    ]  # fmt: skip
    everything = [
        v
        for t, (_, n) in enumerate(plan)
        for v in txn_clients.values(f"{pair.passthrough}-tx", t, n)
    ]
    rc = same_shape(pair, {t: read(proxied.bootstrap, t, "read_committed") for t in pair.topics})
    assert [v for _, v in rc[0]] == BEFORE_VALUES + committed
    ru = same_shape(pair, {t: read(proxied.bootstrap, t, "read_uncommitted") for t in pair.topics})
    assert [v for _, v in ru[0]] == BEFORE_VALUES + everything
    assert rc[1] == ru[1] == BEFORE + len(everything) + len(plan)  # past the last marker
    # Kafka's log of the tiered partition: the cutover, then the coordinator's markers
    assert watermarks(proxied.cluster.bootstrap, pair.tiered) == (0, pair.cutover + len(plan))


@pytest.mark.parametrize("client", txn_clients.CLIENTS)
def test_a_second_producer_fences_the_first_as_on_kafka(proxied, client, tmp_path):
    pair = proxied.pair(f"fence-{client[:4]}")
    _fence(proxied, pair, client, tmp_path)


@pytest.mark.parametrize("client", txn_clients.CLIENTS)
def test_a_fenced_producer_is_refused_before_the_follow_sees_the_abort(
    unfollowed, client, tmp_path
):
    """The background follow is stopped: the abort marker the coordinator wrote when the
    second producer's InitProducerId fenced the first is in the stream only because that
    InitProducerId was answered after the owner caught the partition up (without that,
    the first producer's next send was accepted every time; Kafka refuses it)."""
    pair = unfollowed.pair(f"fenceu-{client[:4]}")
    _fence(unfollowed, pair, client, tmp_path, unfollowed=True)


def _fence(proxied: Proxied, pair: Pair, client: str, tmp_path, unfollowed: bool = False) -> None:
    steps = {
        t: txn_clients.fence(client, proxied.bootstrap, f"{t}-tx", t, tmp_path) for t in pair.topics
    }
    assert steps[pair.tiered] == steps[pair.passthrough], steps
    kafka = steps[pair.passthrough]
    assert (kafka["first_send"], kafka["second_init"], kafka["second_commit"]) == (None,) * 3
    assert kafka["first_next_send"] is not None, kafka  # fenced: Kafka refuses it
    assert kafka["first_commit"] is not None, kafka
    if unfollowed:  # the second producer's commit marker: no AddPartitionsToTxn after it
        tiering = proxied.proxy.proxy.tiering
        stream = stream_id(tiered_topic_id(proxied.proxy, pair.tiered), 0)
        marks = lambda: watermarks(proxied.cluster.bootstrap, pair.tiered)  # noqa: E731
        wait_until(lambda: marks() == (0, pair.cutover + 2), TIMEOUT_S, "the commit marker")
        proxied.proxy.run(lambda: tiering.markers.catch_up([stream]))
    for topic in pair.topics:
        wait_decided(proxied.bootstrap, topic)
    rc = same_shape(pair, {t: read(proxied.bootstrap, t, "read_committed") for t in pair.topics})
    assert [v for _, v in rc[0]] == BEFORE_VALUES + [f"{pair.passthrough}-tx-second-0".encode()]
    same_shape(pair, {t: read(proxied.bootstrap, t, "read_uncommitted") for t in pair.topics})


@pytest.mark.parametrize("client", txn_clients.CLIENTS)
def test_read_process_write_commits_all_or_nothing(proxied, client, tmp_path):
    """Input tiered, outputs tiered and passthrough, the group's offsets in the
    transaction, each round a new instance of the application (txn_clients.Round): aborted
    once (nothing of it anywhere), then committed (all of it), then nothing left to
    process (exactly once). The tiered output reads as its passthrough twin."""
    source = proxied.topic(f"rpw-in-{client[:4]}")
    outs = (proxied.topic(f"rpw-out-p-{client[:4]}"), proxied.topic(f"rpw-out-t-{client[:4]}"))
    pair = Pair(*outs, cutover=proxied.tier(outs[1]))
    proxied.tier(source)
    inputs = [f"in-{n}" for n in range(20)]
    produce(proxied.bootstrap, source, [v.encode() for v in inputs])
    outputs = [f"out-{v}".encode() for v in inputs]
    group = f"rpw-{client[:4]}-{uuid.uuid4().hex[:8]}"

    def run(ending: str) -> txn_clients.Round:
        return txn_clients.read_process_write(
            client, proxied.bootstrap, group, source, len(inputs), pair.topics, ending, tmp_path
        )

    def reads(isolation: str) -> Read:
        return same_shape(pair, {t: read(proxied.bootstrap, t, isolation) for t in pair.topics})

    assert run("abort") == txn_clients.Round(inputs)
    for topic in pair.topics:  # each transaction: its records, a marker
        wait_decided(proxied.bootstrap, topic, len(outputs) + 1)
    assert reads("read_committed")[0] == []
    assert committed(proxied.bootstrap, group, source) == -1001  # none
    # a new instance resumes where the group committed: nowhere, so from the start
    assert run("commit") == txn_clients.Round(inputs)
    for topic in pair.topics:
        wait_decided(proxied.bootstrap, topic, 2 * (len(outputs) + 1))
    rc = reads("read_committed")
    assert rc[0] == list(enumerate(outputs, start=len(outputs) + 1))
    assert [v for _, v in reads("read_uncommitted")[0]] == outputs * 2  # aborted: filtered
    assert committed(proxied.bootstrap, group, source) == len(inputs)
    # exactly once: the next instance finds nothing left to process
    assert run("commit") == txn_clients.Round([])
    assert committed(proxied.bootstrap, group, source) == len(inputs)
    assert reads("read_committed") == rc
    # Kafka's log of the tiered output: the cutover, then the coordinator's two markers
    assert watermarks(proxied.cluster.bootstrap, pair.tiered) == (0, pair.cutover + 2)


def committed(bootstrap: str, group: str, topic: str) -> int:
    """The group's committed offset of partition 0 (OffsetFetch, stable offsets only)."""
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": group, "isolation.level": "read_committed"}
    )
    try:
        [at] = consumer.committed([TopicPartition(topic, 0)], timeout=30)
        return at.offset
    finally:
        consumer.close()


def test_a_timed_out_transaction_is_aborted_and_read_committed_moves_on(proxied, tmp_path):
    """A transaction left open past transaction.timeout.ms: the coordinator aborts it
    (its marker reaches the tiered partition without any client); a read_committed
    consumer waiting at its first offset then reads what was committed after it."""
    pair = proxied.pair("txn-timeout")
    abandoned = {}
    for topic in pair.topics:
        producer = Producer(
            {"bootstrap.servers": proxied.bootstrap, "transactional.id": f"{topic}-open",
             "transaction.timeout.ms": 3000, "log_level": 0}
        )  # fmt: skip
        producer.init_transactions(30)
        producer.begin_transaction()
        for n in range(4):
            producer.produce(topic, f"{topic}-open-{n}".encode(), partition=0)
        assert producer.flush(30) == 0
        abandoned[topic] = producer  # never ended, never closed while the test runs
        after = txn_clients.plan("librdkafka", proxied.bootstrap, f"{topic}-tx", topic,
                                 [("commit", 3)], tmp_path)  # fmt: skip
        assert after == {"txn0": None}
        assert watermarks(proxied.bootstrap, topic, isolation="read_committed")[1] == BEFORE
    committed = txn_clients.values(f"{pair.passthrough}-tx", 0, 3)
    # a consumer from the start: stuck at the open transaction until the coordinator's abort
    reads = {
        t: read(proxied.bootstrap, t, "read_committed", until=BEFORE + len(committed))
        for t in pair.topics
    }
    for topic in pair.topics:  # 4 + 3 records, a commit and the abort marker
        wait_decided(proxied.bootstrap, topic, BEFORE + 4 + 3 + 2)
    rc = same_shape(pair, reads)
    assert [v for _, v in rc[0]] == BEFORE_VALUES + committed
    ru = same_shape(pair, {t: read(proxied.bootstrap, t, "read_uncommitted") for t in pair.topics})
    assert len(ru[0]) == BEFORE + 4 + 3
    abandoned.clear()
