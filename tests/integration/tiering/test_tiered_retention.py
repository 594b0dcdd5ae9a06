"""Retention of a tiered topic, run by its owner (proxy/upkeep/retention.py).

One proxy owns every metadata shard. A one-partition topic gets a few records through
Kafka, is tiered, then gets three batches of records, each uploaded as an object of its
own, over a few seconds. The topic's retention.ms (or retention.bytes) is then set so that
exactly the two oldest (the oldest) objects are past it, and a retention pass runs
(called directly; the background loop is set to wait an hour). Then: the log start is the
end of the last range dropped, in the metadata and on the owner's partition; a consumer
that fetches below it gets OFFSET_OUT_OF_RANGE, from Kafka's part of the log as from the
trimmed objects; ListOffsets EARLIEST is the new log start and a consumer from the earliest
offset reads exactly the records kept; the dropped objects stay in the store for the grace
period, then are deleted (ObjectDelete written, the block cache forgets them).
"""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewTopic,
)
from cutover_load import proxy_config, started, tiered_topic_id, topics_command, wait_owned

from offload_jobs.fleet import ObjectToCommit, commit_objects, read_gaps
from offload_jobs.migrate import MigrateJob, StoreSpec, plan, run_task
from proxy.config import parse_config
from proxy.devstack.paths import free_port_block
from proxy.devstack.proxy_thread import ProxyThread
from proxy.metadata.streams import stream_id
from proxy.objects.format import read_object
from proxy.objects.store import ObjectNotFound
from tests.support.clients import watermarks
from tests.support.waiting import wait_until

pytestmark = pytest.mark.kafka

SHARDS = 2
BEFORE = 30  # records through Kafka, below the cutover
PER_OBJECT = 40
GAP_S = 1.5  # between two objects' records
GRACE_S = 10.0  # the checks made within it take a few seconds
HOUR_MS = 3_600_000

Record = tuple[int, bytes, int]  # offset, value, timestamp


def _create_topic(cluster, topic: str) -> None:
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    new = NewTopic(topic, 1, 3, config={"retention.ms": str(HOUR_MS)})
    admin.create_topics([new])[topic].result(30)


def _set_topic_config(cluster, topic: str, values: dict[str, int]) -> None:
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    entries = [
        ConfigEntry(k, str(v), incremental_operation=AlterConfigOpType.SET)
        for k, v in values.items()
    ]
    resource = ConfigResource("topic", topic, incremental_configs=entries)
    admin.incremental_alter_configs([resource])[resource].result(30)


def _produce(
    bootstrap: str, topic: str, prefix: str, count: int, partition: int = 0
) -> list[Record]:
    acked: list[Record] = []
    errors: list[str] = []

    def delivered(err, msg) -> None:
        if err is not None:
            errors.append(str(err))
        else:
            acked.append((msg.offset(), msg.value(), msg.timestamp()[1]))

    producer = Producer(
        {"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5}
    )
    for n in range(count):
        value = f"{prefix}-{n}".encode()
        producer.produce(topic, value, partition=partition, on_delivery=delivered)
        producer.poll(0)
    assert producer.flush(60) == 0
    assert not errors, errors[:5]
    return sorted(acked)


def _read_from_earliest(
    bootstrap: str, topic: str, want: int, partition: int = 0
) -> list[tuple[int, bytes]]:
    """(offset, value) of the partition's first `want` records from ListOffsets EARLIEST
    on."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"r-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
            "auto.offset.reset": "error",
        }
    )
    consumer.assign([TopicPartition(topic, partition, OFFSET_BEGINNING)])
    got: list[tuple[int, bytes]] = []
    deadline = time.monotonic() + 60
    try:
        while len(got) < want and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            assert msg.error() is None, msg.error()
            got.append((msg.offset(), msg.value()))
    finally:
        consumer.close()
    return got


def _fetch_error_at(bootstrap: str, topic: str, offset: int) -> int:
    """The error a consumer with auto.offset.reset=error gets fetching from `offset`;
    AssertionError if it gets a record instead."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"o-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
            "auto.offset.reset": "error",
        }
    )
    consumer.assign([TopicPartition(topic, 0, offset)])
    deadline = time.monotonic() + 30
    try:
        while time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            assert msg.error() is not None, f"got offset {msg.offset()} fetching {offset}"
            return msg.error().code()
    finally:
        consumer.close()
    raise AssertionError(f"no answer fetching offset {offset}")


def _offset_for_time(bootstrap: str, topic: str, timestamp: int) -> int:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"t-{uuid.uuid4().hex}"})
    try:
        [found] = consumer.offsets_for_times([TopicPartition(topic, 0, timestamp)], 30)
        return found.offset
    finally:
        consumer.close()


