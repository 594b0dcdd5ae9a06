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

    @property
    def diverges(self) -> bool:
        return self.compared and self.passthrough != self.tiered


def divergences(rows: list[Row]) -> list[Row]:
    return [row for row in rows if row.diverges]


def _cell(answer: Any) -> list[str]:
    if isinstance(answer, tuple) and answer and all(_is_item(a) for a in answer):
        text = ", ".join(map(repr, answer))  # a fetch: records then its end
    else:
        text = repr(answer)
    return textwrap.wrap(text, WIDTH) or [""]


def _is_item(a: Any) -> bool:
    return not isinstance(a, (str, int)) or isinstance(a, bool)


def report(rows: list[Row], title: str) -> str:
    """Every row: step, op, then the two answers side by side; `!=` marks divergences."""
    lines = [title, f"{'':4} {'op':44} | {'passthrough (Kafka)':{WIDTH}} | tiered"]
    for row in rows:
        mark = "!=" if row.diverges else ("  " if row.compared else " -")
        left, right = _cell(row.passthrough), _cell(row.tiered)
        for n in range(max(len(left), len(right))):
            head = f"{row.step:>2}{mark} {row.op[:44]:44}" if n == 0 else " " * 49
            a = left[n] if n < len(left) else ""
            b = right[n] if n < len(right) else ""
            lines.append(f"{head} | {a:{WIDTH}} | {b}")
    first = next((row for row in rows if row.diverges), None)
    if first is not None:
        lines.append(f"first divergence at step {first.step}: {first.op}")
        lines.append(f"  passthrough: {first.passthrough!r}")
        lines.append(f"  tiered:      {first.tiered!r}")
    return "\n".join(lines)


def assert_conforms(rows: list[Row], title: str) -> None:
    if divergences(rows):
        raise AssertionError(report(rows, title))
