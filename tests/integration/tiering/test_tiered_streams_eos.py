"""A Kafka Streams application with processing.guarantee=exactly_once_v2 through a tiered
fleet (issue 17): its input, repartition, changelog and output topics tiered (or some of
them passthrough), a proxy killed with SIGKILL and the Streams instance killed midway;
the output read with read_committed is exactly what the input makes.

The application (java/EosSum.java, streams_app.py) re-keys each input value v to
"g<v % GROUPS>" (a repartition topic), keeps per key the count and sum of its values in a
RocksDB store (a changelog topic) and writes each update "<count>,<sum>" to the output;
its store's cache is off, so every input record makes exactly one update. Each of its
transactions writes repartition or changelog and output records and the input's or the
repartition topic's consumer offsets, through the proxies.

A producer writes the values 1..RECORDS to the tiered input through the fleet at a steady
rate; meanwhile the proxy of the application's zone (zone-a: its connections, and the
owner of some partitions) is killed with SIGKILL and, once the other proxy saw it leave
the fleet, started again (its shards wait for it meanwhile); then the application is
killed with SIGKILL and started again on the same state directory (same transactional
ids: the new instance fences the old one's open transactions; its store is rebuilt from
the changelog, read_committed).

Checked, from a read_committed read of the whole output: for each key g, its updates are
counts 1..n_g each once and in order, their sums' increments are exactly the values with
v % GROUPS == g (no update lost, none applied twice, none of an aborted transaction seen),
and no other key; a second read from the beginning (after the uploads: from objects)
answers the same records.
"""

from __future__ import annotations

import struct
import threading
import time
import uuid
from collections import defaultdict

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from streams_app import StreamsApp
from tieredfleet import TieredFleet, topic_id_of, wait_for_log

from tests.support.waiting import wait_for

pytestmark = [pytest.mark.kafka, pytest.mark.minio, pytest.mark.timeout(600)]

PARTITIONS = 4
GROUPS = 12
RECORDS = 3000
RATE = 150.0  # input records a second: 20 s of input


@pytest.fixture(scope="module")
def fleet(kafka_cluster, s3_server, tmp_path_factory):
    with TieredFleet(kafka_cluster.bootstrap, s3_server, tmp_path_factory.mktemp("fleet")) as f:
        yield f


class InputProducer:
    """An idempotent producer (acks=all) in a thread, writing key "u<n>", value n (a big
    endian long, Streams' LongSerde) for n in `values` (1..RECORDS) at RATE a second."""

    def __init__(self, bootstrap: str, topic: str, values: range = range(1, RECORDS + 1)) -> None:
        self.bootstrap, self.topic, self.values = bootstrap, topic, values
        self.acked: list[int] = []
        self.errors: list[str] = []
        self.left: int | None = None
        self._thread = threading.Thread(target=self._run, name="eos input")

    def start(self) -> InputProducer:
        self._thread.start()
        return self

    def join(self) -> None:
        self._thread.join(200)
        assert not self._thread.is_alive(), "the input producer did not finish"

    def _run(self) -> None:
        producer = Producer(
            {
                "bootstrap.servers": self.bootstrap,
                "client.id": "eos-input,tierproxy_az=zone-b",
                "enable.idempotence": True,
                "acks": "all",
                "linger.ms": 5,
                "message.timeout.ms": 120_000,
                "log_level": 2,  # a proxy that is down is expected here: no connect noise
            }
        )

        def delivered(err, msg) -> None:
            if err is not None:
                self.errors.append(str(err))
            else:
                self.acked.append(struct.unpack(">q", msg.value())[0])

        started = time.monotonic()
        for i, n in enumerate(self.values, 1):
            while (wait := started + i / RATE - time.monotonic()) > 0:
                producer.poll(min(wait, 0.05))
            producer.produce(self.topic, struct.pack(">q", n), key=f"u{n}".encode(),
                             on_delivery=delivered)  # fmt: skip
            producer.poll(0)
        self.left = producer.flush(150)


