"""Processes a benchmark starts and watches: the proxy, the Java tools, py-spy.

CPU time and peak memory come from /proc, so a process is measured from outside without
any help from it: utime + stime of /proc/<pid>/stat (all its threads), VmHWM of
/proc/<pid>/status; the bytes on its TCP connections from the kernel (`ss`). Every child
dies with the benchmark (PR_SET_PDEATHSIG), is in a session of its own so its whole group
can be signalled, and is stopped in `finally`.
"""

from __future__ import annotations

import ctypes
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path

import yaml

from proxy.devstack import ManagedProcess
from proxy.devstack.paths import repo_root

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:  # runs in the child between fork and exec
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


# -- /proc ---------------------------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process, all threads, in seconds."""
    return sum(cpu_split(pid))


def cpu_split(pid: int) -> tuple[float, float]:
    """User and system CPU time of a process, all threads, in seconds."""
    with open(f"/proc/{pid}/stat") as stat:
        text = stat.read()
    fields = text[text.rindex(")") + 2 :].split()  # fields[0] is field 3 (state)
    return int(fields[11]) / CLOCK_TICKS, int(fields[12]) / CLOCK_TICKS


def syscalls(pid: int) -> tuple[int, int]:
    """The read and write system calls a process has made, all threads (/proc/<pid>/io:
    syscr, syscw; a socket's recv and send count among them)."""
    with open(f"/proc/{pid}/io") as io:
        fields = dict(line.split(": ") for line in io.read().splitlines())
    return int(fields["syscr"]), int(fields["syscw"])


