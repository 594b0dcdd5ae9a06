"""The uploader on a real WAL (files in tmp_path) and a real store: the local directory
store and MinIO. Batches of 50 streams come back from the objects exactly once, in order,
byte for byte, from one object per upload; the WAL is trimmed only after the commit; a
refused commit trims nothing; a failed PUT is retried with the same objects; a crash
between commit and trim uploads nothing twice after the WAL is reopened.

Commits go to a real `MetadataState` (the rules every metadata reader applies), so a
duplicate or a gap would be refused exactly as in production.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Sequence
from uuid import UUID

import pytest

from proxy.metadata.codec import encode
from proxy.metadata.records import ObjectCommit, ShardClaim, StreamCutover
from proxy.metadata.state import MetadataState
from proxy.metadata.streams import stream_id
from proxy.objects.format import read_block, read_object
from proxy.objects.keys import ObjectKind, object_key
from proxy.objects.local import LocalDirectoryStore
from proxy.objects.store import ObjectStoreError, Payload
from proxy.records.batches import iter_batches, with_base_offset
from proxy.upload.uploader import (
    CommitRefused,
    ObjectIdAllocator,
    UploadedObject,
    Uploader,
    UploaderConfig,
    UploadError,
)
from proxy.wal import WalConfig, WriteAheadLog
from tests.support.batches import build_batch
from tests.support.clock import ManualClock
from tests.support.stores import PrefixedStore
from tests.support.waiting import eventually

TOPIC = UUID("3f2a9c1e-7b4d-4e8a-9c0f-1d2e3f405162")
STREAMS = [stream_id(TOPIC, p) for p in range(50)]
NOW_MS = 1_700_000_000_000
# no trigger fires on its own unless a test asks: uploads happen on flush()
QUIET = UploaderConfig(upload_bytes=1 << 30, upload_interval_s=600)


def kafka_batch(stream: int, n: int, records: int = 3) -> bytes:
    """A v2 batch as kafka-python's producer writes it, with values naming stream and n."""
    return build_batch([f"{stream}:{n}:{i}:".encode() * 4 for i in range(records)])


class Producer:
    """Appends batches as an owner does: offsets assigned per stream, WAL group commits."""

    def __init__(self, wal: WriteAheadLog) -> None:
        self.wal = wal
        self.next_offset = dict.fromkeys(STREAMS, 0)
        self.batches: dict[int, list[bytes]] = {s: [] for s in STREAMS}

    async def produce(self, rounds: int, streams: Sequence[int] = STREAMS) -> None:
        appends = []
        for _ in range(rounds):
            for s in streams:
                batch = with_base_offset(kafka_batch(s, len(self.batches[s])), self.next_offset[s])
                appends.append(self.wal.append(s, self.next_offset[s], batch))
                self.next_offset[s] = next(iter_batches(batch))[0].next_offset
                self.batches[s].append(bytes(batch))
        await asyncio.gather(*appends)


class Shard:
    """One metadata shard in memory, applying records as its owner writes them; `commit`
    is the callback the owner gives the uploader."""

    def __init__(self) -> None:
        self.state = MetadataState(0, 1)
        self.epoch = 1
        self.committed: list[UploadedObject] = []
        self.write(ShardClaim(0, self.epoch, "proxy-a", NOW_MS))
        for p, s in enumerate(STREAMS):
            self.write(StreamCutover(0, s, 1, self.epoch, TOPIC, p, 0, 0, 0, NOW_MS))

    def write(self, record: object) -> None:
        key, value = encode(record)
        verdict = self.state.apply(key, value, self.state.next_offset)
        assert verdict.accepted, verdict.reason

    async def commit(self, objects: Sequence[UploadedObject]) -> None:
        for o in objects:
            record = ObjectCommit(0, o.object_id, o.kind, o.size, self.epoch, NOW_MS, o.ranges)
            verdict = self.state.check(record)
            if not verdict.accepted:
                raise CommitRefused(verdict.reason)
            self.write(record)
            self.committed.append(o)


