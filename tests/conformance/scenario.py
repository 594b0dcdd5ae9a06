"""Runs a scenario: two new one-partition topics (passthrough and tiered) through the
same fleet, every op in order on both with the same client, the tiered-only ops on the
tiered topic alone; returns the rows to compare (compare.py)."""

from __future__ import annotations

import os
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from answers import Record
from compare import Row, report
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from ops import (
    Commit,
    DeleteRecords,
    EpochEnd,
    Fetch,
    ListOffsets,
    Produce,
    Restart,
    Resume,
    StrayKafkaWrite,
    Tier,
    TxnProduce,
    tiered_only,
)
from raw_kafka import epoch_ends, leaders
from tieredfleet import TieredFleet, topic_id_of

from tests.support.clients import watermarks
from tests.support.waiting import wait_for

# CONFORMANCE_ORACLE_ONLY=1: `Tier` does nothing, so both topics are Kafka's: every
# scenario must then conform, which checks the suite itself (its ops, runners and
# waits are deterministic), e.g. a new op before the tiered side supports it.
ORACLE_ONLY = bool(os.environ.get("CONFORMANCE_ORACLE_ONLY"))
MARKER_TIMEOUT_S = 30.0


@dataclass
class Scenario:
    """What a scenario ran on, for its report."""

    passthrough: str
    tiered: str
    base_ms: int
    rows: list[Row] = field(default_factory=list)
    cutover: int | None = None
    append_time: bool = False  # message.timestamp.type=LogAppendTime on both topics
    # (txn, topic) -> records the open transaction wrote there (its end writes a marker)
    in_txn: dict[tuple[int, str], int] = field(default_factory=dict)
    markers: dict[str, set[int]] = field(default_factory=dict)  # topic -> their offsets

    @property
    def title(self) -> str:
        return (
            f"passthrough {self.passthrough}, tiered {self.tiered}, base time {self.base_ms} "
            f"(timestamps below are relative to it), cutover {self.cutover}"
        )


