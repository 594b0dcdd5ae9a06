"""The migration job end to end: real Kafka, MinIO, Spark and `tierproxy run` proxies.

A 2-partition topic is written through Kafka by five idempotent producers (gzip, snappy,
lz4, zstd, none) and a transactional one (a committed and an aborted transaction), with
keys, headers and mixed values; it is tiered, and a few more records go through the proxy
past the cutover. Then `tierproxy migrate` (in-process, on the session's Spark):

1. from a copy of the log directories in which one byte of partition 1's segment is
   flipped: that partition's range fails and the output names the file and the batch's
   byte; partition 0 is migrated and committed; partition 1 still has its gap;
2. from the brokers' own log directories: only partition 1's range is moved;
3. once more: nothing to move, no object written;
4. `tierproxy verify`: every batch below the cutover, Kafka's against the objects': OK.

Every committed object holds Kafka's batches byte for byte. Then Kafka's copy is deleted
(DeleteRecords up to the cutover) and a consumer reads the whole topic through the proxy
from offset 0: every record as produced, in order, across the cutover, and with
read_committed every record but the aborted transaction's; EARLIEST is 0.
"""

from __future__ import annotations

import argparse
import shutil
import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from offloaddata import CODECS, Produced, Topic, create_topic, position, produce

from offload_jobs import migrate_cli
from offload_jobs.report_cli import add_parsers
from offload_jobs.segments import SegmentReader
from proxy import __version__
from proxy.metadata.streams import OFFLOAD_ID_BIT, offload_object_id, shard_of, stream_id
from proxy.objects.format import find_entries, read_block, read_object
from proxy.objects.keys import parse_object_key
from proxy.peer.clients import PeerClients
from proxy.records.batches import iter_batches
from tests.integration.tiering.tieredfleet import TieredFleet
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.kafka, pytest.mark.minio, pytest.mark.spark]

PER_CODEC = 200
AFTER = 40  # records through the proxy, past the cutover


def _config(fleet: TieredFleet) -> str:
    return str(fleet.base_dir / f"{fleet['zone-a'].name}.yaml")


