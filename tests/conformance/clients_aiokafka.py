"""The aiokafka runner: every op against a list of topics (partition 0 of each), answers
as in answers.py. Each op runs on an event loop of its own with clients of its own."""

from __future__ import annotations

import asyncio
import time

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, RecordsToDelete
from aiokafka.errors import KafkaError, OffsetOutOfRangeError
from answers import OUT_OF_RANGE, Record, end, error, offset_answer, relative
from ops import Commit, DeleteRecords, Fetch, ListOffsets, Produce, Resume

TIMEOUT_S = 30.0


def _name(exc: BaseException) -> str:
    """Kafka's error name for a broker's error (the class's `message`), else the class."""
    message = getattr(exc, "message", None)
    if getattr(exc, "errno", None) is not None and message:
        return message
    return f"{type(exc).__name__}: {exc}"


def _tp(topic: str) -> TopicPartition:
    return TopicPartition(topic, 0)


class Aiokafka:
    name = "aiokafka"

    def close(self) -> None:
        pass

    def _client_id(self, zone: str) -> str:
        return f"conformance-aiokafka,tierproxy_az={zone}"

    def produce(self, bootstrap: str, topics: list[str], op: Produce, base_ms: int) -> dict:
        return asyncio.run(self._produce(bootstrap, topics, op, base_ms))

    async def _produce(self, bootstrap: str, topics: list[str], op: Produce, base_ms: int):
        producer = AIOKafkaProducer(
            bootstrap_servers=bootstrap, client_id=self._client_id(op.zone), acks="all",
            enable_idempotence=True, compression_type=None if op.codec == "none" else op.codec,
            request_timeout_ms=int(TIMEOUT_S * 1000),
        )  # fmt: skip
        await producer.start()
        answers = {}
        try:
            for topic in topics:
                batch = producer.create_batch()
                for r in op.records:
                    added = batch.append(
                        timestamp=base_ms + r.ts, key=r.key, value=r.value, headers=list(r.headers)
                    )
                    assert added is not None, "the batch is full"
                batch.close()
                try:
                    metadata = await (await producer.send_batch(batch, topic, partition=0))
                except KafkaError as exc:
                    answers[topic] = (_name(exc),) * len(op.records)
                else:
                    answers[topic] = tuple(metadata.offset + n for n in range(len(op.records)))
        finally:
            await producer.stop()
        return answers

    def _consumer(self, bootstrap: str, zone: str, group: str | None, reset: str):
        return AIOKafkaConsumer(
            bootstrap_servers=bootstrap, client_id=self._client_id(zone), group_id=group,
            enable_auto_commit=False, auto_offset_reset=reset,
        )  # fmt: skip

    def fetch(self, bootstrap: str, topics: list[str], op: Fetch, base_ms: int) -> dict:
        return asyncio.run(self._fetch(bootstrap, topics, op, base_ms))

    async def _fetch(self, bootstrap: str, topics: list[str], op: Fetch, base_ms: int):
        consumer = self._consumer(bootstrap, op.zone, None, "none")
        await consumer.start()
        got: dict[str, list] = {t: [] for t in topics}
        try:
            tps = [_tp(t) for t in topics]
            consumer.assign(tps)
            for tp in tps:
                consumer.seek(tp, op.offset)
            ends = await consumer.end_offsets(tps)
            open_ = set(tps)
            deadline = time.monotonic() + TIMEOUT_S
            while open_ and time.monotonic() < deadline:
                for tp in list(open_):
                    position = await consumer.position(tp)
                    if position == ends[tp]:  # past it, the fetch answers out of range
                        got[tp.topic].append(end(position))
                        open_.discard(tp)
                        consumer.pause(tp)
                if not open_:
                    break
                try:
                    batches = await consumer.getmany(*open_, timeout_ms=200)
                except OffsetOutOfRangeError as exc:
                    for tp in exc.args[0]:
                        got[tp.topic].append(error(OUT_OF_RANGE))
                        open_.discard(tp)
                        consumer.pause(tp)
                    continue
                for tp, records in batches.items():
                    got[tp.topic] += [_record(r, base_ms) for r in records]
            for tp in open_:
                got[tp.topic].append(error("TIMEOUT"))
        finally:
            await consumer.stop()
        return {t: tuple(got[t]) for t in topics}

    def list_offsets(self, bootstrap: str, topics: list[str], op: ListOffsets, base_ms: int):
        return asyncio.run(self._list_offsets(bootstrap, topics, op, base_ms))

    async def _list_offsets(self, bootstrap, topics, op: ListOffsets, base_ms: int):
        consumer = self._consumer(bootstrap, op.zone, None, "none")
        await consumer.start()
        tps = [_tp(t) for t in topics]
        try:
            if op.spec in ("earliest", "latest"):
                ask = consumer.beginning_offsets if op.spec == "earliest" else consumer.end_offsets
                found = await ask(tps)
                return {tp.topic: offset_answer(found[tp], -1, base_ms, None) for tp in tps}
            assert op.spec == "timestamp", op.spec
            found = await consumer.offsets_for_times({tp: base_ms + op.ts for tp in tps})
            answers = {}
            for tp in tps:
                hit = found[tp]
                offset, ts = (hit.offset, hit.timestamp) if hit is not None else (-1, -1)
                answers[tp.topic] = offset_answer(offset, ts, base_ms, None)
            return answers
        finally:
            await consumer.stop()

    def delete_records(self, bootstrap: str, topics: list[str], op: DeleteRecords, base_ms: int):
        return asyncio.run(self._delete_records(bootstrap, topics, op))

    async def _delete_records(self, bootstrap: str, topics: list[str], op: DeleteRecords):
        admin = AIOKafkaAdminClient(
            bootstrap_servers=bootstrap, client_id=self._client_id(op.zone),
            request_timeout_ms=15_000,  # Kafka answers a DeleteRecords at once
        )  # fmt: skip
        await admin.start()
        answers = {}
        try:
            for topic in topics:
                try:
                    low = await admin.delete_records({_tp(topic): RecordsToDelete(op.offset)})
                except KafkaError as exc:
                    answers[topic] = error(_name(exc))
                else:
                    answers[topic] = ("low_watermark", low[_tp(topic)])
        finally:
            await admin.close()
        return answers

    def commit(self, bootstrap: str, topics: list[str], op: Commit, group: str, base_ms: int):
        return asyncio.run(self._commit(bootstrap, topics, op, group))

    async def _commit(self, bootstrap: str, topics: list[str], op: Commit, group: str):
        answers = {}
        for topic in topics:
            consumer = self._consumer(bootstrap, op.zone, group, "none")
            await consumer.start()
            try:
                consumer.assign([_tp(topic)])
                await consumer.commit({_tp(topic): op.offset})
                answers[topic] = ("committed", await consumer.committed(_tp(topic)))
            except KafkaError as exc:
                answers[topic] = error(_name(exc))
            finally:
                await consumer.stop()
        return answers

    def resume(self, bootstrap: str, topics: list[str], op: Resume, group: str, base_ms: int):
        return asyncio.run(self._resume(bootstrap, topics, op, group))

    async def _resume(self, bootstrap: str, topics: list[str], op: Resume, group: str):
        answers = {}
        for topic in topics:
            tp = _tp(topic)
            consumer = self._consumer(bootstrap, op.zone, group, op.reset)
            await consumer.start()
            answers[topic] = error("TIMEOUT")
            try:
                consumer.assign([tp])
                high = (await consumer.end_offsets([tp]))[tp]
                deadline = time.monotonic() + TIMEOUT_S
                while time.monotonic() < deadline:
                    records = (await consumer.getmany(tp, timeout_ms=200)).get(tp)
                    if records:
                        answers[topic] = ("record", records[0].offset, records[0].value)
                        break
                    if (position := await consumer.position(tp)) >= high:
                        answers[topic] = end(position)
                        break
            except KafkaError as exc:
                answers[topic] = error(_name(exc))
            finally:
                await consumer.stop()
        return answers


def _record(r, base_ms: int) -> Record:
    return Record(
        r.offset,
        r.key,
        r.value,
        relative(r.timestamp, base_ms),
        "LogAppendTime" if r.timestamp_type == 1 else "CreateTime",
        tuple((k, v) for k, v in r.headers),
    )
