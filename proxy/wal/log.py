"""The local write-ahead log: one task owns the files (docs/wal.md).

`append` frames the batch, hands it to the writer task through a queue and awaits a
future that is resolved once the entry is durable. The writer takes every append waiting
when it is free as one group: one write (writev) and one fsync, on a worker thread so the
event loop never blocks; appends arriving meanwhile gather for the next group. Trims and
close go through the same queue, so the segment list has a single owner and no locks.

Capacity: the bytes between the trim point and the end may not pass `capacity_bytes`.
The writer then stops taking appends (in order: none overtakes another) until `trim_to`
makes room, and counts how long it waited.

A failed write or fsync breaks the WAL (see WalBrokenError); reopening recovers it.
But a write that finds the disk full (ENOSPC, EDQUOT) does not: nothing of it was fsynced
or answered, so the segment is cut back to where the group began and the group waits at
the head of the queue, in order, and is written again after `no_space_retry_s` or a trim,
until the disk has room (docs/wal.md, "A full disk"). So does an fsync that finds the
disk full (a filesystem that allocates only at writeback): the group's bytes are cut off
the file first, since a failed writeback leaves their pages clean and not on the disk. An
fsync that fails for any other reason breaks it: the page cache cannot be trusted then.
"""

from __future__ import annotations

import asyncio
import bisect
import collections
import errno
import logging
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace

from proxy.wal.common import LogState, check_read, check_trim, entry_header
from proxy.wal.fs import Buffer, Filesystem, OsFilesystem, WalFile
from proxy.wal.segments import (
    Recovery,
    Segment,
    create_segment,
    read_range,
    recover,
    trim_segments,
)
from proxy.wal.types import (
    WalBrokenError,
    WalClosedError,
    WalConfig,
    WalEntry,
    WalPosition,
    WalStats,
)

log = logging.getLogger("tierproxy.wal")

_NO_SPACE = (errno.ENOSPC, errno.EDQUOT)


class _NoSpace(Exception):
    """A group's write found the disk full; the segment was cut back to its size before
    the write (or the new segment was never created), so nothing of the group is in it."""


@dataclass(slots=True, eq=False)
class _Append:
    header: bytes
    batch: Buffer
    size: int
    future: asyncio.Future[WalPosition]
    throttled: bool = False


@dataclass(slots=True, eq=False)
class _Trim:
    offset: int
    future: asyncio.Future[None]


class _Close:
    pass


class _Wake:
    """Look at the queue again: an append was withdrawn (the one behind it may fit)."""


_Message = _Append | _Trim | _Close | _Wake