def _report_command(argv: list[str]) -> argparse.Namespace:
    """`tierproxy verify|export ...` parsed as the CLI parses it."""
    parser = argparse.ArgumentParser(prog="tierproxy")
    add_parsers(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(argv)


def _migrate(fleet: TieredFleet, spark, topic: str, dirs: list[Path], capsys) -> tuple[int, str]:
    """`tierproxy migrate` in this process, on the session's Spark: (exit code, output).
    No `dirs`: --from-cluster."""
    proxy = fleet["zone-a"]
    parser = argparse.ArgumentParser()
    migrate_cli.add_arguments(parser)
    argv = [topic, "--config", str(fleet.base_dir / f"{proxy.name}.yaml")]
    argv += ["--peer", f"127.0.0.1:{proxy.peer_port}"]
    for directory in dirs:
        argv += ["--from-segments", str(directory)]
    if not dirs:
        argv.append("--from-cluster")
    code = migrate_cli.run(parser.parse_args(argv), spark=spark)
    out = capsys.readouterr()
    return code, out.out + out.err


def _produce_through_proxy(bootstrap: str, topic: Topic) -> None:
    acked: list[Produced] = []
    producer = Producer(
        {"bootstrap.servers": bootstrap, "enable.idempotence": True, "compression.type": "zstd"}
    )

    def delivered(err, msg) -> None:
        assert err is None, err
        acked.append(Produced(msg.partition(), msg.offset(), msg.timestamp()[1], msg.key(),
                              msg.value(), (("after", b"1"),), "zstd", True))  # fmt: skip

    for n in range(AFTER):
        producer.produce(topic.name, f"after:{n}".encode(), f"k{n}".encode(),
                         partition=n % topic.partitions, headers=[("after", b"1")],
                         on_delivery=delivered)  # fmt: skip
    assert producer.flush(60) == 0
    topic.records += acked


def _read_all(bootstrap: str, topic: Topic, want: int, isolation: str) -> list[Produced]:
    """Every record through the proxy from offset 0 of each partition: with
    read_uncommitted the aborted ones too, with read_committed those a consumer of Kafka
    would see (the proxy names the aborted transactions of the batches it answers)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"m-{uuid.uuid4().hex}",
                         "enable.auto.commit": False, "auto.offset.reset": "error",
                         "isolation.level": isolation})  # fmt: skip
    got: list[Produced] = []
    try:
        consumer.assign([TopicPartition(topic.name, p, 0) for p in range(topic.partitions)])

        def poll() -> int:
            for msg in consumer.consume(500, 0.5):
                assert msg.error() is None, msg.error()
                headers = tuple(
                    (k, None if v is None else bytes(v)) for k, v in msg.headers() or ()
                )
                got.append(Produced(msg.partition(), msg.offset(), msg.timestamp()[1], msg.key(),
                                    msg.value(), headers, "", True))  # fmt: skip
            return len(got)

        wait_for(poll, lambda n: n >= want, f"{want} records through the proxy", 120)
        low, _ = consumer.get_watermark_offsets(TopicPartition(topic.name, 0), timeout=30)
        assert low == 0  # EARLIEST: the tiered log start, Kafka's copy being gone
    finally:
        consumer.close()
    return sorted(got, key=position)


def _same(records: list[Produced]) -> list[tuple]:
    return [(r.partition, r.offset, r.timestamp_ms, r.key, r.value, r.headers) for r in records]


def _objects_hold_kafkas_batches(fleet: TieredFleet, topic_id, partition: int, log_dir: Path):
    """The committed objects of a partition hold, batch for batch, the bytes of its
    segments (codecs, producer ids, sequences, markers and timestamps included)."""
    stream = stream_id(topic_id, partition)
    state = fleet.states()[shard_of(stream, fleet.shard_count)]
    cutover = state.cutover(stream)
    stored: list[bytes] = []

    async def read() -> None:
        store = await fleet._open_store()
        for r in state.committed_ranges(stream):
            if r.start_offset >= cutover:
                break
            data = await store.get(r.object_key)
            _, index = read_object(data, r.object_key)
            for entry in find_entries(index, stream, r.start_offset):
                if entry.start_offset >= r.end_offset:
                    break
                stored.extend(
                    bytes(b) for _, b in iter_batches(read_block(data, entry, r.object_key))
                )

    fleet._loop.run(read())
    kafka = [bytes(b.data) for b in SegmentReader(log_dir).read(0, cutover)]
    assert len(kafka) > 3
    assert stored == kafka


def test_migrate_from_segments_then_drop_kafkas_copy(fleet, kafka_cluster, spark, tmp_path, capsys):
    bootstrap = kafka_cluster.bootstrap
    topic = Topic(f"migrate-{uuid.uuid4().hex[:8]}", 2)
    # a segment per producer (rolled by time: segment.bytes is 1 MiB at least), so a
    # partition's gap is read as several ranges, one per segment
    config = {"min.insync.replicas": "2", "segment.ms": "500"}
    create_topic(bootstrap, topic.name, topic.partitions, config)
    for codec in CODECS:
        produce(bootstrap, topic, codec, PER_CODEC)
        time.sleep(0.6)
    produce(bootstrap, topic, "lz4", 100, transactional=True)
    topic_id, cutovers = _tier(fleet, topic)
    _produce_through_proxy(fleet.bootstrap(), topic)
    log_dirs = [Path(node.data_dir) / "logs" for node in kafka_cluster.nodes]

    # 1. a copy with one flipped byte in partition 1's first segment: that segment's range
    # fails, every other range moves
    copy = tmp_path / "copy"
    for p in range(topic.partitions):
        shutil.copytree(log_dirs[0] / f"{topic.name}-{p}", copy / f"{topic.name}-{p}")
    segment, second, *_ = sorted((copy / f"{topic.name}-1").glob("*.log"))
    second_base = int(second.stem)
    batches = list(SegmentReader(segment.parent).read(0, second_base))
    corrupt_at = sum(len(b.data) for b in batches[:-1])  # the segment's last batch
    assert len(batches[-1].data) > 70
    data = bytearray(segment.read_bytes())
    data[corrupt_at + 70] ^= 0x40  # inside its records
    segment.write_bytes(data)
    code, out = _migrate(fleet, spark, topic.name, [copy], capsys)
    assert code == 1, out
    assert f"{segment}: byte {corrupt_at}: CRC-32C mismatch" in out
    assert f"{topic.name}-1 [0, {second_base})" in out
    states = fleet.states()
    gaps = {p: states[shard_of(s, 2)].backfill_gaps(s) for p, s in
            ((p, stream_id(topic_id, p)) for p in range(topic.partitions))}  # fmt: skip
    assert gaps == {0: [], 1: [(0, second_base)]}

    # 2. the brokers' own segments: only what is left moves
    before = _offload_keys(fleet)
    code, out = _migrate(fleet, spark, topic.name, log_dirs, capsys)
    assert code == 0, out
    assert "2 tiered partitions, 1 ranges to move" in out
    assert len(_offload_keys(fleet) - before) == 1
    assert "1 committed, 0 committed already" in out
    for p in range(topic.partitions):
        _objects_hold_kafkas_batches(fleet, topic_id, p, log_dirs[0] / f"{topic.name}-{p}")

    # 3. again: nothing to move, nothing written
    before = _offload_keys(fleet)
    code, out = _migrate(fleet, spark, topic.name, log_dirs, capsys)
    assert code == 0 and "0 ranges to move" in out and " 0 objects" in out, out
    assert _offload_keys(fleet) == before

    # 4. verify, before Kafka's copy goes: every batch below the cutover, Kafka vs objects
    report = tmp_path / "verify.json"
    args = _report_command(
        ["verify", topic.name, "--config", _config(fleet), "--json", str(report)]
    )
    code = args.func(args, spark)
    out = capsys.readouterr().out
    assert code == 0, out
    assert f"verification of {topic.name}: OK" in out
    assert '"ok": true' in report.read_text()

    _drop_kafkas_copy_and_read_all(fleet, bootstrap, topic, cutovers)


def _tier(fleet: TieredFleet, topic: Topic):
    """Tier the topic; (its id, {partition: cutover offset}) once every partition is."""
    fleet.tier(topic.name)
    topic_id = next(
        state.topic(t).topic_id
        for state in fleet.states()
        for t in state.topic_ids()
        if state.topic(t).topic == topic.name
    )
    return topic_id, fleet.wait_for_cutover(topic_id, topic.partitions)


def _drop_kafkas_copy_and_read_all(fleet, bootstrap: str, topic: Topic, cutovers) -> None:
    """DeleteRecords up to each cutover, then the whole topic through the proxy from 0."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    deleted = admin.delete_records(
        [TopicPartition(topic.name, p, cutovers[p]) for p in range(topic.partitions)]
    )
    for tp, future in deleted.items():
        assert future.result(30).low_watermark == cutovers[tp.partition]
    expected = sorted(topic.records, key=position)
    assert [r.offset for r in expected if r.partition == 0][0] == 0
    got = _read_all(fleet.bootstrap(), topic, len(expected), "read_uncommitted")
    assert _same(got) == _same(expected)
    visible = topic.visible()
    assert len(visible) < len(expected)  # an aborted transaction is in the migrated range
    got = _read_all(fleet.bootstrap(), topic, len(visible), "read_committed")
    assert _same(got) == _same(visible)


