"""The uploader never commits an object whose PUT is older than `max_commit_age_s` (half
the orphan sweep's grace, proxy/upkeep/orphan_plan.py): it deletes it and uploads the
data again, so the sweep can never delete an object a slow commit is about to name. On a
real WAL and a real store (the local directory store and MinIO), the uploader's clock
driven by the test: the first PUT "takes" longer than the limit."""

from __future__ import annotations

import pytest
from test_uploader import (
    Producer,
    Shard,
    TestStore,
    assert_all_committed_once,
    committed_batches,
    wal_config,
)

from proxy.objects.local import LocalDirectoryStore
from proxy.upload.uploader import ObjectIdAllocator, Uploader, UploaderConfig
from proxy.wal import WriteAheadLog

LIMIT_S = 30.0


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class SlowFirstPut(TestStore):
    """The first `slow` PUTs end `seconds` later on the uploader's clock."""

    __test__ = False

    def __init__(self, inner, prefix: str, clock: Clock, seconds: float, slow: int = 1) -> None:
        super().__init__(inner, prefix)
        self.clock, self.seconds, self.slow = clock, seconds, slow

    async def create(self, key, data) -> None:
        await super().create(key, data)
        if self.slow:
            self.slow -= 1
            self.clock.now += self.seconds


@pytest.fixture(params=["local", pytest.param("s3", marks=pytest.mark.minio)])
async def inner(request, tmp_path, make_s3_store):
    if request.param == "local":
        async with LocalDirectoryStore(tmp_path / "objects") as local:
            yield local
    else:
        yield await make_s3_store(request.getfixturevalue("s3_server"))


async def upload_once(store: TestStore, clock: Clock, tmp_path) -> tuple[Shard, Producer, Uploader]:
    shard = Shard()
    config = UploaderConfig(upload_bytes=1 << 30, upload_interval_s=600, max_commit_age_s=LIMIT_S)
    wal = await WriteAheadLog.open(wal_config(tmp_path))
    async with wal:
        producer = Producer(wal)
        uploader = Uploader(
            wal, store, shard.commit, ObjectIdAllocator(1), config=config, clock=clock
        )
        async with uploader:
            await producer.produce(rounds=2)
            await uploader.flush()
        assert wal.trimmed_to == wal.durable_end
    return shard, producer, uploader


async def test_a_put_older_than_the_limit_is_uploaded_again_not_committed(
    inner, tmp_path, key_prefix
):
    clock = Clock()
    store = SlowFirstPut(inner, key_prefix, clock, seconds=LIMIT_S + 1)
    shard, producer, uploader = await upload_once(store, clock, tmp_path)
    stale, fresh = store.puts
    assert uploader.stats.late_puts == 1 and uploader.stats.puts == 2
    assert [o.key for o in shard.committed] == [fresh]  # the stale object was never named
    assert [info.key async for info in store.list("")] == [fresh]  # and deleted at once
    assert_all_committed_once(await committed_batches(store, shard), producer, shard)


async def test_a_put_within_the_limit_is_committed(inner, tmp_path, key_prefix):
    clock = Clock()
    store = SlowFirstPut(inner, key_prefix, clock, seconds=LIMIT_S - 1)
    shard, producer, uploader = await upload_once(store, clock, tmp_path)
    assert uploader.stats.late_puts == 0 and [o.key for o in shard.committed] == store.puts
    assert len(store.puts) == 1
    # what the per-shard check in the service's commit reads: the PUT's start + the limit
    assert shard.committed[0].commit_by == 1000.0 + LIMIT_S
    assert_all_committed_once(await committed_batches(store, shard), producer, shard)