class Runner:
    """The fleet, Kafka's own address (for stray writes) and one runner per client."""

    def __init__(self, fleet: TieredFleet, kafka_bootstrap: str, clients: dict[str, Any]):
        self.fleet = fleet
        self.kafka_bootstrap = kafka_bootstrap
        self.clients = clients
        self.admin = AdminClient({"bootstrap.servers": kafka_bootstrap})

    def new_scenario(self, tag: str, config: dict[str, str] | None = None) -> Scenario:
        suffix = uuid.uuid4().hex[:8]
        names = [f"conf-{tag}-pass-{suffix}", f"conf-{tag}-tier-{suffix}"]
        new = [NewTopic(name, 1, 3, config=dict(config or {})) for name in names]
        futures = self.admin.create_topics(new)
        for future in futures.values():
            future.result(30)
        for name in names:
            wait_for(lambda n=name: topic_id_of(self.admin, n), bool, f"{name} known")
        base_ms = (time.time_ns() // 1_000_000_000) * 1000
        append_time = (config or {}).get("message.timestamp.type") == "LogAppendTime"
        return Scenario(names[0], names[1], base_ms, append_time=append_time)

    def run(self, ops: list, tag: str = "gen", config: dict[str, str] | None = None) -> Scenario:
        """Every op in order, on two new topics with this topic config. An op that cannot
        run at all (a proxy that does not come back, a client that fails outright) fails
        with the rows so far."""
        scenario = self.new_scenario(tag, config)
        try:
            for step, op in enumerate(ops):
                started = time.monotonic()
                try:
                    scenario.rows.append(self.step(scenario, step, op))
                    scenario.rows[-1].seconds = time.monotonic() - started
                except Exception as exc:
                    raise AssertionError(
                        f"{report(scenario.rows, scenario.title)}\nstep {step}, {op}, failed: {exc}"
                    ) from exc
        finally:
            for client in self.clients.values():
                client.close_transactions()
        return scenario

    def step(self, s: Scenario, step: int, op) -> Row:
        both = [s.passthrough, s.tiered]
        if ORACLE_ONLY and tiered_only(op):
            return Row(step, str(op), "-", "skipped (oracle only)", compared=False)
        if isinstance(op, Tier):
            s.cutover = self.tier(s.tiered)
            return Row(step, str(op), "-", f"cutover at {s.cutover}", compared=False)
        if isinstance(op, Restart):
            return Row(step, str(op), "-", self.restart(), compared=False)
        if isinstance(op, StrayKafkaWrite):
            return Row(step, str(op), "-", self.stray_write(s.tiered, op), compared=False)
        if isinstance(op, EpochEnd):
            answers = {t: self.epoch_end(t, op) for t in both}
        else:
            client = self.clients[op.client]
            bootstrap = self.fleet[op.zone].bootstrap
            if isinstance(op, Produce):
                answers = client.produce(bootstrap, both, op, s.base_ms)
            elif isinstance(op, TxnProduce):
                answers = self.txn_produce(s, client, bootstrap, op)
            elif isinstance(op, Fetch):
                answers = client.fetch(bootstrap, both, op, s.base_ms)
            elif isinstance(op, ListOffsets):
                answers = client.list_offsets(bootstrap, both, op, s.base_ms)
            elif isinstance(op, DeleteRecords):
                answers = client.delete_records(bootstrap, both, op, s.base_ms)
            elif isinstance(op, Commit):
                group = f"{s.passthrough}-g{op.group}"
                answers = client.commit(bootstrap, both, op, group, s.base_ms)
            elif isinstance(op, Resume):
                group = f"{s.passthrough}-g{op.group}"
                answers = client.resume(bootstrap, both, op, group, s.base_ms)
            else:
                raise TypeError(f"not an op: {op!r}")
        if s.append_time:
            answers = {t: _append_times(a, s.base_ms) for t, a in answers.items()}
        if isinstance(op, ListOffsets):
            timed = answers  # a marker's own timestamp, for comparing with a record's
            answers = {t: _marker_time(a, s.markers.get(t, set())) for t, a in answers.items()}
            if op.spec == "max_timestamp" and _deleted_max(
                timed[s.passthrough],
                timed[s.tiered],
                watermarks(self.kafka_bootstrap, s.passthrough),
            ):
                kafka = f"{answers[s.passthrough]}: a deleted record (known difference)"
                return Row(step, str(op), kafka, answers[s.tiered], compared=False)
        return Row(step, str(op), answers[s.passthrough], answers[s.tiered])

    def tier(self, topic: str) -> int:
        """The admin path (`tierproxy topics tier`), then until the cutover is written."""
        self.fleet.tier(topic)
        topic_id = topic_id_of(self.admin, topic)
        assert topic_id is not None
        return self.fleet.wait_for_cutover(topic_id, 1)[0]

    def restart(self, timeout_s: float = 60.0) -> str:
        started = time.monotonic()
        self.fleet.stop()
        self.fleet.start()
        proxies = list(self.fleet.proxies.values())
        try:
            wait_for(lambda: all(p.ready()[0] for p in proxies), bool, "ready", timeout_s)
        except AssertionError:
            tails = "\n".join(f"{p.name}:\n{p.process.tail(15)}" for p in proxies)
            raise AssertionError(
                f"not ready {timeout_s:.0f} s after the restart (/readyz 503); "
                f"Kafka's partitions never stop being available:\n{tails}"
            ) from None
        return f"ready after {time.monotonic() - started:.1f} s"

    def epoch_end(self, topic: str, op: EpochEnd) -> tuple:
        proxy = self.fleet[op.zone]
        leader, epoch = leaders(("127.0.0.1", proxy.port), [topic])[topic, 0]
        # the proxy shows broker N at broker_port_base + N
        error, answered, end = epoch_ends(
            ("127.0.0.1", proxy.base_port + leader), {(topic, 0): epoch + op.delta}
        )[topic, 0]
        return ("epoch_end", error, answered - epoch if answered >= 0 else answered, end)

    def stray_write(self, topic: str, op: StrayKafkaWrite) -> str:
        producer = Producer(
            {"bootstrap.servers": self.kafka_bootstrap, "compression.type": op.codec,
             "linger.ms": 100, "log_level": 3}
        )  # fmt: skip
        offsets: list = []
        for n in range(op.count):
            producer.produce(
                topic, b"stray-%d" % n, partition=0,
                on_delivery=lambda err, msg: offsets.append(err or msg.offset()),
            )  # fmt: skip
        assert producer.flush(30) == 0
        return f"Kafka took them at {offsets}"

    def txn_produce(self, s: Scenario, client, bootstrap: str, op: TxnProduce) -> dict:
        """The client's answer; once a transaction that wrote to a topic ends, until its
        marker is in that topic's log. Kafka's coordinator answers EndTxn before it
        writes the markers (and the tiered topic's marker follows Kafka's): a read right
        after would see the transaction open or decided by chance."""
        topics = [s.passthrough, s.tiered]
        ending = op.end in ("commit", "abort")
        highs = {t: watermarks(bootstrap, t)[1] for t in topics} if ending else {}
        answers = client.txn_produce(bootstrap, topics, op, s.base_ms)
        for topic in topics:
            written = sum(isinstance(o, int) for o in answers[topic])
            s.in_txn[op.txn, topic] = s.in_txn.get((op.txn, topic), 0) + written
            if not ending:
                continue
            if s.in_txn.pop((op.txn, topic)) and answers[topic][-1] == op.end:
                after = highs[topic] + written  # the records, then the marker
                try:
                    wait_for(lambda t=topic: watermarks(bootstrap, t)[1], lambda h, a=after: h > a,
                             f"the marker of txn{op.txn} in {topic}", MARKER_TIMEOUT_S)  # fmt: skip
                except AssertionError:
                    answers[topic] += ("MARKER_NOT_SEEN",)
                else:
                    s.markers.setdefault(topic, set()).add(after)
        return answers


def _deleted_max(kafka, tiered, kafka_watermarks: tuple[int, int]) -> bool:
    """MAX_TIMESTAMP answered with a deleted record: Kafka answers the largest timestamp
    of its segments, deleted records of the segment holding its log start included, while
    a tiered topic answers the largest of what it still holds: the stream from its log
    start, and Kafka's part below the cutover as Kafka counts it (docs/tiering.md, "What
    a client can tell"). Only that case is not compared: Kafka's answer below its log
    start, the tiered one none or a record no later than Kafka's (its timestamp compared
    with a marker's own, the coordinator's clock, where Kafka answers a deleted marker)."""
    low, _ = kafka_watermarks
    if not (isinstance(kafka, tuple) and kafka[0] == "offset" and 0 <= kafka[1] < low):
        return False
    if tiered == ("offset", -1, -1, None):
        return True
    return (
        isinstance(tiered, tuple)
        and tiered[0] == "offset"
        and tiered[1] >= 0
        and isinstance(tiered[2], int)
        and isinstance(kafka[2], int)
        and tiered[2] <= kafka[2]
    )


def _marker_time(answer, markers: set[int]):
    """A marker's timestamp is the coordinator's clock when it ended the transaction, on
    each topic its own: ListOffsets answering a marker (the largest timestamp, a lookup
    past the records') is compared by offset."""
    if isinstance(answer, tuple) and answer[0] == "offset" and answer[1] in markers:
        return (*answer[:2], "marker's", *answer[3:])
    return answer


def _append_times(answer, base_ms: int):
    """With LogAppendTime each topic's timestamps are its own clock's: a record's is
    compared as "appended" when it is a time since the scenario began (the broker's or
    the proxy's), and stays as it is otherwise (a producer's timestamp kept)."""
    if not isinstance(answer, tuple):
        return answer
    now = time.time_ns() // 1_000_000 - base_ms
    return tuple(
        r._replace(ts="appended") if isinstance(r, Record) and 0 <= r.ts <= now else r
        for r in answer
    )
