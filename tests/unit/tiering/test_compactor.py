"""The compactor's passes and deletes (proxy/upkeep/compactor.py, object_gc.py) against a
local directory store, real objects of real Kafka batches and real metadata states; the
shard's owner is a stand-in that judges and applies records as ShardOwner.write does.

What it shows: a stream's bytes in the new stream object are its batches exactly; the
replaced objects leave the store only after the grace and only once no shard naming them
uses them; a refused commit's object is deleted at once; a commit whose outcome is not
known is settled from the shard's records after the grace."""

from __future__ import annotations

from uuid import UUID

import pytest
from prometheus_client import CollectorRegistry

from proxy.metadata.codec import encode
from proxy.metadata.records import (
    ObjectCommit,
    OffsetRange,
    ShardClaim,
    StreamCutover,
    StreamTrim,
)
from proxy.metadata.state import MetadataState
from proxy.metadata.store import ShardFenced
from proxy.metadata.streams import shard_of, stream_id
from proxy.objects.format import FORMAT_VERSION, read_block, read_object
from proxy.objects.format_writer import ObjectWriter
from proxy.objects.keys import ObjectKind, object_key
from proxy.objects.local import LocalDirectoryStore
from proxy.objects.store import ObjectNotFound
from proxy.records.batches import with_base_offset
from proxy.upkeep.compaction_plan import CompactionSettings
from proxy.upkeep.compactor import Compactor
from tests.support.batches import NOW_MS, build_batch
from tests.support.owners import Owner

TOPIC = UUID("6ba7b810-9dad-41d1-80b4-00c04fd430c8")
SETTINGS = CompactionSettings(
    small_object_bytes=1 << 20, stream_object_bytes=1 << 22, min_objects=2
)
GRACE = 10.0


def kafka_batch(n: int, records: int = 3) -> bytes:
    return build_batch([b"%d-%d" % (n, i) for i in range(records)], timestamps=[NOW_MS] * records)


class Ids:
    """Object ids from 5001 up, as ObjectIdAllocator hands them out; `collided` moves to
    another writer's ids, as it does."""

    def __init__(self) -> None:
        self.writer, self.last = 0, 5000

    def __call__(self) -> int:
        self.last += 1
        return self.last

    def collided(self) -> None:
        self.writer += 1
        self.last = (self.writer << 32) - 1


class Fleet:
    """`shard_count` shards, shard 0 owned here; one stream per shard; uploads of stream
    set objects spanning the streams of `upload_shards`, put in the store and committed
    in each shard they touch."""

    def __init__(self, tmp_path, shard_count: int = 1) -> None:
        self.store = LocalDirectoryStore(tmp_path / "objects")
        self.states = [MetadataState(k, shard_count) for k in range(shard_count)]
        self.streams: list[int] = []
        for shard in range(shard_count):
            self.apply(shard, ShardClaim(0, 1, "proxy-a", 1))
            partition = next(
                p for p in range(100) if shard_of(stream_id(TOPIC, p), shard_count) == shard
            )
            s = stream_id(TOPIC, partition)
            self.apply(shard, StreamCutover(0, s, 1, 1, TOPIC, partition, 0, 0, 0, 1))
            self.streams.append(s)
        self.owner = Owner(self.states[0])
        self.batches: dict[int, list[bytes]] = {s: [] for s in self.streams}
        self.now = 1000.0
        self.forgotten: list[str] = []
        self.ids = Ids()
        self.registry = CollectorRegistry()
        self.compactor = Compactor(
            self.store,
            shard_count,
            owner_of=lambda k: self.owner if k == 0 else None,
            state_of=lambda k: self.states[k],
            read_to_end=self._read_to_end,
            allocate=self.ids,
            settings=SETTINGS,
            grace_s=GRACE,
            forget=self.forgotten.append,
            registry=self.registry,
            clock=lambda: self.now,
        )

    async def _read_to_end(self, shard: int) -> None:
        return None

    def apply(self, shard: int, record) -> None:
        state = self.states[shard]
        assert state.apply(*encode(record), state.next_offset).accepted

    async def upload(
        self, number: int, shards: tuple[int, ...] = (0,), *, version: int = FORMAT_VERSION
    ) -> str:
        writer = ObjectWriter(number, ObjectKind.STREAM_SET, version=version)
        ranges = {}
        for shard in shards:
            s = self.streams[shard]
            end = self.states[shard].stream_end(s)
            batch = with_base_offset(kafka_batch(number), end)
            self.batches[s].append(bytes(batch))
            writer.add_batches(s, batch)
            ranges[shard] = OffsetRange(s, end, end + 3)
        built = writer.build()
        await self.store.put(built.key, built.pieces)
        for shard, r in ranges.items():
            commit = ObjectCommit(0, number, ObjectKind.STREAM_SET, built.size, 1, number, (r,))
            self.apply(shard, commit)
        return built.key

    async def exists(self, key: str) -> bool:
        try:
            await self.store.size(key)
        except ObjectNotFound:
            return False
        return True

    def metric(self, name: str) -> float:
        return self.registry.get_sample_value(name) or 0.0


