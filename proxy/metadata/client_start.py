"""Starting an aiokafka client from a task that may be cancelled (a shard revoked while its
owner starts, a proxy stopping).

aiokafka's bootstrap opens a connection, asks it for metadata and then closes it; a
cancellation that lands while it waits for that answer leaves the connection open and
known to nobody (not in the client's connection table, so `stop()` cannot close it). So
a cancelled start here lets the start finish first, for at most `settle_s`, and the
caller's `stop()` then closes everything the client opened. Past `settle_s` (Kafka not
answering) the start is cancelled after all: a stuck start must not hold a revoke up.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Protocol

SETTLE_S = 10.0


class _Startable(Protocol):
    async def start(self) -> None: ...


async def start_client(client: _Startable, settle_s: float = SETTLE_S) -> None:
    """`await client.start()`; cancelled, it waits up to `settle_s` for the start to end,
    then raises CancelledError."""
    starting = asyncio.ensure_future(client.start())
    try:
        await asyncio.shield(starting)
    except asyncio.CancelledError:
        if not starting.done():
            with contextlib.suppress(TimeoutError, Exception):
                async with asyncio.timeout(settle_s):
                    await asyncio.shield(starting)
            if not starting.done():
                starting.cancel()
        if starting.done() and not starting.cancelled():
            starting.exception()  # retrieved: the caller's close deals with the client
        raise