class WriteAheadLog(LogState):
    """Open with `await WriteAheadLog.open(config)`; close with `await wal.close()`."""

    def __init__(
        self,
        config: WalConfig,
        fs: Filesystem,
        clock: Callable[[], float],
        recovery: Recovery,
        active: WalFile,
        executor: ThreadPoolExecutor,
    ) -> None:
        self._config = config
        self._fs = fs
        self._clock = clock
        self._executor = executor
        self.recovery = recovery
        # owned by the writer task; others only read them, on the loop thread
        self._segments: tuple[Segment, ...] = recovery.segments
        self._active = active
        self._end = recovery.end  # next WAL offset to hand out
        self._durable_end = recovery.end
        self._trimmed_to = recovery.trimmed_to
        self._stats = WalStats()
        self._broken: BaseException | None = None
        self._closed = False
        self._stopping = False
        self._pending: collections.deque[_Append] = collections.deque()
        self._writing: list[_Append] = []  # the group being written now
        self._trims: list[_Trim] = []
        self._blocked_since: float | None = None
        self._no_space_since: float | None = None  # a write found the disk full
        self._full_waiters = []
        self._inbox: asyncio.Queue[_Message] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None
        self._loop = asyncio.get_running_loop()  # built by `open`, on the loop it serves
        # called with each group's fsync time in seconds (the proxy's histogram), on the
        # writer thread: it must be thread-safe and cheap
        self.on_sync: Callable[[float], None] | None = None

    @classmethod
    async def open(
        cls,
        config: WalConfig,
        *,
        fs: Filesystem | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> WriteAheadLog:
        """Recover the directory (see `proxy.wal.segments.recover`) and start the writer.
        `wal.recovery` says what was found; `wal.replay()` gives back the entries not yet
        trimmed, for the caller to rebuild its state and upload them again."""
        fs = fs if fs is not None else OsFilesystem()
        executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="wal-writer")
        loop = asyncio.get_running_loop()
        try:
            recovery = await loop.run_in_executor(
                executor, recover, fs, config.directory, config.read_chunk_bytes
            )
            active = await loop.run_in_executor(
                executor, fs.open, recovery.segments[-1].path, "append"
            )
        except BaseException:
            executor.shutdown(wait=False)
            raise
        wal = cls(config, fs, clock, recovery, active, executor)
        wal._task = asyncio.create_task(wal._run(), name=f"wal-writer {config.directory}")
        return wal

    # -- what callers see ---------------------------------------------------------------

    @property
    def log_start(self) -> int:
        """The first WAL offset still on disk (the base of the oldest segment)."""
        return self._segments[0].base

    @property
    def segments(self) -> tuple[Segment, ...]:
        return self._segments

    async def append(
        self, stream_id: int, base_offset: int, batch: Buffer, reference: Buffer | None = None
    ) -> WalPosition:
        """Write one record batch; return where it is once it is durable. Waits while the
        WAL is full. `batch` must not change until this returns. If the caller stops
        waiting (cancel), the entry may or may not end up in the WAL. With `reference`
        (at most 65535 bytes, opaque here) the entry is a version-2 one that `read` and
        `replay` give back with it (docs/wal.md, "Entry format")."""
        return await self.submit(stream_id, base_offset, batch, reference)

    def submit(
        self, stream_id: int, base_offset: int, batch: Buffer, reference: Buffer | None = None
    ) -> asyncio.Future[WalPosition]:
        """`append` without a coroutine: the write is queued now, behind every write
        queued before it, and the future is its answer (the owner's hot path: no task per
        append). Raises at once what `append` would (closed, broken, too large). The
        reference is copied into the entry's header now; the batch is not."""
        self._check_open()
        header, size = entry_header(
            stream_id, base_offset, batch, self._config.capacity_bytes, reference
        )
        future: asyncio.Future[WalPosition] = self._loop.create_future()
        self._inbox.put_nowait(_Append(header, batch, size, future))
        return future

    def withdraw(self, write: asyncio.Future[WalPosition]) -> bool:
        """Take back an append `submit` queued, if it waits because the log is full (or
        its disk is) and the writer has not begun to write it: True if it never will be
        written (its future is cancelled); False otherwise (its future says how it ends:
        with room, a queued append is written within a group commit)."""
        if write.done() or (self._blocked_since is None and self._no_space_since is None):
            return False
        if any(item.future is write for item in self._writing):
            return False
        write.cancel()  # still queued: `_head_fits` drops it before any group takes it
        self._inbox.put_nowait(_Wake())
        return True

    async def trim_to(self, offset: int) -> None:
        """Everything before WAL offset `offset` was uploaded and committed: release it.
        Segments wholly before it are removed; the active one stays. Going back is a
        no-op. Pass `position.end` of the last entry uploaded."""
        self._check_open()
        check_trim(offset, self._durable_end)
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._inbox.put_nowait(_Trim(offset, future))
        await future

    async def read(self, from_offset: int, max_bytes: int = 1 << 20) -> list[WalEntry]:
        """Acknowledged entries starting at WAL offset `from_offset` (an entry's start, or
        the durable end: then none), in order, about `max_bytes` of them, always at least
        one when there is one. Runs beside the writer, on another thread."""
        segments, end = self._segments, self._durable_end
        check_read(from_offset, max_bytes, segments[0].base, end)
        if from_offset == end:
            return []
        return await asyncio.to_thread(read_range, self._fs, segments, from_offset, end, max_bytes)

    async def replay(self, max_bytes: int = 8 << 20) -> AsyncIterator[WalEntry]:
        """Every entry not yet trimmed, in order, up to the durable end as of the call: what
        a restarted owner rebuilds its state from and uploads again."""
        end = self._durable_end
        trimmed = self._trimmed_to
        bases = [segment.base for segment in self._segments]
        offset = self._segments[max(0, bisect.bisect_right(bases, trimmed) - 1)].base
        while offset < end:
            entries = await self.read(offset, max_bytes)
            for entry in entries:
                if entry.position.start >= end:
                    return
                if entry.position.end > trimmed:
                    yield entry
            offset = entries[-1].position.end

    async def close(self) -> None:
        """Finish what can be written, fail appends still waiting for room with
        WalClosedError, close the files. Idempotent."""
        if not self._closed:
            self._closed = True
            self._inbox.put_nowait(_Close())
        if self._task is not None and not self._task.done():
            await asyncio.wait([self._task])
        self._executor.shutdown(wait=False)

    def _check_open(self) -> None:
        if self._closed:
            raise WalClosedError("the WAL is closed")
        if self._broken is not None:
            raise WalBrokenError(
                f"the WAL is broken by an earlier failure ({self._broken!r}); reopen it"
            ) from self._broken

    # -- the writer task ----------------------------------------------------------------

    async def _run(self) -> None:
        try:
            await self._serve()
            if not self._stopping:  # broken: refuse everything until closed
                while not isinstance(message := await self._inbox.get(), _Close):
                    self._refuse(message, self._broken_error())
        except asyncio.CancelledError:
            self._fail_all(WalClosedError("the WAL writer was cancelled"))
            raise
        except Exception as exc:  # a bug: say so to everyone waiting, then stop
            self._broken = exc
            self._fail_all(self._broken_error())
        finally:
            self._closed = True
            self._active.close()

    async def _serve(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if self._no_space_since is not None:
                if self._stopping:  # the disk is still full: what waits is not written
                    break
                await self._wait_for_space()
            if not self._head_fits():
                if self._stopping:
                    break
                if self._pending and self._blocked_since is None:
                    self._blocked_since = self._clock()
                    for item in self._pending:
                        item.throttled = True
                    self._now_full()
                self._accept(await self._inbox.get())
            while not self._inbox.empty():
                self._accept(self._inbox.get_nowait())
            if self._trims:
                await self._apply_trims(loop)
            group, roll = self._take_group()
            self._writing = group
            try:
                if group and not await self._commit(loop, group, roll):
                    self._fail_all(self._broken_error())
                    return
            finally:
                self._writing = []
        self._fail_all(WalClosedError("the WAL was closed before this append was written"))

    async def _wait_for_space(self) -> None:
        """The disk was full at the last write: wait `no_space_retry_s`, or less if a
        trim or a close comes (a trim removes segments: room), then try again."""
        if not self._inbox.empty():
            return
        getter = asyncio.ensure_future(self._inbox.get())
        try:
            await asyncio.wait([getter], timeout=self._config.no_space_retry_s)
        finally:
            if not getter.done():
                getter.cancel()
        if getter.done() and not getter.cancelled():
            self._accept(getter.result())

    def _accept(self, message: _Message) -> None:
        if isinstance(message, _Append):
            message.throttled = self._blocked_since is not None
            self._pending.append(message)
        elif isinstance(message, _Trim):
            self._trims.append(message)
        elif isinstance(message, _Close):
            self._stopping = True

    def _head_fits(self) -> bool:
        while self._pending and self._pending[0].future.done():  # cancelled by its caller
            self._pending.popleft()
        if not self._pending:
            return False
        retained = self._end + self._pending[0].size - self._trimmed_to
        return retained <= self._config.capacity_bytes

    def _take_group(self) -> tuple[list[_Append], bool]:
        """The appends the next write covers, and whether a new segment starts first.
        A group fits what is left of the active segment (a fresh one if the head does not
        fit there), so only an entry larger than `segment_bytes` makes a larger segment."""
        group: list[_Append] = []
        if not self._head_fits():
            return group, False
        config = self._config
        active = self._segments[-1].size
        roll = active > 0 and active + self._pending[0].size > config.segment_bytes
        limit = min(config.max_group_bytes, config.segment_bytes - (0 if roll else active))
        group_bytes = 0
        while self._head_fits():
            head = self._pending[0]
            if group and group_bytes + head.size > limit:
                break
            if self._end + group_bytes + head.size - self._trimmed_to > config.capacity_bytes:
                break
            group.append(self._pending.popleft())
            group_bytes += head.size
        if group and self._blocked_since is not None:
            self._stats = replace(
                self._stats,
                throttled_seconds=self._stats.throttled_seconds
                + (self._clock() - self._blocked_since),
            )
            self._blocked_since = None
        return group, roll

    async def _commit(
        self, loop: asyncio.AbstractEventLoop, group: list[_Append], roll: bool
    ) -> bool:
        """One group: roll if due, write, fsync, resolve. False if the WAL broke."""
        group_bytes = sum(item.size for item in group)
        rolled = 0
        try:
            if roll:
                new, file = await loop.run_in_executor(
                    self._executor, _create_segment, self._fs, self._config.directory, self._end
                )
                self._active.close()
                self._active = file
                self._segments = (*self._segments, new)
                rolled = 1
            buffers = [part for item in group for part in (item.header, item.batch)]
            await loop.run_in_executor(
                self._executor,
                _write_and_sync,
                self._active,
                buffers,
                self._segments[-1].size,
                self.on_sync,
            )
        except _NoSpace as exc:
            self._wait_no_space(group, exc.__cause__)
            return True
        except Exception as exc:
            self._broken = exc
            error = self._broken_error()
            for item in group:
                if not item.future.done():
                    item.future.set_exception(error)
            return False
        if self._no_space_since is not None:
            self._space_again()
        start = self._end
        self._end += group_bytes
        self._durable_end = self._end
        last = self._segments[-1]
        self._segments = (*self._segments[:-1], replace(last, size=last.size + group_bytes))
        s = self._stats
        self._stats = replace(
            s,
            appends=s.appends + len(group),
            bytes_appended=s.bytes_appended + group_bytes,
            fsyncs=s.fsyncs + 1,
            dir_fsyncs=s.dir_fsyncs + rolled,
            largest_group=max(s.largest_group, len(group)),
            segments_rolled=s.segments_rolled + rolled,
            throttled_appends=s.throttled_appends + sum(item.throttled for item in group),
        )
        for item in group:
            position = WalPosition(start, start + item.size)
            start = position.end
            if not item.future.done():
                item.future.set_result(position)
        return True

    def _wait_no_space(self, group: list[_Append], error: BaseException | None) -> None:
        """Put the group back at the head of the queue (in order) to be written again."""
        self._pending.extendleft(reversed(group))
        if self._no_space_since is None:
            self._no_space_since = self._clock()
            self._now_full()
            self._stats = replace(
                self._stats,
                no_space_waits=self._stats.no_space_waits + 1,
                waiting_for_space=True,
            )
            log.warning(
                "WAL %s: the disk is full (%s): appends wait until it has room",
                self._config.directory,
                error,
            )

    def _space_again(self) -> None:
        assert self._no_space_since is not None
        waited = self._clock() - self._no_space_since
        self._no_space_since = None
        self._stats = replace(
            self._stats,
            no_space_seconds=self._stats.no_space_seconds + waited,
            waiting_for_space=False,
        )
        log.warning(
            "WAL %s: the disk has room again after %.1f s; appends go on",
            self._config.directory,
            waited,
        )

    async def _apply_trims(self, loop: asyncio.AbstractEventLoop) -> None:
        trims, self._trims = self._trims, []
        target = max(trim.offset for trim in trims)
        error: BaseException | None = None
        moved = target > self._trimmed_to
        self._trimmed_to = max(self._trimmed_to, target)
        # segments a failed trim left behind are retried even if the point did not move
        doomed = [s for s in self._segments[:-1] if s.end <= self._trimmed_to]
        if moved or doomed:
            deleted, error = await loop.run_in_executor(
                self._executor,
                trim_segments,
                self._fs,
                self._config.directory,
                doomed,
                self._trimmed_to,
            )
            self._segments = self._segments[deleted:]
            self._stats = replace(
                self._stats, segments_deleted=self._stats.segments_deleted + deleted
            )
        for trim in trims:
            if trim.future.done():
                continue
            if error is None:
                trim.future.set_result(None)
            else:
                trim.future.set_exception(error)

    def _broken_error(self) -> WalBrokenError:
        error = WalBrokenError(f"WAL write or fsync failed: {self._broken!r}; reopen the WAL")
        error.__cause__ = self._broken
        return error

    def _refuse(self, message: _Message, error: BaseException) -> None:
        if isinstance(message, _Append | _Trim) and not message.future.done():
            message.future.set_exception(error)

    def _fail_all(self, error: BaseException) -> None:
        for item in self._pending:
            self._refuse(item, error)
        self._pending.clear()
        for trim in self._trims:
            self._refuse(trim, error)
        self._trims.clear()
        while not self._inbox.empty():
            self._refuse(self._inbox.get_nowait(), error)


def _create_segment(fs: Filesystem, directory: str, base: int) -> tuple[Segment, WalFile]:
    try:
        return create_segment(fs, directory, base)
    except OSError as exc:
        if exc.errno not in _NO_SPACE:
            raise
        raise _NoSpace() from exc


def _write_and_sync(
    file: WalFile,
    buffers: list[Buffer],
    size_before: int,
    on_sync: Callable[[float], None] | None = None,
) -> None:
    """Write the group and fsync it. A write or an fsync that finds the disk full cuts
    the file back to `size_before` (a prefix of the group may be in it, or all of it in
    pages the failed writeback left unwritten) and raises _NoSpace; a failed cut, like any
    other failure, is raised as it is (the WAL breaks)."""
    try:
        file.write(buffers)
    except OSError as exc:
        if exc.errno not in _NO_SPACE:
            raise
        file.truncate(size_before)
        raise _NoSpace() from exc
    started = time.perf_counter()
    try:
        file.fsync()
    except OSError as exc:
        if exc.errno not in _NO_SPACE:
            raise
        # the disk said it was full only at writeback: the group's pages may be marked
        # clean without being on the disk, and a later fsync would not write them. Cut
        # them off; the group is written again, whole, once there is room
        file.truncate(size_before)
        raise _NoSpace() from exc
    if on_sync is not None:
        on_sync(time.perf_counter() - started)