def _backfill(fleet: TieredFleet, object_id: int, size: int, stream: int, start: int, end: int):
    """(error code, message) of a backfill commit sent to the proxy's peer listener."""

    async def ask():
        clients = PeerClients()
        try:
            address = ("127.0.0.1", fleet["zone-a"].peer_port)
            return await clients.backfill(address, object_id, size, stream, start, end)
        finally:
            await clients.close()

    return fleet._loop.run(ask())


def test_migrate_from_the_cluster_and_what_the_owner_refuses(fleet, kafka_cluster, spark, capsys):
    bootstrap = kafka_cluster.bootstrap
    missing = f"not-tiered-{uuid.uuid4().hex[:8]}"
    code, out = _migrate(fleet, spark, missing, [], capsys)
    assert code == 1 and f"topic {missing} does not exist in Kafka" in out, out

    topic = Topic(f"migrate-c-{uuid.uuid4().hex[:8]}", 1)
    create_topic(bootstrap, topic.name, topic.partitions, {"min.insync.replicas": "2"})
    produce(bootstrap, topic, "snappy", 150)
    produce(bootstrap, topic, "zstd", 60, transactional=True)
    topic_id, cutovers = _tier(fleet, topic)
    _produce_through_proxy(fleet.bootstrap(), topic)
    code, out = _migrate(fleet, spark, topic.name, [], capsys)
    assert code == 0, out
    proxy = fleet["zone-a"]
    hello = f"peer 127.0.0.1:{proxy.peer_port}: proxy {proxy.name} (tierproxy {__version__})"
    assert out.startswith(hello + "\n"), out  # the preflight's ping, answered
    assert "1 tiered partitions, 1 ranges to move" in out and "(1 committed" in out, out
    log_dir = Path(kafka_cluster.nodes[0].data_dir) / "logs" / f"{topic.name}-0"
    _objects_hold_kafkas_batches(fleet, topic_id, 0, log_dir)

    # the owner checks every backfill commit: the one committed, sent again, is a no-op
    stream = stream_id(topic_id, 0)
    [migrated] = fleet.states()[shard_of(stream, 2)].committed_ranges(stream)[:1]
    assert (migrated.start_offset, migrated.end_offset) == (0, cutovers[0])
    again = (migrated.object_id, migrated.object_size, stream, 0, cutovers[0])
    assert _backfill(fleet, *again) == (0, f"stream {stream} [0, {cutovers[0]}) in object "
                                        f"{migrated.object_id}: committed already")  # fmt: skip
    code, message = _backfill(fleet, migrated.object_id, 100, stream, 0, 5)
    assert code == 42 and "not the offload object id of that range" in message
    code, message = _backfill(fleet, offload_object_id(stream, 0, 5), 100, stream, 0, 5)
    assert code == 44 and "overlap" in message, message
    past = (offload_object_id(stream, 1, cutovers[0] + 1), 100, stream, 1, cutovers[0] + 1)
    code, message = _backfill(fleet, *past)
    assert code == 44 and f"ends past the cutover {cutovers[0]}" in message
    other = stream_id(uuid.uuid4(), 0)
    code, message = _backfill(fleet, offload_object_id(other, 0, 5), 100, other, 0, 5)
    assert code == 3 and "the stream is not tiered" in message

    _drop_kafkas_copy_and_read_all(fleet, bootstrap, topic, cutovers)


def _offload_keys(fleet: TieredFleet) -> set[str]:
    """Keys of offload objects (top bit of the id set) in the shared bucket."""

    async def keys() -> set[str]:
        store = await fleet._open_store()
        found = set()
        async for info in store.list(""):
            if "/stream/" in info.key:
                object_id, _ = parse_object_key(info.key)
                if object_id & OFFLOAD_ID_BIT:
                    found.add(info.key)
        return found

    return fleet._loop.run(keys())
