"""The owner's log cache: the tail of each stream it owns, in memory, for tail reads.

The partition `append`s batches once the WAL has made them durable; the uploader says
`uploaded(stream, end)` once everything below `end` is committed to S3. Only uploaded
batches may be evicted: below them a reader can go to S3, above them the cache (and the
WAL) is the only copy a fetch can be served from.

- The cache keeps references, not copies: each entry is the appended memoryview (or a
  view of the appended bytes), one or several whole record batches, never parsed. The
  bytes must not change after `append`.
- Bounded by `max_bytes`: over it, the oldest uploaded batches go first, whichever
  stream holds them (a stream always loses its oldest first, so what it holds stays
  contiguous). When nothing can go, the append still succeeds (produce never fails for
  the cache) and `overflows` counts it; the next `uploaded` evicts down to the bound.
- `read` follows Kafka's fetch rule: the first entry whole even above `max_bytes`, then
  stop before exceeding it. An offset below what the cache holds is a miss (read S3); at
  the end it is empty (wait: `wait_for_data`).
- `wait_for_data` parks a future per long poll; `append` and `drop` wake the ones whose
  offset the stream's end has passed. No polling; a timed-out waiter leaves at once.
- A rebuilt partition loads the WAL entries it recovered that are not uploaded yet
  (`recovered_tail.py`), as many as fit. The older ones stay in the WAL only: `in_wal`
  notes where, `wal_position` tells a reader that misses below the cache where to read
  them, until `uploaded` passes them (then the objects hold them).

No locks: everything runs on the event loop; only `wait_for_data` needs one.
"""

from __future__ import annotations

import asyncio
import bisect
import heapq
from collections import deque
from dataclasses import dataclass, field
from itertools import islice

__all__ = ["LogCache"]

Bytes = bytes | bytearray | memoryview


@dataclass(slots=True, eq=False)
class _Entry:
    base_offset: int
    last_offset: int
    data: memoryview
    seq: int  # append order across streams: the oldest evictable entry has the lowest


@dataclass(slots=True, eq=False)
class _Stream:
    end_offset: int
    uploaded_end: int = 0  # everything below is committed to S3
    entries: deque[_Entry] = field(default_factory=deque)
    queued: bool = False  # its oldest entry is in the eviction heap

    @property
    def start_offset(self) -> int:
        return self.entries[0].base_offset if self.entries else self.end_offset

    def evictable_head(self) -> _Entry | None:
        if self.entries and self.entries[0].last_offset < self.uploaded_end:
            return self.entries[0]
        return None


