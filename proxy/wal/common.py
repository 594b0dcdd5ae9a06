"""What the two write-ahead logs share: the local one (`log.WriteAheadLog`) and the
owner's log in the bucket (`s3log.S3WriteAheadLog`).

Both answer the `Log` surface (port.py) from the same state: the trim point, the durable
end, the failure that broke the log, the counters; and both check what a caller passes
the same way (an entry that could never fit, a trim past the durable end, a read outside
the log). Those live here once, so the two logs cannot drift apart on them; each keeps
its own writer task, storage, recovery and `close`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import replace
from typing import Self

from proxy.wal.entry import encode_header, entry_size
from proxy.wal.fs import Buffer
from proxy.wal.types import WalOffsetOutOfRange, WalStats


class LogState:
    """The state both logs keep and expose; each assigns every attribute in __init__."""

    _clock: Callable[[], float]
    _end: int  # the next WAL offset to hand out
    _durable_end: int
    _trimmed_to: int
    _stats: WalStats
    _broken: BaseException | None
    _blocked_since: float | None  # when appends began to wait for room, if they wait now
    _loop: asyncio.AbstractEventLoop
    _full_waiters: list[asyncio.Future[None]]  # see `next_full`

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def close(self) -> None:
        raise NotImplementedError

    def next_full(self) -> asyncio.Future[None]:
        """A future done the next time the log starts to wait for room (it is full, or its
        disk is): from then on, what it holds queued can be withdrawn. A caller that stops
        caring cancels it."""
        self._full_waiters = [f for f in self._full_waiters if not f.done()]
        future: asyncio.Future[None] = self._loop.create_future()
        self._full_waiters.append(future)
        return future

    def _now_full(self) -> None:
        waiters, self._full_waiters = self._full_waiters, []
        for future in waiters:
            if not future.done():
                future.set_result(None)

    @property
    def trimmed_to(self) -> int:
        return self._trimmed_to

    @property
    def durable_end(self) -> int:
        """The WAL offset after the last acknowledged entry."""
        return self._durable_end

    @property
    def broken(self) -> BaseException | None:
        """The write, fsync or PUT failure that broke the WAL, if one did."""
        return self._broken

    @property
    def stats(self) -> WalStats:
        throttled = self._stats.throttled_seconds
        if self._blocked_since is not None:  # blocked now: count the wait so far
            throttled += self._clock() - self._blocked_since
        return replace(
            self._stats, retained_bytes=self._end - self._trimmed_to, throttled_seconds=throttled
        )


def entry_header(
    stream_id: int,
    base_offset: int,
    batch: Buffer,
    capacity_bytes: int,
    reference: Buffer | None = None,
) -> tuple[bytes, int]:
    """The header framing `batch` (with `reference`, a version-2 entry's, the reference
    in it) and the entry's size in the log; ValueError for an entry that could never fit
    the log's capacity (waiting for room would wait forever)."""
    size = entry_size(len(batch), None if reference is None else len(reference))
    if size > capacity_bytes:
        raise ValueError(
            f"a WAL entry of {size} bytes can never fit the WAL's capacity of "
            f"{capacity_bytes} bytes (capacity_bytes)"
        )
    return encode_header(stream_id, base_offset, batch, reference), size


def check_trim(offset: int, durable_end: int) -> None:
    """A trim may release only what is acknowledged."""
    if offset > durable_end:
        raise ValueError(f"cannot trim to WAL offset {offset}: past the durable end {durable_end}")


def check_read(from_offset: int, max_bytes: int, log_start: int, end: int) -> None:
    """A read starts inside the log (its end included: then it reads nothing)."""
    if max_bytes <= 0:
        raise ValueError(f"max_bytes must be positive, got {max_bytes}")
    if not log_start <= from_offset <= end:
        raise WalOffsetOutOfRange(f"WAL offset {from_offset} is outside [{log_start}, {end}]")
