"""Batches taken by reference (partition/referenced.py) on a real WAL and a real store (a
LocalDirectoryStore; the S3-WAL objects PUT by the real writer): the owner's answer once
the small reference entry is durable, the bytes fetched after into the fetched log and
the log cache, the sender's object released only then, a restart between the two, and
a trim that forgets both.
"""

from __future__ import annotations

import asyncio
import logging
import time
from types import SimpleNamespace
from uuid import UUID

import pytest

from proxy.handoff.objects import encode_location, writer_id_for
from proxy.handoff.reader import S3WalReader
from proxy.handoff.writer import S3WalWriter
from proxy.metadata.codec import encode
from proxy.metadata.records import ShardClaim, StreamCutover
from proxy.metadata.state import MetadataState
from proxy.metadata.streams import stream_id
from proxy.metrics import ProxyMetrics
from proxy.objects.local import LocalDirectoryStore
from proxy.objects.store import ObjectStore
from proxy.partition import referenced
from proxy.partition.owner import PartitionConfig
from proxy.partition.partition_set import PartitionSet
from proxy.partition.referenced import ReferenceError, ReferencingLog
from proxy.partition.sequence_holes import ProducerBatch, SequenceHoles
from proxy.peer.messages import AppendRequest
from proxy.reads.logcache import LogCache
from proxy.records.batches import HEADER_SIZE, read_batch_header
from proxy.tiered.beyond_cutover import BeyondCutover
from proxy.tiered.metrics import TieringMetrics
from proxy.tiered.owners import AtOwner
from proxy.wal import WalConfig, WriteAheadLog
from proxy.wal.memfs import MemoryFilesystem
from tests.support.batches import build_batch
from tests.support.waiting import eventually

TOPIC = UUID("0b4c2a5e-1f3d-4e6a-9b8c-7d6e5f4a3b2c")
S0 = stream_id(TOPIC, 0)
CUTOVER = 500
NOW_MS = 1_700_000_000_000


def batch(pid: int, seq: int, records: int = 3) -> bytes:
    values = [f"{pid}:{seq + i}:".encode() * 20 for i in range(records)]
    return build_batch(values, producer_id=pid, producer_epoch=0, base_sequence=seq)


def shard_state() -> MetadataState:
    state = MetadataState(0, 1)
    for record in (
        ShardClaim(0, 1, "proxy-a", NOW_MS),
        StreamCutover(0, S0, 1, 1, TOPIC, 0, 0, CUTOVER, CUTOVER, NOW_MS, None),
    ):
        key, value = encode(record)
        assert state.apply(key, value, state.next_offset).accepted
    return state


class GatedStore:
    """A real store whose GETs wait while `gate` is clear (the owner's fetch held back)."""

    def __init__(self, inner: ObjectStore) -> None:
        self.inner = inner
        self.gate = asyncio.Event()
        self.gate.set()
        self.gets = 0

    async def get(self, key: str, start: int | None = None, end: int | None = None) -> bytes:
        await self.gate.wait()
        self.gets += 1
        return await self.inner.get(key, start, end)

    def __getattr__(self, name: str):
        return getattr(self.inner, name)


async def open_log(tmp_path, store) -> ReferencingLog:
    wal = await WriteAheadLog.open(WalConfig(str(tmp_path / "wal")))
    fetched = await WriteAheadLog.open(WalConfig(str(tmp_path / "wal" / "fetched")))
    return await ReferencingLog.open(wal, fetched, S3WalReader(store))


async def cached_partitions(log: ReferencingLog) -> tuple[LogCache, PartitionSet]:
    """A log cache and the partition set of S0 over `log`, fed the fetched bytes."""
    cache = LogCache(1 << 20)
    partitions = PartitionSet(log, log_cache=cache)
    log.on_fetched = partitions.fetched
    await partitions.recover([S0], shard_state())
    return cache, partitions


@pytest.fixture
async def writer(tmp_path):
    store = LocalDirectoryStore(str(tmp_path / "bucket"))
    async with S3WalWriter(store, writer_id_for("proxy-b", 1.0), max_delay_s=0.01) as w:
        yield w


