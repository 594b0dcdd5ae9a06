"""Calls that must go on in the order they came, per key, across a wait.

A Kafka broker handles one request of a connection at a time, so a producer's batches
reach a partition's sequencer in the order it sent them. The proxy handles a
connection's requests concurrently and keeps that order by starting each partition's
produce in request order and by never letting one produce wait where a later one would
not (produce.py). Where a produce has to wait (a partition being cut over, or started
after its shard was claimed, service.py), a later produce of the same stream must wait
behind it, even if what it waited for is there by then: else the later batch reaches the
sequencer first and is refused OUT_OF_ORDER_SEQUENCE_NUMBER (or, for a producer the
stream does not know yet, taken, and the earlier one then refused), a gap no broker
makes and that client libraries treat as fatal.

`InOrder` is that queue, used wherever a stream's (or a topic's) calls must keep their
order across a wait: the held produces (hold.py), the hand-off to the owner and the
owner's arrivals (owners.py), a topic's first read of its produce rules
(topic_configs.py). `take(key)` takes a place at the caller's first step (before any
suspension), so places are in call order; the caller may do work that can run
concurrently (an S3-WAL PUT, a GET), then `await turn.ready()` waits until every earlier
place of the key has ended, and `turn.end()` (in a `finally`) ends its own. A turn that
ends before it was ready (cancelled while waiting, or failed before it) lets the next one
go only once its own predecessor has ended: a later call never overtakes an earlier one
still under way. `turn(key)` is the same as one block. The fast path asks `busy(key)`
first (one dict lookup) and takes a place only when a wait is needed or another call of
the key holds one. asyncio only, no I/O.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Hashable


class Turn:
    """One place in a key's queue (`InOrder.take`)."""

    __slots__ = ("_before", "_key", "_mine", "_order", "_ready")

    def __init__(
        self,
        order: InOrder,
        key: Hashable,
        before: asyncio.Future[None] | None,
        mine: asyncio.Future[None],
    ) -> None:
        self._order, self._key, self._before, self._mine = order, key, before, mine
        self._ready = before is None or before.done()

    @property
    def behind(self) -> bool:
        """Whether an earlier place of the key was under way when this one was taken."""
        return self._before is not None

    async def ready(self) -> None:
        """Wait until every earlier place of the key has ended (never cancels them)."""
        if not self._ready:
            assert self._before is not None
            await asyncio.wait([self._before])
            self._ready = True

    def end(self) -> None:
        """This place is over: the next one may go once every earlier one has ended."""
        if self._ready or self._before is None or self._before.done():
            self._order._end(self._key, self._mine)
        else:
            self._before.add_done_callback(lambda _: self._order._end(self._key, self._mine))


class InOrder:
    """Per key, the places taken and not yet ended, in the order they were taken."""

    def __init__(self) -> None:
        # key -> the latest place's future, done once that place and all before it ended
        self._last: dict[Hashable, asyncio.Future[None]] = {}

    def busy(self, key: Hashable) -> bool:
        """Whether a place of `key` is under way or waiting: a call must take one too."""
        return key in self._last

    def take(self, key: Hashable) -> Turn:
        """The next place of `key`; the caller must `end()` it whatever happens."""
        before = self._last.get(key)
        mine: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._last[key] = mine
        return Turn(self, key, before, mine)

    @contextlib.asynccontextmanager
    async def turn(self, key: Hashable) -> AsyncIterator[None]:
        """Wait for every earlier place of `key` to end, then run the block. Taken at the
        caller's first step (before any suspension), so turns are in call order."""
        place = self.take(key)
        try:
            await place.ready()
            yield
        finally:
            place.end()

    def _end(self, key: Hashable, mine: asyncio.Future[None]) -> None:
        if not mine.done():
            mine.set_result(None)
        if self._last.get(key) is mine:
            del self._last[key]
