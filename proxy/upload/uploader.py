"""The uploader: WAL data to the object store, committed, then trimmed (docs/uploader.md).

One task owns the uploader's state (STYLE.md rule 3). It waits for a trigger (the WAL
holds `upload_bytes` not yet uploaded, or its oldest such byte is `upload_interval_s`
old, or someone calls `flush`), reads the WAL from where it got to, plans objects
(`upload_plan.py`), PUTs them, hands them to `commit`, and only then trims the WAL. At
most one upload is in flight and uploads start at least `min_upload_interval_s` apart, so
the PUT rate is bounded whatever the number of partitions.

- Objects are created exclusively (`store.create`): a late PUT never replaces anything.
  A failed create (the store has already retried) is retried, same objects and same
  keys, after a backoff, until it succeeds or the uploader is closed. Nothing is trimmed.
- A create that finds its key taken (`ObjectExists`: another process drew the same
  object id writer, or an earlier failed create of ours landed after all) draws a new
  writer (`ObjectIdAllocator.collided`) and creates that object again, at once, under a
  new id. The object met is left alone and never committed by this uploader (one of
  ours is an orphan the sweep deletes).
- A commit that raises (refused, fenced, unknown outcome) stops the uploader with
  `UploadError`: nothing is trimmed, the data stays in the WAL.
- An object whose PUT started more than `max_commit_age_s` ago (half the orphan sweep's
  grace, orphan_plan.py) is not committed: the sweep may take it for an orphan. It is
  deleted and its data uploaded again, in new objects (the WAL still holds it).
- After a restart the uploader starts at `wal.trimmed_to`. Entries a crash left between
  commit and trim are skipped by `committed_end(stream)`, the stream's committed end in
  the metadata, so nothing is uploaded twice.
- Entries `stale(entry)` names (written under an ownership of their stream that another
  member's took over uncleanly since: `PartitionSet.disown`) are skipped and trimmed,
  never uploaded: the log of their stream went on without them.
"""

from __future__ import annotations

import asyncio
import bisect
import logging
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace

from proxy.objects.format_writer import BuiltObject
from proxy.objects.keys import ObjectKind
from proxy.objects.store import ObjectExists, ObjectStore, ObjectStoreError
from proxy.upload.config import UploaderConfig, UploaderStats
from proxy.upload.plan import (
    ObjectIdAllocator,
    UploadedObject,
    UploadPlan,
    build_object,
    plan_upload,
)
from proxy.wal.port import Log
from proxy.wal.types import WalBrokenError, WalCorruptError, WalEntry

__all__ = [
    "CommitRefused",
    "ObjectIdAllocator",
    "UploadError",
    "UploadedObject",
    "Uploader",
    "UploaderConfig",
    "UploaderStats",
]

log = logging.getLogger(__name__)

Commit = Callable[[Sequence[UploadedObject]], Awaitable[object]]
CommittedEnd = Callable[[int], int | None]
Stale = Callable[[WalEntry], bool]


class UploadError(Exception):
    """The uploader stopped. What was not committed stays in the WAL."""


class CommitRefused(Exception):
    """What a commit callback raises to refuse a commit (any exception counts the same)."""