class TieredTopic:
    """A proxy, a tiered one-partition topic with BEFORE records in Kafka, and objects."""

    def __init__(
        self, cluster, tmp_path, proxy: ProxyThread, topic: str, before_batches: int = 1
    ) -> None:
        self.cluster, self.proxy, self.topic = cluster, proxy, topic
        wait_owned([proxy], SHARDS)
        self.tiering = proxy.proxy.tiering
        self.before: list[Record] = []
        for n in range(before_batches):  # one flush each: at least that many batches
            count = BEFORE // before_batches
            self.before += _produce(proxy.bootstrap, topic, f"before{n}", count)
        assert topics_command("tier", topic, self.tiering.peer_port).returncode == 0
        self.stream = stream_id(tiered_topic_id(proxy, topic), 0)
        wait_until(lambda: started(self.tiering, self.stream), 30, "started")
        assert self.state.cutover(self.stream) == BEFORE

    @property
    def state(self):
        return self.tiering.state(self.stream)

    def upload(self, prefix: str) -> list[Record]:
        """PER_OBJECT records, committed as one object."""
        records = _produce(self.proxy.bootstrap, self.topic, prefix, PER_OBJECT)
        self.proxy.run(lambda: self.tiering.uploader.flush())
        end = records[-1][0] + 1
        wait_until(lambda: self.state.stream_end(self.stream) == end, 30, f"{prefix} committed")
        return records

    def ranges(self):
        return self.state.committed_ranges(self.stream)

    def retention_sees(self, **values: int) -> None:
        """Set the topic's config and wait until the proxy's admin client reads it back
        (a broker applies an altered config in its own time)."""
        _set_topic_config(self.cluster, self.topic, values)
        wanted = {k.replace(".", "_"): v for k, v in values.items()}

        def seen() -> bool:
            configs = self.proxy.run(
                lambda: self.tiering.retention.configs.get([self.topic], refresh=True)
            )
            found = configs.get(self.topic)
            return found is not None and all(getattr(found, k) == v for k, v in wanted.items())

        wait_until(seen, 30, f"retention config {values} read", interval_s=0.3)

    def run_retention(self, now_ms: int | None = None):
        return self.proxy.run(lambda: self.tiering.retention.run_once(now_ms))

    def exists(self, key: str) -> bool:
        try:
            self.proxy.run(lambda: self.tiering.store.size(key))
        except ObjectNotFound:
            return False
        return True

    def block_bytes(self, r) -> int:
        """The stream's block bytes in the object holding range `r` (its index)."""
        data = self.proxy.run(lambda: self.tiering.store.get(r.object_key))
        _, index = read_object(data, r.object_key)
        return sum(e.size for e in index if e.stream_id == self.stream)


def _start(kafka_cluster, tmp_path, name: str):
    suffix = uuid.uuid4().hex[:8]
    topic = f"{name}-{suffix}"
    _create_topic(kafka_cluster, topic)
    config = proxy_config(
        kafka_cluster,
        tmp_path,
        f"{name}-{suffix}",
        "zone-a",
        suffix,
        free_port_block(8),
        upload_interval_s=3600.0,
        retention_check_interval_s=3600.0,
        object_delete_grace_s=GRACE_S,
    )
    return topic, ProxyThread(parse_config(config))


