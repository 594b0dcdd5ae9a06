"""Runs a scenario: two new one-partition topics (passthrough and tiered) through the
same fleet, every op in order on both with the same client, the tiered-only ops on the
tiered topic alone; returns the rows to compare (compare.py)."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from answers import Record
from compare import Row, report
from confluent_kafka import KafkaException, Producer
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
    StrayTransaction,
    Tier,
)
from raw_kafka import epoch_ends, leaders
from tieredfleet import TieredFleet, topic_id_of

from tests.support.waiting import wait_for


@dataclass
class Scenario:
    """What a scenario ran on, for its report."""

    passthrough: str
    tiered: str
    base_ms: int
    rows: list[Row] = field(default_factory=list)
    cutover: int | None = None
    append_time: bool = False  # message.timestamp.type=LogAppendTime on both topics

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
        for step, op in enumerate(ops):
            started = time.monotonic()
            try:
                scenario.rows.append(self.step(scenario, step, op))
                scenario.rows[-1].seconds = time.monotonic() - started
            except Exception as exc:
                raise AssertionError(
                    f"{report(scenario.rows, scenario.title)}\nstep {step}, {op}, failed: {exc}"
                ) from exc
        return scenario

    def step(self, s: Scenario, step: int, op) -> Row:
        both = [s.passthrough, s.tiered]
        if isinstance(op, Tier):
            s.cutover = self.tier(s.tiered)
            return Row(step, str(op), "-", f"cutover at {s.cutover}", compared=False)
        if isinstance(op, Restart):
            return Row(step, str(op), "-", self.restart(), compared=False)
        if isinstance(op, StrayKafkaWrite):
            return Row(step, str(op), "-", self.stray_write(s.tiered, op), compared=False)
        if isinstance(op, StrayTransaction):
            return Row(step, str(op), "-", self.stray_transaction(s.tiered, op), compared=False)
        if isinstance(op, EpochEnd):
            answers = {t: self.epoch_end(t, op) for t in both}
        else:
            client = self.clients[op.client]
            bootstrap = self.fleet[op.zone].bootstrap
            if isinstance(op, Produce):
                answers = client.produce(bootstrap, both, op, s.base_ms)
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

    def stray_transaction(self, topic: str, op: StrayTransaction) -> str:
        producer = Producer(
            {"bootstrap.servers": self.fleet[op.zone].bootstrap,
             "client.id": f"conformance-txn,tierproxy_az={op.zone}",
             "transactional.id": f"conformance-{uuid.uuid4().hex}",
             "transaction.timeout.ms": 10000, "message.timeout.ms": 10000, "log_level": 0}
        )  # fmt: skip
        said: list[str] = []
        try:
            producer.init_transactions(20)
            producer.begin_transaction()
            producer.produce(
                topic, b"in-a-transaction", partition=0,
                on_delivery=lambda err, msg: said.append(f"delivery: {err}"),
            )  # fmt: skip
            producer.flush(15)
            producer.commit_transaction(15)
            said.append("committed")
        except KafkaException as exc:
            said.append(f"refused: {exc.args[0].name()}")
            try:
                producer.abort_transaction(15)
                said.append("aborted")
            except KafkaException as again:
                said.append(f"abort: {again.args[0].name()}")
        return "; ".join(said)


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