class TestStore(PrefixedStore):
    """The store under test behind a key prefix of this test's own (the MinIO bucket is
    shared), counting PUTs and failing the next `fail_puts` of them."""

    __test__ = False

    def __init__(self, inner, prefix: str) -> None:
        super().__init__(inner, prefix)
        self.puts: list[str] = []
        self.fail_puts = 0

    async def put(self, key: str, data: Payload) -> None:
        await self._write(key, data, self.inner.put)

    async def create(self, key: str, data: Payload) -> None:
        await self._write(key, data, self.inner.create)

    async def _write(self, key: str, data: Payload, write) -> None:
        if self.fail_puts:
            self.fail_puts -= 1
            raise ObjectStoreError(key, "put", "injected: S3 is down", retryable=True)
        await write(self.prefix + key, data)
        self.puts.append(key)


@pytest.fixture(params=["local", pytest.param("s3", marks=pytest.mark.minio)])
async def store(request, tmp_path, key_prefix, make_s3_store) -> AsyncIterator[TestStore]:
    if request.param == "local":
        async with LocalDirectoryStore(tmp_path / "objects") as local:
            yield TestStore(local, key_prefix)
    else:
        s3 = await make_s3_store(request.getfixturevalue("s3_server"))
        test_store = TestStore(s3, key_prefix)
        test_store.s3 = s3
        yield test_store


@pytest.fixture
async def local_store(tmp_path) -> AsyncIterator[TestStore]:
    async with LocalDirectoryStore(tmp_path / "objects") as local:
        yield TestStore(local, "t/")


def wal_config(tmp_path) -> WalConfig:
    # small segments, so trimming removes some
    return WalConfig(str(tmp_path / "wal"), segment_bytes=64 * 1024)


async def committed_batches(store: TestStore, shard: Shard) -> dict[int, list[bytes]]:
    """Every batch of every committed object, per stream, in commit order; each object's
    index checked against its commit."""
    found: dict[int, list[bytes]] = {}
    for o in shard.committed:
        data = await store.get(o.key)
        footer, index = read_object(data, o.key)
        assert (footer.object_id, footer.kind, len(data)) == (o.object_id, o.kind, o.size)
        for entry in index:
            block = read_block(data, entry, o.key)
            found.setdefault(entry.stream_id, []).extend(bytes(b) for _, b in iter_batches(block))
    return found


def assert_all_committed_once(found: dict[int, list[bytes]], producer: Producer, shard: Shard):
    for s in STREAMS:
        assert found.get(s, []) == producer.batches[s], f"stream {s}"
        assert shard.state.stream_end(s) == producer.next_offset[s]
        ranges = shard.state.committed_ranges(s)
        assert all(a.end_offset == b.start_offset for a, b in zip(ranges, ranges[1:], strict=False))


async def test_fifty_streams_go_up_in_one_object_per_upload(store, tmp_path):
    shard = Shard()
    async with await WriteAheadLog.open(wal_config(tmp_path)) as wal:
        producer = Producer(wal)
        uploader = Uploader(wal, store, shard.commit, ObjectIdAllocator(1), config=QUIET)
        async with uploader:
            for _ in range(3):
                await producer.produce(rounds=4)
                await uploader.flush()
            stats = uploader.stats
        assert len(store.puts) == 3 == stats.puts == stats.objects == stats.stream_set_objects
        assert stats.backlog_bytes == 0 and stats.uploaded_to == wal.durable_end
        assert wal.trimmed_to == wal.durable_end and wal.stats.retained_bytes == 0
        assert len(wal.segments) < 5 and wal.stats.segments_deleted > 0
    if hasattr(store, "s3"):
        assert store.s3.metrics.count("PutObject") == 3
        assert store.s3.metrics.count("UploadPart") == 0
    assert_all_committed_once(await committed_batches(store, shard), producer, shard)
    assert [o.key for o in shard.committed] == store.puts


async def test_the_size_trigger_uploads_without_flush(local_store, tmp_path):
    shard = Shard()
    config = UploaderConfig(upload_bytes=32 * 1024, upload_interval_s=600)
    async with await WriteAheadLog.open(wal_config(tmp_path)) as wal:
        producer = Producer(wal)
        async with Uploader(
            wal, local_store, shard.commit, ObjectIdAllocator(1), config=config
        ) as up:
            for _ in range(10):  # ~ 19 KiB a round
                await producer.produce(rounds=1)
                await asyncio.sleep(0.03)
            await eventually(lambda: up.stats.backlog_bytes < 32 * 1024)
            stats = up.stats
    assert 2 <= stats.uploads <= 6 and stats.objects == stats.uploads == len(local_store.puts)
    assert stats.object_bytes / stats.uploads > 28 * 1024  # about the trigger's worth each
    assert stats.uploaded_to == wal.trimmed_to > 0