@pytest.fixture
async def fleet(tmp_path):
    made: list[Fleet] = []

    def make(shard_count: int = 1) -> Fleet:
        made.append(Fleet(tmp_path / str(len(made)), shard_count))
        return made[-1]

    yield make
    for f in made:
        await f.compactor.close()
        await f.store.close()


async def test_a_pass_rewrites_the_batches_verbatim_and_deletes_after_the_grace(fleet):
    f = fleet()
    keys = [await f.upload(n) for n in range(1, 6)]
    [s] = f.streams
    [result] = await f.compactor.run_once()
    assert result.replaced == (1, 2, 3, 4, 5) and len(result.written) == 1
    [r] = f.owner.state.committed_ranges(s)
    assert (r.start_offset, r.end_offset, r.object_kind) == (0, 15, ObjectKind.STREAM)
    data = await f.store.get(r.object_key)
    _, index = read_object(data, r.object_key)
    assert b"".join(bytes(read_block(data, e, r.object_key)) for e in index) == b"".join(
        f.batches[s]
    )
    assert len(index) == 1  # the five small blocks joined
    assert f.metric("tierproxy_compactions_total") == 1
    assert f.metric("tierproxy_compaction_bytes_written_total") == r.object_size
    # not before the grace
    assert await f.compactor.collect_garbage() == []
    f.now += GRACE - 0.1
    assert await f.compactor.collect_garbage() == []
    assert all([await f.exists(k) for k in keys])
    f.now += 0.2
    assert sorted(await f.compactor.collect_garbage()) == [1, 2, 3, 4, 5]
    assert not any([await f.exists(k) for k in keys])
    assert f.owner.state.garbage_objects() == []
    assert f.owner.state.image()["deleted"] == [1, 2, 3, 4, 5]
    assert sorted(f.forgotten) == sorted(keys)
    assert f.metric("tierproxy_compaction_objects_deleted_total") == 5
    assert f.registry.get_sample_value("tierproxy_shard_objects", {"shard": "0"}) == 1


async def test_an_object_used_by_another_shard_stays_until_that_shard_replaced_it(fleet):
    f = fleet(shard_count=2)
    keys = [await f.upload(n, shards=(0, 1)) for n in range(1, 4)]
    [result] = await f.compactor.run_once()
    assert result.replaced == (1, 2, 3)
    assert [c.object_id for c in f.owner.state.garbage_objects()] == [1, 2, 3]
    f.now += 2 * GRACE
    assert await f.compactor.collect_garbage() == []  # shard 1 still reads them
    assert all([await f.exists(k) for k in keys])
    # shard 1's owner (elsewhere) compacts its part: from then on the grace runs
    s1 = f.streams[1]
    f.apply(1, ObjectCommit(0, 9000, ObjectKind.STREAM, 100, 1, 9, (OffsetRange(s1, 0, 9),),
                            (1, 2, 3)))  # fmt: skip
    assert await f.compactor.collect_garbage() == []
    f.now += GRACE
    assert sorted(await f.compactor.collect_garbage()) == [1, 2, 3]
    assert not any([await f.exists(k) for k in keys])
    assert f.states[1].object_commit(1) is not None  # shard 1 writes its own delete


async def test_an_object_a_shard_does_not_know_yet_is_kept(fleet):
    f = fleet(shard_count=2)
    keys = [await f.upload(n, shards=(0,)) for n in range(1, 3)]
    # an upload spanning both shards whose commit in shard 1 has not come (yet)
    writer = ObjectWriter(3, ObjectKind.STREAM_SET)
    s0, s1 = f.streams
    writer.add_batches(s0, with_base_offset(kafka_batch(3), 6))
    writer.add_batches(s1, with_base_offset(kafka_batch(3), 0))
    built = writer.build()
    await f.store.put(built.key, built.pieces)
    f.apply(
        0, ObjectCommit(0, 3, ObjectKind.STREAM_SET, built.size, 1, 3, (OffsetRange(s0, 6, 9),))
    )
    await f.compactor.run_once()
    f.now += 3 * GRACE
    assert await f.compactor.collect_garbage() == []  # seen garbage everywhere from now
    f.now += GRACE
    assert sorted(await f.compactor.collect_garbage()) == [1, 2]
    assert await f.exists(built.key) and not any([await f.exists(k) for k in keys])
    # it is gone from the store (shard 1's owner deleted it): the delete is written here
    await f.store.delete([built.key])
    f.now += GRACE
    assert await f.compactor.collect_garbage() == [3]


