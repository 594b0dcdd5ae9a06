"""Tiered produce through a fleet of proxy processes while things go wrong.

Two `tierproxy run` processes, one in zone-a and one in zone-b (tieredfleet.py), tier a
topic to the session's MinIO (`notify: s3`). Idempotent producers write through the proxy
of their zone: librdkafka, aiokafka and the Java client in the clean run, librdkafka
(which retries for as long as it is told) under the faults. Whatever happens to the
proxies (a clean run, an owner killed with SIGKILL and started again, an owner paused past
its session timeout), every record a producer was told is written must be in the objects
the metadata commits, once, at the offset the producer was told; in each partition the
offsets run from the cutover with no gap and each producer's records keep their order.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections import Counter

import pytest
from confluent_kafka import Producer
from tieredfleet import (
    Committed,
    JavaProducer,
    Produced,
    TieredFleet,
    parse_value,
    produce_aiokafka,
    produce_librdkafka,
    wait_for,
    wait_for_log,
    wal_backlog,
)

from proxy.metadata.records import ObjectCommit, ShardClaim
from proxy.wal.log import WriteAheadLog
from proxy.wal.types import WalConfig

pytestmark = [pytest.mark.kafka, pytest.mark.minio]

PARTITIONS = 6
SEEDED = 10  # records per partition written through Kafka before the cutover
VALUE_SIZE = 512


@pytest.fixture
def make_fleet(kafka_cluster, s3_server, tmp_path):
    """`make_fleet(**tiering)`: a TieredFleet (not started), closed after the test."""
    fleets: list[TieredFleet] = []

    def make(**tiering) -> TieredFleet:
        fleet = TieredFleet(kafka_cluster.bootstrap, s3_server, tmp_path, tiering=tiering)
        fleets.append(fleet)
        return fleet

    yield make
    for fleet in fleets:
        fleet.close()


def _tiered_topic(fleet: TieredFleet) -> tuple[str, uuid.UUID]:
    """A topic whose partitions are owned by both proxies: every partition seeded through
    the proxies (passthrough), then tiered; waits for every partition's cutover."""
    topic, topic_id = fleet.create_spread_topic(PARTITIONS)
    producer = Producer({"bootstrap.servers": fleet["zone-a"].bootstrap, "acks": "all"})
    for n in range(SEEDED * PARTITIONS):
        producer.produce(topic, b"seed", partition=n % PARTITIONS)
    assert producer.flush(30) == 0
    assert "tiered" in fleet.tier(topic)
    cutovers = fleet.wait_for_cutover(topic_id, PARTITIONS)
    assert cutovers == dict.fromkeys(range(PARTITIONS), SEEDED)
    return topic, topic_id


def check_committed(committed: Committed, produced: list[Produced], *, exact: bool) -> int:
    """Every acknowledged record committed once, where its producer was told; each
    partition's offsets contiguous from the cutover to the committed end; each producer's
    records in order within a partition. `exact`: nothing committed that was not
    acknowledged. Returns how many records are committed."""
    locations = committed.locations()
    twice = {value: where for value, where in locations.items() if len(where) > 1}
    assert not twice, f"{len(twice)} records committed twice, e.g. {list(twice.items())[:3]}"
    acked: dict[bytes, tuple[int, int]] = {}
    for producer in produced:
        acked.update(producer.acked)
    missing = {v: at for v, at in acked.items() if locations.get(v) != [at]}
    assert not missing, (
        f"{len(missing)} acknowledged records not committed where acknowledged, e.g. "
        + ", ".join(
            f"{v[:20]!r} at {at}: {locations.get(v)}" for v, at in list(missing.items())[:5]
        )
    )
    if exact:
        extra = set(locations) - set(acked)
        assert not extra, f"{len(extra)} records committed, never acknowledged"
    assert sorted(committed.records) == list(range(PARTITIONS))
    for partition, records in committed.records.items():
        offsets = [offset for offset, _ in records]
        start, end = committed.cutover[partition], committed.end[partition]
        assert offsets == list(range(start, end)), f"partition {partition}: a gap or overlap"
        last: dict[str, int] = {}
        for offset, value in records:
            name, n = parse_value(value)
            assert n > last.get(name, -1), f"{name} out of order at {partition}/{offset}"
            last[name] = n
    return sum(len(records) for records in committed.records.values())


def _wal_is_trimmed(directory) -> bool:
    """Open a stopped proxy's WAL: nothing in it past its trim point."""

    async def replay() -> int:
        wal = await WriteAheadLog.open(WalConfig(str(directory)))
        try:
            return len([entry async for entry in wal.replay()])
        finally:
            await wal.close()

    return asyncio.run(replay()) == 0


