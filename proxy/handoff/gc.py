"""Deleting S3-WAL objects once nothing needs them (docs/wal.md, "Deleting S3-WAL objects").

An S3-WAL object is the only durable copy of its appends until each append's owner has
them in its own WAL. An owner that read the batch before it answered (the bytes path):
a success means the batch is in the owner's fsynced WAL, a failure that nothing was
acknowledged, so the writer's proxy releases the location once the answer (or the
failure of the call) is in. An owner that took the batch by reference (docs/wal.md, "The
owner answering from the notification") answers before it has the bytes: the location
is released only when that owner says so (`tiered/owners.py`, `HeldLocations`). An object
whose every append is released is deleted, in batches (DeleteObjects). An append
cancelled before it got its location is released when its object's PUT ends. A delete
that fails (the store down longer than its own retries) is tried again, backing off to
RETRY_MAX_S, until it succeeds or the writer closes: the orphan sweep leaves a running
writer's objects alone, so a delete given up here would keep the object for days. New
releases wait for that retry too, and at most MAX_RETRYING keys wait (a store that
refuses deletes for good, its permissions wrong, costs bounded memory).

What a writer that died leaves is deleted by the orphan sweep once older than
`tiering.s3wal_retention_s` (orphan_plan.py). Like the writer, this has no task of its
own: its state changes synchronously on the loop.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from proxy.objects.store import ObjectStore, ObjectStoreError

log = logging.getLogger(__name__)

DELETE_BATCH = 1000  # keys per DeleteObjects request (S3's limit)
RETRY_MAX_S = 30.0  # the longest wait before a failed delete is tried again
MAX_RETRYING = 100_000  # keys kept waiting for a failed delete's retry


class S3WalReleases:
    """Per object, its appends not yet released; deletes what reaches zero, batched:
    after `delay_s`, or at once when `batch` keys wait."""

    def __init__(
        self,
        store: ObjectStore,
        *,
        delay_s: float = 1.0,
        batch: int = DELETE_BATCH,
        on_deleted: Callable[[int], None] | None = None,
    ) -> None:
        if not delay_s > 0 or not 0 < batch <= DELETE_BATCH:
            raise ValueError(f"S3-WAL releases: delay_s={delay_s!r} batch={batch!r}")
        self._store, self._delay_s, self._batch = store, delay_s, batch
        self._on_deleted = on_deleted
        self._held: dict[str, int] = {}  # object key -> appends not yet released
        self._due: list[str] = []
        self._timer: asyncio.TimerHandle | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._failures = 0  # deletes failed in a row: the next retry's backoff
        self._closed = False  # the store may be closed next: later releases keep nothing

    @property
    def held(self) -> int:
        """Objects PUT with an append not yet released."""
        return len(self._held)

    def hold(self, key: str, appends: int, released: int = 0) -> None:
        """An object was PUT holding `appends` appends, `released` of them already."""
        if self._closed:
            return
        if appends - released > 0:
            self._held[key] = appends - released
        else:
            self._queue(key)

    def release(self, key: str) -> None:
        """One append in object `key` is answered by its owner (or failed)."""
        left = self._held.get(key)
        if left is None or self._closed:
            return  # not PUT by this writer, or released once too often: keep nothing
        if left > 1:
            self._held[key] = left - 1
            return
        del self._held[key]
        self._queue(key)

    async def close(self) -> None:
        """Delete what is due now and wait for the deletes in flight; objects still held
        are left to the orphan sweep."""
        self._closed = True
        self._start()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    def _queue(self, key: str) -> None:
        self._due.append(key)
        if not self._failures and len(self._due) >= self._batch:
            self._start()
        elif self._timer is None:  # while deletes fail, with the next retry
            wait = self._backoff() if self._failures else self._delay_s
            self._timer = asyncio.get_running_loop().call_later(wait, self._start)

    def _backoff(self) -> float:
        return min(self._delay_s * 2 ** min(self._failures, 30), RETRY_MAX_S)

    def _retry(self, keys: list[str]) -> float:
        """Queue `keys` again, due after a backoff; the wait. At most MAX_RETRYING keys
        wait (a store refusing deletes for good, its permissions wrong): the oldest past
        that are given up, left in the bucket."""
        self._failures += 1
        wait = self._backoff()
        self._due[:0] = keys
        if len(self._due) > MAX_RETRYING:
            dropped = len(self._due) - MAX_RETRYING
            del self._due[:dropped]
            log.error("S3-WAL: %d released objects no longer retried: left in the bucket", dropped)
        if self._timer is not None:
            self._timer.cancel()
        self._timer = asyncio.get_running_loop().call_later(wait, self._start)
        return wait

    def _start(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        keys, self._due = self._due, []
        if keys:
            task = asyncio.get_running_loop().create_task(self._delete(keys))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _delete(self, keys: list[str]) -> None:
        try:
            await self._store.delete(keys)
        except ObjectStoreError as exc:
            if self._closed:  # stopping: the orphan sweep deletes them after the retention
                log.warning("S3-WAL: could not delete %d released objects: %s", len(keys), exc)
            else:
                wait = self._retry(keys)
                log.warning(
                    "S3-WAL: could not delete %d released objects, again in %.1f s: %s",
                    *(len(keys), wait, exc),
                )
            return
        self._failures = 0
        if self._on_deleted is not None:
            self._on_deleted(len(keys))
