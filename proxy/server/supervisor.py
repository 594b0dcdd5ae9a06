"""`workers: N`: the parent that runs N `tierproxy run --worker i` processes, and what a
worker does before it serves (docs/operations.md, "Every core of a host").

The parent only starts, watches and signals its workers; every decision (restart, after
how long, give up) is `server/supervision.py`'s. SIGTERM or SIGINT to the parent is
forwarded to every worker, each stops cleanly (hands its shards over, everything
uploaded), and the parent exits once all have. It prints "proxy ready at <bootstrap>",
as the single process does, once every worker said it was ready. A worker dies with its parent
(PR_SET_PDEATHSIG), so a parent killed with -9 leaves no worker serving under a name the
next parent's worker will take; and a worker holds a lock on its WAL directory for its
whole life, so no two processes ever replay one WAL.
"""

from __future__ import annotations

import asyncio
import ctypes
import fcntl
import logging
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

from proxy import logs
from proxy.config import ConfigError, ProxyConfig
from proxy.config.workers import unused_wal_directories, worker_config
from proxy.server.supervision import (
    GiveUp,
    LetExit,
    RestartPolicy,
    WorkerRun,
    exit_code,
    on_exit,
)
from proxy.wal.fs import OsFilesystem
from proxy.wal.segments import backlog_bytes

log = logging.getLogger("tierproxy.workers")

PARENT_ENV = "TIERPROXY_WORKERS_PARENT"  # the parent's pid, told to each worker
READY_ENV = "TIERPROXY_WORKER_READY_FD"  # a pipe the worker writes to once it is ready
_PR_SET_PDEATHSIG = 1
_LOCK_WAIT_S = 60.0  # a worker of a parent killed with -9 may still be stopping


def check_wal_directories(config: ProxyConfig) -> None:
    """Refuse to start while a WAL directory this `workers` count does not replay holds
    records not uploaded: a worker removed when N shrank (or the single process's WAL
    when N grew) after a crash. Replaying it here is not possible: its records belong to
    that worker's member name, whose shards wait for it; the way out is to start once
    more with the old count and stop cleanly (SIGTERM uploads everything)."""
    if not config.tiering.enabled or config.tiering.wal_mode != "local":
        return
    base = config.tiering.wal_directory
    try:
        names = os.listdir(base)
    except FileNotFoundError:
        return
    fs = OsFilesystem()
    for directory in unused_wal_directories(config, names):
        backlog = backlog_bytes(fs, str(directory))
        if backlog:
            raise ConfigError(
                "workers",
                f"{config.workers}, but {directory} holds {backlog} WAL bytes not uploaded, "
                "left by a worker this count does not run (or by the single process): start "
                "once with the workers count that wrote it and stop it with SIGTERM (it "
                "uploads everything), then change workers",
            )


# -- the parent ---------------------------------------------------------------------------


def supervise(config_path: Path, config: ProxyConfig, policy: RestartPolicy | None = None) -> int:
    """Run `config.workers` workers until SIGTERM/SIGINT; the exit code (1 if gave up)."""
    logs.configure_logging(config.log_level, config.logging.format, config.logging.access)
    return asyncio.run(_Supervisor(config_path, config, policy or RestartPolicy()).run())


