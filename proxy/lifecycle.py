"""Starting a service of many parts so that a failed start leaves nothing running.

A service's `start` runs its steps in order; its `stop` stops each part only if the part
got that far, so it undoes any prefix of the start, and does nothing the second time.
`start_or_undo` joins the two: a step that fails, or a cancel, stops what was started
and raises the error (docs/ARCHITECTURE.md, "A start that fails"). `run_connection` is
how a listener keeps the connections it accepted, so that its stop can end them all.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from typing import Any


async def start_or_undo(
    start: Callable[[], Awaitable[None]], stop: Callable[[], Awaitable[None]]
) -> None:
    try:
        await start()
    except BaseException:
        await stop()
        raise


async def settle(steps: Iterable[Awaitable[object]]) -> None:
    """Run the steps together and wait for every one to end, then raise the first error:
    unlike a bare gather, none is left running when one fails (the undo follows)."""
    results = await asyncio.gather(*steps, return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException):
            raise result


def run_connection(
    connections: set[asyncio.Task[None]],
    writer: asyncio.StreamWriter,
    serve: Coroutine[Any, Any, None],
) -> None:
    """Serve an accepted connection as a task that is in `connections` from this moment.

    Called from a listener's plain accept callback, not a coroutine: a stop that cancels
    every task in `connections` reaches this one even before it first runs (a task
    cancelled then runs no `finally`, so its end aborts the socket here instead); once it
    ends it leaves the set."""
    task = asyncio.get_running_loop().create_task(serve)
    connections.add(task)

    def done(task: asyncio.Task[None]) -> None:
        connections.discard(task)
        if not writer.transport.is_closing():
            writer.transport.abort()

    task.add_done_callback(done)
