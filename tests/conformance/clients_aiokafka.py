"""The aiokafka runner: every op against a list of topics (partition 0 of each), answers
as in answers.py. Every op runs on the runner's own event loop (a scenario's
transactional producers live across ops), with clients of its own."""

from __future__ import annotations

import asyncio
import time

import ops
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, RecordsToDelete
from aiokafka.errors import KafkaError, OffsetOutOfRangeError
from answers import OUT_OF_RANGE, Record, end, error, offset_answer, relative
from ops import Commit, DeleteRecords, Fetch, ListOffsets, Produce, Resume, TxnProduce

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

    def __init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._txns: dict[str, tuple[AIOKafkaProducer, bool]] = {}  # txn id -> (it, open)

    def _run(self, coro):
        return self._loop.run_until_complete(coro)

    def close(self) -> None:
        self.close_transactions()
        self._loop.close()

    def close_transactions(self) -> None:
        """The scenario's transactional producers, gone (an open transaction aborted)."""
        self._run(self._close_transactions())

    async def _close_transactions(self) -> None:
        txns, self._txns = self._txns, {}
        for producer, open_ in txns.values():
            if open_:
                await _quietly(producer.abort_transaction())
            await _quietly(producer.stop())

    def _client_id(self, zone: str) -> str:
        return f"conformance-aiokafka,tierproxy_az={zone}"

    def produce(self, bootstrap: str, topics: list[str], op: Produce, base_ms: int) -> dict:
        return self._run(self._produce(bootstrap, topics, op, base_ms))

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
                answers[topic] = await _send_batch(producer, topic, op.records, base_ms)
        finally:
            await producer.stop()
        return answers

    def txn_produce(self, bootstrap: str, topics: list[str], op: TxnProduce, base_ms: int):
        return self._run(self._txn_produce_all(bootstrap, topics, op, base_ms))

    async def _txn_produce_all(self, bootstrap, topics, op: TxnProduce, base_ms: int) -> dict:
        return {t: await self._txn_produce(bootstrap, t, op, base_ms) for t in topics}

    async def _txn_produce(self, bootstrap: str, topic: str, op: TxnProduce, base_ms: int):
        txn_id = f"{topic}-txn{op.txn}"
        if txn_id not in self._txns:
            producer = AIOKafkaProducer(
                bootstrap_servers=bootstrap, client_id=self._client_id(op.zone),
                transactional_id=txn_id, transaction_timeout_ms=60000,
                compression_type=None if op.codec == "none" else op.codec,
                request_timeout_ms=int(TIMEOUT_S * 1000),
            )  # fmt: skip
            try:
                await producer.start()
            except KafkaError as exc:
                await _quietly(producer.stop())
                return (_name(exc),)
            self._txns[txn_id] = (producer, False)
        producer, open_ = self._txns[txn_id]
        if not open_:
            await producer.begin_transaction()
            self._txns[txn_id] = (producer, True)
        offsets = await _send_batch(producer, topic, op.records, base_ms) if op.records else ()
        if op.end == "open":
            return (*offsets, "open")
        end = producer.commit_transaction if op.end == "commit" else producer.abort_transaction
        try:
            await asyncio.wait_for(end(), TIMEOUT_S)
        except (TimeoutError, KafkaError) as exc:
            failed = _name(exc)
            if await _quietly(producer.abort_transaction()):
                self._txns[txn_id] = (producer, False)
            else:
                del self._txns[txn_id]
                await _quietly(producer.stop())
            return (*offsets, failed)
        self._txns[txn_id] = (producer, False)
        return (*offsets, op.end)

    def _consumer(
        self,
        bootstrap: str,
        zone: str,
        group: str | None,
        reset: str,
        isolation: str = "read_uncommitted",
    ):
        return AIOKafkaConsumer(
            bootstrap_servers=bootstrap, client_id=self._client_id(zone), group_id=group,
            enable_auto_commit=False, auto_offset_reset=reset, isolation_level=isolation,
        )  # fmt: skip

    def fetch(self, bootstrap: str, topics: list[str], op: Fetch, base_ms: int) -> dict:
        return self._run(self._fetch(bootstrap, topics, op, base_ms))

    async def _fetch(self, bootstrap: str, topics: list[str], op: Fetch, base_ms: int):
        """To the high watermark; read_committed: to the last stable offset, or where it
        starts when that is past it but not past the high watermark (Kafka answers no
        records there, and out of range past the high watermark)."""
        tps = [_tp(t) for t in topics]
        highs = None
        if op.isolation == "read_committed":
            highs = await self._high_watermarks(bootstrap, op.zone, tps)
        consumer = self._consumer(bootstrap, op.zone, None, "none", op.isolation)
        await consumer.start()
        got: dict[str, list] = {t: [] for t in topics}
        try:
            consumer.assign(tps)
            for tp in tps:
                consumer.seek(tp, op.offset)
            ends = await consumer.end_offsets(tps)
            highs = highs or ends
            open_ = set(tps)
            deadline = time.monotonic() + TIMEOUT_S
            while open_ and time.monotonic() < deadline:
                for tp in list(open_):
                    position = await consumer.position(tp)
                    if position == ends[tp] or ends[tp] < position <= highs[tp]:
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

    async def _high_watermarks(self, bootstrap: str, zone: str, tps: list) -> dict:
        consumer = self._consumer(bootstrap, zone, None, "none")
        await consumer.start()
        try:
            return await consumer.end_offsets(tps)
        finally:
            await consumer.stop()

    def list_offsets(self, bootstrap: str, topics: list[str], op: ListOffsets, base_ms: int):
        return self._run(self._list_offsets(bootstrap, topics, op, base_ms))

    async def _list_offsets(self, bootstrap, topics, op: ListOffsets, base_ms: int):
        consumer = self._consumer(bootstrap, op.zone, None, "none", op.isolation)
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
        return self._run(self._delete_records(bootstrap, topics, op))

    async def _delete_records(self, bootstrap: str, topics: list[str], op: DeleteRecords):
        admin = AIOKafkaAdminClient(
            bootstrap_servers=bootstrap, client_id=self._client_id(op.zone),
            request_timeout_ms=ops.DELETE_TIMEOUT_MS,
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
        return self._run(self._commit(bootstrap, topics, op, group))

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
        return self._run(self._resume(bootstrap, topics, op, group))

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


async def _send_batch(producer: AIOKafkaProducer, topic: str, records, base_ms: int) -> tuple:
    """The records as one batch to partition 0: their offsets, or the error for each."""
    batch = producer.create_batch()
    for r in records:
        added = batch.append(
            timestamp=base_ms + r.ts, key=r.key, value=r.value, headers=list(r.headers)
        )
        assert added is not None, "the batch is full"
    batch.close()
    try:
        metadata = await (await producer.send_batch(batch, topic, partition=0))
    except KafkaError as exc:
        return (_name(exc),) * len(records)
    return tuple(metadata.offset + n for n in range(len(records)))


async def _quietly(call) -> bool:
    """Whether the call succeeded (cleaning up after a failed transaction)."""
    try:
        await asyncio.wait_for(call, TIMEOUT_S)
    except Exception:  # whatever it was, the scenario's answer already names the failure
        return False
    return True


def _record(r, base_ms: int) -> Record:
    return Record(
        r.offset,
        r.key,
        r.value,
        relative(r.timestamp, base_ms),
        "LogAppendTime" if r.timestamp_type == 1 else "CreateTime",
        tuple((k, v) for k, v in r.headers),
    )
