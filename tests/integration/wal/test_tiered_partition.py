"""The owner of a tiered partition on a real WAL (files in tmp_path, or the fault-injecting
twin): real Kafka v2 batches from kafka-python's producer code, sequenced, made durable
with group commit, answered after the fsync; retries answered with their original
offsets; a failed fsync fences the partition and loses nothing acknowledged; idempotence
survives a restart through the WAL replay, the producer snapshot and the objects.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import AsyncIterator
from types import SimpleNamespace
from uuid import UUID

import pytest
from kio.schema.errors import ErrorCode

from proxy.metadata.codec import encode
from proxy.metadata.records import ObjectCommit, ProducerSnapshot, ShardClaim, StreamCutover
from proxy.metadata.state import MetadataState
from proxy.metadata.streams import stream_id
from proxy.objects.format import read_block, read_object
from proxy.objects.local import LocalDirectoryStore
from proxy.partition.owner import PartitionConfig, ProduceResult, RecoveryError, TieredPartition
from proxy.partition.partition_set import PartitionSet
from proxy.partition.rules import SEED_FOR_MS, CommittedBlock
from proxy.partition.sequence_holes import ProducerBatch, SequenceHoles
from proxy.reads.logcache import LogCache
from proxy.records.batches import iter_batches, read_batch_header, with_base_offset
from proxy.records.markers import Marker, marker_batch
from proxy.tiered.reads import TieredReads
from proxy.upload.uploader import ObjectIdAllocator, Uploader, UploaderConfig
from proxy.wal import WalBrokenError, WalConfig, WriteAheadLog
from proxy.wal.entry import entry_size
from proxy.wal.memfs import MemoryFilesystem
from proxy.wal.segments import segment_name
from tests.support.batches import build_batch
from tests.support.waiting import eventually

TOPIC = UUID("5b1e0c7a-2d4f-4a9b-8e3c-6f7a8b9c0d1e")
STREAMS = [stream_id(TOPIC, p) for p in range(2)]
S0 = STREAMS[0]
CUTOVER = 1000  # the upstream log end at the cutover: the proxy's offsets start here
NOW_MS = 1_700_000_000_000
RECORDS = 3  # per batch


def batch(pid: int, seq: int, *, epoch: int = 0, transactional: bool = False) -> bytes:
    """An idempotent producer's batch as kafka-python writes it (base offset 0)."""
    values = [f"{pid}:{seq + i}:".encode() * 8 for i in range(RECORDS)]
    return build_batch(
        values, keys=[b"k"] * RECORDS, producer_id=pid, producer_epoch=epoch,
        base_sequence=seq, transactional=transactional,
    )  # fmt: skip


def nth(pid: int, n: int) -> bytes:
    return batch(pid, n * RECORDS)


class Shard:
    """One metadata shard in memory: both streams tiered at CUTOVER; commits as an owner
    writes them (the commit callback of the uploader)."""

    def __init__(self, open_at: int | None = None) -> None:
        """`open_at`: a transaction was open at the cutover of S0 from that offset."""
        self.state = MetadataState(0, 1)
        self.write(ShardClaim(0, 1, "proxy-a", NOW_MS))
        for p, s in enumerate(STREAMS):
            stable = open_at if s == S0 else None
            self.write(StreamCutover(0, s, 1, 1, TOPIC, p, 0, CUTOVER, CUTOVER, NOW_MS, stable))

    def write(self, record: object) -> None:
        key, value = encode(record)
        verdict = self.state.apply(key, value, self.state.next_offset)
        assert verdict.accepted, verdict.reason

    async def commit(self, objects) -> None:
        for o in objects:
            self.write(ObjectCommit(0, o.object_id, o.kind, o.size, 1, NOW_MS, o.ranges))


def config_for(directory) -> WalConfig:
    return WalConfig(str(directory), segment_bytes=64 * 1024)


def ok(result: ProduceResult | None, base_offset: int) -> None:
    assert result is not None and result.error_code == 0, result
    assert result.base_offset == base_offset, result
    assert (result.log_append_time_ms, result.log_start_offset) == (-1, 0)


async def wal_batches(wal: WriteAheadLog) -> dict[tuple[int, int], tuple[bytes, int]]:
    """(stream, base offset) -> (batch bytes, WAL end of its entry), from a replay."""
    return {
        (e.stream_id, e.base_offset): (bytes(e.batch), e.position.end) async for e in wal.replay()
    }


@contextlib.asynccontextmanager
async def held_fsyncs(fs: MemoryFilesystem) -> AsyncIterator[None]:
    fs.hold_fsyncs()
    try:
        yield
    finally:
        fs.release_fsyncs()


async def test_ten_producers_get_contiguous_offsets_answered_after_a_group_fsync(tmp_path):
    shard = Shard()
    async with await WriteAheadLog.open(config_for(tmp_path / "wal")) as wal:
        partitions = PartitionSet(wal)
        await partitions.recover(STREAMS, shard.state)
        answers: dict[tuple[int, int], tuple[int, ProduceResult | None, int]] = {}

        async def send(stream: int, pid: int, n: int) -> None:
            result = await partitions.produce(stream, memoryview(nth(pid, n)), acks=-1)
            answers[pid, n] = (stream, result, wal.durable_end)  # what the producer saw

        async def producer(i: int) -> None:  # up to 5 requests in flight, as Kafka's
            window: deque[asyncio.Task[None]] = deque()
            for n in range(200):
                if len(window) == 5:
                    await window.popleft()
                window.append(asyncio.create_task(send(STREAMS[i % 2], 100 + i, n)))
            await asyncio.gather(*window)

        await asyncio.gather(*(producer(i) for i in range(10)))
        written = await wal_batches(wal)
        stats = wal.stats
        for s in STREAMS:
            partition = partitions.get(s)
            assert partition.high_watermark == partition.log_end_offset == CUTOVER + 3000
        await partitions.close()

    assert len(answers) == 2000
    for s in STREAMS:
        bases = sorted(r.base_offset for stream, r, _ in answers.values() if stream == s)
        assert bases == list(range(CUTOVER, CUTOVER + 3000, RECORDS))  # contiguous, no dup
    for (pid, n), (stream, result, durable_end) in answers.items():
        assert result.error_code == 0 and result.log_start_offset == 0
        data, entry_end = written[stream, result.base_offset]
        assert durable_end >= entry_end  # answered only once its entry was durable
        assert data[8:] == nth(pid, n)[8:]  # the producer's bytes, offsets assigned
        if n:
            assert result.base_offset > answers[pid, n - 1][1].base_offset
    assert stats.appends == 2000 and len(written) == 2000
    assert stats.fsyncs * 4 <= stats.appends, stats  # group commit


