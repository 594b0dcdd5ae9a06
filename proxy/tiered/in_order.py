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

`InOrder.turn(key)` is that queue: each turn begins once every earlier turn of the key
has ended, and a cancelled turn lets the next one begin only when its own predecessor's
has ended. The fast path asks `busy(key)` first (one dict lookup) and takes a turn only
when a wait is needed or another call of the key is in one. asyncio only, no I/O.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Hashable


class InOrder:
    """Per key, the turns taken and not yet ended, in the order they were taken."""

    def __init__(self) -> None:
        # key -> the latest turn's future, done once that turn and all before it ended
        self._last: dict[Hashable, asyncio.Future[None]] = {}

    def busy(self, key: Hashable) -> bool:
        """Whether a turn of `key` is under way or waiting: a call must take one too."""
        return key in self._last

    @contextlib.asynccontextmanager
    async def turn(self, key: Hashable) -> AsyncIterator[None]:
        """Wait for every earlier turn of `key` to end, then run the block. Taken at the
        caller's first step (before any suspension), so turns are in call order."""
        before = self._last.get(key)
        mine: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._last[key] = mine
        waited = before is None or before.done()
        try:
            if not waited:
                assert before is not None
                await asyncio.wait([before])  # never cancels `before`
                waited = True
            yield
        finally:
            if waited:
                self._end(key, mine)
            else:  # cancelled while waiting: the next turn waits for the one before too
                assert before is not None
                before.add_done_callback(lambda _: self._end(key, mine))

    def _end(self, key: Hashable, mine: asyncio.Future[None]) -> None:
        if not mine.done():
            mine.set_result(None)
        if self._last.get(key) is mine:
            del self._last[key]
