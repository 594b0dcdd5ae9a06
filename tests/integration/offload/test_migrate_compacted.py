"""A compacted topic migrated from Kafka with its cleaner's holes, then cleaned in S3 by
the proxy's log cleaner (issue 20; docs/offload.md, docs/tiering.md "Compacted topics"),
against Kafka's cleaner on a twin topic: the oracle.

Two compacted one-partition topics (segment.ms=100, min.cleanable.dirty.ratio=0.01,
delete.retention.ms an hour, so tombstones stay on both) get the same records in the
same order, so equal offsets: three keyed rounds through Kafka (23 keys, tombstones,
headers, three codecs), segments rolled between them. Kafka's cleaner leaves holes in
both; once the one to be tiered has holes in the leader's segments and they no longer
change, it is tiered (one `tierproxy run` proxy, its cleaner every 2 s), and a few
updates of five keys and a tombstone go to the tiered topic through the proxy and to the
twin through Kafka. The proxy cleans the tiered part first (its checkpoint then ends past
the cutover); then `tierproxy migrate --from-segments` copies the leader's segments (with an
external Kafka, whose files are not here: `--from-cluster`, the same log by Fetch), holes
and the never-cleaned active segment included, and the proxy must clean them too: a
backfill below its checkpoint makes the log dirty again. A last record after segment.ms
rolls Kafka's active segment on the twin.

Checked: below that record, every surviving record read through the proxy (offset, key,
value, headers) equals the twin's read from Kafka, each key once, and its timestamp is
the tiered topic's own acknowledged one; the latest value per key is the workload's.
Then `tierproxy verify` finds Kafka's copy below the cutover (cleaned by Kafka) and the
objects (cleaned by the proxy) the same, record by record.
"""

from __future__ import annotations

import argparse
import time
import uuid

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
from offloaddata import Produced, Topic, create_topic, leader_log_dir, produce
from test_migrate_segments import _migrate, _tier

from offload_jobs import report_cli
from offload_jobs.cluster_reader import read_batches
from proxy.metadata.streams import shard_of, stream_id
from tests.integration.tiering.tieredfleet import TieredFleet
from tests.support.clients import watermarks
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.kafka, pytest.mark.minio, pytest.mark.spark]

SEGMENT_MS = 100
CONFIG = {
    "cleanup.policy": "compact",
    "segment.ms": str(SEGMENT_MS),
    "min.cleanable.dirty.ratio": "0.01",
    "min.compaction.lag.ms": "0",
    "delete.retention.ms": "3600000",
}
Rec = tuple[int, bytes | None, bytes | None, tuple, int]  # offset, key, value, headers, ts


@pytest.fixture(scope="module")
def fleet(kafka_cluster, s3_server, tmp_path_factory):
    """One `tierproxy run` proxy (zone-a), its log cleaner every 2 s."""
    base = tmp_path_factory.mktemp("fleet")
    with TieredFleet(
        kafka_cluster.bootstrap,
        s3_server,
        base,
        zones=("zone-a",),
        shard_count=2,
        tiering={"log_cleaner_interval_s": 2},
    ) as fleet:
        yield fleet


def _send(bootstrap: str, topic: Topic, records: list[tuple[bytes, bytes | None]]) -> None:
    """Keyed records, idempotent, each acknowledged one kept in `topic.records`."""
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    errors: list[str] = []

    def delivered(err, msg) -> None:
        if err is not None:
            errors.append(str(err))
        else:
            topic.records.append(Produced(0, msg.offset(), msg.timestamp()[1], msg.key(),
                                          msg.value(), (), "none", True))  # fmt: skip

    for key, value in records:
        producer.produce(topic.name, value, key, partition=0, on_delivery=delivered)
    assert producer.flush(60) == 0 and not errors, errors[:3]


def _read(bootstrap: str, topic: str, last: int) -> list[Rec]:
    """Every record up to offset `last`, read_uncommitted from offset 0."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"c-{uuid.uuid4().hex}",
                         "enable.auto.commit": False})  # fmt: skip
    consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
    got: list[Rec] = []
    deadline = time.monotonic() + 60
    try:
        while (not got or got[-1][0] < last) and time.monotonic() < deadline:
            for msg in consumer.consume(500, 0.5):
                assert msg.error() is None, msg.error()
                headers = tuple((k, None if v is None else bytes(v)) for k, v in
                                msg.headers() or ())  # fmt: skip
                got.append((msg.offset(), msg.key(), msg.value(), headers, msg.timestamp()[1]))
    finally:
        consumer.close()
    assert got and got[-1][0] == last, f"read up to {got[-1][0] if got else None}, not {last}"
    return got


def _cleaned(records: list[Rec], last: int) -> bool:
    """Each key once below `last` (the record rolling the active segment)."""
    below = [r for r in records if r[0] < last]
    return len({r[1] for r in below}) == len(below)


def _kafka_holes_settled(bootstrap: str, name: str) -> bool:
    """The leader's log has holes the cleaner left, and does not change meanwhile."""
    before = [b.data for b in read_batches(bootstrap, name, 0, 0, allow_gaps=True)]
    batches = list(read_batches(bootstrap, name, 0, 0, allow_gaps=True))
    ends = [0] + [b.last_offset + 1 for b in batches]
    holes = any(end < b.base_offset for end, b in zip(ends, batches, strict=False))
    return holes and [b.data for b in batches] == before


