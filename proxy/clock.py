"""The wall clock in Kafka's unit: milliseconds since the epoch.

One helper instead of a copy per module. Code that must be tested at a chosen time takes a
`clock_ms` callable defaulting to `now_ms`, so tests pass their own.
"""

from __future__ import annotations

import time


def now_ms() -> int:
    """Kafka's timestamp of this moment (what a broker's `time.milliseconds()` gives)."""
    return time.time_ns() // 1_000_000
