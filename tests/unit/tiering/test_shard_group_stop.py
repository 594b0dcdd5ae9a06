"""A shard given up by its member (lost while assigned, or revoked): a step that hangs
is logged, naming the shard and the step, since the shard is claimed again only after
it (a CI run of 2026-12-05 stopped with a shard never claimed again and no line saying
why: docs/reliability.md, "What the suite found")."""

from __future__ import annotations

import asyncio
import functools
import logging
from types import SimpleNamespace

from proxy.metadata import group
from proxy.metadata.group import ShardAssignment
from tests.support.waiting import eventually


class Owner:
    owning = False  # lost: closed, not released
    state = SimpleNamespace(owner="proxy-a")

    def __init__(self) -> None:
        self.closed = False

    async def close(self) -> None:
        self.closed = True


async def _give_up(caplog) -> None:
    stopped = asyncio.Event()

    async def on_lost(shard: int) -> None:  # its partitions' close waits
        await stopped.wait()

    assignment = ShardAssignment({}, "meta", 4, "proxy-a", on_lost=on_lost)
    owner = Owner()
    giving_up = asyncio.ensure_future(assignment._stop(3, owner, True))  # noqa: SLF001
    await eventually(lambda: caplog.records, interval_s=0.01)
    [said] = caplog.records
    assert said.levelno == logging.WARNING
    assert "shard 3" in said.getMessage() and "stopping its partitions" in said.getMessage()
    assert not giving_up.done() and not owner.closed
    stopped.set()
    await asyncio.wait_for(giving_up, 5)
    assert owner.closed and len(caplog.records) == 1  # the close was quick: not logged


def test_a_step_that_hangs_is_logged_naming_the_shard_and_the_step(caplog, monkeypatch):
    monkeypatch.setattr(group, "SLOW_STEP_S", 0.05)
    caplog.set_level(logging.WARNING, "tierproxy.metadata")
    asyncio.run(asyncio.wait_for(_give_up(caplog), 10))


async def _claim(caplog, held_by: str | None) -> None:
    assignment = ShardAssignment({}, "meta", 4, "proxy-a")
    owner = SimpleNamespace(held_by=held_by, stage="reading the shard to its end")
    started = asyncio.Event()
    claiming = asyncio.ensure_future(
        assignment._watched(2, functools.partial(group._claiming, owner), started.wait())  # noqa: SLF001
    )
    await asyncio.sleep(0.2)  # four times SLOW_STEP_S: the warning is due, if it is ever
    started.set()
    await claiming


def test_a_claim_that_hangs_is_logged_with_its_stage_unless_it_waits_for_the_last_owner(
    caplog, monkeypatch
):
    monkeypatch.setattr(group, "SLOW_STEP_S", 0.05)
    caplog.set_level(logging.WARNING, "tierproxy.metadata")
    asyncio.run(_claim(caplog, held_by="proxy-b"))  # that wait says itself what it waits for
    assert caplog.records == []
    asyncio.run(_claim(caplog, held_by=None))
    [said] = caplog.records
    assert "shard 2: claiming it (reading the shard to its end)" in said.getMessage()
