"""Bandwidth shared by priority: one token bucket, waiters served strictly by priority.

`TokenBucket` is the arithmetic (bytes refill at `rate` per second up to `burst`; time is
passed in). `BandwidthLimiter` is the waiting layer on top: `await acquire(priority, n)`.

- PRODUCE never waits: it takes its bytes at once, even into debt (tokens below zero), so
  produce is never slowed by reads and reads pay for it afterwards.
- The others queue by priority (TAIL_READ, COMPACTION, CATCHUP_READ), FIFO within one.
  Only the head of the queue is ever granted: a small low-priority request does not slip
  past a large waiting head, or a stream of small ones would starve it. A higher-priority
  request arriving later becomes the head.
- A request larger than the burst is granted once the bucket is full and leaves it in
  debt: it never deadlocks, and the long-run rate still holds.
- A cancelled waiter leaves the queue; if it was granted but cancelled before it could
  resume, its bytes go back to the bucket.
- Rate 0 or None: unlimited, nothing waits (the counters still count).

One timer at most, armed for the moment the head can be granted; `poll()` is what it
calls, and a test that moves an injected clock calls it too.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from enum import IntEnum

__all__ = ["BandwidthLimiter", "Priority", "PriorityStats", "TokenBucket"]


class Priority(IntEnum):
    """Lower value, served first."""

    PRODUCE = 0
    TAIL_READ = 1
    COMPACTION = 2
    CATCHUP_READ = 3


@dataclass(slots=True)
class PriorityStats:
    grants: int = 0  # acquire calls that returned
    bytes_granted: int = 0
    waits: int = 0  # of those, how many had to wait
    seconds_waited: float = 0.0  # by the clock the limiter was given


class TokenBucket:
    """Tokens are bytes. `tokens` may go below zero (debt); it never exceeds `burst`."""

    __slots__ = ("rate", "burst", "tokens", "_updated")

    def __init__(self, rate: float, burst: int, now: float) -> None:
        self.rate, self.burst = rate, burst
        self.tokens: float = burst
        self._updated = now

    def refill(self, now: float) -> None:
        if now > self._updated:  # a clock that steps back adds nothing
            self.tokens = min(self.burst, self.tokens + (now - self._updated) * self.rate)
            self._updated = now

    def ready(self, nbytes: int) -> bool:
        """Whether `nbytes` may be taken now: a request above the burst needs it full."""
        return self.tokens >= min(nbytes, self.burst)

    def seconds_until_ready(self, nbytes: int) -> float:
        return max(0.0, (min(nbytes, self.burst) - self.tokens) / self.rate)

    def take(self, nbytes: int) -> None:
        self.tokens -= nbytes

    def give_back(self, nbytes: int) -> None:
        self.tokens = min(self.burst, self.tokens + nbytes)


@dataclass(slots=True, eq=False)
class _Waiter:
    priority: Priority
    nbytes: int
    since: float
    granted: asyncio.Future[float]  # the grant time


class BandwidthLimiter:
    """`await acquire(priority, nbytes)`; `stats[priority]` counts what was granted."""

    def __init__(
        self,
        rate: float | None,
        burst: int | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if rate is not None and (isinstance(rate, bool) or rate < 0):
            raise ValueError(f"bandwidth limit error at rate: {rate!r} is negative")
        if burst is not None and (isinstance(burst, bool) or burst <= 0):
            raise ValueError(f"bandwidth limit error at burst: {burst!r} not positive")
        self._clock = clock
        self._bucket: TokenBucket | None = None
        if rate:  # one second's worth unless told
            self._bucket = TokenBucket(rate, burst or max(1, int(rate)), clock())
        self._queues: tuple[deque[_Waiter], ...] = tuple(deque() for _ in Priority)
        self._timer: asyncio.TimerHandle | None = None
        self.stats: dict[Priority, PriorityStats] = {p: PriorityStats() for p in Priority}

    @property
    def unlimited(self) -> bool:
        return self._bucket is None

    @property
    def tokens(self) -> float:
        """Bytes that may be taken now (negative: debt); infinite when unlimited."""
        if self._bucket is None:
            return float("inf")
        self._bucket.refill(self._clock())
        return self._bucket.tokens

    @property
    def waiting(self) -> int:
        return sum(len(queue) for queue in self._queues)

    async def acquire(self, priority: Priority, nbytes: int) -> None:
        """Return once `nbytes` are granted at `priority` (at once for PRODUCE)."""
        priority = Priority(priority)
        if nbytes < 0:
            raise ValueError(f"bandwidth limit error at nbytes: {nbytes!r} is negative")
        bucket = self._bucket
        if bucket is None or nbytes == 0:
            self._count(priority, nbytes, None)
            return
        now = self._clock()
        bucket.refill(now)
        if priority is Priority.PRODUCE or (self._is_head(priority) and bucket.ready(nbytes)):
            bucket.take(nbytes)
            self._count(priority, nbytes, None)
            return
        waiter = _Waiter(priority, nbytes, now, asyncio.get_running_loop().create_future())
        self._queues[priority].append(waiter)
        if self._head() is waiter:
            self._arm()
        try:
            granted_at = await waiter.granted
        except asyncio.CancelledError:
            self._cancelled(waiter)
            raise
        self._count(priority, nbytes, granted_at - waiter.since)

    def poll(self) -> None:
        """Grant the queue's head while the bucket allows, then arm the timer for the
        next one. The timer calls this; so may anyone who knows the clock moved."""
        bucket = self._bucket
        if bucket is None:
            return
        now = self._clock()
        bucket.refill(now)
        while (head := self._head()) is not None and bucket.ready(head.nbytes):
            self._queues[head.priority].popleft()
            bucket.take(head.nbytes)
            head.granted.set_result(now)
        self._arm()

    # -- the queue -----------------------------------------------------------------------

    def _head(self) -> _Waiter | None:
        for queue in self._queues:
            if queue:
                return queue[0]
        return None

    def _is_head(self, priority: Priority) -> bool:
        """Whether a request at `priority` would be the head if it queued now."""
        return not any(self._queues[p] for p in range(priority + 1))

    def _arm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        head = self._head()
        if head is not None and self._bucket is not None:
            delay = self._bucket.seconds_until_ready(head.nbytes)
            self._timer = asyncio.get_running_loop().call_later(delay, self.poll)

    def _cancelled(self, waiter: _Waiter) -> None:
        granted = waiter.granted
        if granted.done() and not granted.cancelled():  # cancelled before it could resume
            if self._bucket is not None:
                self._bucket.give_back(waiter.nbytes)
            self.poll()
            return
        granted.cancel()
        was_head = self._head() is waiter
        self._queues[waiter.priority].remove(waiter)
        if was_head:  # the next head may be grantable now, or need another timer
            self.poll()

    def _count(self, priority: Priority, nbytes: int, waited: float | None) -> None:
        """`waited`: None if the request did not queue."""
        stats = self.stats[priority]
        stats.grants += 1
        stats.bytes_granted += nbytes
        if waited is not None:
            stats.waits += 1
            stats.seconds_waited += waited
