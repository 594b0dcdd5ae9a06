"""Compacted tiered topics against Kafka's own cleaner, the oracle (docs/tiering.md,
"Compacted topics"; proxy/upkeep/log_cleaner.py).

The same keyed workload goes to two compacted one-partition topics: a passthrough one,
cleaned by Kafka, and a tiered one, cleaned by the proxy (one proxy owning both
metadata shards; its cleaner's pass is called directly, the loop set to wait an hour):
updates of ten keys, tombstones, record headers and explicit timestamps, in batches of
every codec, a committed transaction and an aborted one (the same steps in both, so
markers land at the same offsets). Kafka's topic has segment.ms=1000 and
min.cleanable.dirty.ratio=0.01 (its broker's log.cleaner.backoff.ms is Kafka's default,
15 s: the devstack does not change it); once the workload is in, a last record written
after segment.ms rolls Kafka's active segment, so everything before it is cleanable on
both sides. Kafka never cleans its active segment: the comparison covers the offsets
below that last record, which both sides have cleaned whole.

Checked: every surviving record (offset, key, value, headers, timestamp) read by
librdkafka is the same on both, with read_uncommitted (aborted records gone, not merely
hidden); the key -> latest value map is the workload's (tombstones kept:
delete.retention.ms is an hour on both). Then, on the tiered side only (Kafka's clock
cannot be moved), more updates and a pass an hour and a half later: the tombstones are
gone, as Kafka's cleaner removes them after delete.retention.ms, and the tombstones
that pass first sees are kept with a horizon of their own.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from cutover_load import one_proxy, started, tiered_topic_id, topics_command

from proxy.metadata.streams import stream_id
from proxy.objects.ratelimit import Priority
from tests.support.clients import watermarks
from tests.support.waiting import wait_until

pytestmark = pytest.mark.kafka

KEYS = 10
SEGMENT_MS = 1000
HOUR_MS = 3_600_000
CODECS = ["none", "gzip", "snappy", "lz4", "zstd"]
# record timestamps a minute old: Kafka rolls a segment on record timestamps (the new
# batch's against the segment's first), and markers carry the wall clock
BASE_TS = int(time.time() * 1000) - 60_000

Rec = tuple[int, bytes | None, bytes | None, tuple, int]  # offset, key, value, headers, ts


def _create(bootstrap: str, topic: str, policy: str) -> None:
    config = {
        "cleanup.policy": policy,
        "min.cleanable.dirty.ratio": "0.01",
        "segment.ms": str(SEGMENT_MS),
        "delete.retention.ms": str(HOUR_MS),
    }
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, 1, 3, config=config)])[topic].result(30)


def _round(n: int) -> list[tuple[bytes, bytes | None, list, int]]:
    """Round n's records: (key, value or None, headers, timestamp)."""
    out = []
    for i in range(30):
        key = f"k{(i * 7 + n) % KEYS}".encode()
        value = None if (i + n) % 9 == 0 else f"v{n}-{i}".encode()
        headers = [("round", str(n).encode())] if i % 3 == 0 else []
        out.append((key, value, headers, BASE_TS + n * 1000 + i))
    return out


def _produce(bootstrap: str, topic: str, records, codec: str) -> None:
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "enable.idempotence": True,
            "linger.ms": 20,
            "compression.type": codec,
        }
    )
    errors: list[str] = []
    for key, value, headers, ts in records:
        producer.produce(
            topic,
            value,
            key,
            partition=0,
            headers=headers,
            timestamp=ts,
            on_delivery=lambda err, _m: errors.append(str(err)) if err else None,
        )
    assert producer.flush(60) == 0
    assert not errors, errors[:3]


def _transaction(bootstrap: str, topic: str, records, commit: bool) -> None:
    producer = Producer(
        {"bootstrap.servers": bootstrap, "transactional.id": f"tx-{uuid.uuid4().hex}"}
    )
    producer.init_transactions(30)
    producer.begin_transaction()
    for key, value, headers, ts in records:
        producer.produce(topic, value, key, partition=0, headers=headers, timestamp=ts)
    producer.flush(30)
    if commit:
        producer.commit_transaction(30)
    else:
        producer.abort_transaction(30)


