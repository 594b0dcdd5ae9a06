"""Where the last `make test` spent its time: the slowest test modules and tests.

scripts/test.sh writes each part's JUnit XML to .cache/test-times/ (pure.xml, shared.xml);
this reads them. Module times are the sums of their tests' times (setup and teardown of
fixtures included, as pytest times them), so a module-scoped cluster counts once, in the
module that started it.

    .venv/bin/python scripts/test_times.py [--top N] [XML ...]
"""

from __future__ import annotations

import argparse
import sys
import xml.etree.ElementTree as ElementTree
from collections import defaultdict
from pathlib import Path


def cases(path: Path) -> list[tuple[str, str, float]]:
    """(module, test, seconds) for each test case in a JUnit XML file."""
    root = ElementTree.parse(path).getroot()
    return [
        (case.get("classname", "").split("::")[0], case.get("name", ""), float(case.get("time", 0)))
        for case in root.iter("testcase")
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="*", type=Path)
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args(argv)
    files = args.files or sorted(Path(".cache/test-times").glob("*.xml"))
    if not files:
        print("no JUnit XML: run make test first", file=sys.stderr)
        return 1
    for path in files:
        found = cases(path)
        by_module: dict[str, float] = defaultdict(float)
        for module, _, seconds in found:
            by_module[module] += seconds
        total = sum(by_module.values())
        print(f"{path}: {len(found)} tests, {total / 60:.1f} min")
        for module, seconds in sorted(by_module.items(), key=lambda m: -m[1])[: args.top]:
            print(f"  {seconds:8.1f} s  {seconds / total:5.1%}  {module}")
        print("  slowest tests:")
        for module, name, seconds in sorted(found, key=lambda c: -c[2])[: args.top]:
            print(f"  {seconds:8.1f} s  {module}::{name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