def _metadata_commits(fleet: TieredFleet) -> dict[int, dict[int, ObjectCommit]]:
    """shard -> object id -> its ObjectCommit records, as read from the metadata topic."""
    found: dict[int, dict[int, ObjectCommit]] = {}
    for shard in range(fleet.shard_count):
        for _, record in fleet.records(shard):
            if isinstance(record, ObjectCommit):
                found.setdefault(shard, {})[record.object_id] = record
    return found


def test_idempotent_producers_in_two_zones_land_in_minio(make_fleet, tmp_path):
    fleet = make_fleet()
    a, b = fleet["zone-a"], fleet["zone-b"]
    try:
        started = time.monotonic()
        fleet.start()
        fleet.wait_until_owned()
        topic, topic_id = _tiered_topic(fleet)
        ready = time.monotonic()

        javas = [
            JavaProducer(p.bootstrap, topic, p.zone, prefix, 10_000, tmp_path)
            for p, prefix in ((a, 1), (b, 2))
        ]
        results: list[Produced] = []

        def librdkafka(proxy, name: str) -> None:
            results.append(
                produce_librdkafka(
                    proxy.bootstrap, topic, proxy.zone, name, 25_000, PARTITIONS, VALUE_SIZE
                )
            )

        async def aiokafka_both() -> list[Produced]:
            return list(
                await asyncio.gather(
                    *(
                        produce_aiokafka(
                            p.bootstrap, topic, p.zone, name, 15_000, PARTITIONS, VALUE_SIZE
                        )
                        for p, name in ((a, "aio-a"), (b, "aio-b"))
                    )
                )
            )

        threads = [
            threading.Thread(target=librdkafka, args=(a, "rdk-a")),
            threading.Thread(target=librdkafka, args=(b, "rdk-b")),
        ]
        for thread in threads:
            thread.start()
        results += asyncio.run(aiokafka_both())
        for thread in threads:
            thread.join(180)
        results += [java.wait() for java in javas]
        produced_at = time.monotonic()

        by_name = {r.name: r for r in results}
        assert sorted(by_name) == ["aio-a", "aio-b", "java-1", "java-2", "rdk-a", "rdk-b"]
        for r in results:
            assert not r.errors and not r.fatal, f"{r.name}: {(r.errors + r.fatal)[:5]}"
            assert len(r.acked) == r.sent, f"{r.name}: {r.sent} sent, {len(r.acked)} acked"
        assert sum(len(r.acked) for r in results) == 100_000

        # Steady state: within a few upload intervals nothing is left in either WAL.
        wait_for(
            lambda: [wal_backlog(p.wal_dir) for p in (a, b)],
            lambda backlogs: backlogs == [0, 0],
            "both WALs trimmed",
            timeout=15,
        )
        # The peer hop carried requests and answers, not records: compare it with the
        # record bytes each proxy handed to the other's partitions.
        owners = {p: fleet.stream_owner(topic_id, p) for p in range(PARTITIONS)}
        zone_of = {"rdk-a": a, "aio-a": a, "java-1": a, "rdk-b": b, "aio-b": b, "java-2": b}
        handed = Counter()
        for r in results:
            proxy = zone_of[r.name]
            for value, (partition, _) in r.acked.items():
                if owners[partition] != proxy.name:
                    handed[proxy.name] += len(value)
        for proxy in (a, b):
            to_owner = proxy.metric("tierproxy_peer_bytes_total", mode="s3", direction="to_owner")
            from_owner = proxy.metric(
                "tierproxy_peer_bytes_total", mode="s3", direction="from_owner"
            )
            assert handed[proxy.name] > 0, f"nothing handed over by {proxy.name}: {owners}"
            assert 0 < to_owner < 0.05 * handed[proxy.name], (proxy.name, to_owner, handed)
            assert 0 < from_owner < 0.05 * handed[proxy.name], (proxy.name, from_owner, handed)
            assert proxy.metric("tierproxy_peer_bytes_total", mode="direct") == 0
    finally:
        fleet.stop()
    stopped = time.monotonic()
    for proxy in (a, b):
        assert _wal_is_trimmed(proxy.wal_dir), f"{proxy.name}'s WAL holds uncommitted data"
    committed = fleet.committed(topic_id, PARTITIONS)
    assert check_committed(committed, results, exact=True) == 100_000

    # Every object the metadata names is in MinIO, with the size its commit says, and has
    # an ObjectCommit in the partition of each shard whose streams it holds.
    commits = _metadata_commits(fleet)
    sizes = fleet.object_sizes(list(committed.objects))
    for key, shard in committed.objects.items():
        object_id = int(key.rsplit("/", 1)[1], 16)
        assert object_id in commits.get(shard, {}), f"{key}: no ObjectCommit in {shard}"
        assert sizes[key] == commits[shard][object_id].size
    print(
        f"\nstart+cutover {ready - started:.1f} s, produce {produced_at - ready:.1f} s, "
        f"stop {stopped - produced_at:.1f} s, objects {len(committed.objects)}; "
        + ", ".join(f"{r.name} {r.seconds:.1f} s" for r in results)
    )


