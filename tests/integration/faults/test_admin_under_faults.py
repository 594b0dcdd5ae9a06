"""Admin operations under load while proxies are killed (issue 18; docs/reliability.md,
"Admin operations under faults").

Two `tierproxy run` processes (zone-a, zone-b; four metadata shards; the fault suite's
tiering settings, so compaction and garbage collection run throughout, and retention
every second) on the session's Kafka and a MinIO of its own, under the fault suite's
steady load (faultsteps.steady_load; librdkafka batches of a few records: linger.ms 100).
Then, each followed by the fault suite's "recovered" (every shard claimed again, produce
acknowledged in every partition, the consumer caught up):

1. DeleteRecords through the fleet (AdminClient.delete_records), DELETES times, each at
   an offset inside a batch (one the committed objects show with more than one record,
   not its base offset) that the consumer has read already; right after one of them the
   owner of that partition's shard is killed with SIGKILL and restarted (a restart after
   a log start inside a batch once left its shard unowned for good). Each answer is the
   offset asked (Kafka's answer: the log start is the offset given), and ListOffsets
   EARLIEST says it too, after the restart as well.
2. Retention: a second tiered topic holds records stamped an hour back; its retention.ms
   is set to ten minutes (IncrementalAlterConfigs) and the owner of its shard is killed
   and restarted: the log start moves to the end of those records within
   RETENTION_BOUND_S; records produced after are all kept.
3. A cutover of a third topic while a proxy is down: `topics tier` through the survivor,
   the killed proxy started again; the cutover completes, and the records produced
   before it (through Kafka's log) and after it (the stream) are all read back once.

The end checks are the fault suite's (faultchecks.py): nothing acknowledged lost,
nothing twice, committed == consumed, nothing left behind, no process left running, no
ERROR line; and a fresh consumer from the earliest offset of each topic reads exactly
the acknowledged records at or above the log start, none below it (assert_read_back).
"""

from __future__ import annotations

import os
import random
import threading
import time
import uuid

import pytest
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewTopic,
)
from cutover_load import LoadProducer
from faultchecks import (
    TIERING,
    assert_nothing_lost,
    assert_read_back,
    close_run,
    finish,
    read_back,
    write_figures,
)
from faultload import CLIENT, Figures
from faultsteps import RECOVERY_BOUND_S, Injector, steady_load
from tieredfleet import TieredFleet, produce_librdkafka, topic_id_of

from proxy.devstack import MinioServer
from tests.support.clients import delete_records, read_from_earliest, watermarks
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.faults, pytest.mark.timeout(600)]

PARTITIONS = 4
DELETES = 3
KILL_AFTER_DELETE = 1  # the owner killed right after this DeleteRecords (0-based)
RETENTION_INTERVAL_S = 1.0
# from the owner's restart: its shards back, its retention's first pass (it reads the
# topic's configs afresh) and the StreamTrim read by the fleet
RETENTION_BOUND_S = RECOVERY_BOUND_S + 5 * RETENTION_INTERVAL_S
HOUR_MS = 3_600_000
OLD_RECORDS = 300  # the retention topic's records stamped an hour back
CUTOVER_PARTITIONS = 2
PER_SIDE = 200  # the third topic's records before and after its cutover
# librdkafka batches of a few records (150 records/s a producer over four partitions)
BATCHED = {**CLIENT, "linger.ms": 100}


def _seed() -> int:
    return int(os.environ.get("TIERPROXY_FAULT_SEED", "18"))


def _create(fleet: TieredFleet, name: str, partitions: int) -> uuid.UUID:
    admin = AdminClient({"bootstrap.servers": fleet.kafka_bootstrap})
    admin.create_topics([NewTopic(name, partitions, 3)])[name].result(30)
    return wait_for(lambda: topic_id_of(admin, name), bool, f"{name} known")


def _owner_zone(fleet: TieredFleet, topic_id: uuid.UUID, partition: int) -> str:
    return fleet.by_name(fleet.stream_owner(topic_id, partition)).zone


def _earliest(fleet: TieredFleet, topic: str, partition: int) -> int:
    return watermarks(fleet.bootstrap(), topic, partition)[0]


