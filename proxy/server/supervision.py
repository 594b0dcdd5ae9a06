"""The decisions of the parent of `workers: N` (`server/supervisor.py` runs them): when a
worker that exited is started again, after how long, and when the parent gives up.

Pure: an exit and what the worker got to, a decision out. A worker that dies before it
said it was ready (its listeners open, its shard group joined: "worker i ready at")
failed to start; its restarts back off exponentially, and after `max_start_failures` such
deaths in a row the parent stops every worker and exits non-zero: a worker that cannot
start (a WAL it cannot read, a port held by another program, Kafka unreachable) would
otherwise be restarted for ever while the host serves with fewer. A worker that was ready
died of something else (kill -9, the OOM killer): it is started again at once and its
count starts again. A config error (exit code 2) is not retried: it would fail the same
way.
"""

from __future__ import annotations

from dataclasses import dataclass

CONFIG_ERROR_EXIT = 2  # what `tierproxy run` exits with on a config error


@dataclass(frozen=True)
class RestartPolicy:
    first_backoff_s: float = 0.5
    max_backoff_s: float = 30.0
    max_start_failures: int = 5  # deaths in a row, each before ready: give up


@dataclass(frozen=True)
class WorkerRun:
    """One worker's current process: whether it said it was ready, and how many starts
    in a row failed before it."""

    index: int
    ready: bool = False
    start_failures: int = 0


@dataclass(frozen=True)
class Restart:
    after_s: float
    start_failures: int  # for the next WorkerRun


@dataclass(frozen=True)
class GiveUp:
    reason: str


@dataclass(frozen=True)
class LetExit:
    """The parent is stopping: the worker's exit is the one asked for."""


Decision = Restart | GiveUp | LetExit


def on_exit(run: WorkerRun, returncode: int, stopping: bool, policy: RestartPolicy) -> Decision:
    """What to do once worker `run.index` exited with `returncode` (negative: the signal
    that killed it)."""
    if stopping:
        return LetExit()
    if returncode == CONFIG_ERROR_EXIT:
        return GiveUp(f"worker {run.index} refused its config (exit code {returncode})")
    if run.ready:
        return Restart(after_s=0.0, start_failures=0)
    failures = run.start_failures + 1
    if failures >= policy.max_start_failures:
        return GiveUp(
            f"worker {run.index} died {failures} times in a row before it was ready "
            f"(last exit code {returncode})"
        )
    backoff = min(policy.max_backoff_s, policy.first_backoff_s * 2 ** (failures - 1))
    return Restart(after_s=backoff, start_failures=failures)


def exit_code(returncodes: list[int], gave_up: bool) -> int:
    """The parent's own exit code: 0 when every worker stopped cleanly on request."""
    if gave_up or any(code != 0 for code in returncodes):
        return 1
    return 0