async def test_the_time_trigger_uploads_without_flush(local_store, tmp_path):
    shard = Shard()
    clock = ManualClock()  # the uploader's: "not yet due" is a time the test sets
    config = UploaderConfig(upload_bytes=1 << 30, upload_interval_s=0.3)
    async with await WriteAheadLog.open(wal_config(tmp_path)) as wal:
        producer = Producer(wal)
        async with Uploader(
            wal, local_store, shard.commit, ObjectIdAllocator(1), config=config, clock=clock
        ) as up:

            def seen() -> bool:
                """Whether the uploader has seen the backlog (it then has an age)."""
                clock.now += 0.001
                return up.backlog_seconds > 0

            for streams in (STREAMS[:3], STREAMS):
                await producer.produce(rounds=1, streams=streams)
                await eventually(seen, what="the uploader saw the backlog")
                uploads = up.stats.uploads
                clock.now += 0.29
                looked = clock.calls
                await eventually(lambda n=looked + 3: clock.calls >= n, what="three more looks")
                assert up.stats.uploads == uploads  # not yet due
                clock.now += 0.01
                await eventually(lambda: up.stats.backlog_bytes == 0)
                assert up.stats.uploads == uploads + 1
            stats = up.stats
    assert stats.uploads == stats.objects == 2 == len(local_store.puts)
    assert_all_committed_once(await committed_batches(local_store, shard), producer, shard)


async def test_a_refused_commit_trims_nothing_and_stops_the_uploader(store, tmp_path):
    shard = Shard()
    async with await WriteAheadLog.open(wal_config(tmp_path)) as wal:
        producer = Producer(wal)
        uploader = Uploader(wal, store, shard.commit, ObjectIdAllocator(1), config=QUIET)
        async with uploader:
            await producer.produce(rounds=2)
            await uploader.flush()
            # another proxy claims the shard: this owner's commits are stale now
            shard.write(ShardClaim(0, 2, "proxy-b", NOW_MS))
            trimmed = wal.trimmed_to
            await producer.produce(rounds=2)
            with pytest.raises(UploadError, match="stale.*nothing trimmed, the data stays"):
                await uploader.flush()
            assert await uploader.stopped() is uploader.failed
            with pytest.raises(UploadError, match="stale"):
                await uploader.flush()
        assert wal.trimmed_to == trimmed < wal.durable_end
        left = [e async for e in wal.replay()]
        assert len(left) == 2 * len(STREAMS)
    assert len(store.puts) == 2 and len(shard.committed) == 1  # the refused one is an orphan


async def test_failed_puts_are_retried_with_the_same_objects(store, tmp_path):
    shard = Shard()
    config = UploaderConfig(
        upload_bytes=1 << 30, upload_interval_s=600, retry_backoff_s=0.02, retry_backoff_max_s=0.05
    )
    async with await WriteAheadLog.open(wal_config(tmp_path)) as wal:
        producer = Producer(wal)
        async with Uploader(wal, store, shard.commit, ObjectIdAllocator(1), config=config) as up:
            await producer.produce(rounds=2)
            store.fail_puts = 3
            await up.flush()
            stats = up.stats
        assert wal.trimmed_to == wal.durable_end
    assert stats.put_failures == 3 and stats.puts == 1 and stats.objects == 1
    assert len(store.puts) == 1 and shard.committed[0].key == store.puts[0]
    assert_all_committed_once(await committed_batches(store, shard), producer, shard)


async def test_a_key_taken_by_another_process_is_written_again_under_a_new_id(store, tmp_path):
    """Another process drew the same object id writer and holds the key of the uploader's
    next id: the create fails, a new writer is drawn, the object is created again under a
    new id and committed once; the other process's object is left as it was."""
    shard = Shard()
    ids = ObjectIdAllocator(1, rng=random.Random(7))
    taken = object_key(1 << 32, ObjectKind.STREAM_SET)
    await store.inner.put(store.prefix + taken, b"another process's object")
    async with await WriteAheadLog.open(wal_config(tmp_path)) as wal:
        producer = Producer(wal)
        async with Uploader(wal, store, shard.commit, ids, config=QUIET) as up:
            await producer.produce(rounds=2)
            await up.flush()
            await producer.produce(rounds=1)
            await up.flush()
            stats = up.stats
        assert wal.trimmed_to == wal.durable_end
    assert stats.id_collisions == 1 and stats.puts == 2 and ids.writer != 1
    assert [o.object_id for o in shard.committed] == [ids.writer << 32, ids.writer << 32 | 1]
    assert store.puts == [o.key for o in shard.committed]
    assert await store.get(taken) == b"another process's object"
    assert_all_committed_once(await committed_batches(store, shard), producer, shard)