async def test_retries_get_their_original_offsets_and_write_nothing(tmp_path):
    async with await WriteAheadLog.open(config_for(tmp_path / "wal")) as wal:
        async with await TieredPartition.recover(S0, wal, Shard().state) as partition:
            # a retry sent while its original is in flight waits for the original's fsync
            first, retry = await asyncio.gather(
                partition.produce(nth(7, 0), -1), partition.produce(nth(7, 0), -1)
            )
            ok(first, CUTOVER)
            ok(retry, CUTOVER)
            assert wal.stats.appends == 1
            for n in range(1, 6):
                ok(await partition.produce(nth(7, n), -1), CUTOVER + RECORDS * n)
            appends, end = wal.stats.appends, partition.log_end_offset
            for n in range(1, 6):  # any of the last 5 batches
                ok(await partition.produce(nth(7, n), -1), CUTOVER + RECORDS * n)
            assert await partition.produce(nth(7, 1), acks=0) is None
            assert (wal.stats.appends, partition.log_end_offset) == (appends, end)
            # older than the last 5: not recognised, so out of order
            result = await partition.produce(nth(7, 0), -1)
            assert result.error_code == ErrorCode.out_of_order_sequence_number


async def test_a_rebuild_soon_after_the_cutover_takes_the_producers_of_kafkas_log(tmp_path, caplog):
    """Producer 7's first two batches are in Kafka's log just below the cutover (what
    `read_upstream` reads: the tail). The stream rebuilt right after the cutover answers
    a retry of the second with Kafka's offsets and writes nothing, refuses a gap with 45
    and takes the next batch, as Kafka would. Before, it knew no producer from Kafka's
    part and took both the retry (a duplicate) and the gap. A tail it cannot read is
    logged and the stream starts as before, taking the producer at any sequence."""
    kafka = [
        read_batch_header(with_base_offset(nth(7, n), CUTOVER - 2 * RECORDS + n * RECORDS))
        for n in range(2)
    ]
    asked = []

    async def read_upstream(stream: int, lowest: int | None, end: int):
        asked.append((stream, lowest, end))
        return kafka

    def soon() -> int:
        return NOW_MS + 1000  # the cutover was written at NOW_MS

    async with await WriteAheadLog.open(config_for(tmp_path / "wal")) as wal:
        partition = await TieredPartition.recover(
            S0, wal, Shard().state, clock_ms=soon, read_upstream=read_upstream
        )
        async with partition:
            assert asked == [(S0, None, CUTOVER)]
            ok(await partition.produce(nth(7, 1), -1), CUTOVER - RECORDS)  # Kafka's offsets
            result = await partition.produce(nth(7, 3), -1)
            assert result.error_code == ErrorCode.out_of_order_sequence_number
            assert wal.stats.appends == 0
            ok(await partition.produce(nth(7, 2), -1), CUTOVER)

    async def away(stream: int, lowest: int | None, end: int):
        raise OSError("Kafka is away")

    async with await WriteAheadLog.open(config_for(tmp_path / "wal2")) as wal:
        with caplog.at_level(logging.WARNING, "tierproxy.tiering"):
            partition = await TieredPartition.recover(
                S0, wal, Shard().state, clock_ms=soon, read_upstream=away
            )
        assert "Kafka's log below the cutover 1000 not read" in caplog.text
        async with partition:
            ok(await partition.produce(nth(7, 3), -1), CUTOVER)  # any sequence, as before


async def test_a_rebuild_past_the_seed_window_carries_only_the_open_transactions(tmp_path):
    """A transaction of producer 9 was open at the cutover, so every rebuild with no
    snapshot reads Kafka's tail, however late; producer 7 (idempotent, done) is in that
    tail too. Rebuilt more than SEED_FOR_MS after the cutover, the stream carries 9's
    transaction (its next batch goes on from its sequence, a gap is 45) but not 7, which
    Kafka may have expired since: 7's next batch is taken at any sequence."""
    open_at = CUTOVER - 3 * RECORDS
    txn = [batch(9, n * RECORDS, transactional=True) for n in range(2)]
    kafka = [
        read_batch_header(with_base_offset(txn[0], open_at)),
        read_batch_header(with_base_offset(nth(7, 0), open_at + RECORDS)),
        read_batch_header(with_base_offset(txn[1], open_at + 2 * RECORDS)),
    ]

    async def read_upstream(stream: int, lowest: int | None, end: int):
        assert lowest == open_at
        return kafka

    shard = Shard(open_at)

    def late() -> int:
        return NOW_MS + SEED_FOR_MS + 1000

    async with await WriteAheadLog.open(config_for(tmp_path / "wal")) as wal:
        partition = await TieredPartition.recover(
            S0, wal, shard.state, clock_ms=late, read_upstream=read_upstream
        )
        async with partition:
            gap = await partition.produce(batch(9, 3 * RECORDS, transactional=True), -1)
            assert gap.error_code == ErrorCode.out_of_order_sequence_number
            ok(await partition.produce(batch(9, 2 * RECORDS, transactional=True), -1), CUTOVER)
            ok(await partition.produce(nth(7, 5), -1), CUTOVER + RECORDS)  # any sequence


