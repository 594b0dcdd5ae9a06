"""Soak: the fault suite's scenario for N seeds back to back, one table (issue 18).

    .venv/bin/python -m benchmarks.soak [--runs 20] [--seeds 1,2,3] [--json soak.json]
                                        [--keep DIR]

Each run is `pytest tests/integration/faults/test_fault_injection.py` in a process of its
own with `TIERPROXY_FAULT_SEED` set (random seeds unless `--seeds`), its own Kafka and
MinIO, as in CI; the figures it writes (`fault-figures.json` in its tmp dir) make one row:
faults injected, records acknowledged, lost, duplicates of each kind (in the log, served
again), the recovery times (median and max over every fault of the run), what was left
in the bucket (orphans, S3-WAL objects, garbage past the grace) and the result. A run
that fails still gives its row when it got as far as writing its figures; one that did
not says where pytest stopped. The figures that matter: lost 0 and duplicates 0 in every
row. Markdown on stdout, as the runs end; `--json` has every run's figures. `--keep DIR`
keeps each run's tmp dir (the proxies' and Kafka's logs) under DIR; else they are deleted.

Outside CI: a run takes 5-10 minutes on the shared 2-core machine.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SUITE = "tests/integration/faults/test_fault_injection.py"
HEADER = (
    "| seed | result | faults | acknowledged | lost | duplicates (in the log / served "
    "again) | recovery median / max (s) | orphans / S3-WAL / garbage past grace | wall (s) |\n"
    "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"
)


def run_one(seed: int, base: Path) -> dict:
    """One run of the suite with `seed`: its figures (or none), its result, its time."""
    env = dict(os.environ, TIERPROXY_FAULT_SEED=str(seed), PYTHONPATH=str(ROOT))
    began = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "pytest", SUITE, "-q", "-p", "no:cacheprovider",
         f"--basetemp={base}"],
        cwd=ROOT, env=env, capture_output=True, text=True, check=False,
    )  # fmt: skip
    wall = time.monotonic() - began
    base.mkdir(exist_ok=True)
    (base / "pytest.out").write_text(done.stdout + done.stderr)  # why a run failed
    found = sorted(base.glob("**/fault-figures.json"))
    figures = json.loads(found[-1].read_text()) if found else None
    summary = [line for line in done.stdout.splitlines() if line.startswith(("FAILED", "ERROR"))]
    return {
        "seed": seed,
        "passed": done.returncode == 0,
        "failure": (summary[-1][:200] if summary else done.stdout.strip()[-200:])
        if done.returncode
        else None,
        "wall_s": round(wall, 1),
        "figures": figures,
    }


def row(run: dict) -> str:
    f = run["figures"]
    result = "passed" if run["passed"] else f"failed: {run['failure']}"
    if f is None:
        return f"| {run['seed']} | {result} | - | - | - | - | - | - | {run['wall_s']} |"
    kinds = f.get("recovery_s", {}).values()
    # the slowest kind's median, and the slowest single recovery
    recovery = (
        f"{max(k['median'] for k in kinds):.2f} / {max(k['max'] for k in kinds):.2f}"
        if kinds
        else "-"
    )
    faults = ", ".join(f"{n} {kind}" for kind, n in f["faults_injected"].items())
    left = (
        f"{len(f.get('orphans_past_grace', []))} / {len(f.get('s3wal_past_retention', []))}"
        f" / {len(f.get('garbage_left_after_grace', []))}"
    )
    duplicates = f"{f.get('duplicates_in_the_log', '-')} / {f.get('duplicates_served_again', '-')}"
    return (
        f"| {run['seed']} | {result} | {f['faults_total']} ({faults}) | "
        f"{f['records_acknowledged']:,} | {f['lost']} | {duplicates} | {recovery} | {left} | "
        f"{run['wall_s']} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--seeds", help="comma-separated seeds (else random)")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--keep", type=Path, help="keep each run's tmp dir under this dir")
    args = parser.parse_args()
    if args.seeds:
        seeds = [int(s) for s in args.seeds.split(",")]
    else:
        seeds = [random.SystemRandom().randrange(2**32) for _ in range(args.runs)]
    if args.keep:
        args.keep.mkdir(parents=True, exist_ok=True)  # pytest makes --basetemp, not parents
    runs = []
    print(HEADER, flush=True)
    with tempfile.TemporaryDirectory(prefix="soak-") as tmp:
        for i, seed in enumerate(seeds):
            base = (args.keep or Path(tmp)) / f"run{i}-{seed}"
            run = run_one(seed, base)
            runs.append(run)
            print(row(run), flush=True)
            if args.json:
                args.json.write_text(json.dumps(runs, indent=2) + "\n")
    bad = [r["seed"] for r in runs if not r["passed"]]
    lost = sum((r["figures"] or {}).get("lost", 0) for r in runs)
    twice = sum((r["figures"] or {}).get("duplicates", 0) for r in runs)
    print(f"\n{len(runs)} runs, {len(runs) - len(bad)} passed; lost {lost}, duplicates {twice}")
    if bad:
        print(f"failed seeds: {bad}")


if __name__ == "__main__":
    main()