class Load:
    """An idempotent librdkafka producer in each zone, `rate` records a second each, until
    `finish`. Both know every proxy, so a client whose proxy is gone finds the other."""

    def __init__(self, fleet: TieredFleet, topic: str, rate: float) -> None:
        self._stop = threading.Event()
        self.produced = [Produced(f"load-{zone[-1]}") for zone in fleet.proxies]
        self._threads = [
            threading.Thread(target=self._run, args=(fleet, topic, zone, rate, p), daemon=True)
            for zone, p in zip(fleet.proxies, self.produced, strict=True)
        ]
        for thread in self._threads:
            thread.start()

    def _run(self, fleet: TieredFleet, topic: str, zone: str, rate: float, into) -> None:
        try:
            produce_librdkafka(
                fleet.bootstrap(),
                topic,
                zone,
                into.name,
                10**7,
                PARTITIONS,
                VALUE_SIZE,
                rate=rate,
                stop=self._stop,
                into=into,
            )
        except Exception as exc:  # the test sees it in `errors`
            into.errors.append(repr(exc))

    def stop(self) -> None:
        """Stop sending (a failed test: the threads are daemons, left to finish)."""
        self._stop.set()

    def acked(self) -> int:
        return sum(len(p.acked) for p in self.produced)

    def finish(self) -> list[Produced]:
        """Stop sending, wait for every answer; every record sent must be acknowledged."""
        self._stop.set()
        for thread in self._threads:
            thread.join(200)
        assert not any(t.is_alive() for t in self._threads), "a producer is still flushing"
        for produced in self.produced:
            assert not produced.fatal, f"{produced.name}: fatal errors {produced.fatal[:3]}"
            assert not produced.errors, f"{produced.name}: {produced.errors[:5]}"
            assert produced.acked
        return self.produced


def _victim(fleet: TieredFleet, topic_id: uuid.UUID):
    """(the proxy owning most of the topic's streams, the other one, its shards)."""
    owners = Counter(fleet.stream_owner(topic_id, p) for p in range(PARTITIONS))
    victim = fleet.by_name(owners.most_common(1)[0][0])
    survivor = next(p for p in fleet.proxies.values() if p is not victim)
    shards = sorted(s for s, (owner, _, _) in fleet.owners().items() if owner == victim.name)
    return victim, survivor, shards


def _held_for(proxy, victim, shards: list[int], after: int, timeout: float = 30.0) -> None:
    """Until `proxy` logs that it waits for `victim` before claiming each of `shards`."""
    for shard in shards:
        wait_for_log(
            proxy,
            f"waits for {victim.name} to come back before it claims metadata shard {shard}",
            timeout,
            after=after,
        )


def _reclaimed(fleet: TieredFleet, victim, shards: list[int], before: dict) -> None:
    """Until the victim owns its shards again at a newer epoch, and every shard is owned."""
    wait_for(
        fleet.owners,
        lambda owners: all(
            owners[s][0] == victim.name and owners[s][1] > before[s][1] for s in shards
        ),
        f"{victim.name} claiming {shards} again",
    )
    fleet.wait_until_owned({p.name for p in fleet.proxies.values()})