async def test_a_partition_set_serves_each_stream_as_soon_as_it_is_rebuilt(tmp_path):
    """Two streams rebuilt together soon after the cutover: the one whose read of Kafka's
    tail is slow does not hold the other's produce up (before, both were started once
    every rebuild had ended)."""
    slow = asyncio.Event()

    async def read_upstream(stream: int, lowest: int | None, end: int):
        if stream == STREAMS[1]:
            await slow.wait()
        return []

    def soon() -> int:
        return NOW_MS + 1000

    async with await WriteAheadLog.open(config_for(tmp_path / "wal")) as wal:
        partitions = PartitionSet(wal, clock_ms=soon)
        recovering = asyncio.create_task(
            partitions.recover(STREAMS, Shard().state, read_upstream=read_upstream)
        )
        await eventually(lambda: partitions.get(S0) is not None)
        assert partitions.get(STREAMS[1]) is None and not recovering.done()
        ok(await partitions.produce(S0, nth(7, 0), -1), CUTOVER)
        slow.set()
        await asyncio.wait_for(recovering, 10)
        assert partitions.get(STREAMS[1]) is not None
        await partitions.close()


async def test_an_out_of_order_sequence_gets_45_and_writes_nothing(tmp_path):
    async with await WriteAheadLog.open(config_for(tmp_path / "wal")) as wal:
        async with await TieredPartition.recover(S0, wal, Shard().state) as partition:
            ok(await partition.produce(batch(7, 0), -1), CUTOVER)
            result = await partition.produce(batch(7, 10), -1)  # expected 3
            assert result.error_code == 45 == ErrorCode.out_of_order_sequence_number
            assert result.base_offset == -1
            assert "10 (incoming seq. number), 2 (current end sequence number)" in (
                result.error_message
            )
            assert wal.stats.appends == 1 and partition.log_end_offset == CUTOVER + 3
            ok(await partition.produce(batch(7, 3), -1), CUTOVER + 3)  # the right one goes on


async def test_a_full_queue_makes_callers_wait_in_order_and_drops_nothing():
    fs = MemoryFilesystem()
    config = PartitionConfig(queue_size=2, max_in_flight=2)
    async with await WriteAheadLog.open(WalConfig("/wal"), fs=fs) as wal:
        partition = await TieredPartition.recover(S0, wal, Shard().state, config=config)
        async with partition:
            long_poll = asyncio.create_task(partition.wait_for_append(CUTOVER, 5000))
            async with held_fsyncs(fs):
                sends = [
                    asyncio.create_task(partition.produce(nth(7, n), 0 if n == 9 else -1))
                    for n in range(10)
                ]
                await eventually(
                    lambda: partition.log_end_offset == CUTOVER + 2 * RECORDS, interval_s=0.002
                )
                await asyncio.sleep(0.05)
                # 2 in flight, 2 queued, 6 waiting to be queued (the acks=0 one too)
                assert partition.log_end_offset == CUTOVER + 6 and wal.durable_end == 0
                assert not any(t.done() for t in sends) and not long_poll.done()
            results = await asyncio.gather(*sends)
            assert await long_poll >= CUTOVER + RECORDS
        for n, result in enumerate(results[:9]):
            ok(result, CUTOVER + RECORDS * n)  # in the order of the calls
        assert results[9] is None
        assert partition.high_watermark == CUTOVER + 30 and wal.stats.appends == 10


async def test_a_close_answers_the_appends_a_full_wal_holds_and_never_writes_them(tmp_path, caplog):
    """A full WAL holds its queued appends until an upload trims it; that upload may need
    the partition's shard owned again, which waits for the partition's close. So the
    close takes them back from the WAL and answers them retriable, at once."""
    caplog.set_level(logging.INFO, "proxy.partition.owner")
    shard = Shard()
    size = entry_size(len(nth(7, 0)))
    config = WalConfig(str(tmp_path / "wal"), segment_bytes=64 * 1024, capacity_bytes=2 * size)
    async with await WriteAheadLog.open(config) as wal:
        partitions = PartitionSet(wal)
        await partitions.recover(STREAMS, shard.state)
        partition = partitions.get(S0)
        ok(await partitions.produce(S0, nth(7, 0), -1), CUTOVER)
        ok(await partitions.produce(S0, nth(7, 1), -1), CUTOVER + RECORDS)
        held = [asyncio.create_task(partitions.produce(S0, nth(7, n), -1)) for n in (2, 3)]
        other = asyncio.create_task(partitions.produce(STREAMS[1], nth(8, 0), -1))
        await eventually(lambda: partition.log_end_offset == CUTOVER + 4 * RECORDS)
        await asyncio.wait_for(partitions.remove(S0), 5)  # did not wait for room
        for answer in await asyncio.gather(*held):
            assert answer.error_code == ErrorCode.not_leader_or_follower, answer
        assert f"stream {S0}: closed with the WAL full: 2 appends" in caplog.text
        assert not other.done()  # the other stream's append still waits for room
        # the shard owned again: rebuilt from what the WAL holds, the retries take the
        # offsets the withdrawn appends had, once an upload makes room
        await partitions.recover([S0], shard.state)
        assert partitions.get(S0).log_end_offset == CUTOVER + 2 * RECORDS
        retries = [asyncio.create_task(partitions.produce(S0, nth(7, n), -1)) for n in (2, 3)]
        await wal.trim_to(wal.durable_end)  # room for two
        ok(await other, CUTOVER)
        ok(await retries[0], CUTOVER + 2 * RECORDS)
        await wal.trim_to(wal.durable_end)
        ok(await retries[1], CUTOVER + 3 * RECORDS)
        # written: the first two, the other stream's, the two retries; never the withdrawn
        written = [nth(7, 0), nth(7, 1), nth(8, 0), nth(7, 2), nth(7, 3)]
        assert (wal.stats.appends, wal.stats.bytes_appended) == (
            5,
            sum(entry_size(len(b)) for b in written),
        )
        assert list(await wal_batches(wal)) == [(S0, CUTOVER + 3 * RECORDS)]  # not trimmed
        await partitions.close()