def test_retention_ms_trims_whole_objects_and_deletes_them_after_the_grace(kafka_cluster, tmp_path):
    started = time.monotonic()
    topic, thread = _start(kafka_cluster, tmp_path, "ret-ms")
    with thread as proxy:
        t = TieredTopic(kafka_cluster, tmp_path, proxy, topic)
        old = t.upload("a")
        time.sleep(GAP_S)
        old += t.upload("b")
        time.sleep(GAP_S)
        kept = t.upload("c")
        ranges = t.ranges()
        assert [(r.start_offset, r.end_offset) for r in ranges] == [
            (BEFORE, BEFORE + PER_OBJECT),
            (BEFORE + PER_OBJECT, BEFORE + 2 * PER_OBJECT),
            (BEFORE + 2 * PER_OBJECT, BEFORE + 3 * PER_OBJECT),
        ]
        dropped_keys = sorted(r.object_key for r in ranges[:2])
        # a retention.ms that the second object's records are past, the third's not
        newest_old, oldest_kept = max(ts for *_, ts in old), min(ts for *_, ts in kept)
        assert oldest_kept - newest_old > 500, (newest_old, oldest_kept)
        middle = (newest_old + oldest_kept) // 2
        now = int(time.time() * 1000)
        t.retention_sees(**{"retention.ms": now - middle})

        report = t.run_retention(now)
        trimmed_at = time.monotonic()
        log_start = BEFORE + 2 * PER_OBJECT
        assert report.trimmed == {t.stream: log_start}
        assert t.tiering.partitions.get(t.stream).log_start_offset == log_start
        wait_until(lambda: t.state.stream(t.stream).log_start_offset == log_start, 30, "read")
        assert [r.object_key for r in t.ranges()] == [ranges[2].object_key]
        # within the grace the dropped objects stay (readers that began before the trim)
        assert sorted(c.object_id for c in t.state.garbage_objects()) == sorted(
            r.object_id for r in ranges[:2]
        )
        assert all(t.exists(key) for key in dropped_keys)
        assert all(t.tiering.block_cache.has_index(key) for key in dropped_keys)

        # below the new log start: out of range, in Kafka's part as in the trimmed objects
        for offset in (0, BEFORE, BEFORE + PER_OBJECT + 5, log_start - 1):
            code = _fetch_error_at(proxy.bootstrap, topic, offset)
            assert code == KafkaError._AUTO_OFFSET_RESET, (offset, code)
        end = log_start + PER_OBJECT
        assert watermarks(proxy.bootstrap, topic) == (log_start, end)
        # a time before everything kept: the first record kept, not one of Kafka's
        assert _offset_for_time(proxy.bootstrap, topic, t.before[0][2]) == log_start
        expected = [(offset, value) for offset, value, _ in kept]
        assert _read_from_earliest(proxy.bootstrap, topic, PER_OBJECT) == expected

        # after the grace (and with retention.ms unlimited again: nothing more goes), the
        # garbage collector deletes them, then writes their ObjectDelete
        t.retention_sees(**{"retention.ms": -1})
        assert t.run_retention().trimmed == {}
        owner = t.tiering.assignment.owner(t.state.shard)
        wait_until(lambda: owner.state.garbage_objects() == [], 3 * GRACE_S, "deleted")
        assert time.monotonic() - trimmed_at >= GRACE_S
        assert not any(t.exists(key) for key in dropped_keys)
        assert t.exists(ranges[2].object_key)
        assert not any(t.tiering.block_cache.has_index(key) for key in dropped_keys)
        assert all(owner.state.object_commit(r.object_id) is None for r in ranges[:2])
        assert _read_from_earliest(proxy.bootstrap, topic, PER_OBJECT) == expected
    print(f"retention.ms test took {time.monotonic() - started:.1f} s")


def test_retention_bytes_keeps_at_least_the_limit_dropping_oldest_objects_whole(
    kafka_cluster, tmp_path
):
    started = time.monotonic()
    topic, thread = _start(kafka_cluster, tmp_path, "ret-bytes")
    with thread as proxy:
        t = TieredTopic(kafka_cluster, tmp_path, proxy, topic)
        t.upload("d")
        kept = t.upload("e") + t.upload("f")
        ranges = t.ranges()
        assert len(ranges) == 3
        sizes = [t.block_bytes(r) for r in ranges]
        assert all(size > 0 for size in sizes)
        # one byte more than the two newest hold: dropping the oldest would go below it
        t.retention_sees(**{"retention.bytes": sizes[1] + sizes[2] + 1})
        assert t.run_retention().trimmed == {}
        assert t.state.stream(t.stream).log_start_offset == 0  # Kafka's log start at cutover
        assert t.tiering.partitions.get(t.stream).log_start_offset == 0

        # exactly what the two newest hold: the oldest goes, nothing more
        t.retention_sees(**{"retention.bytes": sizes[1] + sizes[2]})
        log_start = ranges[0].end_offset
        assert t.run_retention().trimmed == {t.stream: log_start}
        assert t.tiering.partitions.get(t.stream).log_start_offset == log_start
        wait_until(lambda: t.state.stream(t.stream).log_start_offset == log_start, 30, "read")
        assert [r.object_key for r in t.ranges()] == [r.object_key for r in ranges[1:]]
        assert t.run_retention().trimmed == {}  # the rest is exactly the limit: kept

        assert _fetch_error_at(proxy.bootstrap, topic, 0) == KafkaError._AUTO_OFFSET_RESET
        assert watermarks(proxy.bootstrap, topic) == (log_start, log_start + 2 * PER_OBJECT)
        expected = [(offset, value) for offset, value, _ in kept]
        assert _read_from_earliest(proxy.bootstrap, topic, 2 * PER_OBJECT) == expected
    print(f"retention.bytes test took {time.monotonic() - started:.1f} s")


