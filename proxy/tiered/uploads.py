"""The tiered service's uploader (docs/tiering.md, "Upload"): one `Uploader` over the
WAL at a time, started again a moment after it stops (its error is in the log), whose
objects are committed by the owners of their streams' shards, here.

It also answers the group's release of a shard (`release`): a shard is handed over
cleanly only once everything acknowledged for it is committed.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from typing import Protocol

from proxy.clock import now_ms
from proxy.config.tiering import TieringConfig
from proxy.metadata.records import ObjectCommit
from proxy.metadata.state import MetadataState
from proxy.metadata.store import ShardOwner
from proxy.metadata.streams import shard_of
from proxy.objects.store import ObjectStore
from proxy.reads.logcache import LogCache
from proxy.upkeep.orphan_plan import commit_age_limit
from proxy.upload.plan import ObjectIdAllocator
from proxy.upload.uploader import (
    CommitRefused,
    Stale,
    UploadedObject,
    Uploader,
    UploaderConfig,
)
from proxy.wal.port import Log
from proxy.wal.types import WalEntry

log = logging.getLogger("tierproxy.tiering")

COMMIT_OWNER_WAIT_S = 30.0  # an upload during a rebalance waits this long for the owners
UPLOADER_RESTART_S = 1.0


def uploader_config(config: TieringConfig) -> UploaderConfig:
    """The uploader's settings from the `tiering` section."""
    return UploaderConfig(
        upload_bytes=config.upload_bytes,
        upload_interval_s=config.upload_interval_s,
        max_commit_age_s=commit_age_limit(config.orphan_grace_s),
        object_format_version=config.object_format_version,
    )


class UploadsHost(Protocol):
    """What the uploads need of the tiered service."""

    @property
    def config(self) -> TieringConfig: ...

    @property
    def log_cache(self) -> LogCache: ...

    def state(self, stream: int) -> MetadataState: ...

    def shard_owner(self, shard: int) -> ShardOwner | None: ...


class UploadLoop:
    def __init__(
        self,
        service: UploadsHost,
        wal: Log,
        store: ObjectStore,
        allocate: ObjectIdAllocator,
        stale: Stale | None = None,
    ) -> None:
        self._service, self._wal, self._store, self._allocate = service, wal, store, allocate
        self._stale = stale  # WAL entries never to upload (PartitionSet.stale)
        self.uploader: Uploader | None = None  # the current one

    def _skipped(self, entry: WalEntry) -> bool:
        """A WAL entry never to upload: stale (`PartitionSet.stale`), or of a stream the
        metadata of a shard owned here no longer has (untiered, or its topic deleted in
        Kafka: its entries past the committed end are dropped with it; the owner would
        refuse their commit and the uploader would stop on it again and again)."""
        if self._stale is not None and self._stale(entry):
            return True
        stream = entry.stream_id
        owner = self._service.shard_owner(shard_of(stream, self._service.config.shard_count))
        return owner is not None and owner.state.stream(stream) is None

    async def run(self) -> None:
        """Run an uploader, and another once it stops, until cancelled."""
        service = self._service
        config = uploader_config(service.config)
        while True:
            self.uploader = Uploader(
                self._wal,
                self._store,
                self.commit,
                self._allocate,
                committed_end=lambda stream: service.state(stream).stream_end(stream),
                stale=self._skipped,
                config=config,
            )
            self.uploader.start()
            error = await self.uploader.stopped()
            log.warning("uploader stopped (%s); restarting in %s s", error, UPLOADER_RESTART_S)
            await asyncio.sleep(UPLOADER_RESTART_S)

    async def close(self) -> None:
        if self.uploader is not None:
            await self.uploader.close()

    async def release(self, shard: int) -> bool:
        """Whether everything acknowledged for the shard is committed: upload it now."""
        uploader = self.uploader
        if uploader is None or uploader.failed is not None:
            return False
        try:
            async with asyncio.timeout(self._service.config.session_timeout_ms / 1000):
                await uploader.flush()
        except Exception as exc:
            log.warning("shard %d handed over uncleanly: the upload failed: %r", shard, exc)
            return False
        return True

    async def commit(self, objects: Sequence[UploadedObject]) -> None:
        """One ObjectCommit per (object, shard), written by that shard's owner here."""
        by_shard: dict[int, list[tuple[UploadedObject, tuple]]] = {}
        for uploaded in objects:
            for shard, ranges in uploaded.ranges_by_shard(self._service.config.shard_count).items():
                by_shard.setdefault(shard, []).append((uploaded, ranges))
        for shard, items in sorted(by_shard.items()):
            owner = await self._owner_for_commit(shard)
            if time.monotonic() > min(o.commit_by for o, _ in items):
                # the orphan sweep may delete it now: the restarted uploader uploads again
                raise CommitRefused(f"shard {shard}: the objects' PUT is too old to commit")
            now = now_ms()
            commits = [
                ObjectCommit(
                    owner.state.generation, o.object_id, o.kind, o.size, owner.epoch, now, ranges
                )
                for o, ranges in items
            ]
            for verdict in await owner.write(commits):
                if verdict.outcome.value == "refuse":
                    raise CommitRefused(f"shard {shard}: {verdict.reason}")
            for _, ranges in items:  # the log cache may let these go now
                for r in ranges:
                    self._service.log_cache.uploaded(r.stream_id, r.end_offset)

    async def _owner_for_commit(self, shard: int) -> ShardOwner:
        deadline = time.monotonic() + COMMIT_OWNER_WAIT_S
        while (owner := self._service.shard_owner(shard)) is None:
            if time.monotonic() > deadline:
                raise CommitRefused(f"shard {shard} is not owned here")
            await asyncio.sleep(0.1)
        return owner