class OutputReader:
    """A read_committed consumer of every partition of the output from offset 0, in a
    thread; `updates[key]` is the (count, sum) updates of a key in the order read."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.bootstrap, self.topic = bootstrap, topic
        self.updates: dict[str, list[tuple[int, int]]] = defaultdict(list)
        self.at: dict[tuple[int, int], tuple[str, str]] = {}  # (partition, offset) -> record
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="eos output")

    def start(self) -> OutputReader:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)

    def _run(self) -> None:
        consumer = Consumer(
            {
                "bootstrap.servers": self.bootstrap,
                "client.id": "eos-output,tierproxy_az=zone-b",
                "group.id": f"eos-check-{uuid.uuid4().hex[:8]}",  # assign() only
                "isolation.level": "read_committed",
                "enable.auto.commit": False,
                "auto.offset.reset": "error",
                "log_level": 2,
            }
        )
        consumer.assign([TopicPartition(self.topic, p, 0) for p in range(PARTITIONS)])
        try:
            while not self._stop.is_set():
                for msg in consumer.consume(500, 0.2):
                    if msg.error() is not None:
                        self.errors.append(str(msg.error()))
                        continue
                    key, value = msg.key().decode(), msg.value().decode()
                    self.at[(msg.partition(), msg.offset())] = (key, value)
                    count, total = value.split(",")
                    self.updates[key].append((int(count), int(total)))
        finally:
            consumer.close()

    def complete(self, expected: dict[str, list[int]]) -> bool:
        return all(
            len(self.updates.get(key, ())) >= len(values) for key, values in expected.items()
        )


def _create_topics(fleet: TieredFleet, topics: dict[str, dict[str, str]]) -> None:
    admin = AdminClient({"bootstrap.servers": fleet.kafka_bootstrap})
    futures = admin.create_topics(
        [NewTopic(name, PARTITIONS, 3, config=config) for name, config in topics.items()]
    )
    for future in futures.values():
        future.result(30)
    for name in topics:
        wait_for(lambda n=name: topic_id_of(admin, n), lambda found: found is not None, name)


def _tier(fleet: TieredFleet, topics: list[str]) -> None:
    admin = AdminClient({"bootstrap.servers": fleet.kafka_bootstrap})
    for topic in topics:
        assert "tiered" in fleet.tier(topic)
    for topic in topics:
        topic_id = topic_id_of(admin, topic)
        assert topic_id is not None
        fleet.wait_for_cutover(topic_id, PARTITIONS)


def _check(updates: dict[str, list[tuple[int, int]]], expected: dict[str, list[int]]) -> None:
    """Each key's updates: counts 1..n in order, the sums' increments its values."""
    assert sorted(updates) == sorted(expected), "output keys"
    for key, values in expected.items():
        got = updates[key]
        counts = [count for count, _ in got]
        assert counts == list(range(1, len(values) + 1)), (
            f"{key}: {len(got)} updates for {len(values)} values; counts lost or repeated: "
            f"{_breaks(counts)}"
        )
        sums = [0] + [total for _, total in got]
        increments = sorted(b - a for a, b in zip(sums, sums[1:], strict=False))
        assert increments == sorted(values), f"{key}: the sums' increments are not its values"


def _breaks(counts: list[int]) -> list[tuple[int, int]]:
    """(index, count) where the counts do not go on by one: the first few."""
    return [(i, c) for i, c in enumerate(counts) if c != i + 1][:5]


def _read_all(bootstrap: str, topic: str, ends: dict[int, int]) -> dict[tuple[int, int], tuple]:
    """Every record of the output below `ends`, read_committed, from offset 0."""
    reader = OutputReader(bootstrap, topic).start()
    try:
        wait_for(
            lambda: {p: max((o for q, o in list(reader.at) if q == p), default=-1) for p in ends},
            lambda last: all(last[p] >= end - 1 for p, end in ends.items() if end > 0),
            "the second read of the output",
            60,
        )
    finally:
        reader.stop()
    return reader.at


VARIANTS = {
    # every topic of the application tiered
    "all-tiered": ("in", "rekey-repartition", "totals-changelog", "out"),
    # each transaction spans tiered and passthrough partitions: the input and the
    # changelog tiered, the repartition topic and the output passthrough
    "mixed": ("in", "totals-changelog"),
}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_exactly_once_streams_through_a_tiered_fleet_killed_midway(fleet, tmp_path, variant):
    began = time.monotonic()
    app_id = f"eos-{variant}-{uuid.uuid4().hex[:6]}"
    name = {short: f"{app_id}-{short}" for short in ("in", "out")}
    name |= {short: f"{app_id}-{short}" for short in ("rekey-repartition", "totals-changelog")}
    # Streams' internal topics made beforehand as Streams would make them, so they can be
    # tiered before it writes
    _create_topics(
        fleet,
        {
            name["in"]: {},
            name["out"]: {},
            name["rekey-repartition"]: {"cleanup.policy": "delete", "retention.ms": "-1"},
            name["totals-changelog"]: {"cleanup.policy": "compact"},
        },
    )
    _tier(fleet, [name[short] for short in VARIANTS[variant]])
    phases = [("topics tiered", time.monotonic() - began)]
    app = StreamsApp(tmp_path, fleet.bootstrap(), app_id, name["in"], name["out"], GROUPS)
    output = OutputReader(fleet.bootstrap(), name["out"]).start()
    expected: dict[str, list[int]] = defaultdict(list)
    for n in range(1, RECORDS + 1):
        expected[f"g{n % GROUPS}"].append(n)
    try:
        app.start()
        app.wait_running()
        phases.append(("streams running", time.monotonic() - began))
        source = InputProducer(fleet.bootstrap(), name["in"]).start()
        # a fifth in, the application's proxy dies; back once the other saw it go (its
        # shards wait for it: its WAL may hold what it acknowledged)
        wait_for(lambda: len(output.at), lambda got: got >= RECORDS // 5, "output flowing", 60)
        other = fleet["zone-b"]
        logged = other.log_size()
        fleet.kill("zone-a")
        wait_for_log(other, f"fleet changed; live: {other.name} (zone-b)\n", 60, after=logged)
        phases.append(("proxy killed", time.monotonic() - began))
        fleet.start("zone-a")
        fleet.wait_until_owned(timeout=60)
        phases.append(("proxy back", time.monotonic() - began))
        # then the application dies mid-transaction and starts again on its state directory
        wait_for(lambda: len(source.acked), lambda got: got >= RECORDS * 2 // 3, "input", 60)
        app.kill()
        phases.append(("streams killed", time.monotonic() - began))
        app.start()
        app.wait_running()
        phases.append(("streams running again", time.monotonic() - began))
        source.join()
        assert source.errors == [] and source.left == 0, source.errors[:5]
        assert sorted(source.acked) == list(range(1, RECORDS + 1))
        phases.append(("input written", time.monotonic() - began))
        wait_for(lambda: output.complete(expected), bool, "every update in the output", 90)
        phases.append(("output complete", time.monotonic() - began))
        # the output's end as read_committed sees it (no open transaction is left once the
        # input is processed: Streams commits every 200 ms)
        ends = {}
        for partition, offset in list(output.at):
            ends[partition] = max(ends.get(partition, 0), offset + 1)
    finally:
        output.stop()
        app.close()
    assert output.errors == []
    _check(dict(output.updates), expected)
    print(
        f"{variant}: {RECORDS} inputs, {len(output.at)} updates, {app.runs} Streams runs, "
        f"threads replaced {len(app.replaced_threads())}; at "
        + ", ".join(f"{what} {at:.0f} s" for what, at in phases)
    )
    again = _read_all(fleet.bootstrap(), name["out"], ends)
    assert {at: r for at, r in again.items() if at[1] < ends.get(at[0], 0)} == output.at


def test_the_check_catches_a_lost_a_repeated_and_a_foreign_update():
    """_check itself: the faults it is there to see."""
    expected = {"g0": [3, 6], "g1": [1, 4]}
    good = {"g0": [(1, 3), (2, 9)], "g1": [(1, 4), (2, 5)]}
    _check(good, expected)
    for bad in (
        {"g0": [(1, 3)], "g1": [(1, 4), (2, 5)]},  # an update lost
        {"g0": [(1, 3), (1, 3), (2, 9)], "g1": [(1, 4), (2, 5)]},  # one applied twice
        {"g0": [(1, 3), (2, 10)], "g1": [(1, 4), (2, 5)]},  # a wrong value
        {**good, "g2": [(1, 2)]},  # a key no input makes
    ):
        with pytest.raises(AssertionError):
            _check(bad, expected)