class LogCache:
    """The tails of the streams this proxy owns, bounded by `max_bytes` of batch data."""

    def __init__(self, max_bytes: int) -> None:
        if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes <= 0:
            raise ValueError(f"log cache config error at max_bytes: {max_bytes!r} not positive")
        self.max_bytes = max_bytes
        self._streams: dict[int, _Stream] = {}
        self._evictable: list[tuple[int, int]] = []  # heap of (head seq, stream id)
        self._seq = 0
        self._in_wal: dict[int, list[tuple[int, int, object]]] = {}  # stream: (base, last, where)
        self._waiters: dict[int, dict[asyncio.Future[None], int]] = {}  # stream: {f: offset}
        # counters, plain attributes
        self.bytes = 0  # held now
        self.hits = 0  # reads that returned batches
        self.misses = 0  # reads below what the cache holds (or of a stream it lacks)
        self.bytes_read = 0
        self.evictions = 0  # entries evicted (drop is not eviction)
        self.evicted_bytes = 0
        self.overflows = 0  # appends that left the cache over max_bytes

    # -- the owner's side ----------------------------------------------------------------

    def append(self, stream: int, base_offset: int, last_offset: int, batch: Bytes) -> None:
        """Batches [base_offset, last_offset] of `stream`, durable. Continues the stream's
        end (the first append of a stream starts it anywhere)."""
        data = batch if isinstance(batch, memoryview) else memoryview(batch)
        if last_offset < base_offset or not data.nbytes:
            raise ValueError(
                f"log cache append to stream {stream}: offsets [{base_offset}, {last_offset}]"
                f" with {data.nbytes} bytes"
            )
        log = self._streams.get(stream)
        if log is None:
            log = self._streams[stream] = _Stream(base_offset)
        elif base_offset != log.end_offset:
            raise ValueError(
                f"log cache append to stream {stream} at offset {base_offset}, "
                f"its end is {log.end_offset}"
            )
        self._seq += 1
        log.entries.append(_Entry(base_offset, last_offset, data, self._seq))
        log.end_offset = last_offset + 1
        self.bytes += data.nbytes
        self._queue(stream, log)  # evictable at once if an upload beat the append here
        self._evict()
        if self.bytes > self.max_bytes:
            self.overflows += 1
        self._wake(stream, log.end_offset)

    def in_wal(self, stream: int, base_offset: int, last_offset: int, where: object) -> None:
        """A recovered entry [base_offset, last_offset] not uploaded yet that the cache does
        not hold: `where` the WAL has it (its WalPosition). In offset order, below the
        stream's first append."""
        self._in_wal.setdefault(stream, []).append((base_offset, last_offset, where))

    def wal_position(self, stream: int, offset: int) -> object | None:
        """Where the WAL holds the entry with `offset` that the cache left there (`in_wal`);
        None when it did not (the cache holds it, or the objects do)."""
        noted = self._in_wal.get(stream)
        if not noted:
            return None
        i = bisect.bisect_left(noted, offset, key=lambda e: e[1])
        return noted[i][2] if i < len(noted) and noted[i][0] <= offset else None

    def uploaded(self, stream: int, end_offset: int) -> None:
        """Everything of `stream` below `end_offset` is committed to S3: it may go."""
        noted = self._in_wal.get(stream)
        if noted:
            kept = [e for e in noted if e[1] >= end_offset]
            if kept:
                self._in_wal[stream] = kept
            else:
                del self._in_wal[stream]
        log = self._streams.get(stream)
        if log is None or end_offset <= log.uploaded_end:
            return
        log.uploaded_end = end_offset
        self._queue(stream, log)
        self._evict()

    def drop(self, stream: int) -> None:
        """The partition stopped here: forget the stream, wake its waiters."""
        self._in_wal.pop(stream, None)
        log = self._streams.pop(stream, None)
        if log is not None:
            self.bytes -= sum(entry.data.nbytes for entry in log.entries)
            if log.queued:
                self._evictable = [item for item in self._evictable if item[1] != stream]
                heapq.heapify(self._evictable)
        self._wake(stream, None)

    @property
    def room(self) -> int:
        """The bytes that appends may add without an overflow: the bound less what no
        eviction can free (entries not uploaded yet). Computed, for rebuilds only."""
        pinned = sum(
            entry.data.nbytes
            for log in self._streams.values()
            for entry in log.entries
            if entry.last_offset >= log.uploaded_end
        )
        return max(self.max_bytes - pinned, 0)

    # -- the reader's side ---------------------------------------------------------------

    def start_offset(self, stream: int) -> int | None:
        """The first offset the cache holds (= end_offset when it holds none)."""
        log = self._streams.get(stream)
        return None if log is None else log.start_offset

    def end_offset(self, stream: int) -> int | None:
        """The offset after the last appended batch; None for a stream not cached here."""
        log = self._streams.get(stream)
        return None if log is None else log.end_offset

    def read(self, stream: int, offset: int, max_bytes: int) -> tuple[list[memoryview], int]:
        """The entries from the one holding `offset` on, and the offset after them. Empty
        (and `offset` back) below what the cache holds, which counts a miss, or at the end."""
        log = self._streams.get(stream)
        if log is None or offset < log.start_offset:
            self.misses += 1
            return [], offset
        if offset >= log.end_offset:
            return [], offset
        first = bisect.bisect_left(log.entries, offset, key=lambda e: e.last_offset)
        last = log.entries[first]
        found, size = [last.data], last.data.nbytes
        for entry in islice(log.entries, first + 1, None):
            if size + entry.data.nbytes > max_bytes:
                break
            found.append(entry.data)
            size += entry.data.nbytes
            last = entry
        self.hits += 1
        self.bytes_read += size
        return found, last.last_offset + 1

    @property
    def waiting(self) -> int:
        return sum(len(waiters) for waiters in self._waiters.values())

    async def wait_for_data(self, stream: int, offset: int, max_wait_ms: float | None) -> bool:
        """A fetch long poll: wait up to `max_wait_ms` (None: no limit) for data at or past
        `offset` to be appended. True if the stream's end is past `offset`; False at the
        timeout or when the stream was dropped. (Milliseconds, as Fetch's MaxWaitMs and
        `TieredPartition.wait_for_append`.)"""
        if self._has_data(stream, offset):
            return True
        if max_wait_ms is not None and max_wait_ms <= 0:
            return False
        future = asyncio.get_running_loop().create_future()
        waiters = self._waiters.setdefault(stream, {})
        waiters[future] = offset
        try:
            async with asyncio.timeout(None if max_wait_ms is None else max_wait_ms / 1000):
                await future
        except TimeoutError:
            pass
        finally:
            waiters.pop(future, None)
            if not waiters and self._waiters.get(stream) is waiters:
                del self._waiters[stream]
        return self._has_data(stream, offset)

    # -- inside --------------------------------------------------------------------------

    def _has_data(self, stream: int, offset: int) -> bool:
        end = self.end_offset(stream)
        return end is not None and end > offset

    def _wake(self, stream: int, end_offset: int | None) -> None:
        """Wake the waiters the stream's end has passed (all of them if it is gone)."""
        waiters = self._waiters.get(stream)
        if not waiters:
            return
        for future, offset in list(waiters.items()):
            if end_offset is None or offset < end_offset:
                del waiters[future]
                if not future.done():
                    future.set_result(None)
        if not waiters:
            del self._waiters[stream]

    def _queue(self, stream: int, log: _Stream) -> None:
        if not log.queued and (entry := log.evictable_head()) is not None:
            heapq.heappush(self._evictable, (entry.seq, stream))
            log.queued = True

    def _evict(self) -> None:
        """The oldest uploaded entries go, across streams, until the bytes fit."""
        while self.bytes > self.max_bytes and self._evictable:
            _, stream = heapq.heappop(self._evictable)
            log = self._streams[stream]
            entry = log.entries.popleft()
            log.queued = False
            self.bytes -= entry.data.nbytes
            self.evictions += 1
            self.evicted_bytes += entry.data.nbytes
            self._queue(stream, log)