def _migrate(t: TieredTopic, first: int | None = None) -> int:
    """What `tierproxy migrate --from-cluster` does, its tasks run here instead of on Spark
    executors: the backfill gaps from the metadata, one object per Kafka batch below the
    cutover (PUT), each committed through the proxy's peer port (the owner's backfill
    commit); only the `first` ones by offset if given (a job not done yet). Returns how
    many objects were committed, once this proxy's view (`t.state`) holds them: a commit
    is answered when the owner's own reader of the shard has read it back; the proxy's
    reader of that shard, which `t.state` is (and Fetch and ListOffsets use), applies it
    next, in its own time (a client meanwhile reads those offsets from Kafka's copy)."""
    tiering = t.proxy.config.tiering
    job = MigrateJob(
        t.topic,
        t.cluster.bootstrap,
        tiering.metadata_topic,
        tiering.shard_count,
        StoreSpec.from_settings(tiering.object_store),
        ("127.0.0.1", t.tiering.peer_port),
        from_cluster=True,
        target_object_bytes=1,
    )
    kafka = {"bootstrap_servers": t.cluster.bootstrap}
    gaps = asyncio.run(read_gaps(kafka, job.metadata_topic, job.shard_count, t.topic))
    results = [run_task(job, task) for task in plan(job, gaps)]
    assert [r.error for r in results if r.error] == []
    objects = [
        ObjectToCommit(object_id, size, r.task.stream_id, start, end)
        for r in results
        for object_id, size, start, end in r.objects
    ]
    objects = sorted(objects, key=lambda o: o.start_offset)[:first]
    outcome = asyncio.run(commit_objects(job.peer, objects))
    assert outcome.refused == [] and outcome.committed == len(objects)

    def seen() -> bool:
        gaps = t.state.backfill_gaps(t.stream)
        return not any(s < o.end_offset and o.start_offset < e for o in objects for s, e in gaps)

    wait_until(seen, 30, f"{len(objects)} committed objects read by this proxy")
    return len(objects)


def test_retention_trims_migrated_ranges_below_the_cutover_as_one_log(kafka_cluster, tmp_path):
    """The offload job's ranges below the cutover and the uploads' above it are one log:
    retention.bytes counts them all and drops the oldest first, migrated ones included,
    so the log start moves below the cutover; then up to the cutover."""
    topic, thread = _start(kafka_cluster, tmp_path, "ret-mig")
    with thread as proxy:
        t = TieredTopic(kafka_cluster, tmp_path, proxy, topic, before_batches=3)
        assert _migrate(t) >= 3
        migrated = t.ranges()
        assert migrated[0].start_offset == 0 and migrated[-1].end_offset == BEFORE
        kept = t.upload("g") + t.upload("h")
        ranges = t.ranges()
        assert len(ranges) == len(migrated) + 2
        # docs/offload.md step 4: Kafka's copy below the cutover is dropped, in Kafka
        admin = AdminClient({"bootstrap.servers": kafka_cluster.bootstrap})
        [future] = admin.delete_records([TopicPartition(topic, 0, BEFORE)]).values()
        assert future.result(30).low_watermark == BEFORE
        sizes = [t.block_bytes(r) for r in ranges]
        assert all(size > 0 for size in sizes)

        # what all but the oldest migrated range hold: that one goes, below the cutover
        t.retention_sees(**{"retention.bytes": sum(sizes[1:])})
        log_start = ranges[0].end_offset
        assert 0 < log_start < BEFORE
        assert t.run_retention().trimmed == {t.stream: log_start}
        assert t.tiering.partitions.get(t.stream).log_start_offset == log_start
        wait_until(lambda: t.state.stream(t.stream).log_start_offset == log_start, 30, "read")
        assert [r.object_key for r in t.ranges()] == [r.object_key for r in ranges[1:]]
        assert t.run_retention().trimmed == {}  # the rest is exactly the limit: kept
        end = kept[-1][0] + 1
        assert watermarks(proxy.bootstrap, topic) == (log_start, end)
        assert _fetch_error_at(proxy.bootstrap, topic, 0) == KafkaError._AUTO_OFFSET_RESET
        expected = [(o, v) for o, v, _ in t.before[log_start:] + kept]
        assert _read_from_earliest(proxy.bootstrap, topic, end - log_start) == expected

        # what the uploads hold: every migrated range goes, the log starts at the cutover
        t.retention_sees(**{"retention.bytes": sum(sizes[len(migrated) :])})
        assert t.run_retention().trimmed == {t.stream: BEFORE}
        wait_until(lambda: t.state.stream(t.stream).log_start_offset == BEFORE, 30, "cutover")
        assert [r.object_key for r in t.ranges()] == [r.object_key for r in ranges[-2:]]
        assert watermarks(proxy.bootstrap, topic) == (BEFORE, end)
        expected = [(o, v) for o, v, _ in kept]
        assert _read_from_earliest(proxy.bootstrap, topic, len(kept)) == expected