async def test_a_close_withdraws_an_append_the_wal_holds_for_room_after_the_close_began():
    """The close's first look finds the WAL with room: its append is queued behind another
    stream's and would be written within a group commit, so it stays. Then the WAL fills
    before reaching it: the close takes it back then, and does not wait for room."""
    fs = MemoryFilesystem()
    shard = Shard()
    size = entry_size(len(nth(7, 0)))
    wal = await WriteAheadLog.open(WalConfig("/wal", capacity_bytes=2 * size), fs=fs)
    partitions = PartitionSet(wal)
    await partitions.recover(STREAMS, shard.state)
    async with held_fsyncs(fs):
        other = [asyncio.create_task(partitions.produce(STREAMS[1], nth(8, 0), -1))]
        path = f"/wal/{segment_name(0)}"
        await eventually(lambda: len(fs.file_bytes(path)) == size, interval_s=0.002)  # fsync held
        other.append(asyncio.create_task(partitions.produce(STREAMS[1], nth(8, 1), -1)))
        mine = asyncio.create_task(partitions.produce(S0, nth(7, 0), -1))
        await eventually(lambda: partitions.get(S0).log_end_offset == CUTOVER + RECORDS)
        closing = asyncio.create_task(partitions.remove(S0))
        await asyncio.sleep(0)  # the close has looked: nothing to withdraw, the WAL has room
        assert not closing.done() and not mine.done()
    # the writer writes the other stream's second append (the WAL is full then), and
    # starts to wait for room with this partition's append at the head
    await asyncio.wait_for(closing, 5)
    assert (await mine).error_code == ErrorCode.not_leader_or_follower
    ok(await other[0], CUTOVER)
    ok(await other[1], CUTOVER + RECORDS)
    assert wal.stats.appends == 2
    await partitions.close()
    await wal.close()


async def test_a_failed_fsync_fences_the_partition_and_loses_nothing_acknowledged():
    fs = MemoryFilesystem()
    config = WalConfig("/wal")
    shard = Shard()
    broken: list[tuple[int, BaseException]] = []
    wal = await WriteAheadLog.open(config, fs=fs)
    partitions = PartitionSet(wal, on_broken=lambda s, e: broken.append((s, e)))
    await partitions.recover(STREAMS, shard.state)
    partition = partitions.get(S0)
    acked = [await partitions.produce(S0, nth(7, n), -1) for n in range(10)]
    async with held_fsyncs(fs):
        in_flight = [
            asyncio.create_task(partitions.produce(S0, nth(7, n), -1)) for n in range(10, 15)
        ]
        await eventually(
            lambda: partition.log_end_offset == CUTOVER + 15 * RECORDS, interval_s=0.002
        )
        fs.fail_next_fsync()  # the held fsync fails
    results = await asyncio.gather(*in_flight)
    assert [r.error_code for r in results] == [56] * 5
    assert "the WAL write failed" in results[0].error_message
    assert broken == [(S0, partition.broken)] and isinstance(partition.broken, WalBrokenError)
    assert partitions.broken == {S0: partition.broken}
    assert partition.high_watermark == CUTOVER + 30
    # later requests, retries included, get 56 too (retriable: the client moves on)
    for records in (nth(7, 15), nth(7, 9), nth(8, 0)):
        result = await partitions.produce(S0, records, -1)
        assert result.error_code == ErrorCode.kafka_storage_error, result
    await partitions.close()
    await wal.close()

    # a power loss now: every acknowledged batch is on disk
    async with await WriteAheadLog.open(config, fs=fs.crash()) as wal:
        written = await wal_batches(wal)
        for n, result in enumerate(acked):
            ok(result, CUTOVER + RECORDS * n)
            assert written[S0, result.base_offset][0][8:] == nth(7, n)[8:]
        async with await TieredPartition.recover(S0, wal, shard.state) as recovered:
            assert recovered.log_end_offset == CUTOVER + 30
            ok(await recovered.produce(nth(7, 9), -1), CUTOVER + 27)  # a retry: duplicate
            ok(await recovered.produce(nth(7, 10), -1), CUTOVER + 30)
    # no power loss: the failed appends were written after all; the rebuild settles it
    async with await WriteAheadLog.open(config, fs=fs) as wal:
        async with await TieredPartition.recover(S0, wal, shard.state) as recovered:
            assert recovered.log_end_offset == CUTOVER + 45
            ok(await recovered.produce(nth(7, 12), -1), CUTOVER + 36)
            assert wal.stats.appends == 0


@pytest.mark.parametrize("ending", ["close", "abandon"])
async def test_idempotence_survives_a_restart_through_the_wal_replay(tmp_path, ending):
    shard = Shard()
    directory = tmp_path / "wal"
    old_wal = await WriteAheadLog.open(config_for(directory))
    old = PartitionSet(old_wal)
    await old.recover(STREAMS, shard.state)
    sends = [old.produce(S0, nth(pid, n), -1) for n in range(20) for pid in (7, 8)]
    sends += [old.produce(STREAMS[1], nth(9, n), -1) for n in range(3)]
    results = await asyncio.gather(*sends)
    assert all(r.error_code == 0 for r in results)
    last = {7: results[38].base_offset, 8: results[39].base_offset}
    if ending == "close":
        await old.close()
        await old_wal.close()
    # "abandon": the old process's state is gone, its files are what it left

    async with await WriteAheadLog.open(config_for(directory)) as wal:
        partitions = PartitionSet(wal)
        await partitions.recover(STREAMS, shard.state)
        partition = partitions.get(S0)
        assert partition.log_end_offset == partition.high_watermark == CUTOVER + 40 * RECORDS
        assert partitions.get(STREAMS[1]).log_end_offset == CUTOVER + 9
        for pid in (7, 8):  # a retry of each producer's last batch is a duplicate
            ok(await partitions.produce(S0, nth(pid, 19), -1), last[pid])
        result = await partitions.produce(S0, nth(7, 21), -1)  # a gap is still a gap
        assert result.error_code == ErrorCode.out_of_order_sequence_number
        assert wal.stats.appends == 0
        ok(await partitions.produce(S0, nth(7, 20), -1), CUTOVER + 120)
        await partitions.close()
    await old.close()
    await old_wal.close()


