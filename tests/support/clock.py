"""A clock the test moves by hand, for code that takes a `clock` (or `now`) callable: a
test that must see "not yet" sets the time instead of sleeping past a deadline."""

from __future__ import annotations


class ManualClock:
    """`clock()` is `clock.now`, which only the test changes (`clock.now += 2.5`);
    `calls` counts the readings, so that a test can wait until the code under test has
    looked at the time it set (instead of sleeping for some of its rounds)."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now
        self.calls = 0

    def __call__(self) -> float:
        self.calls += 1
        return self.now