def jit_cpu_seconds(pid: int) -> float:
    """CPU time of a JVM's JIT compiler threads ("C1/C2 CompilerThread"): a broker still
    compiling does more work per byte than a warm one."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            text = (task / "stat").read_text()
        except (FileNotFoundError, ProcessLookupError):
            continue
        name = text[text.index("(") + 1 : text.rindex(")")]
        if "Compiler" in name:
            fields = text[text.rindex(")") + 2 :].split()
            total += int(fields[11]) + int(fields[12])
    return total / CLOCK_TICKS


def sched_stats(pid: int) -> tuple[int, int, int]:
    """(ns on a CPU, ns runnable but waiting for one, timeslices) over all its threads,
    from /proc/<pid>/task/*/schedstat: how long the process waited to be scheduled."""
    totals = [0, 0, 0]
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            values = (task / "schedstat").read_text().split()
        except (FileNotFoundError, ProcessLookupError):
            continue  # a thread that just ended
        for i in range(3):
            totals[i] += int(values[i])
    return totals[0], totals[1], totals[2]


def memory_bytes(pid: int) -> dict[str, int]:
    """VmRSS (now) and VmHWM (peak resident set) of a process, in bytes."""
    found = {}
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                found[key] = int(value.split()[0]) * 1024
    return found


def machine_cpu() -> tuple[int, int]:
    """(busy, total) jiffies of the whole machine so far (first line of /proc/stat)."""
    with open("/proc/stat") as stat:
        values = [int(v) for v in stat.readline().split()[1:]]
    idle = values[3] + values[4]  # idle + iowait
    return sum(values[:8]) - idle, sum(values[:8])


def wait_idle(pids: list[int], idle_cores: float = 0.3, timeout: float = 20.0) -> float:
    """Wait until the processes use less than `idle_cores` CPU s per second (at least one
    second, at most `timeout`), so that no phase pays for the one before; the seconds
    waited."""
    started = time.monotonic()
    last = sum(cpu_seconds(pid) for pid in pids)
    while time.monotonic() - started < timeout:
        time.sleep(1.0)
        now = sum(cpu_seconds(pid) for pid in pids)
        if now - last < idle_cores:
            break
        last = now
    return time.monotonic() - started


def machine_description() -> dict[str, object]:
    model = "unknown"
    with open("/proc/cpuinfo") as cpuinfo:
        for line in cpuinfo:
            if line.startswith("model name"):
                model = line.partition(":")[2].strip()
                break
    with open("/proc/meminfo") as meminfo:
        mem_kib = int(meminfo.readline().split()[1])
    return {
        "nproc": os.cpu_count(),
        "cpu_model": model,
        "memory_gib": round(mem_kib / 2**20, 1),
        "kernel": os.uname().release,
        "python": sys.version.split()[0],
        "loadavg_at_start": os.getloadavg(),
    }


def tcp_bytes(host: str, port: int, pids: dict[int, str]) -> dict[tuple, tuple[int, int]]:
    """{(local, remote, pids[pid]): (bytes acked, bytes received)} of the established TCP
    connections to host:port that the processes in `pids` hold, as the kernel counts
    them (`ss -tip`): what the wire carried, whatever the processes count themselves."""
    argv = ["ss", "-tinpH", "state", "established", f"( dport = :{port} )"]
    out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    found, key = {}, None
    for line in out.splitlines():
        if not line[:1].isspace():  # a connection; its tcp_info follows, indented
            fields, pid = line.split(), re.search(r"pid=(\d+)", line)
            holder = pids.get(int(pid[1])) if pid else None
            key = (fields[2], fields[3], holder) if fields[3] == f"{host}:{port}" else None
            key = key if holder else None
        elif key is not None:
            counts = dict(re.findall(r"(bytes_acked|bytes_received):(\d+)", line))
            found[key] = (int(counts.get("bytes_acked", 0)), int(counts.get("bytes_received", 0)))
    return found


# -- Prometheus endpoints (the proxy's /metrics, MinIO's) ------------------------------

_SAMPLE = re.compile(r"^(\w+)(?:\{([^}]*)\})? (\S+)$", re.MULTILINE)


def scrape(url: str, prefixes: tuple[str, ...]) -> dict[str, dict[tuple, float]]:
    """{metric: {sorted (label, value) pairs: sample}} of the samples on a Prometheus
    endpoint whose name starts with one of `prefixes`."""
    with urllib.request.urlopen(url, timeout=10) as answer:
        text = answer.read().decode()
    found: dict[str, dict[tuple, float]] = defaultdict(dict)
    for m in _SAMPLE.finditer(text):
        if m[1].startswith(prefixes):
            found[m[1]][tuple(sorted(re.findall(r'(\w+)="([^"]*)"', m[2] or "")))] = float(m[3])
    return found


def increases(after: dict[tuple, float], before: dict[tuple, float]) -> list[dict]:
    """The samples of one metric that grew between two scrapes, as
    [{label: value, ..., "value": increase}]."""
    grown = ((labels, value - before.get(labels, 0.0)) for labels, value in after.items())
    return [dict(labels) | {"value": v} for labels, v in grown if v]


# -- the proxy -----------------------------------------------------------------------


def _ports_free(ports: list[int]) -> bool:
    for port in ports:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                return False
    return True


def pick_port_base(node_ids: list[int]) -> int:
    """A `broker_port_base` such that base + every node id is free now."""
    for _ in range(200):
        base = random.randrange(20000, 60000 - max(node_ids))
        if _ports_free([base + node_id for node_id in node_ids]):
            return base
    raise RuntimeError("no free range of ports for the proxy's broker listeners")


def tierproxy_argv() -> list[str]:
    """The command line of `tierproxy`, running this checkout's code: the venv's script
    (or `-m proxy.cli`) with PYTHONPATH naming this checkout first, set here for every
    process the run starts. Without it a benchmark run from a second work tree that
    shares the first one's venv (an editable install, which resolves `proxy` in the tree
    it was installed from) would measure that tree's proxy while naming its own commit
    (`git_state`); the benchmark's own process imports its tree's code already (its
    working directory comes first on its path)."""
    here = str(repo_root())
    paths = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    if paths[0] != here:
        os.environ["PYTHONPATH"] = os.pathsep.join([here, *filter(None, paths)])
    script = Path(sys.executable).parent / "tierproxy"
    return [str(script)] if script.exists() else [sys.executable, "-m", "proxy.cli"]


class ProxyProcess:
    """`tierproxy run --config <yaml>` in a process of its own, in front of `upstream`.

    `settings` adds config sections (fleet, metrics, tiering, ...) or keys of one
    (listeners: bind_host); `name` names its config and log files in `work_dir`."""

    def __init__(
        self,
        upstream: str,
        node_ids: list[int],
        work_dir: Path,
        *,
        name: str = "proxy",
        settings: dict | None = None,
    ) -> None:
        self.config_path = work_dir / f"{name}.yaml"
        bootstrap_port = pick_port_base([0])
        config = {
            "upstream": {"bootstrap": upstream},
            "listeners": {
                "bind_host": "127.0.0.1",
                "advertised_host": "127.0.0.1",
                "bootstrap_port": bootstrap_port,
                "broker_port_base": pick_port_base(node_ids),
            },
            "log_level": "info",
            "logging": {"format": "text"},  # its report greps " WARNING " lines
        }
        for section, value in (settings or {}).items():
            if isinstance(value, dict) and isinstance(config.get(section), dict):
                config[section] = config[section] | value
            else:
                config[section] = value
        self.config = config
        self.config_path.write_text(yaml.safe_dump(config))
        self.argv = [*tierproxy_argv(), "run", "--config", str(self.config_path)]
        self.process = ManagedProcess("tierproxy-bench", self.argv, work_dir / f"{name}.log")
        self.bootstrap = ""

    @property
    def pid(self) -> int:
        assert self.process.pid is not None
        return self.process.pid

    def start(self, timeout: float = 60.0) -> ProxyProcess:
        """Start it (again, after `stop`) and wait until its log says it is ready."""
        seen = len(self.log_lines())  # a restart appends to the log of the last run
        self.process.start()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in self.log_lines()[seen:]:
                if line.startswith("proxy ready at "):
                    self.bootstrap = line.rsplit(" ", 1)[-1].strip()
                    return self
            if not self.process.running():
                raise RuntimeError("the proxy exited at start:\n" + self.process.tail())
            time.sleep(0.1)
        raise RuntimeError(f"the proxy was not ready after {timeout}s:\n" + self.process.tail())

    def log_lines(self) -> list[str]:
        try:
            return self.process.log_path.read_text(errors="replace").splitlines()
        except FileNotFoundError:
            return []

    def problems(self) -> list[str]:
        """The proxy's warnings and errors, to report with the results."""
        return [
            line
            for line in self.log_lines()
            if " WARNING " in line or " ERROR " in line or "Traceback" in line
        ]

    def stop(self) -> None:
        self.process.stop(timeout=10)


# -- threads ---------------------------------------------------------------------------


def in_threads(calls, meanwhile=None) -> list:
    """Each call in a daemon thread of its own and `meanwhile(threads)`, if given, in this
    one; the results in order, or the first error raised again once all have ended."""
    results, errors = [None] * len(calls), []

    def body(i: int, call) -> None:
        try:
            results[i] = call()
        except BaseException as exc:  # noqa: BLE001 - raised again below
            errors.append(exc)

    threads = [threading.Thread(target=body, args=item, daemon=True) for item in enumerate(calls)]
    for thread in threads:
        thread.start()
    if meanwhile is not None:
        meanwhile(threads)
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return results


# -- one-shot tools (the Java performance tools) ---------------------------------------


def run_tool(argv: list[str], timeout: float) -> str:
    """Run a command to completion and return its output; kill its group on any failure."""
    proc = subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        preexec_fn=_die_with_parent,
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
    except BaseException:
        _kill_group(proc)
        raise
    if proc.returncode != 0:
        raise RuntimeError(f"{argv[0]} ... exited with {proc.returncode}:\n{out[-4000:]}")
    return out


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(10)


# -- profilers: py-spy (Python frames), perf (native symbols) --------------------------


@dataclass
class Profile:
    tool: str  # py-spy | perf
    samples: int  # busy samples of the proxy
    idle_samples: int  # py-spy only: parked in epoll
    top: list[tuple[str, int]]  # where the proxy's thread was (leaf frame), busy samples
    groups: list[tuple[str, int]]  # py-spy: Python function on the stack; perf: library


# In a VM py-spy's own idle test keeps samples parked in epoll; with native frames they
# are recognisable and counted as idle here.
_IDLE_LEAVES = {"libc.so.6:epoll_wait", "libc.so.6:epoll_pwait", "libc.so.6:epoll_pwait2"}
# Entry frames on every stack (the event loop's run) say nothing about where time goes.
_ENTRY_FILES = (
    "tierproxy",
    "proxy/cli.py",
    "proxy/server/main.py",
    "uvloop/__init__.py",
    "asyncio/runners.py",
)


class Profiler:
    """A sampling profiler running in the background from `start()` to `stop()`."""

    def __init__(self, argv: list[str], output: Path) -> None:
        self.argv = argv
        self.output = output
        self._proc: subprocess.Popen | None = None

    def start(self) -> None:
        self._proc = subprocess.Popen(
            self.argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )
        time.sleep(0.5)  # attached before the phase starts

    def stop(self) -> None:
        if self._proc is None:
            return
        if self._proc.poll() is None:
            self._proc.send_signal(signal.SIGINT)  # both write their file on SIGINT
        try:
            _, errors = self._proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            _kill_group(self._proc)
            errors = "the profiler did not stop"
        if not self.output.exists():
            print(f"  ({self.argv[0]} wrote no profile: {errors.strip()[-500:]})", file=sys.stderr)
        self._proc = None


class PySpy(Profiler):
    """`py-spy record` on a running pid, in collapsed-stack ("raw") form, until stopped."""

    def __init__(self, pid: int, output: Path, rate: int = 100, native: bool = False) -> None:
        binary = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
        if not Path(binary).exists():
            raise RuntimeError(
                "--profiler py-spy needs py-spy: .venv/bin/pip install py-spy (then run as a "
                "user allowed to ptrace the proxy)"
            )
        argv = [binary, "record", "--pid", str(pid), "--format", "raw", "--output", str(output)]
        argv += ["--rate", str(rate), "--function"]  # one entry per function, not per line
        if native:
            argv.append("--native")
        super().__init__(argv, output)


class PerfRecord(Profiler):
    """`perf record` of the whole machine (cpu-clock); the proxy's pid is picked out after.

    Machine-wide because in this VM `perf record -p <pid>` of a running process records
    nothing; native symbols (libc, kernel) resolve here where py-spy leaves libc bare.
    """

    def __init__(self, output: Path, frequency: int = 499) -> None:
        binary = shutil.which("perf")
        if binary is None:
            raise RuntimeError("--profiler perf needs perf (linux-perf) on the PATH")
        argv = [binary, "record", "-a", "-e", "cpu-clock", "-F", str(frequency), "-q"]
        super().__init__([*argv, "-o", str(output)], output)


_PERF_LINE = re.compile(r"^\s*[\d.]+%\s+(\d+)\s+(\S+)\s+\[.\]\s+(.+?)\s*$")


def summarize_perf(paths: list[Path], pid: int, top: int = 15) -> Profile:
    """Samples of `pid` per symbol and per library over `perf record` files."""
    symbols: Counter[str] = Counter()
    libraries: Counter[str] = Counter()
    for path in paths:
        if not path.exists():
            continue
        report = subprocess.run(
            [
                "perf",
                "report",
                "-i",
                str(path),
                "--pid",
                str(pid),
                "-n",
                "--no-children",
                "--sort",
                "dso,sym",
                "--stdio",
                "-g",
                "none",
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        for line in report.stdout.splitlines():
            m = _PERF_LINE.match(line)
            if m is None:
                continue
            count, dso, sym = int(m[1]), m[2], m[3]
            dso = "kernel" if dso == "[kernel.kallsyms]" else dso
            if sym.startswith("0x"):
                sym = "(unsymbolized)"
            symbols[f"{dso}:{sym}"] += count
            libraries[dso] += count
    total = sum(libraries.values())
    return Profile("perf", total, 0, symbols.most_common(top), libraries.most_common(top))


def summarize_pyspy(paths: list[Path], top: int = 15) -> Profile:
    """Self samples per frame and inclusive samples per Python function, idle left out."""
    self_counts: Counter[str] = Counter()
    python: Counter[str] = Counter()
    busy = idle = 0
    for path in paths:
        if not path.exists():
            continue
        for line in path.read_text().splitlines():
            stack, _, count_text = line.rpartition(" ")
            if not stack or not count_text.isdigit():
                continue
            count = int(count_text)
            frames = [_short(frame) for frame in stack.split(";")]
            if frames[-1] in _IDLE_LEAVES:
                idle += count
                continue
            busy += count
            self_counts[frames[-1]] += count
            for frame in set(frames):
                file = frame.rpartition(":")[0]
                if (file.endswith(".py") or file == "tierproxy") and not file.endswith(
                    _ENTRY_FILES
                ):
                    python[frame] += count
    return Profile("py-spy", busy, idle, self_counts.most_common(top), python.most_common(top))


def _short(frame: str) -> str:
    """`fn (/long/path/site-packages/pkg/mod.py:12)` -> `pkg/mod.py:fn`."""
    name, _, where = frame.partition(" (")
    where = where.rstrip(")").rpartition(":")[0] or where.rstrip(")")
    for marker in ("site-packages/", f"{repo_root()}/", "lib/python3.11/"):
        if marker in where:
            where = where.split(marker, 1)[1]
            break
    if name.startswith("0x"):
        name = "(unsymbolized)"
    return f"{where}:{name}" if where else name
