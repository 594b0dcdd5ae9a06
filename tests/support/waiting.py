"""Polling for a state that changes elsewhere (another process, a thread, the event loop).

One loop, three spellings: `wait_until` (a condition), `wait_for` (a value and a test of
it, whose last value the failure shows) and `eventually` (the same from a coroutine, so
the event loop keeps running while it waits). A test polls only where there is no event
to wait on; a "still not happened" assertion waits for the event that would have made it
happen, never a fixed sleep.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

T = TypeVar("T")


def wait_until(
    condition: Callable[[], Any],
    timeout_s: float = 30.0,
    what: str = "condition",
    interval_s: float = 0.1,
) -> float:
    """Poll `condition()` until true; the seconds it took. AssertionError naming `what`."""
    started = time.monotonic()
    while not condition():
        if time.monotonic() - started > timeout_s:
            raise AssertionError(f"{what}: not after {timeout_s} s")
        time.sleep(interval_s)
    return time.monotonic() - started


def wait_for(
    get: Callable[[], T],
    done: Callable[[T], Any],
    what: str,
    timeout: float = 60.0,
    interval: float = 0.2,
) -> T:
    """Poll `get()` until `done(value)`; that value. The failure shows the last one."""
    deadline = time.monotonic() + timeout
    while True:
        value = get()
        if done(value):
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not {what} after {timeout} s; last: {value!r}"[:3000])
        time.sleep(interval)


async def eventually(
    condition: Callable[[], Any | Awaitable[Any]],
    timeout_s: float = 5.0,
    what: str = "condition",
    interval_s: float = 0.01,
) -> float:
    """`wait_until` for a coroutine: `condition` may be async; the seconds it took."""
    started = time.monotonic()
    while True:
        met = condition()
        if inspect.isawaitable(met):
            met = await met
        if met:
            return time.monotonic() - started
        if time.monotonic() - started > timeout_s:
            raise AssertionError(f"{what}: not within {timeout_s} s")
        await asyncio.sleep(interval_s)