async def test_a_batch_taken_by_reference_is_answered_before_its_bytes_are_read(tmp_path, writer):
    """The answer (offsets, `referenced`) needs only the reference entry: with the GET
    held, it comes, the high watermark moves, and the log cache waits; once the GET ends,
    the log cache holds the batch at its offsets, the WAL reads it whole, and the
    sender's object is released only after the fetched log holds it."""
    store = GatedStore(writer.store)
    records = batch(7, 0)
    location = await writer.append(S0, records)
    log = await open_log(tmp_path, store)
    cache, partitions = await cached_partitions(log)
    partition = partitions.get(S0)
    assert partition is not None
    store.gate.clear()
    key = encode_location(location)
    assert log.expect(key)
    result = await partitions.produce(S0, records[:HEADER_SIZE], -1, reference=key)
    log.unexpect(key)
    assert result is not None and result.error_code == 0 and result.referenced
    assert result.base_offset == CUTOVER and partition.high_watermark == CUTOVER + 3
    assert partition.unfilled_from == CUTOVER and cache.end_offset(S0) is None
    assert await log.held([location], 50) == ()  # kept: its bytes only in the object
    assert log.stats.bytes_appended < 200  # the reference entry, not the batch

    store.gate.set()
    assert await log.held([location], 5000) == (0,)
    assert cache.end_offset(S0) == CUTOVER + 3 and partition.unfilled_from is None
    [cached], _ = cache.read(S0, CUTOVER, 1 << 20)
    assert bytes(cached[8:]) == records[8:] and read_batch_header(cached).base_offset == CUTOVER
    [entry] = await log.read(0)
    assert entry.reference is None and bytes(entry.batch) == bytes(cached)
    await partitions.close()
    await log.close()


async def test_a_commit_behind_a_batch_taken_by_reference_reaches_the_cache_after_it(
    tmp_path, writer
):
    """The log cache takes a stream's batches in offset order: one appended by bytes
    after one taken by reference waits for the other's bytes, then both go in order."""
    store = GatedStore(writer.store)
    first, second = batch(7, 0), batch(8, 0)
    location = await writer.append(S0, first)
    log = await open_log(tmp_path, store)
    cache, partitions = await cached_partitions(log)
    store.gate.clear()
    key = encode_location(location)
    by_reference = await partitions.produce(S0, first[:HEADER_SIZE], -1, reference=key)
    by_bytes = await partitions.produce(S0, second, -1)
    assert by_reference is not None and by_bytes is not None
    assert (by_reference.base_offset, by_bytes.base_offset) == (CUTOVER, CUTOVER + 3)
    assert not by_bytes.referenced and cache.end_offset(S0) is None
    store.gate.set()
    await eventually(lambda: cache.end_offset(S0) == CUTOVER + 6)
    pieces, _ = cache.read(S0, CUTOVER, 1 << 20)
    assert [read_batch_header(p).base_offset for p in pieces] == [CUTOVER, CUTOVER + 3]
    await partitions.close()
    await log.close()


async def test_a_restart_before_the_bytes_are_fetched_fetches_them_and_holds_the_object(
    tmp_path, writer
):
    """The owner stops after answering, its fetch not done: reopened, the WAL knows the
    reference (its sender is told to keep the object), fetches the bytes, and releases
    it; the rebuild finds the batch (a retry of it is a duplicate, answered with its
    offsets) and the WAL reads it whole."""
    store = GatedStore(writer.store)
    records = batch(7, 0)
    location = await writer.append(S0, records)
    key = encode_location(location)
    log = await open_log(tmp_path, store)
    partitions = PartitionSet(log)
    await partitions.recover([S0], shard_state())
    store.gate.clear()
    result = await partitions.produce(S0, records[:HEADER_SIZE], -1, reference=key)
    assert result is not None and result.referenced
    await partitions.close()
    await log.close()  # the fetch never ended

    log = await open_log(tmp_path, store)
    assert log.references == 1
    assert await log.held([location], 50) == ()
    store.gate.set()
    assert await log.held([location], 5000) == (0,)
    partitions = PartitionSet(log)
    await partitions.recover([S0], shard_state())
    partition = partitions.get(S0)
    assert partition is not None and partition.high_watermark == CUTOVER + 3
    retry = await partitions.produce(S0, records, -1)  # the client's retry
    assert retry is not None and retry.error_code == 0 and retry.base_offset == CUTOVER
    [entry] = await log.read(0)
    assert bytes(entry.batch[8:]) == records[8:]
    await partitions.close()
    await log.close()