def _read_all(bootstrap: str, topic: str, last: int) -> list[Rec]:
    """Every record up to offset `last` (which is never cleaned away), read_uncommitted."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"c-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
            "isolation.level": "read_uncommitted",
        }
    )
    consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
    got: list[Rec] = []
    deadline = time.monotonic() + 60
    try:
        while (not got or got[-1][0] < last) and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            assert msg.error() is None, msg.error()
            headers = tuple(msg.headers() or ())
            got.append((msg.offset(), msg.key(), msg.value(), headers, msg.timestamp()[1]))
    finally:
        consumer.close()
    assert got and got[-1][0] == last, f"read up to {got[-1][0] if got else None}, not {last}"
    return got


def _latest(records: list[Rec]) -> dict[bytes | None, bytes | None]:
    latest = {}
    for _, key, value, _, _ in records:
        latest[key] = value
    return latest


class Pair:
    """The passthrough topic (Kafka's cleaner) and the tiered one (the proxy's)."""

    def __init__(self, cluster, proxy, policy: str = "compact") -> None:
        self.kafka, self.proxy = cluster.bootstrap, proxy
        self.tiering = proxy.proxy.tiering
        suffix = uuid.uuid4().hex[:8]
        self.plain, self.tiered = f"compacted-kafka-{suffix}", f"compacted-tiered-{suffix}"
        for topic in (self.plain, self.tiered):
            _create(self.kafka, topic, policy)
        assert topics_command("tier", self.tiered, self.tiering.peer_port).returncode == 0
        self.stream = stream_id(tiered_topic_id(proxy, self.tiered), 0)
        wait_until(lambda: started(self.tiering, self.stream), 30, "started")
        self.written: list[tuple[bytes, bytes | None]] = []  # committed, in order

    def both(self, step) -> None:
        """`step(bootstrap, topic)` on both topics; then both end at the same offset."""
        step(self.kafka, self.plain)
        step(self.proxy.bootstrap, self.tiered)

        def same_end() -> bool:
            return (
                watermarks(self.kafka, self.plain)[1]
                == watermarks(self.proxy.bootstrap, self.tiered)[1]
            )

        wait_until(same_end, 30, "both topics at the same end (markers written)")

    def committed(self) -> int:
        """Upload the tiered topic's tail; its committed end."""
        end = watermarks(self.proxy.bootstrap, self.tiered)[1]
        self.proxy.run(lambda: self.tiering.uploader.flush())
        state = self.tiering.state(self.stream)
        wait_until(lambda: state.stream_end(self.stream) == end, 30, "uploaded")
        return end

    def clean(self, now_ms: int | None = None):
        cleaner = self.tiering.log_cleaner
        return self.proxy.run(lambda: cleaner.run_once(now_ms, refresh_configs=True))

    def delete_records(self, offset: int) -> dict[str, int | str]:
        """DeleteRecords below `offset` on both topics (the tiered one through the proxy):
        topic -> the new log start, or the error's name."""
        out: dict[str, int | str] = {}
        for bootstrap, topic in ((self.kafka, self.plain), (self.proxy.bootstrap, self.tiered)):
            admin = AdminClient({"bootstrap.servers": bootstrap})
            [future] = admin.delete_records([TopicPartition(topic, 0, offset)]).values()
            try:
                out[topic] = future.result(30).low_watermark
            except KafkaException as exc:
                out[topic] = exc.args[0].name()
        return out

    def both_cleaned_from(self, first: int, last: int) -> tuple[list[Rec], list[Rec]]:
        """(Kafka's, the proxy's) records from `first` to `last`, once Kafka's cleaner has
        cleaned below `last` (the proxy cleaned before this is called)."""

        def kafka_cleaned() -> bool:
            below = [r for r in _read_all(self.kafka, self.plain, last) if r[0] < last]
            return len({r[1] for r in below}) == len(below)

        wait_until(kafka_cleaned, 120, "Kafka's cleaner cleaned the topic", interval_s=2)
        plain = _read_all(self.kafka, self.plain, last)
        tiered = _read_all(self.proxy.bootstrap, self.tiered, last)
        assert plain[0][0] >= first and tiered[0][0] >= first
        return plain, tiered


