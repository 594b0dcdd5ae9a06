"""The owner's WAL in S3 (`wal.mode: s3`): an append is answered once the object holding
it is PUT (docs/wal.md, "S3 durability mode"; keys and recovery rules: s3logobject.py).

The same surface as the local `WriteAheadLog`, so the partitions and the uploader do not
know which one they have. One task owns the state: it takes every append waiting when
no PUT is in flight as one group (at most `max_object_bytes`), PUTs it as one object, and
answers the group once the PUT returns. One PUT at a time is what keeps the log free of
holes (see s3logobject.py); appends arriving meanwhile gather for the next group, as with
the local WAL's fsync.

The entries not yet trimmed stay in memory too (bounded by `capacity_bytes`, like the
local WAL's disk), so the uploader reads them without a GET. `trim_to` deletes, in one
batched request, the objects wholly below the trim point; a failed delete is retried at
the next trim.

A failed PUT (after the store's own retries) breaks the WAL as a failed fsync does
(WalBrokenError); reopening recovers it.

Every object is written with the store's exclusive `create`, never replacing one: a PUT
still in flight from a killed process (a late PUT) can only land at the key the restarted
log writes next, and then either fails (the restarted log was first) or makes the
restarted log's create fail, which breaks that WAL: the next restart replays the late
object as the log's unacknowledged tail. The newest object is kept by trims, so a
restart never starts the log's offsets over below a key an earlier process may still
write (docs/wal.md, "Late PUTs").
"""

from __future__ import annotations

import asyncio
import bisect
import collections
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, replace

from proxy.objects.store import ObjectExists, ObjectStore, ObjectStoreError
from proxy.wal.common import LogState, check_read, check_trim, entry_header
from proxy.wal.entry import header_reference
from proxy.wal.fs import Buffer
from proxy.wal.s3log_objects import decode_object, object_key, plan_recovery
from proxy.wal.segments import Segment
from proxy.wal.types import (
    WalBrokenError,
    WalClosedError,
    WalCorruptError,
    WalEntry,
    WalPosition,
    WalStats,
)

log = logging.getLogger("tierproxy.wal")
MiB = 1024 * 1024
RECOVERY_GETS = 8  # objects read at once by `open` (each up to s3wal_max_bytes)


@dataclass(frozen=True, slots=True)
class S3WalConfig:
    """Settings of the S3 WAL. Errors name the config key."""

    prefix: str  # s3logobject.log_prefix(fleet.name)
    capacity_bytes: int = 1024 * MiB  # un-trimmed bytes; an append past it waits
    max_object_bytes: int = 8 * MiB  # one group's object, at most (one entry may pass it)

    def __post_init__(self) -> None:
        for key in ("capacity_bytes", "max_object_bytes"):
            value = getattr(self, key)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"wal config error at {key}: {value!r} is not a positive int")
        if not self.prefix.endswith("/"):
            raise ValueError(f"wal config error at prefix: {self.prefix!r} must end in '/'")


@dataclass(frozen=True, slots=True)
class S3WalRecovery:
    """What `open` found: the log's objects, entries to replay, leftovers deleted."""

    objects: int
    entries: int
    start: int
    end: int
    leftovers_deleted: int
    foreign_keys: int


@dataclass(slots=True, eq=False)
class _Append:
    header: bytes
    batch: Buffer
    stream_id: int
    base_offset: int
    size: int
    future: asyncio.Future[WalPosition]
    throttled: bool = False


