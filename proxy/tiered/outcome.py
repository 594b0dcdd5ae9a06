"""A plan's `local` future done with the outcome of the task that finishes it: the plans
whose local part starts once upstream answered (`planners.AfterUpstream`: txn.py,
offsets.py) create `local` before the task exists."""

from __future__ import annotations

import asyncio
from typing import TypeVar

T = TypeVar("T")


def pass_outcome(task: asyncio.Future[T], into: asyncio.Future[T]) -> None:
    """`into` done as `task` ended (its result, error or cancel), unless done already."""
    if into.done():
        return
    if task.cancelled():
        into.cancel()
    elif (error := task.exception()) is not None:
        into.set_exception(error)
    else:
        into.set_result(task.result())