class _Supervisor:
    def __init__(self, config_path: Path, config: ProxyConfig, policy: RestartPolicy) -> None:
        self.config_path = config_path
        self.count = config.workers
        self.policy = policy
        self.stopping = asyncio.Event()
        self.gave_up = False
        self.processes: dict[int, asyncio.subprocess.Process] = {}
        self.ready: dict[int, bool] = {}
        listeners = config.listeners
        self.bootstrap = f"{listeners.advertised_host}:{listeners.bootstrap_port}"
        self.announced = False

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, self._stop, signum)
        log.info("starting %d workers (parent pid %d)", self.count, os.getpid())
        codes = await asyncio.gather(*(self._keep(i) for i in range(self.count)))
        return exit_code(list(codes), self.gave_up)

    def _stop(self, signum: int) -> None:
        """Forwarded to every worker, at every signal (a second Ctrl-C is heard too)."""
        self.stopping.set()
        for process in self.processes.values():
            if process.returncode is None:
                process.send_signal(signum)

    async def _keep(self, index: int) -> int:
        """Worker `index`, started again whenever it dies, until the parent stops."""
        failures = 0
        while True:
            process = await self._start(index)
            code = await process.wait()
            run = WorkerRun(index, self.ready[index], failures)
            decision = on_exit(run, code, self.stopping.is_set(), self.policy)
            if isinstance(decision, LetExit):
                return code
            if isinstance(decision, GiveUp):
                log.error("giving up: %s; stopping every worker", decision.reason)
                self.gave_up = True
                self._stop(signal.SIGTERM)
                return code
            log.warning(
                "worker %d (pid %d) exited with %d; starting it again in %.1f s",
                index, process.pid, code, decision.after_s,
            )  # fmt: skip
            failures = decision.start_failures
            try:
                await asyncio.wait_for(self.stopping.wait(), decision.after_s)
                return code  # stopped while waiting to restart
            except TimeoutError:
                pass

    async def _start(self, index: int) -> asyncio.subprocess.Process:
        argv = [sys.executable, "-m", "proxy.cli", "run", "--config", str(self.config_path)]
        env = {**os.environ, PARENT_ENV: str(os.getpid())}
        self.ready[index] = False
        read_end, write_end = os.pipe()
        try:
            env[READY_ENV] = str(write_end)
            process = await asyncio.create_subprocess_exec(
                *argv, "--worker", str(index), env=env, pass_fds=(write_end,)
            )
        except BaseException:
            os.close(read_end)
            raise
        finally:
            os.close(write_end)  # the worker's now: end of file once it exits
        self._watch_ready(index, read_end)
        self.processes[index] = process
        log.info("worker %d started (pid %d)", index, process.pid)
        if self.stopping.is_set():  # the signal came while it was being started
            process.send_signal(signal.SIGTERM)
        return process

    def _watch_ready(self, index: int, read_end: int) -> None:
        """The worker writes a byte once ready; end of file when it exits."""
        loop = asyncio.get_running_loop()

        def readable() -> None:
            if os.read(read_end, 16):
                self.ready[index] = True
                log.info("worker %d is ready", index)
                if not self.announced and all(self.ready.get(i) for i in range(self.count)):
                    self.announced = True  # as the single process says it, once
                    print(f"proxy ready at {self.bootstrap}", flush=True)
            loop.remove_reader(read_end)
            os.close(read_end)

        loop.add_reader(read_end, readable)


# -- a worker -----------------------------------------------------------------------------


def run_worker(
    config: ProxyConfig, index: int, serve: Callable[[ProxyConfig, Callable[[], None]], None]
) -> int:
    """Worker `index`: tied to its parent's life, its WAL locked, then `serve` (the
    single process's run) with the worker's own config and a call telling the parent
    that it is ready."""
    _die_with_parent()
    mine = worker_config(config, index)
    lock = _lock_wal(mine) if mine.tiering.enabled and mine.tiering.wal_mode == "local" else None
    try:
        serve(mine, _tell_parent_ready)
    finally:
        if lock is not None:
            os.close(lock)
    return 0


def _tell_parent_ready() -> None:
    fd = os.environ.pop(READY_ENV, None)
    if fd is not None:
        try:
            os.write(int(fd), b"r")
        finally:
            os.close(int(fd))


def _die_with_parent() -> None:
    """SIGTERM when the parent dies (Linux); if it died before this call, exit now."""
    parent = os.environ.get(PARENT_ENV)
    if sys.platform == "linux":
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    if parent is not None and os.getppid() != int(parent):
        raise SystemExit("tierproxy: the parent of this worker is gone")


def _lock_wal(config: ProxyConfig) -> int:
    """An exclusive lock held until the process ends (the kernel drops it even on kill -9),
    on `<WAL directory>.lock`: waits up to a minute for a process of an earlier parent
    still stopping."""
    directory = config.tiering.wal_directory
    directory.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(f"{directory}.lock", os.O_RDWR | os.O_CREAT, 0o644)
    deadline = time.monotonic() + _LOCK_WAIT_S
    told = False
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            if time.monotonic() > deadline:
                os.close(fd)
                raise OSError(f"{directory} is in use by another process") from None
            if not told:
                log.warning("%s is locked by another process; waiting for it", directory)
                told = True
            time.sleep(0.1)