class Uploader:
    """`start()` (or `async with`), then `flush()` when needed, `close(flush=...)` at the end."""

    def __init__(
        self,
        wal: Log,
        store: ObjectStore,
        commit: Commit,
        allocate_id: ObjectIdAllocator,
        *,
        committed_end: CommittedEnd | None = None,
        stale: Stale | None = None,
        config: UploaderConfig | None = None,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
    ) -> None:
        self.config = config or UploaderConfig()
        self._wal, self._store, self._commit = wal, store, commit
        self._allocate_id, self._committed_end = allocate_id, committed_end
        self._stale = stale
        self._clock, self._rng = clock, rng or random.Random()
        # owned by the task
        self._position = wal.trimmed_to  # an entry's start: everything before is committed
        self._backlog_since: float | None = None
        self._last_start = float("-inf")
        self._stats = UploaderStats()
        self._failed: UploadError | None = None
        # written by callers, read by the task
        self._flushes: list[tuple[int, asyncio.Future[None]]] = []
        self._wakeup = asyncio.Event()
        self._closing = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    # -- what callers see ----------------------------------------------------------------

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="uploader")

    async def __aenter__(self) -> Uploader:
        self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    @property
    def stats(self) -> UploaderStats:
        backlog = max(0, self._wal.durable_end - self._position)
        return replace(self._stats, uploaded_to=self._position, backlog_bytes=backlog)

    @property
    def backlog_seconds(self) -> float:
        """How long WAL entries have waited for an upload: since the oldest one not yet
        uploaded was seen (at most an upload's start); 0 when nothing waits."""
        since = self._backlog_since
        if since is None or self._wal.durable_end <= self._position:
            return 0.0
        return max(0.0, self._clock() - since)

    @property
    def failed(self) -> UploadError | None:
        return self._failed

    def wake(self) -> None:
        """Look at the WAL now rather than at the next poll (e.g. after an append)."""
        self._wakeup.set()

    async def flush(self) -> None:
        """Upload, commit and trim everything acknowledged so far. Retries failed PUTs as
        long as it takes (bound it with a timeout); raises UploadError if the uploader
        stopped."""
        self._check_running()
        target = self._wal.durable_end
        if target <= self._position:
            return
        future = asyncio.get_running_loop().create_future()
        self._flushes.append((target, future))
        self._wakeup.set()
        await future

    async def close(self, *, flush: bool = False) -> None:
        """Stop; with `flush`, upload what the WAL holds first. An upload in flight
        finishes unless it is waiting to retry a PUT. Raises the UploadError that stopped
        the uploader, if `flush` could not do its job because of it."""
        try:
            if flush and self._task is not None:
                await self.flush()
        finally:
            self._closing.set()
            self._wakeup.set()
            if self._task is not None:
                try:
                    await asyncio.shield(self._task)
                except asyncio.CancelledError:
                    self._task.cancel()
                    raise

    async def stopped(self) -> UploadError | None:
        """Wait for the task to end; the error that stopped it, None after `close`."""
        if self._task is not None:
            await asyncio.shield(self._task)
        return self._failed

    def _check_running(self) -> None:
        if self._failed is not None:
            raise self._failed
        if self._task is None or self._task.done():
            raise UploadError("the uploader is not running")

    # -- the task ------------------------------------------------------------------------

    async def _run(self) -> None:
        try:
            await self._find_start()
            while await self._wait_for_trigger():
                await self._upload()
                self._settle_flushes()
        except _Closed:
            pass
        except UploadError as error:
            self._failed = error
            log.error("uploader stopped: %s", error)
        except Exception as exc:
            self._failed = UploadError(f"uploader failed: {exc!r}; the data stays in the WAL")
            self._failed.__cause__ = exc
            log.exception("uploader stopped")
        finally:
            failure = self._failed or UploadError("the uploader was closed before this flush")
            for _, future in self._flushes:
                if not future.done():
                    future.set_exception(failure)
            self._flushes.clear()

    async def _find_start(self) -> None:
        """`trim_to` need not cut at an entry boundary; the entry it cuts is kept. Start
        at it: scan the trim point's segment for the first entry ending after it."""
        trimmed = self._wal.trimmed_to
        try:
            await self._wal.read(trimmed, 1)
            return
        except WalCorruptError:
            pass
        bases = [segment.base for segment in self._wal.segments]
        offset = bases[max(0, bisect.bisect_right(bases, trimmed) - 1)]
        while entries := await self._wal.read(offset):
            for entry in entries:
                if entry.position.end > trimmed:
                    self._position = entry.position.start
                    return
            offset = entries[-1].position.end
        self._position = offset

    async def _wait_for_trigger(self) -> bool:
        config = self.config
        while not self._closing.is_set():
            now = self._clock()
            backlog = self._wal.durable_end - self._position
            if backlog <= 0:
                self._backlog_since = None
                self._settle_flushes()
                timeout = config.poll_interval_s
            else:
                if self._backlog_since is None:
                    self._backlog_since = now
                due_at = self._backlog_since + config.upload_interval_s
                if self._flushes or backlog >= config.upload_bytes:
                    due_at = now
                due_at = max(due_at, self._last_start + config.min_upload_interval_s)
                if due_at <= now:
                    return True
                timeout = min(config.poll_interval_s, due_at - now)
            await self._wait(self._wakeup, timeout)
            self._wakeup.clear()
        return False

    async def _upload(self) -> None:
        started = self._last_start = self._clock()
        entries = await self._read()
        ends = self._committed_ends(entries)
        # asked on the loop, like the committed ends; trimmed past like committed entries
        live = entries if self._stale is None else [e for e in entries if not self._stale(e)]
        # planning and building are per-batch work and copies: off the event loop
        plan = await asyncio.to_thread(plan_upload, live, self.config.limits, ends.get)
        uploaded: list[UploadedObject] = []
        if plan.objects:
            uploaded = await self._put_fresh(plan)
            await self._commit_all(uploaded)
        if entries:
            wal_end = entries[-1].position.end
            await self._trim(wal_end)
            self._position = wal_end
        self._backlog_since = started if self._wal.durable_end > self._position else None
        self._count(plan, uploaded, self._clock() - started, len(entries) - len(live))

    async def _read(self) -> list[WalEntry]:
        entries: list[WalEntry] = []
        offset, size = self._position, 0
        while size < self.config.max_upload_bytes:
            got = await self._wal.read(offset, self.config.max_upload_bytes - size)
            if not got:
                break
            entries.extend(got)
            offset = got[-1].position.end
            size += sum(max(entry.position.size, len(entry.batch)) for entry in got)  # a
            # reference entry read through partition/referenced.py counts its batch's bytes
        return entries

    def _committed_ends(self, entries: list[WalEntry]) -> dict[int, int | None]:
        # asked here, on the loop: the metadata state changes on the loop
        if self._committed_end is None:
            return {}
        return {s: self._committed_end(s) for s in {entry.stream_id for entry in entries}}

    def _build(self, plan: UploadPlan, ids: list[int]) -> list[tuple[BuiltObject, UploadedObject]]:
        return [build_object(p, i) for p, i in zip(plan.objects, ids, strict=True)]

    async def _put_fresh(self, plan: UploadPlan) -> list[UploadedObject]:
        """Create the plan's objects; again, under new ids, while the create that
        succeeded started longer than `max_commit_age_s` ago (a store outage, a paused
        process)."""
        limit = self.config.max_commit_age_s
        while True:
            ids = [self._allocate_id() for _ in plan.objects]
            built = await asyncio.to_thread(self._build, plan, ids)
            put_started = await self._put_all(plan, built)
            if self._clock() - put_started <= limit:
                return [replace(u, commit_by=put_started + limit) for _, u in built]
            keys = [b.key for b, _ in built]
            self._stats = replace(self._stats, late_puts=self._stats.late_puts + 1)
            log.warning(
                "uploader: %s PUT %.1f s ago, past max_commit_age_s (%s): not committed, "
                "uploading again",
                ", ".join(keys),
                self._clock() - put_started,
                limit,
            )
            try:  # never named: the orphan sweep deletes what this leaves
                await self._store.delete(keys)
            except ObjectStoreError as exc:
                log.warning("uploader: could not delete %s: %s", ", ".join(keys), exc)

    async def _put_all(
        self, plan: UploadPlan, built: list[tuple[BuiltObject, UploadedObject]]
    ) -> float:
        """Create every object, retrying failed ones; returns when (the uploader's clock)
        the first round with a successful create started: no object is older than that.
        An object whose key is taken (`ObjectExists`: another process drew this writer
        id) is built again under a new id, in place in `built`, and created at once; the
        object met is not ours and is neither touched nor named."""
        delay = self.config.retry_backoff_s
        first_success: float | None = None
        pending = list(range(len(built)))
        while True:
            started = self._clock()
            results = await asyncio.gather(
                *(self._store.create(built[i][0].key, built[i][0].pieces) for i in pending),
                return_exceptions=True,
            )
            failed, taken = [], []
            for i, result in zip(pending, results, strict=True):
                if isinstance(result, ObjectExists):
                    taken.append(i)
                elif isinstance(result, ObjectStoreError):
                    failed.append(i)
                    log.warning("uploader: put failed, will retry: %s", result)
                elif isinstance(result, BaseException):
                    raise UploadError(f"put of {built[i][0].key} failed: {result!r}") from result
            done = len(pending) - len(failed) - len(taken)
            self._stats = replace(
                self._stats,
                puts=self._stats.puts + done,
                put_failures=self._stats.put_failures + len(failed),
                id_collisions=self._stats.id_collisions + len(taken),
            )
            if first_success is None and done:
                first_success = started
            if taken:
                await self._draw_new_ids(plan, built, taken)
            if not failed and not taken:
                assert first_success is not None
                return first_success
            pending = sorted(failed + taken)
            if failed:
                await self._wait(self._closing, self._rng.uniform(delay / 2, delay))
                if self._closing.is_set():
                    raise _Closed
                delay = min(2 * delay, self.config.retry_backoff_max_s)

    async def _draw_new_ids(
        self, plan: UploadPlan, built: list[tuple[BuiltObject, UploadedObject]], taken: list[int]
    ) -> None:
        keys = ", ".join(built[i][0].key for i in taken)
        self._allocate_id.collided()
        log.warning(
            "uploader: %s exist (another process drew this object id writer): writing "
            "again under writer %d",
            keys,
            self._allocate_id.writer,
        )
        ids = [self._allocate_id() for _ in taken]
        rebuilt = await asyncio.to_thread(
            lambda: [build_object(plan.objects[i], n) for i, n in zip(taken, ids, strict=True)]
        )
        for i, again in zip(taken, rebuilt, strict=True):
            built[i] = again

    async def _commit_all(self, objects: list[UploadedObject]) -> None:
        try:
            await self._commit(objects)
        except Exception as exc:
            keys = ", ".join(o.key for o in objects)
            raise UploadError(
                f"commit of {keys} failed: {exc}; nothing trimmed, the data stays in the WAL "
                f"from offset {self._position}"
            ) from exc

    async def _trim(self, offset: int) -> None:
        try:
            await self._wal.trim_to(offset)
        except WalBrokenError as exc:
            # acknowledged entries stay readable: keep moving them to S3; a restart skips
            # the committed ones (committed_end)
            self._stats = replace(self._stats, trim_failures=self._stats.trim_failures + 1)
            log.warning("uploader: WAL broken, not trimming (uploads go on): %s", exc)
        except OSError as exc:
            # the trim point moved; removing the segment is retried by the next trim
            self._stats = replace(self._stats, trim_failures=self._stats.trim_failures + 1)
            log.warning("uploader: trimming the WAL to %d: %s", offset, exc)

    def _count(
        self, plan: UploadPlan, objects: list[UploadedObject], seconds: float, stale: int
    ) -> None:
        s = self._stats
        sets = sum(1 for o in objects if o.kind is ObjectKind.STREAM_SET)
        self._stats = replace(
            s,
            uploads=s.uploads + 1,
            objects=s.objects + len(objects),
            stream_set_objects=s.stream_set_objects + sets,
            stream_objects=s.stream_objects + len(objects) - sets,
            object_bytes=s.object_bytes + sum(o.size for o in objects),
            skipped_entries=s.skipped_entries + plan.skipped_entries + stale,
            last_upload_seconds=seconds,
            max_upload_seconds=max(s.max_upload_seconds, seconds),
            total_upload_seconds=s.total_upload_seconds + seconds,
        )

    def _settle_flushes(self) -> None:
        waiting = []
        for target, future in self._flushes:
            if target > self._position and not future.done():
                waiting.append((target, future))
            elif not future.done():
                future.set_result(None)
        self._flushes = waiting

    @staticmethod
    async def _wait(event: asyncio.Event, seconds: float) -> None:
        try:
            async with asyncio.timeout(seconds):
                await event.wait()
        except TimeoutError:
            pass


class _Closed(Exception):
    """close() was called while a PUT waited to be retried."""