async def test_a_trim_forgets_the_references_and_the_fetched_bytes_below_it(tmp_path, writer):
    log = await open_log(tmp_path, writer.store)
    partitions = PartitionSet(log)
    await partitions.recover([S0], shard_state())
    locations = [await writer.append(S0, batch(7, 3 * n)) for n in range(3)]
    for n, location in enumerate(locations):
        header = batch(7, 3 * n)[:HEADER_SIZE]
        result = await partitions.produce(S0, header, -1, reference=encode_location(location))
        assert result is not None and result.referenced
    assert await log.held(locations, 5000) == (0, 1, 2)
    entries = await log.read(0)
    await log.trim_to(entries[1].position.end)
    assert log.references == 1
    await log.trim_to(entries[2].position.end)
    assert log.references == 0
    await partitions.close()
    await log.close()


async def test_metrics_follow_the_references(tmp_path, writer):
    """/metrics shows the references not trimmed, their bytes, the fetched log's bytes,
    the disclaimed locations and the sender's held locations, from the real parts."""
    log = await open_log(tmp_path, writer.store)
    partitions = PartitionSet(log)
    await partitions.recover([S0], shard_state())
    metrics = ProxyMetrics()
    service = SimpleNamespace(
        wal=log,
        uploader=None,
        log_cache=LogCache(4096),
        config=SimpleNamespace(wal_capacity_bytes=1 << 20),
        beyond_cutover=BeyondCutover(),
        s3wal_reader=None,
        referencing=log,
        held_locations=2,
    )
    tiering = TieringMetrics(metrics.registry)
    tiering.attach(service)

    def value(name: str) -> float:
        return metrics.registry.get_sample_value(name) or 0.0

    try:
        records = [batch(7, 3 * n) for n in range(2)]
        locations = [await writer.append(S0, r) for r in records]
        for r, location in zip(records, locations, strict=True):
            key = encode_location(location)
            result = await partitions.produce(S0, r[:HEADER_SIZE], -1, reference=key)
            assert result is not None and result.referenced
        assert await log.held(locations, 5000) == (0, 1)
        assert value("tierproxy_references") == 2
        assert value("tierproxy_referenced_bytes") == sum(map(len, records))
        assert value("tierproxy_fetched_log_bytes") > sum(map(len, records))
        assert value("tierproxy_held_locations") == 2
        assert value("tierproxy_references_off") == 0
        unknown = await writer.append(S0, batch(8, 0))
        assert await log.held([unknown], 0) == (0,)
        assert value("tierproxy_references_disclaimed") == 1
        [first, _] = await log.read(0)
        await log.trim_to(first.position.end)
        assert value("tierproxy_references") == 1
        assert value("tierproxy_referenced_bytes") == len(records[1])
    finally:
        tiering.close()
        await partitions.close()
        await log.close()


async def test_a_location_told_released_while_unknown_is_never_taken_by_reference(tmp_path, writer):
    """A sender whose hand-off was lost asks about its location before the hand-off
    reaches the owner: told it is released (unknown here), it may delete the object, so
    the hand-off arriving later must not be taken by reference."""
    log = await open_log(tmp_path, writer.store)
    location = await writer.append(S0, batch(7, 0))
    assert await log.held([location], 0) == (0,)
    assert not log.expect(encode_location(location))
    await log.close()


async def test_a_held_ask_answers_every_location_released_even_behind_one_still_held(
    tmp_path, writer
):
    """An ask waits for its locations from the first on: one still held ahead does not
    hide those behind it released (the answer names them at its end), and the ask ends
    as soon as the last is released."""
    log = await open_log(tmp_path, writer.store)
    locations = [await writer.append(S0, batch(7, seq)) for seq in range(3)]
    first = encode_location(locations[0])
    assert log.expect(first)  # its hand-off being handled: held
    assert await log.held(locations, 50) == (1, 2)
    loop = asyncio.get_running_loop()
    loop.call_later(0.05, log.unexpect, first)
    started = loop.time()
    assert await log.held(locations, 5000) == (0, 1, 2)
    assert loop.time() - started < 2
    await log.close()


async def test_past_max_disclaimed_they_are_forgotten_and_no_batch_is_taken_by_reference(
    tmp_path, writer, monkeypatch, caplog
):
    """The disclaimed locations are bounded: past the bound they are forgotten, and since a
    forgotten one could come back, every batch goes by bytes (whose GET finds a deleted
    object missing) for as long as one was to be remembered."""
    monkeypatch.setattr(referenced, "MAX_DISCLAIMED", 2)
    log = await open_log(tmp_path, writer.store)
    locations = [await writer.append(S0, batch(7, seq)) for seq in range(3)]
    assert await log.held(locations[:2], 0) == (0, 1)
    assert log.has_room()
    assert [log.expect(encode_location(at)) for at in locations[:2]] == [False, False]
    with caplog.at_level(logging.WARNING, logger=referenced.__name__):
        assert await log.held(locations[2:], 0) == (0,)
    assert "no batch taken by reference" in caplog.text
    assert not log.has_room()
    # the first two are forgotten (noted as being handled, by bytes); the third still known
    assert [log.expect(encode_location(at)) for at in locations] == [True, True, False]
    assert log.references_off and log.disclaimed == 1
    monkeypatch.setattr(log, "_by_bytes_until", time.monotonic() - 1)  # the hour passed
    assert log.has_room() and not log.references_off
    await log.close()


