"""A child process that cannot outlive the program that started it.

Three layers make sure no java or minio process is left behind, pass or fail:
`stop()` from the owner (fixture finalizer, context manager), an atexit hook for a
normal interpreter exit, and PR_SET_PDEATHSIG so the kernel kills the child when the
parent dies without running any Python (kill -9, a crashed runner).
"""

from __future__ import annotations

import atexit
import ctypes
import os
import signal
import subprocess
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path

from proxy.devstack.paths import DevstackError

_PR_SET_PDEATHSIG = 1
_live: set[ManagedProcess] = set()
_live_lock = threading.Lock()


def _die_with_parent() -> None:  # runs in the child between fork and exec
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


class ManagedProcess:
    """One named child process whose output goes to a log file."""

    def __init__(
        self,
        name: str,
        argv: list[str],
        log_path: Path,
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
    ) -> None:
        self.name = name
        self.argv = argv
        self.log_path = log_path
        self.env = env
        self.cwd = cwd
        self._popen: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return self._popen.pid if self._popen else None

    def start(self) -> None:
        if self.running():
            raise RuntimeError(f"{self.name} is already running")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")  # noqa: SIM115 - the child owns it once started
        try:
            self._popen = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env,
                cwd=self.cwd,
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )
        finally:
            log.close()
        with _live_lock:
            _live.add(self)

    def running(self) -> bool:
        return self._popen is not None and self._popen.poll() is None

    def returncode(self) -> int | None:
        return self._popen.poll() if self._popen else None

    def signal(self, signum: int) -> None:
        if self.running():
            assert self._popen is not None
            os.killpg(self._popen.pid, signum)

    def terminate(self) -> None:
        """Send SIGTERM and return; `stop()` then waits. Lets a cluster stop in parallel."""
        if self.running():
            self._signal_group(signal.SIGTERM)

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM the process group, then SIGKILL what is still there after `timeout`."""
        if self._popen is None:
            return
        try:
            if self._popen.poll() is None:
                self._signal_group(signal.SIGTERM)
                try:
                    self._popen.wait(timeout)
                except subprocess.TimeoutExpired:
                    self._signal_group(signal.SIGKILL)
                    self._popen.wait(5)
            # Children of the child (none expected) go with the group.
            self._signal_group(signal.SIGKILL)
        finally:
            with _live_lock:
                _live.discard(self)

    def kill(self) -> None:
        """kill -9, as a crash would."""
        if self._popen is not None and self._popen.poll() is None:
            self._signal_group(signal.SIGKILL)
            self._popen.wait(5)

    def _signal_group(self, signum: int) -> None:
        assert self._popen is not None
        try:
            os.killpg(self._popen.pid, signum)
        except ProcessLookupError:
            pass

    def wait_ready(self, probe: Callable[[], object], timeout: float) -> None:
        """Until `probe()` returns without an OSError (urllib's errors are OSErrors: no
        answer yet); DevstackError if the process exits first or `timeout` passes."""
        deadline = time.monotonic() + timeout
        last_error = "no answer yet"
        while time.monotonic() < deadline:
            if not self.running():
                raise DevstackError(f"{self.name} exited with {self.returncode()}:\n{self.tail()}")
            try:
                probe()
                return
            except OSError as exc:
                last_error = str(exc)
            time.sleep(0.2)
        raise DevstackError(
            f"{self.name} not ready after {timeout}s ({last_error}):\n{self.tail()}"
        )

    def tail(self, lines: int = 40) -> str:
        try:
            with open(self.log_path, errors="replace") as log:
                return "".join(deque(log, maxlen=lines))
        except FileNotFoundError:
            return ""


def live_processes() -> list[ManagedProcess]:
    with _live_lock:
        return [proc for proc in _live if proc.running()]


def tracked_processes() -> list[ManagedProcess]:
    """Started and not yet stopped by their owner: running, or died on their own."""
    with _live_lock:
        return sorted(_live, key=lambda proc: proc.name)


@atexit.register
def _stop_all() -> None:
    for proc in live_processes():
        proc.stop(timeout=5)
