"""The owner of a tiered partition killed (SIGKILL) in the middle of a transaction (issue
17): between the transaction's last Produce and its marker, or right after the client's
commit or abort returned, while the marker may not have reached the stream yet.

Real `tierproxy run` processes (`TieredFleet`, two zones, a metadata shard each) on the
shared Kafka and MinIO. One librdkafka transactional producer writes each transaction to
a tiered topic and to its passthrough twin alike, so Kafka's log of the twin is the
oracle: the tiered topic must read the same, offsets included (the markers take the same
offsets), read_committed and read_uncommitted, through either proxy.

The killed owner starts again under its name and recovers its WAL (its shard waits for
it); the marker of the transaction it was in the middle of is then found by the marker
follower from the position in its producer-state snapshot, and the producer's next
transaction (same producer id and epoch, its sequence numbers going on) lands after it.
"""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewTopic
from test_tiered_transactions import read, wait_decided
from tieredfleet import TieredFleet, TieredProxy, topic_id_of

from tests.support.waiting import wait_for

pytestmark = [pytest.mark.kafka, pytest.mark.minio]

TIMEOUT_S = 60.0


@pytest.fixture(scope="module")
def fleet(kafka_cluster, s3_server, tmp_path_factory):
    base = tmp_path_factory.mktemp("txn-kill")
    with TieredFleet(kafka_cluster.bootstrap, s3_server, base, shard_count=2) as started:
        yield started


def _ready(proxy: TieredProxy) -> None:
    wait_for(proxy.ready, lambda answer: answer[0], f"{proxy.name} ready", 60, 0.5)


def _end(producer: Producer, end: str) -> None:
    """commit or abort, retried while librdkafka calls the error retriable (the proxy it
    reached the coordinator through may be the one killed)."""
    call = producer.commit_transaction if end == "commit" else producer.abort_transaction
    for _ in range(5):
        try:
            call(TIMEOUT_S)
            return
        except KafkaException as exc:
            if not exc.args[0].retriable():
                raise
    raise AssertionError(f"{end} kept failing with retriable errors")


def _transaction(producer: Producer, topics: tuple[str, ...], tag: str, count: int) -> None:
    """One transaction's records to every topic, flushed (acknowledged), not ended."""
    producer.begin_transaction()
    for n in range(count):
        for topic in topics:
            producer.produce(topic, b"%s-%d" % (tag.encode(), n), partition=0)
    assert producer.flush(TIMEOUT_S) == 0


@pytest.mark.parametrize("end", ["commit", "abort"])
@pytest.mark.parametrize("moment", ["before_the_end", "after_the_end"])
def test_an_owner_killed_mid_transaction_changes_nothing_a_consumer_sees(fleet, moment, end):
    admin = AdminClient({"bootstrap.servers": fleet.kafka_bootstrap})
    passthrough, tiered = (f"kill-{moment[:5]}-{end}-{kind}-{fleet.suffix}" for kind in "pt")
    for topic in (passthrough, tiered):
        admin.create_topics([NewTopic(topic, 1, 3)])[topic].result(30)
    topic_id = wait_for(lambda: topic_id_of(admin, tiered), bool, "topic known")
    fleet.tier(tiered)
    assert fleet.wait_for_cutover(topic_id, 1) == {0: 0}
    topics = (passthrough, tiered)

    producer = Producer(
        {"bootstrap.servers": fleet.bootstrap(), "transactional.id": f"{tiered}-tx",
         "log_level": 0}
    )  # fmt: skip
    producer.init_transactions(TIMEOUT_S)
    _transaction(producer, topics, "first", 5)
    _end(producer, "commit")
    for topic in topics:
        wait_decided(fleet.bootstrap(), topic, 6)

    owner = fleet.by_name(fleet.stream_owner(topic_id, 0))
    _transaction(producer, topics, "killed", 10)  # acknowledged: in the owner's WAL
    if moment == "before_the_end":
        fleet.kill(owner.zone)
        _end(producer, end)  # the coordinator writes the marker while the owner is away
    else:
        _end(producer, end)
        fleet.kill(owner.zone)  # the follower may not have read the marker yet
    fleet.start(owner.zone)
    fleet.wait_until_owned()
    assert fleet.stream_owner(topic_id, 0) == owner.name  # its shard waited for it
    for proxy in fleet.proxies.values():
        _ready(proxy)

    # the producer's next transaction: same producer id and epoch, after the marker
    _transaction(producer, topics, "after", 3)
    _end(producer, "commit")
    for topic in topics:
        wait_decided(fleet.bootstrap(), topic, 6 + 11 + 4)

    killed = [b"killed-%d" % n for n in range(10)] if end == "commit" else []
    expected = [b"first-%d" % n for n in range(5)] + killed + [b"after-%d" % n for n in range(3)]
    for isolation in ("read_committed", "read_uncommitted"):
        for proxy in fleet.proxies.values():  # the owner and the proxy that asks it
            reads = {t: read(proxy.bootstrap, t, isolation) for t in topics}
            assert reads[tiered] == reads[passthrough], (isolation, proxy.name)
        if isolation == "read_committed":
            assert [value for _, value in reads[passthrough][0]] == expected
    producer.flush(TIMEOUT_S)