def objects_reader(store: LocalDirectoryStore, state: MetadataState):
    """`read_committed` over the committed objects: each block of the stream."""

    async def read_committed(stream: int, start: int, end: int):
        for r in state.objects_for(stream, start):
            if r.start_offset >= end:
                break
            data = await store.get(r.object_key)
            _, index = read_object(data, r.object_key)
            for entry in index:
                if entry.stream_id == stream:
                    block = read_block(data, entry, r.object_key)
                    headers = tuple(header for header, _ in iter_batches(block))
                    yield CommittedBlock(
                        entry.start_offset, entry.end_offset, entry.record_count, headers
                    )

    return read_committed


@contextlib.asynccontextmanager
async def uploading_owner(tmp_path, shard: Shard, store: LocalDirectoryStore):
    """(WAL, uploader, started partition of S0) on tmp_path/wal; the uploader commits to
    `shard` only when flushed."""
    quiet = UploaderConfig(upload_bytes=1 << 30, upload_interval_s=600)
    async with await WriteAheadLog.open(config_for(tmp_path / "wal")) as wal:
        async with Uploader(wal, store, shard.commit, ObjectIdAllocator(1), config=quiet) as up:
            async with await TieredPartition.recover(S0, wal, shard.state) as partition:
                yield wal, up, partition


@pytest.mark.parametrize("source", ["snapshot", "objects"])
async def test_recovery_takes_the_committed_part_from_metadata_and_the_tail_from_the_wal(
    tmp_path, source
):
    """Uploaded up to E (the WAL trimmed to there), then more acknowledged: the rebuild
    takes the producer state below E from the snapshot, or replays it from the objects,
    and the log from E on from the WAL."""
    shard = Shard()
    async with LocalDirectoryStore(tmp_path / "objects") as store:
        async with uploading_owner(tmp_path, shard, store) as (_, up, partition):
            for n in range(10):
                ok(await partition.produce(nth(7, n), -1), CUTOVER + RECORDS * n)
            await up.flush()
            end = shard.state.stream_end(S0)
            assert end == CUTOVER + 30 == partition.high_watermark
            if source == "snapshot":
                snapshot = partition.snapshot()
                shard.write(ProducerSnapshot(0, S0, 1, end, NOW_MS, snapshot))
            for n in (10, 11):
                ok(await partition.produce(nth(7, n), -1), CUTOVER + RECORDS * n)
        assert shard.state.stream_end(S0) == CUTOVER + 30  # the tail is only in the WAL

        asked: list[tuple[int, int]] = []
        read_objects = objects_reader(store, shard.state)

        def reader(stream: int, start: int, end: int):
            asked.append((start, end))
            return read_objects(stream, start, end)

        async with await WriteAheadLog.open(config_for(tmp_path / "wal")) as wal:
            assert [e.base_offset async for e in wal.replay()] == [1030, 1033]
            if source == "objects":
                with pytest.raises(RecoveryError, match=r"\[1000, 1030\).*read_committed"):
                    await TieredPartition.recover(S0, wal, shard.state)
            partition = await TieredPartition.recover(S0, wal, shard.state, read_committed=reader)
            assert asked == ([] if source == "snapshot" else [(1000, 1030)])
            async with partition:
                assert partition.log_end_offset == partition.high_watermark == CUTOVER + 36
                ok(await partition.produce(nth(7, 11), -1), CUTOVER + 33)  # from the WAL
                ok(await partition.produce(nth(7, 8), -1), CUTOVER + 24)  # committed, below E
                assert wal.stats.appends == 0
                ok(await partition.produce(nth(7, 12), -1), CUTOVER + 36)


