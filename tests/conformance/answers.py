"""The answers the runners give, normalized so that the three clients' are alike and a
passthrough topic's can be compared with a tiered topic's as they are.

- produce: a tuple, per record, of its offset or an error name;
- fetch: a tuple of `Record`s, then `("end", position)` or `("error", name)`;
- list-offsets: `("offset", offset, timestamp, leader epoch or None)` or an error;
- delete-records: `("low_watermark", offset)` or an error;
- commit: `("committed", offset)`; resume: `("record", offset, value)` or `("end",
  position)`; offset-for-leader-epoch: `("epoch_end", error code, epoch, end offset)`.

Timestamps are relative to the scenario's base time when they are within a day of it.
"""

from __future__ import annotations

from typing import NamedTuple

DAY_MS = 86_400_000
OUT_OF_RANGE = "OFFSET_OUT_OF_RANGE"


class Record(NamedTuple):
    offset: int
    key: bytes | None
    value: bytes | None
    ts: int
    ts_type: str  # CreateTime, LogAppendTime
    headers: tuple[tuple[str, bytes | None], ...]

    def __repr__(self) -> str:
        headers = f" h={list(self.headers)}" if self.headers else ""
        kind = "" if self.ts_type == "CreateTime" else f" {self.ts_type}"
        return f"{self.offset}:{_short(self.key)}={_short(self.value)}@{self.ts}{kind}{headers}"


def _short(value: bytes | None) -> str:
    """A value as it reads in a report: long ones cut, with their length."""
    if value is None or len(value) <= 16:
        return repr(value)
    return f"{value[:12]!r}..({len(value)} B)"


def relative(ts: int, base_ms: int) -> int:
    """A timestamp relative to the base time; -1 (none) and far ones as they are."""
    return ts - base_ms if ts >= 0 and abs(ts - base_ms) < DAY_MS else ts


def error(name: str) -> tuple[str, str]:
    return ("error", name)


def end(position: int) -> tuple[str, int]:
    return ("end", position)


def offset_answer(offset: int, ts: int, base_ms: int, epoch: int | None) -> tuple:
    return ("offset", offset, relative(ts, base_ms), epoch)
