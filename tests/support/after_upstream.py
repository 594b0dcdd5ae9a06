"""Running a plan that acts after upstream answers (`proxy.tiered.planners.AfterUpstream`:
AddPartitionsToTxn, InitProducerId) in a unit test, with a stand-in tiering service."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from typing import Any

from proxy.metadata.topic_index import TieredTopic

HEAD = b"H" * 10  # a request header, as the plan is handed it


def run_after_upstream(make_plan: Callable[[tuple, memoryview], Any], asked: list,
                       version: int, request: bytes, answer: bytes):  # fmt: skip
    """(the plan's upstream frame, what the stand-in was `asked` before upstream answered,
    the client's answer); None if the request goes upstream with nothing after.
    `make_plan(frame, body)` plans the request (`frame`: b"S", HEAD, `request`)."""

    async def run():
        plan = make_plan((b"S", HEAD, request), memoryview(request))
        if plan is None:
            return None
        await asyncio.sleep(0)
        asked_before = list(asked)
        plan.upstream_answered(version, memoryview(answer))
        local = await plan.local
        return plan.upstream_frame, asked_before, plan.merge(version, memoryview(answer), local)

    return asyncio.run(run())


class TieredTopics:
    """The tiering service's `topics` as a plan reads them: these topics are tiered."""

    def __init__(self, tiered: list[TieredTopic]) -> None:
        self.tiered = tiered

    def any(self) -> bool:
        return bool(self.tiered)

    def topic(self, key: str | uuid.UUID) -> TieredTopic | None:
        return next((t for t in self.tiered if key in (t.name, t.topic_id)), None)
