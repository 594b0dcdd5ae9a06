"""A librdkafka transactional producer loop and a read_committed consumer beside it.

`transactional_produce` runs transactions of `records_per_txn` records for `seconds`:
begin, produce, flush, commit. It times the flush (the records acknowledged, after
AddPartitionsToTxn) and `commit_transaction` (EndTxn) apart, so the commit latency is the
coordinator's round trip, not the client's queue. Each value starts with the transaction's
number and its produce time (`stamp`), so `CommittedReader`, a read_committed consumer
in a thread of its own, can tell when each transaction became visible: end-to-end
latency per record, and per transaction from `commit_transaction`'s return to its last
record read.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from dataclasses import asdict, dataclass, field

from aiokafka import AIOKafkaClient
from aiokafka import TopicPartition as AioPartition
from aiokafka.protocol.fetch import FetchRequest
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Producer, TopicPartition

from proxy.records.batches import whole_batches
from proxy.records.markers import read_marker

MIB = 1 << 20
STAMP = 16  # bytes: transaction number, produce time (time.time_ns), both big-endian


def stamp(txn: int, value: bytes) -> bytes:
    return txn.to_bytes(8, "big") + time.time_ns().to_bytes(8, "big") + value[STAMP:]


def quantiles(values: list[float], qs=(0.5, 0.99, 0.999)) -> dict[str, float]:
    """{"p50": ..., "p99": ..., "p99.9": ..., "avg", "max"} of `values` (empty: {})."""
    if not values:
        return {}
    ordered = sorted(values)
    out = {f"p{q * 100:g}": ordered[min(len(ordered) - 1, int(q * len(ordered)))] for q in qs}
    return out | {"avg": sum(ordered) / len(ordered), "max": ordered[-1]}


@dataclass
class TxnResult:
    transactions: int
    records: int
    seconds: float  # from the first begin_transaction to the last commit's return
    mb_per_s: float
    commit_ms: dict[str, float]  # commit_transaction() call to return
    flush_ms: dict[str, float]  # flush(): every record of the transaction acknowledged
    txn_ms: dict[str, float]  # begin_transaction() to commit's return
    committed_at_ns: list[int] = field(default_factory=list, repr=False)  # time.time_ns()

    def to_json(self) -> dict[str, object]:
        return {k: v for k, v in asdict(self).items() if k != "committed_at_ns"}


def transactional_produce(
    bootstrap: str,
    topic: str,
    seconds: float,
    records_per_txn: int,
    record_size: int,
    settings: dict[str, str] | None = None,
) -> TxnResult:
    """Transactions back to back for `seconds` (the last one finishes)."""
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "acks": "all",
            "transactional.id": f"tierproxy-bench-{os.urandom(4).hex()}",
            "client.id": "tierproxy-bench",
        }
        | (settings or {})
    )
    producer.list_topics(topic, timeout=30)  # connections and metadata before the clock
    producer.init_transactions(60)
    value = os.urandom(record_size)
    errors: list[str] = []

    def delivered(err, _msg) -> None:
        if err is not None:
            errors.append(str(err))

    commit_ns, flush_ns, txn_ns, committed_at = [], [], [], []
    clock = time.perf_counter_ns
    started = clock()
    deadline = started + int(seconds * 1e9)
    txn = 0
    while clock() < deadline:
        begun = clock()
        producer.begin_transaction()
        for _ in range(records_per_txn):
            while True:
                try:
                    producer.produce(topic, stamp(txn, value), on_delivery=delivered)
                    break
                except BufferError:
                    producer.poll(0.005)
        flushing = clock()
        if producer.flush(60):
            raise RuntimeError(f"transaction {txn}: records not delivered in 60 s")
        committing = clock()
        producer.commit_transaction(60)
        done = clock()
        committed_at.append(time.time_ns())
        flush_ns.append(committing - flushing)
        commit_ns.append(done - committing)
        txn_ns.append(done - begun)
        txn += 1
        if errors:
            raise RuntimeError(f"transaction {txn}: {errors[:3]}")
    elapsed = (clock() - started) / 1e9
    records = txn * records_per_txn

    def ms(values: list[int]) -> dict[str, float]:
        return quantiles([v / 1e6 for v in values])

    mb = records * record_size / MIB / elapsed
    return TxnResult(
        txn, records, elapsed, mb, ms(commit_ns), ms(flush_ns), ms(txn_ns), committed_at
    )


class CommittedReader:
    """A read_committed consumer of every partition of `topic` from the start, in a
    thread: when each record and each transaction (its last record) was read."""

    def __init__(self, bootstrap: str, topic: str, partitions: int, client_id: str) -> None:
        self.consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": f"tierproxy-bench-{os.urandom(4).hex()}",
                "isolation.level": "read_committed",
                "enable.auto.commit": False,
                "client.id": client_id,
            }
        )
        self.consumer.assign(
            [TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)]
        )
        self.e2e_ns: list[int] = []  # per record: produce() to read
        self.last_read_ns: dict[int, int] = {}  # transaction number -> its last record read
        self.records = 0
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="read-committed")
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            batch = self.consumer.consume(num_messages=1000, timeout=0.1)
            now = time.time_ns()  # per batch: the records of one batch arrived together
            for msg in batch:
                error = msg.error()
                if error is not None:
                    if error.code() != KafkaError._PARTITION_EOF:
                        self.errors.append(str(error))
                    continue
                value = msg.value()
                txn = int.from_bytes(value[:8], "big")
                self.e2e_ns.append(now - int.from_bytes(value[8:16], "big"))
                self.last_read_ns[txn] = now
                self.records += 1

    def wait_for(self, records: int, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while self.records < records and time.monotonic() < deadline:
            time.sleep(0.1)
        return self.records >= records

    def close(self) -> None:
        self._stop.set()
        self._thread.join(30)
        self.consumer.close()

    def visible_ms(self, committed_at_ns: list[int]) -> list[float]:
        """Per transaction read in full: commit_transaction()'s return to its last record
        read (negative: read before the client had the EndTxn answer)."""
        return [
            (self.last_read_ns[t] - at) / 1e6
            for t, at in enumerate(committed_at_ns)
            if t in self.last_read_ns
        ]


class MarkerWatch:
    """Kafka's half of the marker lag: what the proxy's marker follower does (a raw Fetch
    per leader broker, read_uncommitted, long polling `max_wait_ms`), done beside it on the
    same topic, in a thread: per marker, its timestamp (the partition leader's clock as it
    appended it) to the Fetch answer that held it. Kafka answers a read_uncommitted Fetch
    only up to the high watermark, so this is how long Kafka takes to make a marker
    readable; the rest of `tierproxy_txn_marker_lag_seconds` is the proxy's."""

    def __init__(self, bootstrap: str, topic: str, partitions: int, max_wait_ms: int = 500):
        self.lag_ms: list[float] = []
        self._args = (bootstrap, topic, partitions, max_wait_ms)
        self._loop = asyncio.new_event_loop()
        self._stop = asyncio.Event()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._main, daemon=True, name="marker-watch")
        self._thread.start()
        if not self._ready.wait(60):
            raise RuntimeError(f"marker watch of {topic}: no leaders in 60 s")

    def _main(self) -> None:
        self._loop.run_until_complete(self._run(*self._args))

    async def _run(self, bootstrap: str, topic: str, partitions: int, max_wait_ms: int) -> None:
        client = AIOKafkaClient(bootstrap_servers=bootstrap, client_id="tierproxy-bench-watch")
        await client.bootstrap()
        try:
            await client.set_topics([topic])
            leaders: dict[int, list[int]] = {}
            for p in range(partitions):
                node = client.cluster.leader_for_partition(AioPartition(topic, p))
                leaders.setdefault(node, []).append(p)
            self._ready.set()
            polls = [
                self._poll(client, node, topic, ps, max_wait_ms) for node, ps in leaders.items()
            ]
            tasks = [asyncio.ensure_future(poll) for poll in polls]
            await self._stop.wait()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        finally:
            await client.close()

    async def _poll(self, client, node: int, topic: str, partitions: list[int], wait: int):
        positions = dict.fromkeys(partitions, 0)
        while True:
            wanted = [(p, positions[p], 1 << 20) for p in partitions]
            answer = await client.send(node, FetchRequest(wait, 1, 16 << 20, 0, [(topic, wanted)]))
            now_ms = time.time() * 1000
            for _, parts in answer.topics:
                for partition, error_code, _hw, *rest in parts:
                    if error_code:
                        raise RuntimeError(f"marker watch {topic}-{partition}: error {error_code}")
                    batches, _end = whole_batches(memoryview(rest[-1] or b""))
                    for header, batch in batches:
                        positions[partition] = header.next_offset
                        if header.is_control:
                            self.lag_ms.append(now_ms - read_marker(batch).timestamp)

    def close(self) -> list[float]:
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(30)
        return self.lag_ms
