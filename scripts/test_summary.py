"""The last lines of `make test` (scripts/test.sh): each part's pytest summary, then one
line in pytest's own format adding them up, so the output ends as a single pytest run's
would (CI logs, and people, read the last line).

    python scripts/test_summary.py SECONDS PURE_LOG SHARED_LOG
"""

from __future__ import annotations

import re
import sys
from collections import Counter
from pathlib import Path

# pytest's order; "deselected" is left out: each part deselects the other's tests
ORDER = ("failed", "passed", "skipped", "xfailed", "xpassed", "warnings", "errors", "rerun")
SINGULAR = {"warning": "warnings", "error": "errors"}  # as pytest writes one of them
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
# "=== 3 passed, 1 skipped in 2.10s ===", or without the rules under -q
_SUMMARY = re.compile(
    r"^(?:=+ )?((?:\d+ [a-z]+)(?:, \d+ [a-z]+)*|no tests ran) in [0-9.]+s(?: \([0-9:]+\))?(?: =+)?$"
)
_COUNT = re.compile(r"(\d+) ([a-z]+)")


def summary_line(log: Path) -> str | None:
    """The text of the last pytest summary line in `log` (colours removed), if any."""
    found = None
    for line in log.read_text(errors="replace").splitlines():
        match = _SUMMARY.match(_ANSI.sub("", line).strip())
        if match:
            found = match.group(1)
    return found


def counts(text: str) -> Counter[str]:
    found: Counter[str] = Counter()
    for number, word in _COUNT.findall(text):
        found[SINGULAR.get(word, word)] += int(number)
    return found


def combined(seconds: int, texts: list[str]) -> str:
    total: Counter[str] = Counter()
    for text in texts:
        total += counts(text)
    singular_of = {word: singular for singular, word in SINGULAR.items()}
    parts = [
        f"{total[word]} {singular_of.get(word, word) if total[word] == 1 else word}"
        for word in ORDER
        if total[word]
    ]
    hours, rest = divmod(seconds, 3600)
    took = f"{seconds:.2f}s ({hours}:{rest // 60:02}:{rest % 60:02})"
    text = f"{', '.join(parts) or 'no tests ran'} in {took}"
    pad = max(80 - len(text) - 2, 2)
    return "=" * (pad // 2) + f" {text} " + "=" * (pad - pad // 2)


def main(argv: list[str]) -> None:
    seconds, logs = int(argv[0]), {"pure": Path(argv[1]), "shared": Path(argv[2])}
    texts = []
    for name, log in logs.items():
        text = summary_line(log) if log.exists() else None
        print(f"[test] {name} part: {text or 'no summary line (the run did not finish)'}")
        if text:
            texts.append(text)
    print(combined(seconds, texts))


if __name__ == "__main__":
    main(sys.argv[1:])
