"""What every benchmark run records about itself, and how it waits and stops.

`command_line()` and `git_state()` go into each report, so that a figure in
docs/benchmarks.md names the command that made it and the code the proxy ran.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

from confluent_kafka import libversion

from proxy.devstack import versions
from proxy.devstack.paths import repo_root


def command_line() -> str:
    """The command that started this run, as it can be typed again from the checkout:
    `python -m benchmarks.NAME ...` when run as a module."""
    argv = [sys.executable, *sys.argv]
    try:
        argv[0] = str(Path(sys.executable).relative_to(Path.cwd()))
    except ValueError:
        pass
    module = getattr(sys.modules["__main__"], "__spec__", None)
    if module is not None and module.name:
        argv[1:2] = ["-m", module.name.removesuffix(".__main__")]
    return shlex.join(argv)


def git_state() -> str:
    """The commit, and a digest of proxy/ when the tree has uncommitted changes there."""

    def git(*args: str) -> str:
        result = subprocess.run(["git", *args], cwd=repo_root(), capture_output=True, text=True)
        return result.stdout.strip()

    commit = git("rev-parse", "--short", "HEAD") or "unknown"
    dirty = git("status", "--porcelain", "--untracked-files=normal", "proxy")
    if not dirty:
        return commit
    # Others may be editing the tree: name the exact code the proxy process loaded.
    digest = hashlib.sha256()
    for path in sorted((repo_root() / "proxy").rglob("*.py")):
        digest.update(path.relative_to(repo_root()).as_posix().encode() + path.read_bytes())
    return f"{commit} + uncommitted changes (proxy/**/*.py sha256 {digest.hexdigest()[:12]})"


def interrupt(signum: int, frame: object) -> None:
    """A signal handler for SIGTERM/SIGHUP: unwind as on Ctrl-C, so `finally` stops
    every process the run started."""
    raise KeyboardInterrupt


def wait_until(what: str, check, timeout: float, interval: float = 0.3):
    """Poll `check()` until it returns something true; that value. RuntimeError naming
    `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not (result := check()):
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what}: not after {timeout:.0f} s")
        time.sleep(interval)
    return result


def run_facts(args: argparse.Namespace, proxy_code: str, machine: dict, minio: bool) -> dict:
    """The first lines of a report: what ran, when, on which code, machine and versions,
    with which settings. The benchmark adds its own figures to the dict."""
    facts = {
        "command": command_line(),
        "date": time.strftime("%Y-%m-%d %H:%M %Z"),
        "proxy_code": proxy_code,
        "machine": machine,
        "kafka": versions()["KAFKA_VERSION"],
    }
    if minio:
        facts["minio"] = versions()["MINIO_VERSION"]
    facts["librdkafka"] = libversion()[0]
    facts["settings"] = {k: str(v) for k, v in vars(args).items()}
    return facts


def write_json(path: Path | None, out: dict) -> None:
    """`--json`: everything the run measured, where the report names it."""
    if path:
        Path(path).write_text(json.dumps(out, indent=2, default=str))
        print(f"\n(JSON written to {path})")


def run_main(main: Callable[[], int]) -> NoReturn:
    """`main()`'s exit code; on Ctrl-C (or `interrupt`), 130 once `finally` has stopped
    every process the run started."""
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        print("\ninterrupted: everything started was stopped", file=sys.stderr)
        sys.exit(130)


def stop_on_signals() -> None:
    """SIGINT and SIGTERM unwind the run like Ctrl-C (SIGINT too: a background job
    ignores it by default), so that its `finally` and exit stacks stop what it started."""
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, interrupt)


def publish(run: dict, summary: dict, markdown: str, json_path: Path | None, **more) -> int:
    """The report on stdout, and with `--json` the run, its summary and `more` in a file;
    the exit code of a run that got this far (0)."""
    print()
    print(markdown)
    if json_path:
        write_json(json_path, {"run": run, "summary": summary, **more})
    return 0
