"""Transactional producers of three clients (librdkafka, aiokafka, Kafka's Java producer)
running the same steps through the proxy, each step reported as the error the client
surfaced (its Kafka error name, or exception class) or None, so that a tiered topic's
run can be set against a passthrough topic's: Kafka is the oracle.

- `plan`: one producer, transactions one after another on partition 0 of a topic, each
  `(end, count)`: `count` records (values `values(txn_id, t, count)`), flushed, then
  committed or aborted. The answer: one step per transaction.
- `fence`: the first producer sends a record in a transaction (`first_send`); a second
  producer with the same transactional id initializes (`second_init`), which fences the
  first; the first sends again (`first_next_send`) and commits (`first_commit`), both
  refused as Kafka refuses them; the second commits a record of its own
  (`second_commit`). Values `<txn_id>-first-0`, `-first-1`, `-second-0`.
- `read_process_write`: one round of a read-process-write application, a new instance
  of it: a read_committed consumer in a group (subscribed) reads partition 0 of the
  input from the group's committed offset to its end; if it read anything, one
  transaction writes `out-<value>` of each record to partition 0 of every output
  (flushed: written before the end, which an abort would purge otherwise), sends the
  group's offsets (the client's sendOffsetsToTransaction) and commits or aborts.
  The answer: the values read and the error ending the transaction surfaced.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka import TopicPartition as AioTopicPartition
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from proxy.devstack.paths import kafka_libs

Steps = dict[str, str | None]
Plan = list[tuple[str, int]]  # (commit | abort, records)
CLIENTS = ("java", "librdkafka", "aiokafka")
JAVA_SOURCE = Path(__file__).parent / "java" / "TxnSteps.java"
TIMEOUT_S = 30.0


def values(txn_id: str, txn: int, count: int) -> list[bytes]:
    return [f"{txn_id}-{txn}-{n}".encode() for n in range(count)]


def transaction(producer: Producer, topic: str, values: list[bytes], commit: bool) -> None:
    """One librdkafka transaction on partition 0: the records flushed, then committed or
    aborted (raises what the client raises)."""
    producer.begin_transaction()
    for value in values:
        producer.produce(topic, value, partition=0)
    assert producer.flush(TIMEOUT_S) == 0
    if commit:
        producer.commit_transaction(TIMEOUT_S)
    else:
        producer.abort_transaction(TIMEOUT_S)


def plan(client: str, bootstrap: str, txn_id: str, topic: str, txns: Plan, workdir: Path):
    if client == "java":
        spec = ",".join(f"{end}:{count}" for end, count in txns)
        return _java("plan", bootstrap, txn_id, topic, workdir, spec)
    if client == "librdkafka":
        return _librdkafka_plan(bootstrap, txn_id, topic, txns)
    return asyncio.run(asyncio.wait_for(_aiokafka_plan(bootstrap, txn_id, topic, txns), 180))


def fence(client: str, bootstrap: str, txn_id: str, topic: str, workdir: Path) -> Steps:
    if client == "java":
        return _java("fence", bootstrap, txn_id, topic, workdir)
    if client == "librdkafka":
        return _librdkafka_fence(bootstrap, txn_id, topic)
    return asyncio.run(asyncio.wait_for(_aiokafka_fence(bootstrap, txn_id, topic), 180))


@dataclass(frozen=True)
class Round:
    """One read-process-write round: the input values read, and the error the client
    surfaced for its transaction (None: none, or no transaction: nothing was read)."""

    read: list[str]
    error: str | None = None


def read_process_write(
    client: str, bootstrap: str, group: str, source: str, end: int, outputs: tuple[str, ...],
    ending: str, workdir: Path,
) -> Round:  # fmt: skip
    """A round of the group's application (transactional id `<group>-tx`): the input
    `source` read up to `end`, processed into `outputs`, ended by `ending`."""
    txn_id = f"{group}-tx"
    if client == "java":
        more = (",".join(outputs), group, str(end), ending)
        events = _java_events("rpw", bootstrap, txn_id, source, workdir, *more)
        [read] = [e["read"] for e in events if "read" in e]
        return Round(read, *(e["error"] for e in events if e.get("step") == "end"))
    if client == "librdkafka":
        return _librdkafka_rpw(bootstrap, txn_id, group, source, end, outputs, ending)
    rpw = _aiokafka_rpw(bootstrap, txn_id, group, source, end, outputs, ending)
    return asyncio.run(asyncio.wait_for(rpw, 180))


# -- librdkafka ----------------------------------------------------------------------


def _producer(bootstrap: str, txn_id: str, **extra) -> Producer:
    config = {"bootstrap.servers": bootstrap, "transactional.id": txn_id,
              "message.timeout.ms": int(TIMEOUT_S * 1000), "log_level": 0, **extra}  # fmt: skip
    return Producer(config)


def _confluent(call) -> str | None:
    try:
        call()
    except KafkaException as exc:
        return exc.args[0].name()
    return None


def _send(producer: Producer, topic: str, value: bytes) -> str | None:
    """One record, flushed: the error its delivery report gave, or None."""
    failed: list = []
    producer.produce(topic, value, partition=0, on_delivery=lambda e, m: failed.append(e))
    try:
        left = producer.flush(TIMEOUT_S)
    except (KafkaException, SystemError) as exc:
        # a fatal error (fenced) raises from flush, around the delivery report's call
        cause = exc if isinstance(exc, KafkaException) else exc.__cause__ or exc.__context__
        if not isinstance(cause, KafkaException):
            raise
        return cause.args[0].name()
    if not failed:
        return f"{left} left after flush"
    return None if failed[0] is None else failed[0].name()


def _librdkafka_plan(bootstrap: str, txn_id: str, topic: str, txns: Plan) -> Steps:
    producer = _producer(bootstrap, txn_id)
    producer.init_transactions(TIMEOUT_S)
    steps: Steps = {}
    for t, (end, count) in enumerate(txns):
        producer.begin_transaction()
        for value in values(txn_id, t, count):
            producer.produce(topic, value, partition=0)
        assert producer.flush(TIMEOUT_S) == 0
        ending = producer.commit_transaction if end == "commit" else producer.abort_transaction
        steps[f"txn{t}"] = _confluent(lambda e=ending: e(TIMEOUT_S))
    return steps


def _librdkafka_fence(bootstrap: str, txn_id: str, topic: str) -> Steps:
    steps: Steps = {}
    first = _producer(bootstrap, txn_id)
    first.init_transactions(TIMEOUT_S)
    first.begin_transaction()
    steps["first_send"] = _send(first, topic, f"{txn_id}-first-0".encode())
    second = _producer(bootstrap, txn_id)
    steps["second_init"] = _confluent(lambda: second.init_transactions(TIMEOUT_S))
    steps["first_next_send"] = _send(first, topic, f"{txn_id}-first-1".encode())
    steps["first_commit"] = _confluent(lambda: first.commit_transaction(TIMEOUT_S))

    def second_commits() -> None:
        second.begin_transaction()
        second.produce(topic, f"{txn_id}-second-0".encode(), partition=0)
        second.commit_transaction(TIMEOUT_S)

    steps["second_commit"] = _confluent(second_commits)
    return steps


def _librdkafka_rpw(
    bootstrap: str, txn_id: str, group: str, source: str, end: int, outputs: tuple[str, ...],
    ending: str,
) -> Round:  # fmt: skip
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": group, "isolation.level": "read_committed",
         "enable.auto.commit": False, "auto.offset.reset": "earliest",
         "enable.partition.eof": True, "log_level": 0}
    )  # fmt: skip
    producer = _producer(bootstrap, txn_id)
    producer.init_transactions(TIMEOUT_S)
    consumer.subscribe([source])
    read: list[str] = []
    position, deadline = -1, time.monotonic() + 2 * TIMEOUT_S
    try:
        while position < end:  # an EOF event names the position at the end
            assert time.monotonic() < deadline, f"read {len(read)} of the input"
            msg = consumer.poll(0.2)
            if msg is None:
                continue
            if msg.error() is not None:
                assert msg.error().code() == KafkaError._PARTITION_EOF, msg.error()
            else:
                read.append(msg.value().decode())
            position = msg.offset() + (msg.error() is None)
        if not read:
            return Round(read)

        def process() -> None:
            producer.begin_transaction()
            for value in read:
                for output in outputs:
                    producer.produce(output, f"out-{value}".encode(), partition=0)
            assert producer.flush(TIMEOUT_S) == 0  # written: an abort purges what is not
            producer.send_offsets_to_transaction(
                [TopicPartition(source, 0, position)], consumer.consumer_group_metadata(),
                TIMEOUT_S,
            )  # fmt: skip
            ends = producer.commit_transaction if ending == "commit" else producer.abort_transaction
            ends(TIMEOUT_S)

        return Round(read, _confluent(process))
    finally:
        consumer.close()


# -- aiokafka ------------------------------------------------------------------------


async def _aio(call) -> str | None:
    try:
        await asyncio.wait_for(call, TIMEOUT_S)
    except Exception as exc:  # what the client surfaced, whatever it is
        return type(exc).__name__
    return None


def _aio_producer(bootstrap: str, txn_id: str) -> AIOKafkaProducer:
    return AIOKafkaProducer(
        bootstrap_servers=bootstrap, transactional_id=txn_id, request_timeout_ms=20000
    )


async def _aiokafka_plan(bootstrap: str, txn_id: str, topic: str, txns: Plan) -> Steps:
    steps: Steps = {}
    producer = _aio_producer(bootstrap, txn_id)
    await producer.start()
    try:
        for t, (end, count) in enumerate(txns):
            await producer.begin_transaction()
            sent = [await producer.send(topic, v, partition=0) for v in values(txn_id, t, count)]
            await asyncio.gather(*sent)
            ending = producer.commit_transaction if end == "commit" else producer.abort_transaction
            steps[f"txn{t}"] = await _aio(ending())
    finally:
        await producer.stop()
    return steps


async def _aiokafka_fence(bootstrap: str, txn_id: str, topic: str) -> Steps:
    steps: Steps = {}
    first, second = _aio_producer(bootstrap, txn_id), _aio_producer(bootstrap, txn_id)
    await first.start()
    try:
        await first.begin_transaction()
        value = f"{txn_id}-first-0".encode()
        steps["first_send"] = await _aio(first.send_and_wait(topic, value, partition=0))
        steps["second_init"] = await _aio(second.start())
        value = f"{txn_id}-first-1".encode()
        steps["first_next_send"] = await _aio(first.send_and_wait(topic, value, partition=0))
        steps["first_commit"] = await _aio(first.commit_transaction())

        async def second_commits() -> None:
            await second.begin_transaction()
            await second.send_and_wait(topic, f"{txn_id}-second-0".encode(), partition=0)
            await second.commit_transaction()

        steps["second_commit"] = await _aio(second_commits())
    finally:
        await _aio(first.stop())
        await _aio(second.stop())
    return steps


async def _aiokafka_rpw(
    bootstrap: str, txn_id: str, group: str, source: str, end: int, outputs: tuple[str, ...],
    ending: str,
) -> Round:  # fmt: skip
    consumer = AIOKafkaConsumer(
        source, bootstrap_servers=bootstrap, group_id=group, isolation_level="read_committed",
        enable_auto_commit=False, auto_offset_reset="earliest",
    )  # fmt: skip
    producer = _aio_producer(bootstrap, txn_id)
    await consumer.start()
    try:
        await producer.start()
        tp, read = AioTopicPartition(source, 0), []
        while tp not in consumer.assignment() or await consumer.position(tp) < end:
            batches = await consumer.getmany(timeout_ms=200)
            read += [r.value.decode() for r in batches.get(tp, [])]
        if not read:
            return Round(read)
        position = await consumer.position(tp)

        async def process() -> None:
            await producer.begin_transaction()
            sent = [await producer.send(o, f"out-{v}".encode(), partition=0)
                    for v in read for o in outputs]  # fmt: skip
            await asyncio.gather(*sent)
            await producer.send_offsets_to_transaction({tp: position}, group)
            ends = producer.commit_transaction if ending == "commit" else producer.abort_transaction
            await ends()

        return Round(read, await _aio(process()))
    finally:
        await _aio(producer.stop())
        await consumer.stop()


# -- Kafka's Java producer -----------------------------------------------------------


def _java(mode: str, bootstrap: str, txn_id: str, topic: str, workdir: Path, *more: str):
    """TxnSteps.java's steps."""
    events = _java_events(mode, bootstrap, txn_id, topic, workdir, *more)
    return {event["step"]: event["error"] for event in events if "step" in event}


def _java_events(mode: str, bootstrap: str, txn_id: str, topic: str, workdir: Path, *more: str):
    """TxnSteps.java, run as a single source file against Kafka's jars: its JSON lines."""
    argv = [
        shutil.which("java") or "java",
        *("-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1"),
        "-Djava.net.preferIPv4Stack=true",
        *("-cp", f"{kafka_libs()}/*", str(JAVA_SOURCE)),
        *(mode, bootstrap, txn_id, topic, *more),
    ]
    errors = workdir / f"java-{txn_id}.err"
    with open(errors, "wb") as err:
        done = subprocess.run(argv, stdout=subprocess.PIPE, stderr=err, stdin=subprocess.DEVNULL,
                              text=True, timeout=240)  # fmt: skip
    assert done.returncode == 0, errors.read_text(errors="replace")[-3000:]
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
