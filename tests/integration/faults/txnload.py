"""The fault-injection suite's transactional load (issue 17), beside the idempotent one: a
librdkafka transactional producer committing and aborting small transactions on a tiered
topic of its own through the fleet, a read_committed consumer reading it meanwhile, and
the end checks.

Each transaction writes TXN_RECORDS records round robin over the topic's partitions
(`txn-<n>:<i>:` then padding) and is committed, or aborted on purpose one time in four.
What the producer was told is its outcome: committed (commit_transaction returned),
aborted (abort_transaction returned, on purpose or after an abortable error), or unknown
(a fatal error or a commit that did not answer: the producer is made again with the same
transactional.id, whose InitProducerId ends the transaction either way).

The end checks (`check`), on a read_committed read of the whole topic once the load
stopped, the live read_committed consumer, and a read_uncommitted read:
- every record of every committed transaction read once (nothing committed lost);
- no record of an aborted transaction read (nothing aborted visible), though the
  read_uncommitted read holds some of them (the aborts happened);
- no record twice (nothing committed twice), and an unknown transaction all or nothing;
- what the live consumer read under the faults is what the final read holds at those
  offsets (it never saw a record later aborted, nor a different one).
"""

from __future__ import annotations

import random
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from faultload import _quiet_logger
from tieredfleet import TieredFleet, topic_id_of

from proxy.metadata.streams import shard_of, stream_id
from tests.support.waiting import wait_for

TXN_RECORDS = 6  # records a transaction
TXN_RATE = 5.0  # transactions a second at most
ABORT_ONE_IN = 4
TXN_TIMEOUT_S = 120.0  # past the longest fault (MinIO down 60 s and its recovery)


def txn_value(n: int, i: int, size: int) -> bytes:
    return f"txn-{n}:{i}:".encode().ljust(size, b"t")


def parse_txn_value(value: bytes) -> tuple[int, int]:
    """(transaction, record in it) of a value `txn_value` made."""
    head, i, _ = value.split(b":", 2)
    return int(head.removeprefix(b"txn-")), int(i)


def tiered_txn_topic(fleet: TieredFleet, partitions: int) -> tuple[str, dict[int, int]]:
    """A new topic whose partitions fall in the shards of both proxies, tiered (empty);
    its name and {partition: cutover offset}."""
    admin = AdminClient({"bootstrap.servers": fleet.kafka_bootstrap})
    owners = fleet.owners()
    for attempt in range(20):
        name = f"txn-{fleet.suffix}-{attempt}"
        admin.create_topics([NewTopic(name, partitions, 3)])[name].result(30)
        topic_id = wait_for(lambda n=name: topic_id_of(admin, n), bool, f"{name} known")
        streams = [stream_id(topic_id, p) for p in range(partitions)]
        if len({owners[shard_of(s, fleet.shard_count)][0] for s in streams}) > 1:
            fleet.tier(name)
            return name, fleet.wait_for_cutover(topic_id, partitions)
        admin.delete_topics([name])[name].result(30)
    raise AssertionError(f"20 topics, each with every stream in one proxy's shards: {owners}")


@dataclass
class TxnLoad:
    """The transactional producer, in a thread until `stop()`."""

    bootstrap: str
    topic: str
    partitions: int
    zone: str
    value_bytes: int = 100
    seed: int = 0
    outcomes: dict[int, str] = field(default_factory=dict)  # txn -> committed/aborted/unknown
    errors: Counter[str] = field(default_factory=Counter)  # what the client raised, by kind
    client_log: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.transactional_id = f"faults-txn-{uuid.uuid4().hex[:8]}"
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="txn load", daemon=True)
        self._rng = random.Random(self.seed)
        self.committed_at: list[float] = []  # time.monotonic() of each commit
        self.died: str | None = None  # what ended its thread early

    def start(self) -> TxnLoad:
        self._thread.start()
        return self

    def stop(self, flush_timeout_s: float = TXN_TIMEOUT_S) -> None:
        """Stop once the transaction under way has ended."""
        self._stop.set()
        self._thread.join(flush_timeout_s + 60)
        assert not self._thread.is_alive(), "the transactional producer did not stop"

    def committed_since(self, since: float) -> int:
        assert self.died is None, f"the transactional producer died: {self.died}"
        return sum(1 for at in self.committed_at if at > since)

    def _producer(self) -> Producer:
        producer = Producer(
            {
                "bootstrap.servers": self.bootstrap,
                "client.id": f"txn-load,tierproxy_az={self.zone}",
                "transactional.id": self.transactional_id,
                "transaction.timeout.ms": int(TXN_TIMEOUT_S * 1000),
                "message.timeout.ms": int(TXN_TIMEOUT_S * 1000),
                "socket.timeout.ms": 10_000,
                "linger.ms": 5,
            },
            logger=_quiet_logger("txn-load", self.client_log),
        )
        while True:  # InitProducerId: the coordinator may be moving (a broker restart)
            try:
                producer.init_transactions(30)
                return producer
            except KafkaException as exc:
                self.errors[f"init: {exc.args[0].name()}"] += 1
                if not exc.args[0].retriable():
                    raise

    def _run(self) -> None:
        try:
            self._transactions()
        except Exception as exc:
            self.died = repr(exc)
            raise

    def _transactions(self) -> None:
        producer = self._producer()
        n = 0
        started = time.monotonic()
        while not self._stop.is_set():
            while (wait := started + n / TXN_RATE - time.monotonic()) > 0:
                time.sleep(min(wait, 0.05))
            n += 1
            outcome = self._transaction(producer, n, commit=self._rng.randrange(ABORT_ONE_IN) > 0)
            self.outcomes[n] = outcome
            if outcome == "committed":
                self.committed_at.append(time.monotonic())
            if outcome == "unknown":  # fatal: a new producer ends the old one's transaction
                producer = self._producer()

    def _transaction(self, producer: Producer, n: int, commit: bool) -> str:
        """One transaction; its outcome as the producer was told it."""
        try:
            producer.begin_transaction()
            for i in range(TXN_RECORDS):
                value = txn_value(n, i, self.value_bytes)
                while True:
                    try:
                        producer.produce(self.topic, value, partition=i % self.partitions)
                        break
                    except BufferError:
                        producer.poll(0.1)
            if not commit:  # its records written first: else the abort only drops them
                producer.flush(TXN_TIMEOUT_S)
                producer.abort_transaction(TXN_TIMEOUT_S)
                return "aborted"
            while True:
                try:
                    producer.commit_transaction(TXN_TIMEOUT_S)
                    return "committed"
                except KafkaException as exc:
                    error = exc.args[0]
                    self.errors[f"commit: {error.name()}"] += 1
                    if error.txn_requires_abort():
                        producer.abort_transaction(TXN_TIMEOUT_S)
                        return "aborted"
                    if not error.retriable():
                        raise
        except KafkaException as exc:
            error = exc.args[0]
            self.errors[f"{'fatal' if error.fatal() else 'other'}: {error.name()}"] += 1
            if error.txn_requires_abort():
                try:
                    producer.abort_transaction(TXN_TIMEOUT_S)
                    return "aborted"
                except KafkaException as again:
                    self.errors[f"abort: {again.args[0].name()}"] += 1
            return "unknown"