def _inside_a_batch(
    fleet: TieredFleet, injector: Injector, partition: int, above: int, rng: random.Random
) -> tuple[int, tuple[int, int]]:
    """An offset inside a committed batch of more than one record (not its base offset),
    the batch past `above` and read by the consumer already; and that batch."""

    def candidates() -> list[tuple[int, int]]:
        read = injector.consumer.position[partition]
        batches = fleet.committed(injector.topic_id, PARTITIONS).batches.get(partition, [])
        return [(b, last) for b, last in batches if last > b and b > above and last < read]

    found = wait_for(candidates, bool, f"a batch of records in partition {partition}", 30)
    base, last = rng.choice(found[-8:])
    return rng.randint(base + 1, last), (base, last)


def _delete_inside_batches(
    fleet: TieredFleet, injector: Injector, rng: random.Random, log_starts: dict[int, int]
) -> list[dict]:
    """DELETES DeleteRecords inside batches, the shard owner killed after one of them."""
    topic, done = injector.topic, []
    for n in range(DELETES):
        partition = rng.randrange(PARTITIONS)
        offset, batch = _inside_a_batch(fleet, injector, partition, log_starts[partition], rng)
        answered = delete_records(fleet.bootstrap(), {(topic, partition): offset})
        assert answered == {(topic, partition): offset}, (offset, batch, answered)
        log_starts[partition] = offset
        entry = {"partition": partition, "offset": offset, "batch": list(batch)}
        if n == KILL_AFTER_DELETE:
            zone = _owner_zone(fleet, injector.topic_id, partition)
            entry["killed"] = zone
            entry["recovered_s"] = round(
                injector.kill_and_restart(zone, "kill -9 after DeleteRecords"), 2
            )
        else:
            started = time.monotonic()
            injector.recovered("DeleteRecords", started, started, RECOVERY_BOUND_S)
        entry["earliest"] = _earliest(fleet, topic, partition)
        assert entry["earliest"] == offset, entry
        done.append(entry)
    return done