def test_tiered_compacted_topic_matches_kafkas_cleaner(kafka_cluster, tmp_path) -> None:
    with one_proxy(kafka_cluster, tmp_path, "cleaner", log_cleaner_interval_s=3600) as proxy:
        pair = Pair(kafka_cluster, proxy)
        model: dict[bytes, bytes | None] = {}
        for n, codec in enumerate(CODECS):
            records = _round(n)
            pair.both(lambda b, t, r=records, c=codec: _produce(b, t, r, c))
            model.update((k, v) for k, v, _, _ in records)
            if n == 1:  # a committed transaction: its records count
                txn = [
                    (f"k{i}".encode(), f"txn-{i}".encode(), [], BASE_TS + 9000 + i)
                    for i in range(3)
                ]
                pair.both(lambda b, t, r=txn: _transaction(b, t, r, True))
                model.update((k, v) for k, v, _, _ in txn)
            if n == 3:  # an aborted one: its records must go on both
                txn = [(f"k{i}".encode(), b"aborted", [], BASE_TS + 9500 + i) for i in range(4)]
                pair.both(lambda b, t, r=txn: _transaction(b, t, r, False))
            pair.committed()  # one committed range (or more) per round
        # Kafka rolls its active segment on the first append after segment.ms: that wait
        # is the rule itself, not a stand-in for an event
        time.sleep(SEGMENT_MS / 1000 + 0.5)
        roll = [(b"roll", b"roll", [], 0)]  # 0: stamped now by the client
        pair.both(lambda b, t: _produce(b, t, roll, "none"))
        last = watermarks(kafka_cluster.bootstrap, pair.plain)[1] - 1
        pair.committed()

        def kafka_cleaned() -> bool:
            below = [r for r in _read_all(kafka_cluster.bootstrap, pair.plain, last) if r[0] < last]
            return len({r[1] for r in below}) == len(below)

        wait_until(kafka_cleaned, 120, "Kafka's cleaner cleaned the topic", interval_s=2)
        limiter = pair.tiering.bandwidth.limiter
        before = limiter.stats[Priority.COMPACTION].bytes_granted
        cleaner = pair.tiering.log_cleaner.stats
        written_before = cleaner.bytes_written
        report = pair.clean()
        assert pair.stream in report.cleaned, report
        # the cleaner's GETs and PUTs take the proxy's bandwidth at compaction's priority
        written = cleaner.bytes_written - written_before
        assert written > 0
        assert limiter.stats[Priority.COMPACTION].bytes_granted - before > written

        plain = _read_all(kafka_cluster.bootstrap, pair.plain, last)
        tiered = _read_all(proxy.bootstrap, pair.tiered, last)
        assert tiered[:-1] == plain[:-1]  # the last: the roll record, stamped by each client
        assert {k: v for k, v in _latest(plain).items() if k != b"roll"} == model
        assert any(value is None for _, _, value, _, _ in tiered)  # tombstones kept
        assert b"aborted" not in {value for _, _, value, _, _ in tiered}

        # the tombstones' delete horizon passed: gone at the next clean
        more = _round(len(CODECS))
        _produce(proxy.bootstrap, pair.tiered, more, "zstd")
        model.update((k, v) for k, v, _, _ in more)
        end = pair.committed()
        later = pair.clean(int(time.time() * 1000) + HOUR_MS * 3 // 2)
        assert pair.stream in later.cleaned, later
        after = _read_all(proxy.bootstrap, pair.tiered, end - 1)
        # the tombstones the first clean saw are gone; those first seen now are kept,
        # with a horizon of their own (Kafka's KIP-534 rule)
        fresh = {k for k, v in dict((k, v) for k, v, _, _ in more).items() if v is None}
        expected = {k: v for k, v in model.items() if v is not None or k in fresh}
        expected[b"roll"] = b"roll"
        assert _latest(after) == expected
        assert fresh and all(value is not None or key in fresh for _, key, value, _, _ in after)
        assert len({r[1] for r in after}) == len(after)


def test_a_clean_racing_a_reader_and_delete_records(kafka_cluster, tmp_path) -> None:
    """A clean held after it read and rewrote the log, before its commit; meanwhile a
    reader reads the whole log (from the objects the clean replaces) and DeleteRecords
    moves the log start to the middle of it (compact,delete: Kafka deletes records of no
    other compacted topic). Then the clean commits. Nothing acknowledged from the new log
    start on is lost: after a clean the survivors are Kafka's, on Kafka's twin topic with
    the same DeleteRecords. On a topic that is only compacted, DeleteRecords is refused as
    Kafka refuses it (POLICY_VIOLATION), and nothing is trimmed."""
    with one_proxy(kafka_cluster, tmp_path, "race", log_cleaner_interval_s=3600) as proxy:
        only = Pair(kafka_cluster, proxy)
        only.both(lambda b, t: _produce(b, t, _round(0), "lz4"))
        only.committed()
        refused = only.delete_records(10)
        assert refused == {only.plain: "POLICY_VIOLATION", only.tiered: "POLICY_VIOLATION"}
        assert watermarks(proxy.bootstrap, only.tiered)[0] == 0

        pair = Pair(kafka_cluster, proxy, "compact,delete")
        model: dict[bytes, bytes | None] = {}
        for n, codec in enumerate(CODECS[:3]):
            records = _round(n)
            pair.both(lambda b, t, r=records, c=codec: _produce(b, t, r, c))
            model.update((k, v) for k, v, _, _ in records)
            pair.committed()
        time.sleep(SEGMENT_MS / 1000 + 0.5)  # Kafka's roll rule, as above
        pair.both(lambda b, t: _produce(b, t, [(b"roll", b"roll", [], 0)], "none"))
        last = watermarks(kafka_cluster.bootstrap, pair.plain)[1] - 1
        pair.committed()

        cleaner = pair.tiering.log_cleaner
        commit, reached = cleaner._commit, threading.Event()
        gate = proxy.run(_event)

        async def held(*args, **kwargs):
            reached.set()
            await gate.wait()
            return await commit(*args, **kwargs)

        cleaner._commit = held
        outcome: dict[str, object] = {}
        thread = threading.Thread(target=lambda: outcome.update(report=pair.clean()))
        thread.start()
        try:
            assert reached.wait(60), "the clean did not reach its commit"
            during = _read_all(proxy.bootstrap, pair.tiered, last)  # the log not cleaned
            cut = during[len(during) // 2][0]
            assert pair.delete_records(cut) == {pair.plain: cut, pair.tiered: cut}
        finally:
            proxy.run(lambda: _set(gate))
            thread.join(90)
        cleaner._commit = commit
        assert "report" in outcome, "the held clean did not end"
        assert [r[0] for r in during] == list(range(last + 1))  # every offset, uncleaned
        assert {k: v for _, k, v, _, _ in during if k != b"roll"} == model
        # the held clean's commit took the trim into account or was refused; either way
        # a clean after it leaves Kafka's survivors
        pair.clean()
        plain, tiered = pair.both_cleaned_from(cut, last)
        assert tiered[:-1] == plain[:-1]
        assert watermarks(proxy.bootstrap, pair.tiered)[0] == cut
        latest = {r[1]: r[2] for r in during if r[0] >= cut}  # in offset order: last wins
        assert {r[1]: r[2] for r in tiered} == latest
        print(f"held clean: {outcome['report']}; cut at {cut} of {last + 1}")


async def _event() -> asyncio.Event:
    return asyncio.Event()


async def _set(event: asyncio.Event) -> None:
    event.set()
