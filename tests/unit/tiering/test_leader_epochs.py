"""The current leader epochs the proxy answers in ListOffsets (proxy/tiered/leader_epochs.py):
one Metadata lookup shared by concurrent callers, kept a second, and -1 when Kafka
cannot be asked."""

from __future__ import annotations

import asyncio

from proxy.tiered.leader_epochs import MAX_AGE_S, LeaderEpochs


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_concurrent_lookups_share_one_answer_kept_for_max_age():
    asked = []
    clock = Clock()

    async def lookup(topic: str) -> dict[int, int]:
        asked.append(topic)
        await asyncio.sleep(0)
        return {0: 3, 1: 7}

    async def run() -> None:
        epochs = LeaderEpochs(lookup, clock)
        assert await asyncio.gather(epochs.epoch("t", 0), epochs.epoch("t", 1)) == [3, 7]
        assert asked == ["t"]
        clock.now = MAX_AGE_S / 2
        assert await epochs.epoch("t", 2) == -1  # no such partition: no epoch
        assert asked == ["t"]
        clock.now = MAX_AGE_S * 2
        assert await epochs.epoch("t", 0) == 3
        assert asked == ["t", "t"]

    asyncio.run(run())


def test_a_failed_lookup_answers_no_epoch_and_is_not_kept():
    calls = []

    async def lookup(topic: str) -> dict[int, int]:
        calls.append(topic)
        if len(calls) == 1:
            raise ConnectionError("no broker")
        return {0: 2}

    async def run() -> None:
        epochs = LeaderEpochs(lookup, Clock())
        assert await epochs.epoch("t", 0) == -1
        assert await epochs.epoch("t", 0) == 2

    asyncio.run(run())