def read_all(
    bootstrap: str, topic: str, starts: dict[int, int], isolation: str, timeout_s: float = 120.0
) -> dict[tuple[int, int], bytes]:
    """(partition, offset) -> value of every record from `starts` to the end as of now (the
    last stable offset with read_committed), read through the fleet."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "client.id": "txn-check,tierproxy_az=zone-a",
            "group.id": f"txn-check-{uuid.uuid4().hex[:8]}",  # assign() only
            "isolation.level": isolation,
            "enable.auto.commit": False,
            "auto.offset.reset": "error",
            "log_level": 2,
        }
    )
    try:
        tps = [TopicPartition(topic, p, o) for p, o in starts.items()]
        ends = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), 30)[1] for p in starts}
        consumer.assign(tps)
        found: dict[tuple[int, int], bytes] = {}
        deadline = time.monotonic() + timeout_s
        while True:
            positions = {tp.partition: tp.offset for tp in consumer.position(tps)}
            if all(positions[p] >= end or end <= starts[p] for p, end in ends.items()):
                return found
            assert time.monotonic() < deadline, f"{isolation} read: at {positions} of {ends}"
            for msg in consumer.consume(1000, 0.5):
                assert msg.error() is None, msg.error()
                found[(msg.partition(), msg.offset())] = msg.value()
    finally:
        consumer.close()


def check(
    load: TxnLoad,
    committed_read: dict[tuple[int, int], bytes],
    uncommitted_read: dict[tuple[int, int], bytes],
    live_read: dict[int, list[tuple[int, bytes]]],
) -> dict[str, object]:
    """The end checks' counts (see the module's docstring): each must be 0 but
    `aborted_records_written` and the transaction counts."""
    by_txn: dict[int, list[bytes]] = {}
    for value in committed_read.values():
        by_txn.setdefault(parse_txn_value(value)[0], []).append(value)
    values = Counter(committed_read.values())
    outcomes = Counter(load.outcomes.values())
    lost = [
        n
        for n, outcome in load.outcomes.items()
        if outcome == "committed" and len(set(by_txn.get(n, ()))) != TXN_RECORDS
    ]
    aborted_seen = [n for n in by_txn if load.outcomes.get(n) == "aborted"]
    partial = [
        n
        for n, outcome in load.outcomes.items()
        if outcome == "unknown" and len(set(by_txn.get(n, ()))) not in (0, TXN_RECORDS)
    ]
    aborted_written = sum(
        1
        for v in uncommitted_read.values()
        if load.outcomes.get(parse_txn_value(v)[0]) == "aborted"
    )
    live_differs = [
        (p, offset)
        for p, records in live_read.items()
        for offset, value in records
        if committed_read.get((p, offset)) != value
    ]
    live_values = Counter(v for records in live_read.values() for _, v in records)
    return {
        "txn_committed": outcomes["committed"],
        "txn_aborted": outcomes["aborted"],
        "txn_unknown": outcomes["unknown"],
        "txn_client_errors": dict(load.errors),
        "txn_records_read_committed": len(committed_read),
        "txn_aborted_records_written": aborted_written,
        "txn_committed_lost": lost[:10],
        "txn_aborted_visible": aborted_seen[:10],
        "txn_unknown_partial": partial[:10],
        "txn_records_twice": sum(c - 1 for c in values.values() if c > 1),
        "txn_never_sent_visible": [n for n in by_txn if n not in load.outcomes][:10],
        "txn_live_differs": live_differs[:10],
        "txn_live_twice": sum(c - 1 for c in live_values.values() if c > 1),
    }