def test_a_migrated_compacted_topic_is_cleaned_as_kafka_cleans_it(
    fleet, kafka_cluster, spark, capsys
):
    bootstrap = kafka_cluster.bootstrap
    suffix = uuid.uuid4().hex[:8]
    tiered, twin = Topic(f"mig-compacted-{suffix}", 1), Topic(f"mig-compacted-kafka-{suffix}", 1)
    for topic in (tiered, twin):
        create_topic(bootstrap, topic.name, 1, CONFIG)
    for codec in ("zstd", "none", "lz4"):
        for topic in (tiered, twin):
            produce(bootstrap, topic, codec, 300, keyed=True)
        time.sleep(SEGMENT_MS / 1000 + 0.2)  # the next round opens a segment: Kafka's rule
    assert watermarks(bootstrap, tiered.name) == watermarks(bootstrap, twin.name)
    wait_for(
        lambda: _kafka_holes_settled(bootstrap, tiered.name),
        bool,
        "Kafka's cleaner left holes in the segments",
        90,
        interval=2,
    )

    topic_id, cutovers = _tier(fleet, tiered)
    proxy = fleet["zone-a"]
    assert cutovers[0] == watermarks(bootstrap, twin.name)[1]
    after = [(f"key-{n % 5}".encode(), f"after-{n}".encode()) for n in range(20)]
    after.append((b"key-5", None))
    cleans = proxy.metric("tierproxy_log_cleaner_cleans_total")
    _send(fleet.bootstrap(), tiered, after)
    _send(bootstrap, twin, after)
    # the proxy cleans the tiered part: its checkpoint is then past the cutover
    wait_for(
        lambda: proxy.metric("tierproxy_log_cleaner_cleans_total"),
        lambda n: n > cleans,
        "the proxy's cleaner cleaned the tiered part",
        60,
    )

    # the leader's segments, whose cleaner was watched (a follower cleans on its own);
    # with an external Kafka (no files here) the same log read with Fetch
    dirs = []
    if hasattr(kafka_cluster, "nodes"):
        dirs = [leader_log_dir(kafka_cluster, tiered.name, 0).parent]
    code, out = _migrate(fleet, spark, tiered.name, dirs, capsys)
    assert code == 0, out
    stream = stream_id(topic_id, 0)
    assert fleet.states()[shard_of(stream, fleet.shard_count)].backfill_gaps(stream) == []

    time.sleep(SEGMENT_MS / 1000 + 0.2)  # the twin's active segment rolls on the next append
    for bootstrap_of, topic in ((fleet.bootstrap(), tiered), (bootstrap, twin)):
        _send(bootstrap_of, topic, [(b"roll", b"roll")])
    last = watermarks(bootstrap, twin.name)[1] - 1
    assert watermarks(fleet.bootstrap(), tiered.name)[1] - 1 == last
    plain = wait_for(
        lambda: _read(bootstrap, twin.name, last),
        lambda got: _cleaned(got, last),
        "Kafka's cleaner cleaned the twin",
        120,
        interval=2,
    )
    cleaned = wait_for(
        lambda: _read(fleet.bootstrap(), tiered.name, last),
        lambda got: _cleaned(got, last),
        "the proxy's cleaner cleaned the migrated ranges",
        120,
        interval=2,
    )
    assert [r[:4] for r in cleaned[:-1]] == [r[:4] for r in plain[:-1]]
    stamps = {r.offset: r.timestamp_ms for r in tiered.records}
    assert all(r[4] == stamps[r[0]] for r in cleaned)
    latest = {r.key: r.value for r in sorted(tiered.records, key=lambda r: r.offset)}
    assert {r[1]: r[2] for r in cleaned} == latest
    assert any(r[2] is None for r in cleaned)  # tombstones kept (delete.retention.ms)
    assert len(cleaned) < cutovers[0] // 10  # what the holes and the clean left

    # each copy cleaned by its own cleaner: verify compares them record by record
    code, out = _verify(fleet, spark, tiered.name, capsys)
    assert code == 0, out
    assert "compacted: comparing each key's latest record" in out
    assert f"verified {tiered.name}: " in out and out.rstrip().endswith(": OK")


def _verify(fleet: TieredFleet, spark, topic: str, capsys) -> tuple[int, str]:
    """`tierproxy verify` in this process, on the session's Spark: (exit code, output)."""
    parser = argparse.ArgumentParser()
    report_cli.add_parsers(parser.add_subparsers())
    config = fleet.base_dir / f"{fleet['zone-a'].name}.yaml"
    args = parser.parse_args(["verify", topic, "--config", str(config)])
    code = args.func(args, spark=spark)
    out = capsys.readouterr()
    return code, out.out + out.err