async def test_close_while_puts_fail_keeps_the_data_in_the_wal(local_store, tmp_path):
    shard = Shard()
    config = UploaderConfig(upload_bytes=1, retry_backoff_s=0.02, retry_backoff_max_s=0.05)
    async with await WriteAheadLog.open(wal_config(tmp_path)) as wal:
        producer = Producer(wal)
        local_store.fail_puts = 1_000_000
        uploader = Uploader(wal, local_store, shard.commit, ObjectIdAllocator(1), config=config)
        uploader.start()
        await producer.produce(rounds=1)
        await eventually(lambda: uploader.stats.put_failures >= 3)
        await uploader.close()
        assert uploader.failed is None and wal.trimmed_to == 0 and not shard.committed


async def test_close_with_flush_uploads_what_the_wal_holds(local_store, tmp_path):
    shard = Shard()
    async with await WriteAheadLog.open(wal_config(tmp_path)) as wal:
        producer = Producer(wal)
        uploader = Uploader(wal, local_store, shard.commit, ObjectIdAllocator(1), config=QUIET)
        uploader.start()
        await producer.produce(rounds=3)
        await uploader.close(flush=True)
        assert wal.trimmed_to == wal.durable_end
        with pytest.raises(UploadError, match="not running"):
            await uploader.flush()
    assert_all_committed_once(await committed_batches(local_store, shard), producer, shard)


async def test_crash_between_commit_and_trim_uploads_nothing_twice(store, tmp_path):
    shard = Shard()

    async def commit_then_crash(objects: Sequence[UploadedObject]) -> None:
        await shard.commit(objects)
        raise RuntimeError("the proxy died before trimming")

    async with await WriteAheadLog.open(wal_config(tmp_path)) as wal:
        producer = Producer(wal)
        uploader = Uploader(wal, store, commit_then_crash, ObjectIdAllocator(1), config=QUIET)
        async with uploader:
            await producer.produce(rounds=3)
            with pytest.raises(UploadError, match="died"):
                await uploader.flush()
        assert wal.trimmed_to == 0 and len(shard.committed) == 1

    async with await WriteAheadLog.open(wal_config(tmp_path)) as wal:
        assert wal.recovery.entries == 3 * len(STREAMS)  # all of it replays
        producer.wal = wal
        await producer.produce(rounds=2, streams=STREAMS[::2])
        # without the metadata check the replayed entries overlap what is committed
        blind = Uploader(wal, store, shard.commit, ObjectIdAllocator(2), config=QUIET)
        async with blind:
            with pytest.raises(UploadError, match="overlap"):
                await blind.flush()
        assert wal.trimmed_to == 0
        # with it, they are skipped: only the new batches go up, once
        uploader = Uploader(
            wal,
            store,
            shard.commit,
            ObjectIdAllocator(3),
            committed_end=shard.state.stream_end,
            config=QUIET,
        )
        async with uploader:
            await uploader.flush()
            stats = uploader.stats
        assert stats.skipped_entries == 3 * len(STREAMS) and stats.objects == 1
        assert wal.trimmed_to == wal.durable_end
    assert shard.state.refused_count == 0
    assert len(shard.committed) == 2 and len(store.puts) == 3  # the blind one's is an orphan
    assert_all_committed_once(await committed_batches(store, shard), producer, shard)


async def test_restart_at_a_trim_point_inside_an_entry(local_store, tmp_path):
    shard = Shard()
    async with await WriteAheadLog.open(wal_config(tmp_path)) as wal:
        producer = Producer(wal)
        await producer.produce(rounds=1)
        entries = [e async for e in wal.replay()]
        await wal.trim_to(entries[10].position.start + 7)  # trim_to need not cut at an entry
        uploader = Uploader(wal, local_store, shard.commit, ObjectIdAllocator(1), config=QUIET)
        async with uploader:
            await uploader.flush()
        assert wal.trimmed_to == wal.durable_end
    (uploaded,) = shard.committed
    assert {r.stream_id for r in uploaded.ranges} == {e.stream_id for e in entries[10:]}
