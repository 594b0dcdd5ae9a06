"""A late PUT against the owner's S3 WAL (`wal.mode: s3`, proxy/wal/s3log.py; docs/wal.md,
"Late PUTs"), reproduced deterministically on MinIO and on the local store: a log's PUT is
held in flight (the real request, only delayed: what a killed process leaves behind),
the log is opened again on the same prefix as a restarted proxy does, and the held PUT is
let go before the restarted log opens, between its open and its first PUT, or after it.
In every order nothing the restarted log (or the old one, before its PUT) acknowledged is
lost, and the late object is either replayed as the log's unacknowledged tail or never."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from aiobotocore.session import get_session
from test_s3wal import s3_config

from proxy.objects.local import LocalDirectoryStore
from proxy.objects.s3 import S3Store
from proxy.objects.store import ObjectExists, ObjectStore
from proxy.wal.s3log import S3WalConfig, S3WriteAheadLog
from proxy.wal.s3log_objects import log_prefix
from proxy.wal.types import WalBrokenError


def batch(tag: int, size: int = 300) -> bytes:
    return bytes([tag]) * size  # the WAL never looks inside a batch


class HeldCreates:
    """The real store; once `hold` is set, a create waits for `release` before it goes
    out, and `landed` tells how it ended (None: the object is there)."""

    def __init__(self, inner: ObjectStore) -> None:
        self.inner = inner
        self.hold = False
        self.held = asyncio.Event()
        self.release = asyncio.Event()
        self.landed: asyncio.Future[BaseException | None] = (
            asyncio.get_running_loop().create_future()
        )

    async def create(self, key: str, data: Any) -> None:
        if self.hold:
            self.held.set()
            await self.release.wait()
            try:
                await self.inner.create(key, data)
            except BaseException as exc:
                self.landed.set_result(exc)
                raise
            self.landed.set_result(None)
            return
        await self.inner.create(key, data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


@pytest.fixture(params=["local", pytest.param("minio", marks=pytest.mark.minio)])
async def open_store(request, tmp_path) -> AsyncIterator[Callable[[], Awaitable[Any]]]:
    """Opens another store on the same objects (another process's client)."""
    opened: list[Any] = []
    if request.param == "local":

        async def open_local() -> Any:
            opened.append(LocalDirectoryStore(tmp_path / "objects"))
            return opened[-1]

        yield open_local
    else:
        server = request.getfixturevalue("s3_server")
        config = s3_config(server)
        session = get_session()

        async def open_s3() -> Any:
            opened.append(await S3Store.open(config, session=session))
            return opened[-1]

        yield open_s3
    for store in opened:
        await store.close()


@pytest.mark.parametrize("lands", ["before_the_restart", "before_its_first_put", "after_it"])
async def test_a_late_put_of_a_killed_log_loses_nothing_acknowledged(open_store, lands):
    config = S3WalConfig(log_prefix(f"late-{uuid.uuid4().hex[:8]}"))
    old_store = HeldCreates(await open_store())
    old = await S3WriteAheadLog.open(config, old_store)
    acknowledged = [(1, 0, batch(1)), (2, 0, batch(2))]
    for stream, offset, data in acknowledged:
        await old.append(stream, offset, data)
    old_store.hold = True
    late = asyncio.create_task(old.append(1, 1, batch(99)))  # never acknowledged to anyone
    await old_store.held.wait()
    # the old process is killed here, its PUT in flight; the proxy restarts on the prefix
    if lands == "before_the_restart":
        old_store.release.set()
        assert await old_store.landed is None
    new_store = await open_store()
    new = await S3WriteAheadLog.open(config, new_store)
    replayed = [(e.stream_id, e.base_offset, bytes(e.batch)) async for e in new.replay()]
    if lands == "before_the_restart":  # found by the open: the log's unacknowledged tail
        assert replayed == [*acknowledged, (1, 1, batch(99))]
        ours = (1, 2, batch(3))  # the partition goes on after what it replayed
    else:
        assert replayed == acknowledged
        ours = (1, 1, batch(3))  # the same stream offset the late PUT holds
    if lands == "before_its_first_put":
        old_store.release.set()
        assert await old_store.landed is None  # at the key the restarted log writes next
        with pytest.raises(WalBrokenError, match="ObjectExists"):
            await new.append(*ours)  # not acknowledged: its producer retries
        await new.close()
        # restarted once more: the late object is the log's unacknowledged tail
        new = await S3WriteAheadLog.open(config, await open_store())
        replayed = [(e.stream_id, e.base_offset, bytes(e.batch)) async for e in new.replay()]
        acknowledged.append((1, 1, batch(99)))
        assert replayed == acknowledged
        ours = (1, 2, batch(3))
    await new.append(*ours)
    acknowledged.append(ours)
    if lands == "after_it":
        old_store.release.set()
        assert isinstance(await old_store.landed, ObjectExists)  # fenced
        with pytest.raises(WalBrokenError):
            await late
    await new.append(2, 1, batch(4))
    acknowledged.append((2, 1, batch(4)))
    await new.close()
    await asyncio.gather(late, return_exceptions=True)
    await old.close()

    again = await S3WriteAheadLog.open(config, await open_store())
    try:
        replayed = [(e.stream_id, e.base_offset, bytes(e.batch)) async for e in again.replay()]
        if lands == "before_the_restart":
            acknowledged.insert(2, (1, 1, batch(99)))
        assert replayed == acknowledged
        assert again.recovery.leftovers_deleted == 0
    finally:
        await again.trim_to(again.durable_end)
        await again.close()
        await again._store.delete([o.path for o in again.segments])