async def test_bytes_that_are_not_the_batch_ordered_are_refused(tmp_path, writer):
    """The header the owner ordered the batch by must be the batch's: other bytes at the
    location are a ReferenceError for the reader of that entry, never served."""
    log = await open_log(tmp_path, writer.store)
    partitions = PartitionSet(log)
    await partitions.recover([S0], shard_state())
    location = await writer.append(S0, batch(7, 0))
    other = batch(9, 0)[:HEADER_SIZE]  # another producer's header
    result = await partitions.produce(S0, other, -1, reference=encode_location(location))
    assert result is not None and result.referenced
    with pytest.raises(ReferenceError, match="not the batch ordered"):
        await log.read(0)
    await partitions.close()
    await log.close()


class Owner:
    """The tiered service as AtOwner sees it, over a real PartitionSet and ReferencingLog."""

    def __init__(self, partitions: PartitionSet, log: ReferencingLog, reader: S3WalReader):
        self.name = "proxy-a"
        self.holes = SequenceHoles()
        self.partitions = partitions
        self.s3wal_reader = reader
        self.stages = SimpleNamespace(since=lambda *_: None)
        self.referencing = log
        self.takes_references = True

    def state(self, stream: int):
        return SimpleNamespace(stream=lambda s: SimpleNamespace(topic_id=TOPIC))

    async def produce_rules(self, topic):
        return SimpleNamespace(log_append_time=False)

    async def partition_here(self, stream: int):
        return self.partitions.get(stream)

    def not_served(self, stream: int) -> None:
        return None

    def verifier_for(self, stream, transactional_id, produce_version) -> None:
        return None


async def test_a_hand_off_whose_handler_is_cancelled_stays_held_until_its_partition_answers(
    writer,
):
    """The owner's handler of a hand-off is cancelled (its sender gave up: the connection
    dropped) while the batch waits in the partition's queue, which still writes it. A
    sender asking about the location meanwhile is told to keep it, and after the
    partition answered, to keep it until the bytes are fetched: never released while the
    reference entry could come to need the object."""
    fs = MemoryFilesystem()
    wal = await WriteAheadLog.open(WalConfig("/wal"), fs=fs)
    fetched = await WriteAheadLog.open(WalConfig("/wal/fetched"), fs=fs)
    store = GatedStore(writer.store)
    reader = S3WalReader(store)
    log = await ReferencingLog.open(wal, fetched, reader)
    partitions = PartitionSet(log, config=PartitionConfig(max_in_flight=1))
    log.on_fetched = partitions.fetched
    await partitions.recover([S0], shard_state())
    records = batch(7, 0)
    location = await writer.append(S0, records)
    request = AppendRequest(
        1, S0, -1, 30_000, location=location, batch=ProducerBatch(7, 0, 0, 2),
        header=records[:HEADER_SIZE],
    )  # fmt: skip
    at_owner = AtOwner(Owner(partitions, log, reader))  # type: ignore[arg-type]
    store.gate.clear()
    fs.hold_fsyncs()
    try:
        ahead = asyncio.create_task(partitions.produce(S0, batch(8, 0), -1))  # in flight
        await eventually(lambda: partitions.get(S0).log_end_offset == CUTOVER + 3)
        handler = asyncio.create_task(at_owner.append(request))  # queued behind it
        await asyncio.sleep(0.05)
        assert partitions.get(S0).log_end_offset == CUTOVER + 3  # not sequenced yet
        handler.cancel()  # the sender's connection dropped: its call is lost
        await asyncio.gather(handler, return_exceptions=True)
        assert await log.held([location], 50) == ()  # still to be written here
    except BaseException:
        store.gate.set()
        raise
    finally:
        fs.release_fsyncs()
    await ahead
    await eventually(lambda: partitions.get(S0).high_watermark == CUTOVER + 6)
    assert await log.held([location], 50) == ()  # referenced: bytes not fetched yet
    store.gate.set()
    assert await log.held([location], 5000) == (0,)
    await partitions.close()
    await log.close()