def test_owner_killed_mid_load_loses_no_acknowledged_record(make_fleet):
    fleet = make_fleet()
    load = None
    try:
        fleet.start()
        fleet.wait_until_owned()
        topic, topic_id = _tiered_topic(fleet)
        victim, survivor, shards = _victim(fleet, topic_id)
        before = fleet.owners()
        load = Load(fleet, topic, rate=1500)
        wait_for(load.acked, lambda n: n > 5000, "the load under way")

        mark = survivor.log_size()
        fleet.kill(victim.zone)
        killed = time.monotonic()
        backlog = wal_backlog(victim.wal_dir)  # acknowledged by the dead one, not committed
        assert backlog > 0, "the dead owner had committed everything: its WAL is not needed"
        # After the session timeout the survivor is given the dead owner's shards; it
        # fences the dead owner and waits for it: no claim, no unclean takeover.
        _held_for(survivor, victim, shards, mark)
        held = time.monotonic()
        owners = fleet.owners()
        assert {s: owners[s] for s in shards} == {s: before[s] for s in shards}
        acked_while_held = load.acked()
        time.sleep(2)  # the survivor's own partitions keep taking records meanwhile
        assert load.acked() > acked_while_held, "nothing acknowledged while the owner was dead"

        fleet.start(victim.zone)  # same fleet.name, same WAL directory
        _reclaimed(fleet, victim, shards, before)
        recovered = time.monotonic()
        acked_recovered = load.acked()
        wait_for(load.acked, lambda n: n > acked_recovered + 5000, "the load going on")
        produced = load.finish()
    finally:
        if load is not None:
            load.stop()
        fleet.stop()
    for proxy in (victim, survivor):
        assert _wal_is_trimmed(proxy.wal_dir), f"{proxy.name}'s WAL holds uncommitted data"
    total = check_committed(fleet.committed(topic_id, PARTITIONS), produced, exact=True)
    print(
        f"\nkilled {victim.name} owning shards {shards} with {backlog} WAL bytes not "
        f"committed; held by {survivor.name} after {held - killed:.1f} s; restarted and "
        f"owning again after {recovered - held:.1f} s; {total} records committed"
    )


def test_paused_owner_is_fenced(make_fleet):
    # uploads every 2 s: the paused owner surely holds records it has not committed
    fleet = make_fleet(upload_interval_s=2.0)
    load = None
    try:
        fleet.start()
        fleet.wait_until_owned()
        topic, topic_id = _tiered_topic(fleet)
        victim, survivor, shards = _victim(fleet, topic_id)
        before = fleet.owners()
        load = Load(fleet, topic, rate=1500)
        wait_for(load.acked, lambda n: n > 5000, "the load under way")

        mark = survivor.log_size()
        fleet.pause(victim.zone)
        paused = time.monotonic()
        backlog = wal_backlog(victim.wal_dir)
        assert backlog > 0, "the paused owner has nothing left to commit: nothing to show"
        ends = {shard: _end(fleet, shard) for shard in shards}
        # Past the session timeout the survivor fences it (InitProducerId) and waits.
        _held_for(survivor, victim, shards, mark)
        held = time.monotonic()
        # the session runs from the last heartbeat, at most a third of it before the pause
        assert held - paused >= 6.0 * 2 / 3, "the shards moved before the session timeout"
        owners = fleet.owners()
        assert {s: owners[s] for s in shards} == {s: before[s] for s in shards}

        mark = victim.log_size()
        fleet.resume(victim.zone)
        # It wakes up owning the shards as far as it knows, with acknowledged records to
        # commit at its old epoch: Kafka refuses its transaction, and it learns it lost.
        wait_for_log(victim, "Kafka fenced its producer", 30, after=mark)
        fenced_log = victim.log(mark)
        assert "uploader stopped: commit of" in fenced_log or "could not release" in fenced_log
        _reclaimed(fleet, victim, shards, before)
        recovered = time.monotonic()
        acked_recovered = load.acked()
        wait_for(load.acked, lambda n: n > acked_recovered + 5000, "the load going on")
        produced = load.finish()
    finally:
        if load is not None:
            load.stop()
        fleet.stop()
    # Nothing of the old epoch reached the metadata after the pause, not even in an
    # aborted transaction; the next records are the victim's new claims.
    for shard in shards:
        old_epoch = before[shard][1]
        for isolation in ("read_committed", "read_uncommitted"):
            later = [r for o, r in fleet.records(shard, isolation) if o >= ends[shard]]
            stale = [r for r in later if getattr(r, "epoch", old_epoch + 1) <= old_epoch]
            assert not stale, f"shard {shard}: written at the fenced epoch: {stale[:3]}"
        assert any(
            isinstance(r, ShardClaim) and r.owner == victim.name and r.epoch > old_epoch
            for _, r in fleet.records(shard)
        )
    for proxy in (victim, survivor):
        assert _wal_is_trimmed(proxy.wal_dir), f"{proxy.name}'s WAL holds uncommitted data"
    total = check_committed(fleet.committed(topic_id, PARTITIONS), produced, exact=True)
    print(
        f"\npaused {victim.name} owning shards {shards} with {backlog} WAL bytes not "
        f"committed; held by {survivor.name} after {held - paused:.1f} s; resumed, fenced "
        f"and owning again after {recovered - held:.1f} s; {total} records committed"
    )


def _end(fleet: TieredFleet, shard: int) -> int:
    """The offset after the last record of a shard's partition (any isolation)."""
    records = fleet.records(shard, "read_uncommitted")
    return records[-1][0] + 1 if records else 0