async def test_a_gap_in_the_wal_above_the_committed_end_is_refused(tmp_path):
    async with await WriteAheadLog.open(config_for(tmp_path / "wal")) as wal:
        for base in (CUTOVER, CUTOVER + 6):  # the batch at 1003 is missing
            await wal.append(S0, base, with_base_offset(nth(7, (base - CUTOVER) // 3), base))
        with pytest.raises(RecoveryError, match=r"offsets \[1003, 1006\) are missing"):
            await TieredPartition.recover(S0, wal, Shard().state)


@pytest.mark.parametrize("fits", [6, 2, 0])
async def test_a_rebuild_loads_the_tail_not_uploaded_into_the_log_cache_or_notes_it_in_the_wal(
    tmp_path, fits
):
    """Uploaded up to E, then more acknowledged, then a restart: the rebuilt partition's
    log cache holds the tail from E on, as much as fits (the newest); every offset of the
    tail below the high watermark is read at once, from the cache or from the WAL
    (`TieredReads._tail`), and nothing below E is loaded. Once uploaded, the WAL's part
    is forgotten (the objects hold it)."""
    shard = Shard()
    async with LocalDirectoryStore(tmp_path / "objects") as store:
        async with uploading_owner(tmp_path, shard, store) as (wal, up, partition):
            for n in range(4):
                ok(await partition.produce(nth(7, n), -1), CUTOVER + RECORDS * n)
            await up.flush()
            for n in range(4, 9):
                ok(await partition.produce(nth(7, n), -1), CUTOVER + RECORDS * n)
            ok(await partition.produce(nth(8, 0), -1), CUTOVER + 27)
            expected = await wal_batches(wal)
        end = shard.state.stream_end(S0)
        assert end == CUTOVER + 12

        tail = [expected[S0, base][0] for base in range(end, CUTOVER + 30, RECORDS)]
        room = sum(map(len, tail[len(tail) - fits :])) + 1 if fits else 1
        cache = LogCache(room)
        async with await WriteAheadLog.open(config_for(tmp_path / "wal")) as wal:
            partitions = PartitionSet(wal, log_cache=cache)
            await partitions.recover(
                STREAMS, shard.state, read_committed=objects_reader(store, shard.state)
            )
            high = partitions.get(S0).high_watermark
            assert high == CUTOVER + 30
            start = cache.start_offset(S0)
            held = [] if start is None else cache.read(S0, start, 1 << 30)[0]
            assert cache.bytes == sum(len(b) for b in held) <= room
            assert [bytes(b) for b in held] == tail[len(tail) - fits :]  # the newest
            noted = [cache.wal_position(S0, base) for base in range(CUTOVER, high, RECORDS)]
            in_wal = [p is not None for p in noted]
            assert in_wal == [False] * 4 + [True] * (len(tail) - fits) + [False] * fits
            reads = TieredReads(SimpleNamespace(log=wal, partitions=None), None, cache)
            for offset in range(end, high):
                batches = await reads._tail(S0, offset, 1)  # noqa: SLF001
                base = offset - (offset - CUTOVER) % RECORDS
                assert [bytes(b) for b in batches] == [expected[S0, base][0]], offset
            everything = await reads._tail(S0, end, 1 << 20)  # noqa: SLF001
            assert b"".join(everything) == b"".join(tail)
            assert await reads._tail(S0, high, 1 << 20) == []  # noqa: SLF001
            cache.uploaded(S0, high)
            assert cache.wal_position(S0, end) is None
            await partitions.close()


async def test_transactions_and_markers_survive_a_restart_with_a_snapshot(tmp_path):
    """Transactional batches and markers go through the FIFO and the WAL; after a restart
    (snapshot + WAL replay) the open transaction, the LSO and the marker follower's resume
    point are as they were."""
    shard = Shard()
    commit7 = Marker(7, 0, 4, True, NOW_MS + 1, 2000)
    abort7 = Marker(7, 0, 4, False, NOW_MS + 2, 2001)
    zombie7 = Marker(7, 0, 3, True, NOW_MS + 3, 2002)  # an older coordinator: refused
    appended: list[tuple[int, int, bytes]] = []
    store = LocalDirectoryStore(tmp_path / "objects")
    async with store, uploading_owner(tmp_path, shard, store) as (_, up, partition):
        partition.on_appended = lambda _, base, last, records: appended.append(
            (base, last, bytes(records))
        )
        ok(await partition.produce(batch(7, 0, transactional=True), -1), CUTOVER)
        assert partition.last_stable_offset == CUTOVER
        ok(await partition.append_marker(commit7), CUTOVER + 3)
        assert partition.last_stable_offset == partition.high_watermark == CUTOVER + 4
        assert appended[-1] == (CUTOVER + 3, CUTOVER + 3, bytes(marker_batch(commit7, 1003)))
        await up.flush()  # the snapshot covers committed offsets only
        assert shard.state.stream_end(S0) == CUTOVER + 4
        shard.write(ProducerSnapshot(0, S0, 1, CUTOVER + 4, NOW_MS, partition.snapshot()))
        ok(await partition.produce(batch(8, 0, transactional=True), -1), CUTOVER + 4)
        ok(await partition.produce(batch(7, 3, transactional=True), -1), CUTOVER + 7)
        ok(await partition.append_marker(abort7), CUTOVER + 10)
        skipped = await partition.append_marker(zombie7)
        assert skipped.error_code == ErrorCode.transaction_coordinator_fenced
        assert partition.marker_resume() == (2003, ())
        assert partition.last_stable_offset == CUTOVER + 4  # producer 8's transaction
    async with await WriteAheadLog.open(config_for(tmp_path / "wal")) as wal:
        async with await TieredPartition.recover(S0, wal, shard.state) as partition:
            assert partition.high_watermark == CUTOVER + 11
            assert partition.last_stable_offset == CUTOVER + 4
            # from the snapshot's position; the abort is in the stream already
            assert partition.marker_resume() == (2001, ((7, 0, NOW_MS + 2),))
            result = await partition.produce(batch(8, 3), -1)  # not transactional: refused
            assert result.error_code == ErrorCode.invalid_txn_state
            skipped = await partition.append_marker(zombie7)  # refused again, as before
            assert skipped.error_code == ErrorCode.transaction_coordinator_fenced
            assert partition.marker_resume() == (2003, ())
            ok(await partition.append_marker(Marker(8, 0, 4, True, NOW_MS + 4, 2003)), CUTOVER + 11)
            assert partition.last_stable_offset == partition.high_watermark == CUTOVER + 12
            assert partition.marker_resume() == (2004, ())


async def test_past_a_log_start_inside_an_open_transactions_batch_the_lso_is_that_batchs_base(
    tmp_path,
):
    """Kafka keeps the first unstable offset as the position of a batch: once DeleteRecords
    moved the log start inside the batch of an open transaction, its LSO is that batch's
    base offset, below the log start (UnifiedLog.maybeIncrementFirstUnstableOffset);
    the conformance suite's delete_open_txn shape found it. Until the owner learns where
    the batch begins, the LSO stops at the log start; a marker ends it as before."""
    shard = Shard()
    async with LocalDirectoryStore(tmp_path / "objects") as store:
        async with uploading_owner(tmp_path, shard, store) as (_, _, partition):
            ok(await partition.produce(nth(7, 0), -1), CUTOVER)
            assert not partition.opened_below(CUTOVER + 4)
            ok(await partition.produce(batch(8, 0, transactional=True), -1), CUTOVER + 3)
            assert partition.opened_below(CUTOVER + 4) and not partition.opened_below(CUTOVER + 3)
            partition.log_start_offset = CUTOVER + 4  # inside producer 8's batch
            assert partition.last_stable_offset == CUTOVER + 4
            partition.note_start_batch(CUTOVER + 4, CUTOVER + 3)
            assert partition.last_stable_offset == CUTOVER + 3
            with pytest.raises(ValueError, match="cannot begin"):
                partition.note_start_batch(CUTOVER + 4, CUTOVER + 5)
            partition.log_start_offset = CUTOVER + 5  # a later log start: noted for another
            assert partition.last_stable_offset == CUTOVER + 5
            ended = await partition.append_marker(Marker(8, 0, 4, True, NOW_MS + 1, 2000))
            assert (ended.error_code, ended.base_offset) == (0, CUTOVER + 6)
            assert partition.last_stable_offset == partition.high_watermark == CUTOVER + 7
            assert not partition.opened_below(CUTOVER + 7)


UNKNOWN = stream_id(TOPIC, 2)  # not cut over in `Shard`


async def test_a_stream_whose_rebuild_fails_is_noted_until_a_rebuild_starts_it(tmp_path):
    """One of two streams fails its rebuild (not in the metadata it is rebuilt from): the
    other is served, the failed one is in `not_rebuilt` (requests waiting for its start
    stop waiting: hold.py), and a later rebuild that starts it takes it out."""
    async with await WriteAheadLog.open(config_for(tmp_path / "wal")) as wal:
        partitions = PartitionSet(wal)
        shard = Shard()
        with pytest.raises(Exception):  # noqa: B017 - whichever the rebuild raises
            await partitions.recover([S0, UNKNOWN], shard.state)
        assert partitions.get(S0) is not None and partitions.get(UNKNOWN) is None
        assert list(partitions.not_rebuilt) == [UNKNOWN]
        await partitions.remove(UNKNOWN)  # untiered, or its shard lost: forgotten
        assert not partitions.not_rebuilt
        with pytest.raises(Exception):  # noqa: B017
            await partitions.recover([UNKNOWN], shard.state)
        assert list(partitions.not_rebuilt) == [UNKNOWN]
        shard.write(StreamCutover(0, UNKNOWN, 1, 1, TOPIC, 2, 0, CUTOVER, CUTOVER, NOW_MS, None))
        await partitions.recover([S0, UNKNOWN], shard.state)
        assert partitions.get(UNKNOWN) is not None and not partitions.not_rebuilt
        await partitions.close()


def held_upstream():
    """A read of Kafka's tail (soon after the cutover) that waits until the event is set."""
    slow = asyncio.Event()

    async def read_upstream(stream: int, lowest: int | None, end: int):
        await slow.wait()
        return []

    return slow, read_upstream


async def test_a_stream_being_rebuilt_is_left_to_that_rebuild(tmp_path):
    """A second recover() of a stream while the first is rebuilding it (the retry of a
    failed start and a takeover's, say) leaves it to the first: one partition is started,
    where the second's `add` raised "already has a partition"."""
    slow, read_upstream = held_upstream()
    async with await WriteAheadLog.open(config_for(tmp_path / "wal")) as wal:
        partitions = PartitionSet(wal, clock_ms=lambda: NOW_MS + 1000)
        state = Shard().state
        first = asyncio.create_task(partitions.recover([S0], state, read_upstream=read_upstream))
        await asyncio.sleep(0.05)
        await asyncio.wait_for(partitions.recover([S0], state, read_upstream=read_upstream), 1)
        assert partitions.get(S0) is None  # not started twice, nor waited for
        slow.set()
        await asyncio.wait_for(first, 10)
        assert partitions.get(S0) is not None and not partitions.not_rebuilt
        await partitions.close()


async def test_a_stream_removed_while_it_is_rebuilt_is_not_started_when_the_rebuild_ends(
    tmp_path,
):
    """Its shard lost during the rebuild (after the cutover, an un-seal, the retry of a
    failed start: none runs in the shard's owner task, which a loss cancels): the rebuild
    ends on a proxy that no longer owns the stream, and starting it there would take
    produces, acknowledged and never committed. When the shard was claimed here again
    meanwhile (a later recover() left the stream to the first), the stream goes to
    `not_rebuilt`, for the retry to rebuild from the new claim."""
    slow, read_upstream = held_upstream()
    async with await WriteAheadLog.open(config_for(tmp_path / "wal")) as wal:
        partitions = PartitionSet(wal, clock_ms=lambda: NOW_MS + 1000)
        state = Shard().state
        first = asyncio.create_task(partitions.recover([S0], state, read_upstream=read_upstream))
        await asyncio.sleep(0.05)
        await partitions.remove(S0)  # the shard lost
        slow.set()
        await asyncio.wait_for(first, 10)
        assert partitions.get(S0) is None and not partitions.not_rebuilt

        slow.clear()
        first = asyncio.create_task(partitions.recover([S0], state, read_upstream=read_upstream))
        await asyncio.sleep(0.05)
        await partitions.remove(S0)  # lost, then claimed here again: its rebuild skips S0
        await asyncio.wait_for(partitions.recover([S0], state, read_upstream=read_upstream), 1)
        slow.set()
        await asyncio.wait_for(first, 10)
        assert partitions.get(S0) is None and list(partitions.not_rebuilt) == [S0]
        await partitions.recover([S0], state, read_upstream=read_upstream)  # the retry
        assert partitions.get(S0) is not None and not partitions.not_rebuilt
        await partitions.close()


async def test_a_stream_started_removed_and_asked_for_again_while_its_sibling_rebuilds_starts(
    tmp_path,
):
    """Two streams rebuilt together: S0 is started while the other still rebuilds, then
    removed (sealed for an untier, its shard lost) and asked for again (the untier
    refused, the shard claimed again). S0's rebuild is over: the new recover() rebuilds
    and starts it, where it left S0 to the first (still running for the other) and
    nothing started it."""
    slow = asyncio.Event()

    async def read_upstream(stream: int, lowest: int | None, end: int):
        if stream == STREAMS[1]:
            await slow.wait()
        return []

    async with await WriteAheadLog.open(config_for(tmp_path / "wal")) as wal:
        partitions = PartitionSet(wal, clock_ms=lambda: NOW_MS + 1000)
        state = Shard().state
        both = asyncio.create_task(partitions.recover(STREAMS, state, read_upstream=read_upstream))
        await eventually(lambda: partitions.get(S0) is not None)
        await partitions.remove(S0)
        await asyncio.wait_for(partitions.recover([S0], state, read_upstream=read_upstream), 5)
        assert partitions.get(S0) is not None
        slow.set()
        await asyncio.wait_for(both, 10)
        assert partitions.get(STREAMS[1]) is not None and not partitions.not_rebuilt
        await partitions.close()


async def test_a_stream_rebuilt_under_an_older_claim_is_left_to_the_retry(tmp_path):
    """The shard was lost and claimed here again while the stream was rebuilt from the
    old claim's state (`may_start` says no: shards.recover_streams ties it to the claim);
    the new claim's rebuild left it to that one: it is not started, and is noted as not
    rebuilt, for the retry to rebuild it from the new claim's state."""
    slow, read_upstream = held_upstream()
    claim = {"epoch": 1}

    def may_start(stream: int) -> bool:
        return claim["epoch"] == 1

    async with await WriteAheadLog.open(config_for(tmp_path / "wal")) as wal:
        partitions = PartitionSet(wal, clock_ms=lambda: NOW_MS + 1000)
        state = Shard().state
        old = partitions.recover([S0], state, read_upstream=read_upstream, may_start=may_start)
        first = asyncio.create_task(old)
        await asyncio.sleep(0.05)
        claim["epoch"] = 2  # lost and claimed again: the new claim's rebuild
        await asyncio.wait_for(partitions.recover([S0], state, read_upstream=read_upstream), 1)
        slow.set()
        await asyncio.wait_for(first, 10)
        assert partitions.get(S0) is None and list(partitions.not_rebuilt) == [S0]
        await partitions.close()


async def test_a_close_records_a_batch_waiting_for_its_verification_as_dropped(tmp_path):
    """A transactional batch waits for its KIP-890 verification with the coordinator
    (seconds, if the coordinator is slow). A close refuses it once the verification ends;
    its drop is recorded at the close itself, so that the producer's next batch, handed to
    the stream's next owner meanwhile, carries it (sequence_holes.py)."""
    coordinator: asyncio.Future[ProduceResult | None] = asyncio.get_running_loop().create_future()

    async def verify(producer_id: int, producer_epoch: int) -> ProduceResult | None:
        return await coordinator

    holes = SequenceHoles()
    async with await WriteAheadLog.open(config_for(tmp_path / "wal")) as wal:
        partition = await TieredPartition.recover(S0, wal, Shard().state)
        partition.holes = holes
        partition.start()
        waiting = asyncio.create_task(
            partition.produce(batch(7, 0, transactional=True), -1, verify=verify)
        )
        await eventually(lambda: partition.has_transaction_of(7))  # in the gate
        await partition.close()
        assert holes.hole_before(S0, ProducerBatch(7, 0, 3, 5)) == 0  # before the answer
        assert not waiting.done()
        coordinator.set_result(None)  # verified, too late: the partition is closed
        result = await waiting
        assert result is not None and result.error_code == ErrorCode.not_leader_or_follower
        assert wal.stats.appends == 0


async def test_a_partition_being_removed_stays_in_its_set_until_its_writes_are_answered():
    """A shard taken away while a write is in flight (an unclean takeover learnt late, a
    hand-over): the partition stays in the set until its close has answered the write.
    Meanwhile the stream's next batch still reaches it and is refused and recorded as
    dropped; when the set forgets it, the failed write's drop is recorded too, so the
    next batch, handed to the stream's next owner from then on, carries both
    (sequence_holes.py). Before, the set forgot it at once, and a batch handed over then
    missed the drop of the write still in flight."""
    fs = MemoryFilesystem()
    holes = SequenceHoles()
    wal = await WriteAheadLog.open(WalConfig("/wal"), fs=fs)
    partitions = PartitionSet(wal, holes=holes)
    await partitions.recover([S0], Shard().state)
    partition = partitions.get(S0)
    assert partition is not None
    async with held_fsyncs(fs):
        first = asyncio.create_task(partitions.produce(S0, nth(7, 0), -1))
        await eventually(lambda: len(fs.file_bytes(f"/wal/{segment_name(0)}")) > 0)
        fs.fail_next_fsync()
        removal = asyncio.create_task(partitions.remove(S0))
        await eventually(lambda: partition._closing)  # the close began
        assert partitions.get(S0) is partition and not removal.done()
        refused = await partitions.produce(S0, nth(7, 1), -1)  # still here: refused here
        assert refused is not None
        assert refused.error_code == ErrorCode.not_leader_or_follower
        assert holes.hole_before(S0, ProducerBatch(7, 0, 6, 8)) == 3
        assert holes.hole_before(S0, ProducerBatch(7, 0, 3, 5)) == -1  # its fate unknown
    await eventually(lambda: partitions.get(S0) is None)
    assert holes.hole_before(S0, ProducerBatch(7, 0, 3, 5)) == 0  # the failed write's, first
    await asyncio.wait_for(removal, 5)
    assert (await first).error_code == ErrorCode.kafka_storage_error
    await partitions.close()
    with contextlib.suppress(WalBrokenError):
        await wal.close()


async def test_a_stream_asked_for_while_its_partition_closes_is_rebuilt_after_the_close(
    tmp_path,
):
    """Its shard given up and claimed here again while the old partition still answers
    its writes in flight: the new recover() waits for that close, then rebuilds the
    stream from the WAL (the write answered included) and starts it; before the close
    kept the partition in the set, it was left out, and the stream not served here."""
    fs = MemoryFilesystem()
    wal = await WriteAheadLog.open(WalConfig("/wal"), fs=fs)
    partitions = PartitionSet(wal)
    state = Shard().state
    await partitions.recover([S0], state)
    old = partitions.get(S0)
    assert old is not None
    async with held_fsyncs(fs):
        first = asyncio.create_task(partitions.produce(S0, nth(7, 0), -1))
        await eventually(lambda: len(fs.file_bytes(f"/wal/{segment_name(0)}")) > 0)
        removal = asyncio.create_task(partitions.remove(S0))
        again = asyncio.create_task(partitions.recover([S0], state))
        await eventually(lambda: old._closing)
        assert not again.done() and partitions.get(S0) is old
    ok(await asyncio.wait_for(first, 5), CUTOVER)
    await asyncio.wait_for(asyncio.gather(removal, again), 5)
    new = partitions.get(S0)
    assert new is not None and new is not old
    assert new.high_watermark == CUTOVER + RECORDS  # rebuilt with the answered write
    ok(await partitions.produce(S0, nth(7, 1), -1), CUTOVER + RECORDS)
    await partitions.close()
    await wal.close()