def _retention(fleet: TieredFleet, injector: Injector) -> tuple[dict, str, dict]:
    """A tiered topic's old records trimmed by retention.ms, its shard owner killed and
    restarted after the change; (figures, topic, acknowledged)."""
    topic = f"retained-{fleet.suffix}"
    topic_id = _create(fleet, topic, 1)
    fleet.tier(topic)
    fleet.wait_for_cutover(topic_id, 1)
    old = produce_librdkafka(
        fleet.bootstrap(),
        topic,
        "zone-a",
        "old",
        OLD_RECORDS,
        1,
        64,
        timestamp_ms=int(time.time() * 1000) - HOUR_MS,
    )
    assert not old.errors, old.errors[:5]
    acked = old.acked
    end = max(offset for _, offset in acked.values()) + 1
    wait_for(
        lambda: fleet.committed(topic_id, 1).end.get(0, 0),
        lambda committed: committed >= end,
        "the old records committed",
        30,
    )
    admin = AdminClient({"bootstrap.servers": fleet.kafka_bootstrap})
    entry = ConfigEntry(
        "retention.ms", str(HOUR_MS // 6), incremental_operation=AlterConfigOpType.SET
    )
    resource = ConfigResource("topic", topic, incremental_configs=[entry])
    changed = time.monotonic()
    admin.incremental_alter_configs([resource])[resource].result(30)
    zone = _owner_zone(fleet, topic_id, 0)
    injector.kill_and_restart(zone, "kill -9 after AlterConfigs")
    wait_for(
        lambda: _earliest(fleet, topic, 0),
        lambda earliest: earliest == end,
        f"{topic}'s log start at {end}",
        RETENTION_BOUND_S,
    )
    trimmed_s = round(time.monotonic() - changed, 2)
    later = produce_librdkafka(fleet.bootstrap(), topic, "zone-a", "kept", 100, 1, 64)
    assert not later.errors, later.errors[:5]
    acked.update(later.acked)
    return {"killed": zone, "log_start": end, "trimmed_after_s": trimmed_s}, topic, acked


def _cutover_while_down(fleet: TieredFleet, injector: Injector, rng: random.Random):
    """A third topic tiered while a proxy is down; (figures, topic, acknowledged)."""
    topic = f"cut-{fleet.suffix}"
    topic_id = _create(fleet, topic, CUTOVER_PARTITIONS)
    n = CUTOVER_PARTITIONS
    before = produce_librdkafka(fleet.bootstrap(), topic, "zone-a", "before", PER_SIDE, n, 64)
    assert not before.errors, before.errors[:5]
    tiering: list[BaseException | str] = []

    def tier() -> None:
        try:
            tiering.append(fleet.tier(topic))
        except BaseException as exc:  # noqa: BLE001 - asserted in the test's thread
            tiering.append(exc)

    thread = threading.Thread(target=tier, name="tier", daemon=True)
    zone = rng.choice(sorted(fleet.proxies))
    injector.kill_and_restart(zone, "kill -9 during a cutover", while_down=thread.start)
    thread.join(90)
    assert tiering and not isinstance(tiering[0], BaseException), tiering
    starts = fleet.wait_for_cutover(topic_id, n)
    after = produce_librdkafka(fleet.bootstrap(), topic, "zone-b", "after", PER_SIDE, n, 64)
    assert not after.errors, after.errors[:5]
    acked = {**before.acked, **after.acked}
    return {"killed": zone, "cutover": starts}, topic, acked


def test_admin_operations_under_kills_bring_every_shard_back_and_lose_nothing_kept(
    kafka_cluster, tmp_path
):
    seed = _seed()
    rng, figures = random.Random(seed), Figures(seed)
    began = time.monotonic()
    minio = MinioServer(name="minio-admin", base_dir=tmp_path / "minio")
    fleet = None
    producers: list[LoadProducer] = []
    consumer = None
    tiering = {**TIERING, "retention_check_interval_s": RETENTION_INTERVAL_S}
    try:
        minio.start()
        fleet = TieredFleet(kafka_cluster.bootstrap, minio, tmp_path, tiering=tiering)
        fleet.start()
        fleet.wait_until_owned()
        topic_id, injector = steady_load(
            fleet, PARTITIONS, producers, tmp_path, figures, settings=BATCHED
        )
        progress, consumer = injector.progress, injector.consumer
        injector.rng = rng
        figures.notes["setup_s"] = round(time.monotonic() - began, 1)
        log_starts = dict(consumer.starts)

        figures.notes["deletes"] = _delete_inside_batches(fleet, injector, rng, log_starts)
        retention, retained, retained_acks = _retention(fleet, injector)
        figures.notes["retention"] = retention
        cutover, cut, cut_acks = _cutover_while_down(fleet, injector, rng)
        figures.notes["cutover_while_down"] = cutover

        finish(fleet, minio, topic_id, producers, progress, consumer, figures, log_starts)
        acked = {a.value: (a.partition, a.offset) for a in progress.acks()}
        figures.notes["read_back"] = {
            "load": read_back(
                read_from_earliest(fleet.bootstrap(), injector.topic, PARTITIONS),
                acked,
                log_starts,
            ),
            "retention": read_back(
                read_from_earliest(fleet.bootstrap(), retained, 1),
                retained_acks,
                {0: retention["log_start"]},
            ),
            "cutover": read_back(
                read_from_earliest(fleet.bootstrap(), cut, CUTOVER_PARTITIONS), cut_acks, {}
            ),
        }
        figures.notes["compactions"] = sum(
            p.log().count("objects' ranges rewritten into") for p in fleet.proxies.values()
        )
    finally:
        close_run([*producers, consumer], fleet, minio)
    write_figures(figures, fleet, [minio], began, tmp_path / "admin-figures.json")

    for what, counts in figures.notes["read_back"].items():
        assert_read_back(counts, what)
    assert figures.notes["read_back"]["load"]["deleted_on_purpose"] > 0
    assert figures.notes["read_back"]["retention"]["deleted_on_purpose"] == OLD_RECORDS
    assert figures.notes["compactions"] > 0, "no compaction ran during the run"
    assert figures.records_acknowledged > 2_000
    assert_nothing_lost(figures)
    assert figures.notes["proxy_errors"] == [], "the proxies logged errors (see their logs)"