async def test_a_key_taken_by_another_process_gets_a_new_id_and_is_left_alone(fleet):
    """Another process drew the same object id writer and holds the next id's key: the
    create fails, a new writer is drawn, the object is written again under a new id and
    committed; the other process's object is left as it was, and named by nothing."""
    f = fleet()
    for n in range(1, 4):
        await f.upload(n)
    [s] = f.streams
    taken = object_key(5001, ObjectKind.STREAM)
    await f.store.put(taken, b"another process's object")
    [result] = await f.compactor.run_once()
    assert result.replaced == (1, 2, 3) and len(result.written) == 1
    [r] = f.owner.state.committed_ranges(s)
    assert r.object_id == f.ids.last == 1 << 32  # the new writer's first id
    data = await f.store.get(r.object_key)
    _, index = read_object(data, r.object_key)
    assert b"".join(bytes(read_block(data, e, r.object_key)) for e in index) == b"".join(
        f.batches[s]
    )
    assert await f.store.get(taken) == b"another process's object"
    assert f.compactor.stats.id_collisions == 1
    assert [c.object_id for c in f.owner.written if isinstance(c, ObjectCommit)] == [1 << 32]


async def test_a_refused_commit_deletes_its_new_object(fleet):
    f = fleet()
    for n in range(1, 4):
        await f.upload(n)
    [s] = f.streams
    f.owner.before_write = lambda: f.apply(0, StreamTrim(0, s, 1, 3, 1, 7))  # a racing trim
    [result] = await f.compactor.run_once()
    assert (result.written, result.failed) == ((), 1)
    new_key = object_key(f.ids.last, ObjectKind.STREAM)
    assert not await f.exists(new_key)
    assert [r.object_id for r in f.owner.state.committed_ranges(s)] == [2, 3]
    assert f.metric("tierproxy_compaction_failures_total") == 1


async def test_a_commit_of_unknown_outcome_is_settled_after_the_grace(fleet):
    f = fleet()
    for n in range(1, 4):
        await f.upload(n)
    f.owner.fail = ShardFenced(0, "claimed by another")
    [result] = await f.compactor.run_once()
    assert result.failed == 1
    new_key = object_key(f.ids.last, ObjectKind.STREAM)
    assert await f.exists(new_key)  # it may have been committed: not deleted yet
    f.owner.fail = None
    await f.compactor.collect_garbage()
    assert await f.exists(new_key)
    f.now += GRACE
    await f.compactor.collect_garbage()
    assert not await f.exists(new_key)  # the shard's records do not name it


async def test_a_commit_of_unknown_outcome_that_landed_is_kept(fleet):
    f = fleet()
    for n in range(1, 4):
        await f.upload(n)
    real = f.owner.write

    async def lost_answer(records):
        await real(records)  # written, but the answer is lost
        raise ShardFenced(0, "its transaction failed at commit")

    f.owner.write = lost_answer
    [result] = await f.compactor.run_once()
    assert result.failed == 1
    f.owner.write = real
    f.now += GRACE
    await f.compactor.collect_garbage()
    [r] = f.owner.state.committed_ranges(f.streams[0])
    assert r.object_id == f.ids.last and await f.exists(r.object_key)


async def test_a_shard_handed_over_while_its_deletes_are_written_is_no_error(fleet, caplog):
    """The shard is released (a rebalance: a member came back after a restart) between
    the deletes from the store and the ObjectDelete write: the pass goes on quietly (the
    compaction loop logged "compaction pass failed" at ERROR for it); the objects are
    gone from the store, and the next pass of an owner writes their deletes."""
    f = fleet()
    keys = [await f.upload(n) for n in range(1, 4)]
    await f.compactor.run_once()
    assert await f.compactor.collect_garbage() == []  # the grace starts
    f.now += GRACE + 0.1
    f.owner.fail = ShardFenced(0, "no longer its owner: released")
    assert await f.compactor.collect_garbage() == []
    assert not any([await f.exists(k) for k in keys])
    assert [r.levelname for r in caplog.records] == ["WARNING"]
    f.owner.fail = None
    assert sorted(await f.compactor.collect_garbage()) == [1, 2, 3]
    assert f.owner.state.garbage_objects() == []
