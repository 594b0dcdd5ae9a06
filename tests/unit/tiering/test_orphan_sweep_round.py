"""One round of the orphan sweep (proxy/upkeep/orphan_sweep.py) on a LocalDirectoryStore
(file mtimes set back to age objects) against a real `MetadataState`: it deletes what
no shard names past the grace, keeps what a shard names, skips the round when the
metadata cannot be read to its end, and keeps an offload object PUT again since it was
listed (a job run again); a failed round leaves the schedule running, on the sweeper only."""

from __future__ import annotations

import asyncio
import os
import time
from uuid import UUID

import pytest

from proxy.metadata.codec import encode
from proxy.metadata.records import ObjectCommit, OffsetRange, ShardClaim, StreamCutover
from proxy.metadata.state import MetadataState
from proxy.metadata.streams import OFFLOAD_ID_BIT, stream_id
from proxy.objects.keys import ObjectKind, object_key
from proxy.objects.local import LocalDirectoryStore
from proxy.objects.store import ObjectStoreError
from proxy.upkeep import orphan_sweep
from proxy.upkeep.orphan_plan import SweepLimits
from proxy.upkeep.orphan_sweep import OrphanSweep

TOPIC = UUID("5b1c2d3e-4f50-4617-8293-a4b5c6d7e8f9")
STREAM = stream_id(TOPIC, 0)
NOW_MS = 1_700_000_000_000
LIMITS = SweepLimits(orphan_grace_s=100.0, offload_grace_s=1000.0, s3wal_retention_s=100.0)
COMMITTED = 1
ORPHAN, YOUNG = 2, 3
OFFLOAD = OFFLOAD_ID_BIT | 5


def shard_naming(object_id: int) -> MetadataState:
    state = MetadataState(0, 1)
    records = [
        ShardClaim(0, 1, "proxy-a", NOW_MS),
        StreamCutover(0, STREAM, 1, 1, TOPIC, 0, 0, 0, 0, NOW_MS),
        ObjectCommit(
            0, object_id, ObjectKind.STREAM_SET, 10, 1, NOW_MS, (OffsetRange(STREAM, 0, 5),)
        ),
    ]
    for record in records:
        key, value = encode(record)
        assert state.apply(key, value, state.next_offset).accepted
    return state


def key_of(object_id: int) -> str:
    kind = ObjectKind.STREAM if object_id & OFFLOAD_ID_BIT else ObjectKind.STREAM_SET
    return object_key(object_id, kind)


async def put_aged(store: LocalDirectoryStore, root, object_id: int, age_s: float) -> str:
    key = key_of(object_id)
    await store.put(key, b"0123456789")
    then = time.time() - age_s
    os.utime(root.joinpath(*key.split("/")), (then, then))
    return key


def sweep(
    store, state: MetadataState, read_to_end=None, is_sweeper=lambda: True, interval_s=60.0
) -> OrphanSweep:
    async def caught_up(shard: int) -> None:
        return None

    return OrphanSweep(
        store,
        1,
        state_of=lambda k: state,
        read_to_end=read_to_end or caught_up,
        is_sweeper=is_sweeper,
        limits=LIMITS,
        interval_s=interval_s,
    )


async def listed(store) -> set[str]:
    return {info.key async for info in store.list("")}


async def test_a_round_deletes_only_unnamed_objects_past_their_grace(tmp_path):
    async with LocalDirectoryStore(tmp_path) as store:
        committed = await put_aged(store, tmp_path, COMMITTED, 1e6)
        orphan = await put_aged(store, tmp_path, ORPHAN, 101.0)
        young = await put_aged(store, tmp_path, YOUNG, 90.0)
        offload = await put_aged(store, tmp_path, OFFLOAD, 500.0)
        s = sweep(store, shard_naming(COMMITTED))
        result = await s.run_once()
        assert result is not None and result.deleted == (orphan,)
        assert await listed(store) == {committed, young, offload}
        assert s.metrics.value("tierproxy_orphan_bytes_swept_total", kind="stream") == 10
        assert s.metrics.value("tierproxy_orphan_sweeps_total", outcome="done") == 1


async def test_a_round_is_skipped_when_the_metadata_is_not_read_to_its_end(tmp_path, monkeypatch):
    monkeypatch.setattr(orphan_sweep, "CATCH_UP_TIMEOUT_S", 0.05)

    async def stuck(shard: int) -> None:
        await asyncio.Event().wait()

    async with LocalDirectoryStore(tmp_path) as store:
        orphan = await put_aged(store, tmp_path, ORPHAN, 1e6)
        s = sweep(store, shard_naming(COMMITTED), read_to_end=stuck)
        assert await s.run_once() is None
        assert await listed(store) == {orphan}
        assert s.metrics.value("tierproxy_orphan_sweeps_total", outcome="skipped") == 1


@pytest.mark.parametrize("put_again", [False, True])
async def test_an_offload_object_put_again_since_the_listing_stays(tmp_path, put_again):
    class RerunBetween(LocalDirectoryStore):
        """A job runs again between the sweep's listing and its last look at the key."""

        async def list(self, prefix: str = ""):
            if put_again and prefix == key_of(OFFLOAD):
                await self.put(prefix, b"0123456789")  # mtime: now
            async for info in super().list(prefix):
                yield info

    async with RerunBetween(tmp_path) as store:
        offload = await put_aged(store, tmp_path, OFFLOAD, 2000.0)
        result = await sweep(store, shard_naming(COMMITTED)).run_once()
        assert result is not None
        assert result.deleted == (() if put_again else (offload,))
        assert (offload in await listed(store)) is put_again


async def test_the_schedule_survives_a_failed_round_and_runs_only_on_the_sweeper(tmp_path):
    class Down(LocalDirectoryStore):
        async def list(self, prefix: str = ""):
            raise ObjectStoreError(prefix, "list", "injected: the store is down")
            yield  # an async generator, like the stores'

    async with Down(tmp_path) as store:
        sweeper = {"now": False}
        s = sweep(
            store, shard_naming(COMMITTED), is_sweeper=lambda: sweeper["now"], interval_s=0.01
        )
        task = asyncio.create_task(s.run())
        await asyncio.sleep(0.1)
        assert s.metrics.value("tierproxy_orphan_sweeps_total", outcome="failed") == 0
        sweeper["now"] = True
        await asyncio.sleep(0.1)
        assert s.metrics.value("tierproxy_orphan_sweeps_total", outcome="failed") >= 2
        assert not task.done()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
