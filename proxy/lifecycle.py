"""Starting a service of many parts so that a failed start leaves nothing running.

A service's `start` runs its steps in order; its `stop` stops each part only if the part
got that far, so it undoes any prefix of the start, and does nothing the second time.
`start_or_undo` joins the two: a step that fails, or a cancel, stops what was started
and raises the error (docs/ARCHITECTURE.md, "A start that fails").
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable


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
