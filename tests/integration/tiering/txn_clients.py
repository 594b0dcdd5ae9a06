"""Transactional producers of three clients meeting a tiered topic through the proxy.

Each one (librdkafka, aiokafka, Kafka's Java producer) runs the same steps and reports
what it surfaced at each, as `{step: error text or None}`:

- `send_tiered`: in a new transaction, one record to partition 0 of the tiered topic
  (the client's AddPartitionsToTxn names it first);
- `commit_tiered`: committing that transaction (it must fail: it is abortable);
- `abort`: aborting it;
- `commit_plain`: a new transaction with one record to partition 0 of a passthrough
  topic, committed.

`rounds` > 1 repeats the tiered transaction (send, commit, abort) that many times, with
the same transactional id, before the passthrough one. With `plain_first`, each tiered
transaction first sends a record to the passthrough topic and waits for it (librdkafka:
see `librdkafka`).
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
from pathlib import Path

from aiokafka import AIOKafkaProducer
from confluent_kafka import KafkaException, Producer

from proxy.devstack.paths import kafka_libs

Steps = dict[str, str | None]
JAVA_SOURCE = Path(__file__).parent / "java" / "TxnRefusal.java"
TIMEOUT_S = 30.0


def librdkafka(
    bootstrap: str, txn_id: str, tiered: str, plain: str, rounds: int = 1, plain_first=False
) -> Steps:
    """librdkafka sends EndTxn(abort) once it has sent any AddPartitionsToTxn, answered or
    not; Kafka answers INVALID_TXN_STATE (fatal) when the transaction holds no partition.
    `plain_first` puts a passthrough partition in the transaction first, so it has one."""
    steps: Steps = {}
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "transactional.id": txn_id,
            "message.timeout.ms": int(TIMEOUT_S * 1000),
        }
    )
    producer.init_transactions(TIMEOUT_S)
    for _ in range(rounds):
        failed: list[str] = []
        producer.begin_transaction()
        if plain_first:
            producer.produce(plain, b"librdkafka-aborted", partition=0)
            assert producer.flush(TIMEOUT_S) == 0
        producer.produce(
            tiered, b"to-tiered", partition=0, on_delivery=lambda e, m, f=failed: f.append(str(e))
        )
        left = producer.flush(TIMEOUT_S)
        steps["send_tiered"] = failed[0] if failed and failed[0] != "None" else (
            f"{left} left after flush" if left else None
        )  # fmt: skip
        steps["commit_tiered"] = _confluent(lambda: producer.commit_transaction(TIMEOUT_S))
        steps["abort"] = _confluent(lambda: producer.abort_transaction(TIMEOUT_S))
        if steps["abort"] is not None:
            return steps

    def commit_plain() -> None:
        producer.begin_transaction()
        producer.produce(plain, b"librdkafka-committed", partition=0)
        producer.commit_transaction(TIMEOUT_S)

    steps["commit_plain"] = _confluent(commit_plain)
    return steps


def _confluent(call) -> str | None:
    try:
        call()
    except KafkaException as exc:
        error = exc.args[0]
        kind = "fatal" if error.fatal() else "abortable" if error.txn_requires_abort() else ""
        return f"{error.name()} ({kind}): {error.str()}"
    return None


def aiokafka(bootstrap: str, txn_id: str, tiered: str, plain: str, rounds: int = 1) -> Steps:
    return asyncio.run(asyncio.wait_for(_aiokafka(bootstrap, txn_id, tiered, plain, rounds), 120))


async def _aiokafka(bootstrap: str, txn_id: str, tiered: str, plain: str, rounds: int) -> Steps:
    steps: Steps = {}
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, transactional_id=txn_id, request_timeout_ms=20000
    )
    await producer.start()
    try:
        for _ in range(rounds):
            await producer.begin_transaction()
            steps["send_tiered"] = await _aio(
                producer.send_and_wait(tiered, b"to-tiered", partition=0)
            )
            steps["commit_tiered"] = await _aio(producer.commit_transaction())
            steps["abort"] = await _aio(producer.abort_transaction())
            if steps["abort"] is not None:
                return steps

        async def commit_plain() -> None:
            await producer.begin_transaction()
            await producer.send_and_wait(plain, b"aiokafka-committed", partition=0)
            await producer.commit_transaction()

        steps["commit_plain"] = await _aio(commit_plain())
    finally:
        await producer.stop()
    return steps


async def _aio(call) -> str | None:
    try:
        await asyncio.wait_for(call, TIMEOUT_S)
    except Exception as exc:  # what the client surfaced, whatever it is
        return f"{type(exc).__name__}: {exc}"
    return None


def java(
    bootstrap: str, txn_id: str, tiered: str, plain: str, workdir: Path, rounds: int = 1
) -> Steps:
    """Kafka's Java producer, in TxnRefusal.java (one round: `rounds` must be 1)."""
    assert rounds == 1
    argv = [
        shutil.which("java") or "java",
        *("-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1"),
        "-Djava.net.preferIPv4Stack=true",
        *("-cp", f"{kafka_libs()}/*", str(JAVA_SOURCE)),
        *(bootstrap, txn_id, tiered, plain),
    ]
    errors = workdir / f"java-{txn_id}.err"
    with open(errors, "wb") as err:
        done = subprocess.run(argv, stdout=subprocess.PIPE, stderr=err, stdin=subprocess.DEVNULL,
                              text=True, timeout=240)  # fmt: skip
    assert done.returncode == 0, errors.read_text(errors="replace")[-3000:]
    steps: Steps = {}
    for line in done.stdout.splitlines():
        if line.startswith("{"):
            event = json.loads(line)
            steps[event["step"]] = event["error"]
    return steps