class S3WriteAheadLog(LogState):
    """Open with `await S3WriteAheadLog.open(config, store)`; close with `await close()`.
    Its `stats` are as the local WAL's: `fsyncs` counts PUTs, `segments_rolled` objects."""

    def __init__(
        self,
        config: S3WalConfig,
        store: ObjectStore,
        clock: Callable[[], float],
        objects: list[Segment],
        entries: list[WalEntry],
        recovery: S3WalRecovery,
    ) -> None:
        self._config, self._store, self._clock = config, store, clock
        self.recovery = recovery
        # owned by the writer task (others read them on the loop): the objects not yet
        # deleted, and their entries in order with `_starts` for bisecting
        self._objects = objects
        self._entries = entries
        self._starts = [entry.position.start for entry in entries]
        self._end = recovery.end
        self._durable_end = recovery.end
        self._trimmed_to = recovery.start
        self._stats = WalStats()
        self._broken: BaseException | None = None
        self._closed = False
        self._pending: collections.deque[_Append] = collections.deque()
        self._writing: list[_Append] = []  # the group being PUT now
        self._wakeup = asyncio.Event()
        self._loop = asyncio.get_running_loop()  # built by `open`, on the loop it serves
        self._blocked_since: float | None = None
        self._full_waiters = []
        self._task: asyncio.Task[None] | None = None
        # called with each PUT's time in seconds (the proxy's WAL latency histogram)
        self.on_sync: Callable[[float], None] | None = None

    @classmethod
    async def open(
        cls,
        config: S3WalConfig,
        store: ObjectStore,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> S3WriteAheadLog:
        """List the log's objects, delete a trim's leftovers, read and check the rest
        (WalCorruptError names the key and byte of damage) and start the writer.
        `replay()` then gives back every entry of the log, for the caller to rebuild its
        state from and upload again (what is committed already is skipped by them)."""
        plan = plan_recovery(config.prefix, [info async for info in store.list(config.prefix)])
        if plan.leftovers:
            keys = [o.path for o in plan.leftovers]
            log.warning("S3 WAL: deleting %d objects an interrupted trim left", len(keys))
            try:  # below the log: harmless if they stay, the next open tries again
                await store.delete(keys)
            except ObjectStoreError as exc:
                log.warning("S3 WAL: could not delete %s: %s", ", ".join(keys), exc)
        entries: list[WalEntry] = []
        for first in range(0, len(plan.objects), RECOVERY_GETS):  # a few GETs at a time
            chunk = plan.objects[first : first + RECOVERY_GETS]
            for obj, data in zip(
                chunk, await asyncio.gather(*(store.get(o.path) for o in chunk)), strict=True
            ):
                entries.extend(decode_object(obj, data))
        recovery = S3WalRecovery(
            len(plan.objects),
            len(entries),
            plan.start,
            plan.end,
            len(plan.leftovers),
            len(plan.foreign),
        )
        log.info(
            "S3 WAL %s: recovered %d objects, %d entries, offsets [%d, %d)",
            config.prefix,
            recovery.objects,
            recovery.entries,
            recovery.start,
            recovery.end,
        )
        wal = cls(config, store, clock, list(plan.objects), entries, recovery)
        wal._task = asyncio.create_task(wal._run(), name=f"s3-wal {config.prefix}")
        return wal

    # -- what callers see ---------------------------------------------------------------

    @property
    def log_start(self) -> int:
        """The first WAL offset still held (the base of the oldest object kept)."""
        return self._objects[0].base if self._objects else self._trimmed_to

    @property
    def segments(self) -> tuple[Segment, ...]:
        """The objects not yet deleted, in order (the local WAL's segments)."""
        return tuple(self._objects)

    async def append(
        self, stream_id: int, base_offset: int, batch: Buffer, reference: Buffer | None = None
    ) -> WalPosition:
        """Write one record batch; return where it is once its object is PUT. Waits while
        the WAL is full. `batch` must not change until this returns. With `reference`, a
        version-2 entry, given back with it by `read` and `replay`."""
        return await self.submit(stream_id, base_offset, batch, reference)

    def submit(
        self, stream_id: int, base_offset: int, batch: Buffer, reference: Buffer | None = None
    ) -> asyncio.Future[WalPosition]:
        """`append` without a coroutine: queued now, behind every write queued before it;
        the future is its answer. Raises at once what `append` would."""
        self._check_open()
        header, size = entry_header(
            stream_id, base_offset, batch, self._config.capacity_bytes, reference
        )
        future: asyncio.Future[WalPosition] = self._loop.create_future()
        self._pending.append(_Append(header, batch, stream_id, base_offset, size, future))
        self._wakeup.set()
        return future

    def withdraw(self, write: asyncio.Future[WalPosition]) -> bool:
        """Take back an append `submit` queued, if it waits because the log is full and
        its PUT has not begun: True if it never will be written (its future is cancelled);
        False otherwise (its future says how it ends)."""
        if write.done() or self._blocked_since is None:
            return False
        if any(item.future is write for item in self._writing):
            return False
        write.cancel()  # still pending: `_take_group` drops it before any group takes it
        self._wakeup.set()  # the one behind it may fit
        return True

    async def trim_to(self, offset: int) -> None:
        """Everything before WAL offset `offset` was uploaded and committed: release it,
        deleting the objects wholly before it (one straddling it stays). Going back is a
        no-op. A failed delete is logged and retried at the next trim."""
        self._check_open()
        check_trim(offset, self._durable_end)
        # Runs in the caller's task, beside the writer: the writer only appends to the
        # object and entry lists, and this only drops objects it named from their front.
        self._trimmed_to = max(self._trimmed_to, offset)
        self._wakeup.set()  # room may have been made
        # the newest object stays: the next open continues after it, not from offset 0,
        # so no key an earlier process may still write is used again
        doomed = [o for o in self._objects[:-1] if o.end <= self._trimmed_to]
        if not doomed:
            return
        try:
            await self._store.delete([o.path for o in doomed])
        except ObjectStoreError as exc:
            log.warning("S3 WAL: deleting %d objects below %d: %s", len(doomed), offset, exc)
            return
        gone = {o.path for o in doomed}
        self._objects = [o for o in self._objects if o.path not in gone]
        cut = bisect.bisect_left(self._starts, self.log_start)
        del self._entries[:cut], self._starts[:cut]
        self._stats = replace(
            self._stats, segments_deleted=self._stats.segments_deleted + len(doomed)
        )

    async def read(self, from_offset: int, max_bytes: int = 1 << 20) -> list[WalEntry]:
        """Acknowledged entries from WAL offset `from_offset` (an entry's start, or the
        durable end: then none), in order, about `max_bytes` of them and at least one
        when there is one. From memory: no GET."""
        end = self._durable_end
        check_read(from_offset, max_bytes, self.log_start, end)
        if from_offset == end:
            return []
        i = bisect.bisect_left(self._starts, from_offset)
        if i == len(self._starts) or self._starts[i] != from_offset:
            raise WalCorruptError(f"WAL offset {from_offset} is not the start of an entry")
        found: list[WalEntry] = []
        taken = 0
        for entry in self._entries[i:]:
            if entry.position.start >= end or (found and taken + entry.position.size > max_bytes):
                break
            found.append(entry)
            taken += entry.position.size
        return found

    async def replay(self, max_bytes: int = 8 << 20) -> AsyncIterator[WalEntry]:
        """Every entry held, in order, up to the durable end as of the call: after a
        restart, the whole log (the trim point is not kept in S3; what is committed is
        skipped by the partitions and the uploader)."""
        end = self._durable_end
        for entry in list(self._entries):
            if entry.position.start >= end:
                return
            if entry.position.end > self._trimmed_to:
                yield entry

    async def close(self) -> None:
        """Finish the PUT in flight, fail appends not yet taken with WalClosedError.
        Idempotent."""
        self._closed = True
        self._wakeup.set()
        if self._task is not None and not self._task.done():
            await asyncio.wait([self._task])

    def _check_open(self) -> None:
        if self._broken is not None:  # first: a broken WAL's writer has stopped too
            raise WalBrokenError(
                f"the WAL is broken by an earlier failure ({self._broken!r}); reopen it"
            ) from self._broken
        if self._closed:
            raise WalClosedError("the WAL is closed")

    # -- the writer task ----------------------------------------------------------------

    async def _run(self) -> None:
        try:
            while not self._closed:
                group = self._take_group()
                if not group:
                    await self._wakeup.wait()
                    self._wakeup.clear()
                    continue
                self._writing = group
                try:
                    if not await self._commit(group):
                        self._fail_pending(self._broken_error())
                        return
                finally:
                    self._writing = []
            self._fail_pending(WalClosedError("the WAL was closed before this append was PUT"))
        except asyncio.CancelledError:
            self._fail_pending(WalClosedError("the WAL writer was cancelled"))
            raise
        except Exception as exc:  # a bug: say so to everyone waiting
            self._broken = exc
            self._fail_pending(self._broken_error())
            log.exception("S3 WAL writer failed")
        finally:
            self._closed = True

    def _take_group(self) -> list[_Append]:
        group: list[_Append] = []
        group_bytes = 0
        while self._pending:
            head = self._pending[0]
            if head.future.done():  # withdrawn, or its caller gave up: never written
                self._pending.popleft()
                continue
            if group and group_bytes + head.size > self._config.max_object_bytes:
                break
            if self._end + group_bytes + head.size - self._trimmed_to > self._config.capacity_bytes:
                break
            group.append(self._pending.popleft())
            group_bytes += head.size
        if not group and self._pending and self._blocked_since is None:
            self._blocked_since = self._clock()  # full: wait for a trim
            for item in self._pending:
                item.throttled = True
            self._now_full()
        if group and self._blocked_since is not None:
            waited = self._clock() - self._blocked_since
            self._stats = replace(
                self._stats, throttled_seconds=self._stats.throttled_seconds + waited
            )
            self._blocked_since = None
        return group

    async def _commit(self, group: list[_Append]) -> bool:
        """PUT one group as one object, then answer it. False if the WAL broke."""
        start = self._end
        size = sum(item.size for item in group)
        key = object_key(self._config.prefix, start)
        pieces = [part for item in group for part in (item.header, item.batch)]
        started = time.perf_counter()
        try:
            await self._create(key, pieces)
        except Exception as exc:
            self._broken = exc
            error = self._broken_error()
            for item in group:
                if not item.future.done():
                    item.future.set_exception(error)
            return False
        if self.on_sync is not None:
            self.on_sync(time.perf_counter() - started)
        self._end = self._durable_end = start + size
        self._objects.append(Segment(key, start, size))
        position = start
        for item in group:
            entry = WalEntry(
                WalPosition(position, position + item.size),
                item.stream_id,
                item.base_offset,
                memoryview(item.batch).cast("B"),
                # the header's copy, not the caller's buffer, as a replay would read it
                header_reference(item.header),
            )
            self._entries.append(entry)
            self._starts.append(position)
            position += item.size
            if not item.future.done():
                item.future.set_result(entry.position)
        s = self._stats
        self._stats = replace(
            s,
            appends=s.appends + len(group),
            bytes_appended=s.bytes_appended + size,
            fsyncs=s.fsyncs + 1,
            largest_group=max(s.largest_group, len(group)),
            segments_rolled=s.segments_rolled + 1,
            throttled_appends=s.throttled_appends + sum(item.throttled for item in group),
        )
        return True

    async def _create(self, key: str, pieces: list) -> None:
        """Create the object, never replacing one. One already at the key was written by
        another process after this log listed its objects: a late PUT of an earlier
        process of this name (never acknowledged), or, where this process is the late
        one, the restarted log's. Neither can tell which: the WAL breaks, nothing is
        deleted, and a restart replays what the listing then shows (docs/wal.md)."""
        try:
            await self._store.create(key, pieces)
        except ObjectExists:
            log.error(
                "S3 WAL: %s holds an object this log did not write: a late PUT of an "
                "earlier process of this fleet.name, or this process was stopped and a "
                "newer one runs (or two proxies share the name); restart this proxy",
                key,
            )
            raise

    def _broken_error(self) -> WalBrokenError:
        error = WalBrokenError(f"S3 WAL PUT failed: {self._broken!r}; reopen the WAL")
        error.__cause__ = self._broken
        return error

    def _fail_pending(self, error: BaseException) -> None:
        for item in self._pending:
            if not item.future.done():
                item.future.set_exception(error)
        self._pending.clear()
