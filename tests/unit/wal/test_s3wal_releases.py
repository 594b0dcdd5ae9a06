"""Prompt deletion of S3-WAL objects by their writer (proxy/handoff/gc.py): an object goes
once every append in it was released (its owner answered, or the append failed), in one
batched delete; an object with an append still held stays; an append cancelled before it
got its location counts as released; a delete that fails is tried again until it succeeds
(the fault suite's MinIO outage is the real test of that). On a LocalDirectoryStore in
tmp_path."""

from __future__ import annotations

import asyncio

from proxy.handoff.gc import S3WalReleases
from proxy.handoff.writer import S3WalWriter
from proxy.objects.local import LocalDirectoryStore
from proxy.objects.store import ObjectStoreError
from tests.support.batches import batch_of_size
from tests.support.waiting import eventually

WRITER = "test-proxy-1700000000000-00c0ffee"


async def keys(store: LocalDirectoryStore) -> set[str]:
    return {info.key async for info in store.list("wal/")}


async def test_an_object_goes_once_every_append_in_it_is_released(tmp_path):
    async with LocalDirectoryStore(tmp_path) as store:
        writer = S3WalWriter(store, WRITER, max_delay_s=0.05, delete_delay_s=0.05)
        async with writer:
            first = await asyncio.gather(*(writer.append(s, batch(s)) for s in (1, 2, 3)))
            second = await asyncio.gather(*(writer.append(s, batch(s)) for s in (4, 5)))
            [one], [two] = {x.object_key for x in first}, {x.object_key for x in second}
            assert one != two and await keys(store) == {one, two}
            for location in first[:2] + second:
                writer.release(location)
            await eventually(lambda: _gone(store, two))
            assert await keys(store) == {one}  # its third append is still held
            assert writer.releases.held == 1
            writer.release(first[2])
            await eventually(lambda: _gone(store, one))
            writer.release(first[2])  # once too often: ignored
        assert writer.metrics.value("tierproxy_s3wal_objects_deleted_total") == 2


async def _gone(store: LocalDirectoryStore, key: str) -> bool:
    return key not in await keys(store)


async def test_an_object_whose_appends_are_not_all_released_stays(tmp_path):
    async with LocalDirectoryStore(tmp_path) as store:
        writer = S3WalWriter(store, WRITER, max_delay_s=0.05, delete_delay_s=0.01)
        async with writer:
            locations = await asyncio.gather(*(writer.append(s, batch(s)) for s in (1, 2)))
            writer.release(locations[0])
            await asyncio.sleep(0.2)
        # closed with an append still held: left for the orphan sweep's retention
        assert await keys(store) == {locations[0].object_key}
        assert writer.metrics.value("tierproxy_s3wal_objects_deleted_total") == 0


async def test_an_append_cancelled_before_its_put_counts_as_released(tmp_path):
    async with LocalDirectoryStore(tmp_path) as store:
        writer = S3WalWriter(store, WRITER, max_delay_s=0.1, delete_delay_s=0.01)
        async with writer:
            kept = asyncio.ensure_future(writer.append(1, batch(1)))
            dropped = asyncio.ensure_future(writer.append(2, batch(2)))
            await asyncio.sleep(0.01)
            dropped.cancel()  # its producer went away: no one will release it
            location = await kept
            assert await keys(store) == {location.object_key}
            writer.release(location)
            await eventually(lambda: _gone(store, location.object_key))


async def test_releases_batch_their_deletes(tmp_path):
    deletes: list[list[str]] = []

    class Counting(LocalDirectoryStore):
        async def delete(self, keys):
            deletes.append(list(keys))
            await super().delete(keys)

    async with Counting(tmp_path) as store:
        releases = S3WalReleases(store, delay_s=0.05, batch=3)
        for n in range(4):
            releases.hold(f"wal/k{n}", appends=1)
        for n in range(4):
            releases.release(f"wal/k{n}")
        await releases.close()
    assert deletes == [["wal/k0", "wal/k1", "wal/k2"], ["wal/k3"]]


async def test_a_failed_delete_is_tried_again_until_it_succeeds(tmp_path):
    # The store down longer than its own retries (the fault suite's MinIO outage): the
    # orphan sweep leaves a running writer's objects alone, so the writer must not give up.
    failures = 2
    attempts: list[list[str]] = []

    class Down(LocalDirectoryStore):
        async def delete(self, keys):
            attempts.append(list(keys))
            if len(attempts) <= failures:
                raise ObjectStoreError(None, "delete", "connection refused", retryable=True)
            await super().delete(keys)

    async with Down(tmp_path) as store:
        await store.put("wal/k0", b"x")
        deleted: list[int] = []
        releases = S3WalReleases(store, delay_s=0.01, on_deleted=deleted.append)
        releases.hold("wal/k0", appends=1)
        releases.release("wal/k0")
        await eventually(lambda: deleted == [1])
        assert await _gone(store, "wal/k0")
        assert attempts == [["wal/k0"]] * (failures + 1) and deleted == [1]
        await releases.close()


async def test_a_delete_failing_as_the_writer_closes_is_left_to_the_sweep(tmp_path):
    attempts: list[list[str]] = []

    class Down(LocalDirectoryStore):
        async def delete(self, keys):
            attempts.append(list(keys))
            raise ObjectStoreError(None, "delete", "connection refused", retryable=True)

    async with Down(tmp_path) as store:
        releases = S3WalReleases(store, delay_s=10.0)
        releases.hold("wal/k0", appends=1)
        releases.release("wal/k0")
        await releases.close()  # deletes what is due at once, and tries no more
        assert attempts == [["wal/k0"]]
        await asyncio.sleep(0.05)
        assert attempts == [["wal/k0"]]


async def test_deletes_failing_for_long_are_retried_on_and_bounded(tmp_path, monkeypatch):
    # a store refusing deletes for good (permissions): retried past a thousand failures
    # (the backoff's exponent bounded), and at most MAX_RETRYING keys kept, the newest
    monkeypatch.setattr("proxy.handoff.gc.RETRY_MAX_S", 0.0005)
    monkeypatch.setattr("proxy.handoff.gc.MAX_RETRYING", 2)
    attempts: list[list[str]] = []

    class Refusing(LocalDirectoryStore):
        async def delete(self, keys):
            attempts.append(list(keys))
            raise ObjectStoreError(None, "delete", "AccessDenied")

    async with Refusing(tmp_path) as store:
        releases = S3WalReleases(store, delay_s=0.0001)
        for n in range(3):
            releases.hold(f"wal/k{n}", appends=1)
            releases.release(f"wal/k{n}")
        await eventually(lambda: len(attempts) > 1100, timeout_s=30)
        assert attempts[0] == ["wal/k0", "wal/k1", "wal/k2"]
        assert attempts[-1] == ["wal/k1", "wal/k2"]
        await releases.close()


def batch(fill: int, size: int = 200) -> bytes:
    return batch_of_size(size, fill)
