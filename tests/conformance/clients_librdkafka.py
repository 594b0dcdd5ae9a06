"""The librdkafka runner (confluent_kafka): every op against a list of topics (partition
0 of each), one client for all of them where the op allows, answers as in answers.py."""

from __future__ import annotations

import time
import uuid

import ops
from answers import OUT_OF_RANGE, Record, end, error, offset_answer, relative
from confluent_kafka import (
    OFFSET_INVALID,
    TIMESTAMP_LOG_APPEND_TIME,
    Consumer,
    IsolationLevel,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, OffsetSpec
from ops import Commit, DeleteRecords, Fetch, ListOffsets, Produce, Resume, TxnProduce

from tests.support.clients import watermarks

TIMEOUT_S = 30.0
ADMIN_TIMEOUT_S = 15.0  # ListOffsets: Kafka answers it at once
DELETE_TIMEOUT_S = ops.DELETE_TIMEOUT_MS / 1000


def _name(err: KafkaError) -> str:
    if err.code() == KafkaError._AUTO_OFFSET_RESET and "out of range" in err.str().lower():
        return OUT_OF_RANGE  # auto.offset.reset=error: the broker's OFFSET_OUT_OF_RANGE
    return err.name()


def _failure(exc: KafkaException) -> tuple[str, str]:
    return error(_name(exc.args[0]))


def _failure_of(call) -> str | None:
    """None, or the name of the error the call raised (a transactional call's)."""
    try:
        call()
    except KafkaException as exc:
        return _name(exc.args[0])
    return None


class Librdkafka:
    name = "librdkafka"

    def __init__(self) -> None:
        self._producers: dict[tuple[str, str], Producer] = {}
        self._admins: dict[str, AdminClient] = {}
        self._txns: dict[str, tuple[Producer, bool]] = {}  # transactional id -> (it, open)

    def close(self) -> None:
        for producer in self._producers.values():
            producer.flush(10)
        self._producers.clear()
        self._admins.clear()
        self.close_transactions()

    def close_transactions(self) -> None:
        """The scenario's transactional producers, gone (an open transaction aborted)."""
        for producer, open_ in self._txns.values():
            if open_:
                _failure_of(lambda p=producer: p.abort_transaction(10))
            producer.flush(1)
        self._txns.clear()

    def _config(self, bootstrap: str, zone: str, **extra) -> dict:
        return {
            "bootstrap.servers": bootstrap,
            "client.id": f"conformance-librdkafka,tierproxy_az={zone}",
            "log_level": 2,  # no connect noise while a proxy restarts
            **extra,
        }

    def _producer(self, bootstrap: str, zone: str, codec: str) -> Producer:
        key = (bootstrap, codec)
        if key not in self._producers:
            self._producers[key] = Producer(
                self._config(
                    bootstrap, zone,
                    **{"compression.type": codec, "enable.idempotence": True, "acks": "all",
                       "linger.ms": 1000, "batch.num.messages": 10000,
                       "message.timeout.ms": 60000},
                )
            )  # fmt: skip
        return self._producers[key]

    def _admin(self, bootstrap: str, zone: str) -> AdminClient:
        if bootstrap not in self._admins:
            self._admins[bootstrap] = AdminClient(self._config(bootstrap, zone))
        return self._admins[bootstrap]

    def produce(self, bootstrap: str, topics: list[str], op: Produce, base_ms: int) -> dict:
        producer = self._producer(bootstrap, op.zone, op.codec)
        got: dict[str, list] = {t: [None] * len(op.records) for t in topics}

        def report(topic: str, n: int):
            def delivered(err, msg) -> None:
                got[topic][n] = _name(err) if err is not None else msg.offset()

            return delivered

        for topic in topics:
            for n, r in enumerate(op.records):
                producer.produce(
                    topic, r.value, r.key, partition=0, timestamp=base_ms + r.ts,
                    headers=list(r.headers), on_delivery=report(topic, n),
                )  # fmt: skip
        left = producer.flush(TIMEOUT_S * 2)
        if left:
            self._producers.pop((bootstrap, op.codec), None)
        return {t: tuple("NOT_DELIVERED" if o is None else o for o in got[t]) for t in topics}

    def txn_produce(self, bootstrap: str, topics: list[str], op: TxnProduce, base_ms: int):
        return {t: self._txn_produce(bootstrap, t, op, base_ms) for t in topics}

    def _txn_produce(self, bootstrap: str, topic: str, op: TxnProduce, base_ms: int) -> tuple:
        txn_id = f"{topic}-txn{op.txn}"
        if txn_id not in self._txns:
            producer = Producer(
                self._config(
                    bootstrap, op.zone,
                    **{"transactional.id": txn_id, "compression.type": op.codec,
                       "linger.ms": 1000, "batch.num.messages": 10000,
                       "message.timeout.ms": 60000, "transaction.timeout.ms": 60000},
                )
            )  # fmt: skip
            failed = _failure_of(lambda: producer.init_transactions(TIMEOUT_S))
            if failed:
                return (failed,)
            self._txns[txn_id] = (producer, False)
        producer, open_ = self._txns[txn_id]
        if not open_:
            producer.begin_transaction()
            self._txns[txn_id] = (producer, True)
        got: list = [None] * len(op.records)

        def report(n: int):
            def delivered(err, msg) -> None:
                got[n] = _name(err) if err is not None else msg.offset()

            return delivered

        for n, r in enumerate(op.records):
            producer.produce(
                topic, r.value, r.key, partition=0, timestamp=base_ms + r.ts,
                headers=list(r.headers), on_delivery=report(n),
            )  # fmt: skip
        producer.flush(TIMEOUT_S * 2)
        offsets = tuple("NOT_DELIVERED" if o is None else o for o in got)
        if op.end == "open":
            return (*offsets, "open")
        end = producer.commit_transaction if op.end == "commit" else producer.abort_transaction
        failed = _failure_of(lambda: end(TIMEOUT_S))
        if failed is None:
            self._txns[txn_id] = (producer, False)
            return (*offsets, op.end)
        if _failure_of(lambda: producer.abort_transaction(TIMEOUT_S)) is None:
            self._txns[txn_id] = (producer, False)
        else:
            del self._txns[txn_id]  # fatal: a new producer next time
        return (*offsets, failed)

    def _consumer(
        self, bootstrap: str, zone: str, group: str | None, reset: str, **extra
    ) -> Consumer:
        return Consumer(
            self._config(
                bootstrap, zone,
                **{"group.id": group or f"conformance-{uuid.uuid4().hex}",
                   "enable.auto.commit": False, "auto.offset.reset": reset,
                   "enable.partition.eof": True, **extra},
            )
        )  # fmt: skip

    def fetch(self, bootstrap: str, topics: list[str], op: Fetch, base_ms: int) -> dict:
        """To the end librdkafka signals (EOF): the high watermark, or with read_committed
        the last stable offset (or where it starts, when that is past the last stable
        offset but not past the high watermark: Kafka answers no records there, and
        librdkafka signals no end)."""
        consumer = self._consumer(
            bootstrap, op.zone, None, "error", **{"isolation.level": op.isolation}
        )
        got: dict[str, list] = {t: [] for t in topics}
        open_ = set(topics)
        try:
            if op.isolation == "read_committed":  # no EOF there: where the others stop
                for topic in topics:
                    stable = consumer.get_watermark_offsets(
                        TopicPartition(topic, 0), TIMEOUT_S, cached=False
                    )[1]
                    if stable < op.offset <= watermarks(bootstrap, topic)[1]:
                        got[topic].append(end(op.offset))
                        open_.discard(topic)
            consumer.assign([TopicPartition(t, 0, op.offset) for t in topics if t in open_])
            deadline = time.monotonic() + TIMEOUT_S
            while open_ and time.monotonic() < deadline:
                msg = consumer.poll(0.2)
                if msg is None or msg.topic() not in open_:
                    continue
                err = msg.error()
                if err is None:
                    got[msg.topic()].append(_record(msg, base_ms))
                    continue
                if err.code() == KafkaError._PARTITION_EOF:
                    got[msg.topic()].append(end(msg.offset()))
                else:
                    got[msg.topic()].append(error(_name(err)))
                open_.discard(msg.topic())
        finally:
            consumer.close()
        for topic in open_:
            got[topic].append(error("TIMEOUT"))
        return {t: tuple(got[t]) for t in topics}

    def list_offsets(self, bootstrap: str, topics: list[str], op: ListOffsets, base_ms: int):
        spec = {
            "earliest": OffsetSpec.earliest,
            "latest": OffsetSpec.latest,
            "max_timestamp": OffsetSpec.max_timestamp,
        }.get(op.spec)
        asked = {
            TopicPartition(t, 0): spec() if spec else OffsetSpec.for_timestamp(base_ms + op.ts)
            for t in topics
        }
        isolation = (
            IsolationLevel.READ_COMMITTED
            if op.isolation == "read_committed"
            else IsolationLevel.READ_UNCOMMITTED
        )
        futures = self._admin(bootstrap, op.zone).list_offsets(
            asked, isolation_level=isolation, request_timeout=ADMIN_TIMEOUT_S
        )
        answers = {}
        for tp, future in futures.items():
            try:
                info = future.result()
            except KafkaException as exc:
                answers[tp.topic] = _failure(exc)
            else:
                epoch = info.leader_epoch
                answers[tp.topic] = offset_answer(info.offset, info.timestamp, base_ms, epoch)
        return answers

    def delete_records(self, bootstrap: str, topics: list[str], op: DeleteRecords, base_ms: int):
        asked = [TopicPartition(t, 0, op.offset) for t in topics]
        futures = self._admin(bootstrap, op.zone).delete_records(
            asked, request_timeout=DELETE_TIMEOUT_S, operation_timeout=DELETE_TIMEOUT_S
        )
        answers = {}
        for tp, future in futures.items():
            try:
                answers[tp.topic] = ("low_watermark", future.result().low_watermark)
            except KafkaException as exc:
                answers[tp.topic] = _failure(exc)
        return answers

    def commit(self, bootstrap: str, topics: list[str], op: Commit, group: str, base_ms: int):
        answers = {}
        for topic in topics:
            consumer = self._consumer(bootstrap, op.zone, group, "error")
            try:
                # Explicit offsets need no assignment. An assigned partition starts a fetch
                # whose offset reset ("error": none committed, or below a deleted log start)
                # can race close() and deadlock librdkafka (confluentinc/librdkafka#4514:
                # rd_kafka_offset_reset_op_cb re-entered while destroying, seen in a fresh
                # clone's run of 2026-11-28: `close()` never returned).
                consumer.commit(offsets=[TopicPartition(topic, 0, op.offset)], asynchronous=False)
                [read] = consumer.committed([TopicPartition(topic, 0)], timeout=TIMEOUT_S)
                answers[topic] = ("committed", read.offset)
            except KafkaException as exc:
                answers[topic] = _failure(exc)
            finally:
                consumer.close()
        return answers

    def resume(self, bootstrap: str, topics: list[str], op: Resume, group: str, base_ms: int):
        answers = {}
        for topic in topics:
            consumer = self._consumer(bootstrap, op.zone, group, op.reset)
            answers[topic] = error("TIMEOUT")
            try:
                consumer.assign([TopicPartition(topic, 0, OFFSET_INVALID)])  # the committed one
                deadline = time.monotonic() + TIMEOUT_S
                while time.monotonic() < deadline:
                    msg = consumer.poll(0.2)
                    if msg is None:
                        continue
                    err = msg.error()
                    if err is None:
                        answers[topic] = ("record", msg.offset(), msg.value())
                    elif err.code() == KafkaError._PARTITION_EOF:
                        answers[topic] = end(msg.offset())
                    else:
                        answers[topic] = error(_name(err))
                    break
            finally:
                consumer.close()
        return answers


def _record(msg, base_ms: int) -> Record:
    kind, ts = msg.timestamp()
    return Record(
        msg.offset(),
        msg.key(),
        msg.value(),
        relative(ts, base_ms),
        "LogAppendTime" if kind == TIMESTAMP_LOG_APPEND_TIME else "CreateTime",
        tuple((k, v) for k, v in msg.headers() or ()),
    )
