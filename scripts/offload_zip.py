"""`make offload-zip`: the offload jobs' code as one zip for `spark-submit --py-files`.

It holds the packages `proxy` and `offload_jobs` (their .py files and data files, no
caches), the code that executors and the driver import; their dependencies are not in it
(docs/offload.md, "On a Spark cluster"). Entries are sorted and dated 1980, so the same
sources give the same bytes.

    python scripts/offload_zip.py [--out dist/tierproxy-offload.zip]
"""

from __future__ import annotations

import argparse
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("proxy", "offload_jobs")
SKIP = ("__pycache__", ".pyc", ".pyo")


def build(out: Path) -> list[str]:
    """Write the zip at `out`; the names it holds."""
    names = sorted(
        path.relative_to(ROOT).as_posix()
        for package in PACKAGES
        for path in (ROOT / package).rglob("*")
        if path.is_file() and not any(part.endswith(SKIP) for part in path.parts)
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as archive:
        for name in names:
            entry = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
            entry.compress_type = zipfile.ZIP_DEFLATED
            entry.external_attr = 0o644 << 16
            archive.writestr(entry, (ROOT / name).read_bytes())
    return names


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "dist" / "tierproxy-offload.zip")
    args = parser.parse_args()
    names = build(args.out)
    print(f"{args.out}: {len(names)} files of {', '.join(PACKAGES)}")


if __name__ == "__main__":
    main()
