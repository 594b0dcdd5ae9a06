"""The comparison: a scenario's rows (op, passthrough answer, tiered answer) and, when
any compared row differs, one report with every row side by side, the first divergence
marked, so a failure names what Kafka answered and what the tiered topic answered."""

from __future__ import annotations

import textwrap
from dataclasses import dataclass
from typing import Any

WIDTH = 58


@dataclass
class Row:
    step: int
    op: str
    passthrough: Any
    tiered: Any
    compared: bool = True  # tiered-only ops (tier, stray writes) are shown, not compared
    seconds: float = 0.0

    @property
    def diverges(self) -> bool:
        return self.compared and self.passthrough != self.tiered


def divergences(rows: list[Row]) -> list[Row]:
    return [row for row in rows if row.diverges]


def _cell(answer: Any, other: Any) -> list[str]:
    """An answer in a few lines: a sequence (a fetch's records, a produce's offsets) as
    its length and ends, with its first item that differs from the other side's."""
    if not (isinstance(answer, tuple) and len(answer) > 4 and not isinstance(answer[0], str)):
        return textwrap.wrap(repr(answer), WIDTH) or [""]
    text = f"{len(answer)} items: {answer[0]!r} .. {answer[-1]!r}"
    if answer != other:
        theirs = other if isinstance(other, tuple) else ()
        at = next(
            (n for n, item in enumerate(answer) if n >= len(theirs) or theirs[n] != item),
            len(answer),
        )
        shown = repr(answer[at]) if at < len(answer) else "(nothing: shorter)"
        text += f"; first difference, item {at}: {shown}"
    return textwrap.wrap(text, WIDTH)


def report(rows: list[Row], title: str) -> str:
    """Every row: step, op, then the two answers side by side; `!=` marks divergences."""
    lines = [title, f"{'':4} {'op':44} | {'passthrough (Kafka)':{WIDTH}} | tiered"]
    total = sum(row.seconds for row in rows)
    for row in rows:
        mark = "!=" if row.diverges else ("  " if row.compared else " -")
        left = _cell(row.passthrough, row.tiered)
        right = _cell(row.tiered, row.passthrough)
        for n in range(max(len(left), len(right))):
            head = f"{row.step:>2}{mark} {row.op[:44]:44}" if n == 0 else " " * 49
            a = left[n] if n < len(left) else ""
            b = right[n] if n < len(right) else ""
            lines.append(f"{head} | {a:{WIDTH}} | {b}")
    lines.append(f"({len(rows)} steps in {total:.1f} s)")
    first = next((row for row in rows if row.diverges), None)
    if first is not None:
        lines.append(f"first divergence at step {first.step}: {first.op}")
        lines.append(f"  passthrough: {_clip(first.passthrough)}")
        lines.append(f"  tiered:      {_clip(first.tiered)}")
    return "\n".join(lines)


def assert_conforms(rows: list[Row], title: str) -> None:
    if divergences(rows):
        raise AssertionError(report(rows, title))


def _clip(answer: Any, limit: int = 3000) -> str:
    text = repr(answer)
    return text if len(text) <= limit else text[:limit] + f"... ({len(text)} characters)"
