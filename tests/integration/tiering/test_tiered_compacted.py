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
that pass first sees are kept with a horizon of their own. A second pair of topics with
delete.retention.ms of 1 s shows the same on both sides, on the real clocks.
"""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from compacted_load import (
    BASE_TS,
    CODECS,
    HOUR_MS,
    SEGMENT_MS,
    Pair,
    latest,
    produce,
    read_all,
    round_records,
    transaction,
)
from cutover_load import one_proxy

from proxy.objects.ratelimit import Priority
from tests.support.clients import watermarks
from tests.support.waiting import wait_until

pytestmark = pytest.mark.kafka


def test_tiered_compacted_topic_matches_kafkas_cleaner(kafka_cluster, tmp_path) -> None:
    with one_proxy(kafka_cluster, tmp_path, "cleaner", log_cleaner_interval_s=3600) as proxy:
        pair = Pair(kafka_cluster, proxy)
        model: dict[bytes, bytes | None] = {}
        for n, codec in enumerate(CODECS):
            records = round_records(n)
            pair.both(lambda b, t, r=records, c=codec: produce(b, t, r, c))
            model.update((k, v) for k, v, _, _ in records)
            if n == 1:  # a committed transaction: its records count
                txn = [
                    (f"k{i}".encode(), f"txn-{i}".encode(), [], BASE_TS + 9000 + i)
                    for i in range(3)
                ]
                pair.both(lambda b, t, r=txn: transaction(b, t, r, True))
                model.update((k, v) for k, v, _, _ in txn)
            if n == 3:  # an aborted one: its records must go on both
                txn = [(f"k{i}".encode(), b"aborted", [], BASE_TS + 9500 + i) for i in range(4)]
                pair.both(lambda b, t, r=txn: transaction(b, t, r, False))
            pair.committed()  # one committed range (or more) per round
        # Kafka rolls its active segment on the first append after segment.ms: that wait
        # is the rule itself, not a stand-in for an event
        time.sleep(SEGMENT_MS / 1000 + 0.5)
        roll = [(b"roll", b"roll", [], 0)]  # 0: stamped now by the client
        pair.both(lambda b, t: produce(b, t, roll, "none"))
        last = watermarks(kafka_cluster.bootstrap, pair.plain)[1] - 1
        pair.committed()

        def kafka_cleaned() -> bool:
            below = [r for r in read_all(kafka_cluster.bootstrap, pair.plain, last) if r[0] < last]
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

        plain = read_all(kafka_cluster.bootstrap, pair.plain, last)
        tiered = read_all(proxy.bootstrap, pair.tiered, last)
        assert tiered[:-1] == plain[:-1]  # the last: the roll record, stamped by each client
        assert {k: v for k, v in latest(plain).items() if k != b"roll"} == model
        assert any(value is None for _, _, value, _, _ in tiered)  # tombstones kept
        assert b"aborted" not in {value for _, _, value, _, _ in tiered}

        # the tombstones' delete horizon passed: gone at the next clean
        more = round_records(len(CODECS))
        produce(proxy.bootstrap, pair.tiered, more, "zstd")
        model.update((k, v) for k, v, _, _ in more)
        end = pair.committed()
        later = pair.clean(int(time.time() * 1000) + HOUR_MS * 3 // 2)
        assert pair.stream in later.cleaned, later
        after = read_all(proxy.bootstrap, pair.tiered, end - 1)
        # the tombstones the first clean saw are gone; those first seen now are kept,
        # with a horizon of their own (Kafka's KIP-534 rule)
        fresh = {k for k, v in dict((k, v) for k, v, _, _ in more).items() if v is None}
        expected = {k: v for k, v in model.items() if v is not None or k in fresh}
        expected[b"roll"] = b"roll"
        assert latest(after) == expected
        assert fresh and all(value is not None or key in fresh for _, key, value, _, _ in after)
        assert len({r[1] for r in after}) == len(after)


def test_tombstones_go_after_delete_retention_ms_on_both(kafka_cluster, tmp_path) -> None:
    """delete.retention.ms of 1 s on both topics, on the real clocks: the clean that first
    sees a tombstone keeps it (with a delete horizon, KIP-534), the next clean past the
    horizon removes it, on Kafka's side as on the proxy's; tombstones that clean sees
    first are kept. Then what survives is the same on both."""
    retention_ms = 1000
    with one_proxy(kafka_cluster, tmp_path, "tombstones", log_cleaner_interval_s=3600) as proxy:
        pair = Pair(kafka_cluster, proxy, delete_retention_ms=retention_ms)
        first = round_records(0)
        pair.both(lambda b, t: produce(b, t, first, "lz4"))
        gone = {k for k, v in dict((k, v) for k, v, _, _ in first).items() if v is None}
        # round 1 leaves the keys tombstoned in round 0 alone: only their horizon may
        # remove those tombstones, no later value of their key
        second = [r for r in round_records(1) if r[0] not in gone]
        kept = {k for k, v in dict((k, v) for k, v, _, _ in second).items() if v is None}
        assert gone and kept

        def roll_and_clean() -> int:
            """A record after segment.ms rolls Kafka's active segment (Kafka's rule: the
            wait is the rule, not a stand-in for an event); the proxy cleans; the offset
            below which both are comparable once Kafka's cleaner ran."""
            time.sleep(SEGMENT_MS / 1000 + 0.5)
            pair.both(lambda b, t: produce(b, t, [(b"roll", b"roll", [], 0)], "none"))
            pair.committed()
            assert pair.stream in pair.clean().cleaned
            return watermarks(kafka_cluster.bootstrap, pair.plain)[1] - 1

        def tombstones(bootstrap: str, topic: str, last: int) -> set[bytes]:
            return {r[1] for r in read_all(bootstrap, topic, last) if r[2] is None}

        def kafka_cleaned(last: int) -> bool:
            below = [r for r in read_all(kafka_cluster.bootstrap, pair.plain, last) if r[0] < last]
            return len({r[1] for r in below}) == len(below)

        last = roll_and_clean()
        # Kafka's first clean: every tombstone of round 0 kept, with a horizon
        wait_until(lambda: kafka_cleaned(last), 120, "Kafka's first clean", interval_s=2)
        assert tombstones(kafka_cluster.bootstrap, pair.plain, last) == gone
        assert tombstones(proxy.bootstrap, pair.tiered, last) == gone
        time.sleep(retention_ms / 1000 + 0.5)  # past the first cleans' horizons: the rule
        pair.both(lambda b, t: produce(b, t, second, "zstd"))
        last = roll_and_clean()
        wait_until(
            lambda: tombstones(kafka_cluster.bootstrap, pair.plain, last) == kept,
            120,
            "Kafka's cleaner removed the tombstones past their horizon",
            interval_s=2,
        )
        plain = [r for r in read_all(kafka_cluster.bootstrap, pair.plain, last) if r[1] != b"roll"]
        tiered = [r for r in read_all(proxy.bootstrap, pair.tiered, last) if r[1] != b"roll"]
        assert tiered == plain
        assert {r[1] for r in tiered if r[2] is None} == kept
        assert not gone & {r[1] for r in tiered}  # nothing of those keys is left


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
        only.both(lambda b, t: produce(b, t, round_records(0), "lz4"))
        only.committed()
        refused = only.delete_records(10)
        assert refused == {only.plain: "POLICY_VIOLATION", only.tiered: "POLICY_VIOLATION"}
        assert watermarks(proxy.bootstrap, only.tiered)[0] == 0

        pair = Pair(kafka_cluster, proxy, "compact,delete")
        model: dict[bytes, bytes | None] = {}
        for n, codec in enumerate(CODECS[:3]):
            records = round_records(n)
            pair.both(lambda b, t, r=records, c=codec: produce(b, t, r, c))
            model.update((k, v) for k, v, _, _ in records)
            pair.committed()
        time.sleep(SEGMENT_MS / 1000 + 0.5)  # Kafka's roll rule, as above
        pair.both(lambda b, t: produce(b, t, [(b"roll", b"roll", [], 0)], "none"))
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
            during = read_all(proxy.bootstrap, pair.tiered, last)  # the log not cleaned
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
