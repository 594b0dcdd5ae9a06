"""A wake-up for whoever waits for the next metadata record (or another change the tiered
service announces): `notify` wakes every waiter, in the order they began to wait; `wait`
returns at the next notify or after its timeout, whichever comes first. Waiters re-check
their condition after either (a change they wait for may be no record: a partition's
start, for one, is polled for).
"""

from __future__ import annotations

import asyncio


class Changes:
    def __init__(self) -> None:
        self._event = asyncio.Event()

    def notify(self) -> None:
        """Wake whoever waits (a new event for the next wait)."""
        self._event.set()
        self._event = asyncio.Event()

    async def wait(self, timeout_s: float) -> None:
        """Until the next `notify`, at most `timeout_s`."""
        event = self._event
        try:
            async with asyncio.timeout(timeout_s):
                await event.wait()
        except TimeoutError:
            pass
