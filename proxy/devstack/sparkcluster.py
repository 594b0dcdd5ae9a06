"""A Spark standalone cluster from the pyspark package itself: one master and N workers.

The offload jobs must run on a real cluster as users run them (`spark-submit --master
spark://...`, docs/offload.md), so the tests start one: `spark-class
org.apache.spark.deploy.master.Master` and `...deploy.worker.Worker spark://...`, the
same classes `sbin/start-master.sh` and `start-worker.sh` run, each as a child process
of its own (a worker's executors, and their Python workers, are its children, in its
process group: `kill_worker` kills them all, as a lost machine would). Everything is on
loopback; logs, work dirs and scratch folders are under `base_dir`; ports are free ones.

Ready means the master's web UI answers `/json` with every worker ALIVE: an event, not
a sleep.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from proxy.devstack.paths import DevstackError, free_port
from proxy.devstack.process import ManagedProcess

MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"


def spark_bin(name: str) -> Path:
    """A script of the pyspark package's own Spark distribution (`spark-class`,
    `spark-submit`): the Spark the tests' driver uses, so versions match."""
    spec = importlib.util.find_spec("pyspark")
    if spec is None or not spec.submodule_search_locations:
        raise DevstackError("pyspark is not installed: install the offload extra")
    script = Path(next(iter(spec.submodule_search_locations))) / "bin" / name
    if not script.exists():
        raise DevstackError(f"{script} not found: a pyspark without its Spark distribution?")
    return script


class SparkCluster:
    """A master and `workers` workers of `cores` cores and `memory` each, on loopback."""

    def __init__(
        self,
        base_dir: Path | None = None,
        workers: int = 2,
        cores: int = 1,
        memory: str = "1g",
        name: str = "spark",
    ) -> None:
        self.name = name
        self._owns_dir = base_dir is None
        self.base_dir = Path(base_dir or tempfile.mkdtemp(prefix=f"tierproxy-{name}-"))
        self.cores = cores
        self.memory = memory
        self.port = free_port()
        self.web_port = free_port()
        self.master = ManagedProcess(
            f"{name}-master",
            [str(spark_bin("spark-class")), MASTER_CLASS, "--host", "127.0.0.1",
             "--port", str(self.port), "--webui-port", str(self.web_port)],
            log_path=self.base_dir / "master.log",
            env=self._env("master"),
        )  # fmt: skip
        self.workers = [self._worker(n) for n in range(workers)]

    @property
    def master_url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    def _env(self, role: str) -> dict[str, str]:
        env = dict(os.environ)
        env.pop("PYTHONPATH", None)  # executors import what the job ships, nothing else
        env.update(
            SPARK_LOCAL_IP="127.0.0.1",
            SPARK_LOCAL_DIRS=str(self.base_dir / role / "scratch"),
            SPARK_LOG_DIR=str(self.base_dir / role),
            SPARK_PID_DIR=str(self.base_dir / role),
            # the same Python as the driver unless a job says otherwise (spark.pyspark.python)
            PYSPARK_PYTHON=sys.executable,
            # small, quick-starting daemons; no REST submission server (its port is fixed)
            SPARK_DAEMON_MEMORY="256m",
            SPARK_DAEMON_JAVA_OPTS="-XX:TieredStopAtLevel=1 -XX:+UseSerialGC",
            SPARK_MASTER_OPTS="-Dspark.master.rest.enabled=false",
        )
        return env

    def _worker(self, n: int) -> ManagedProcess:
        role = f"worker-{n}"
        return ManagedProcess(
            f"{self.name}-{role}",
            [str(spark_bin("spark-class")), WORKER_CLASS, self.master_url,
             "--host", "127.0.0.1", "--port", str(free_port()),
             "--webui-port", str(free_port()), "--cores", str(self.cores),
             "--memory", self.memory, "--work-dir", str(self.base_dir / role / "work")],
            log_path=self.base_dir / f"{role}.log",
            env=self._env(role),
        )  # fmt: skip

    def start(self, timeout: float = 120.0) -> SparkCluster:
        try:
            self.master.start()
            for worker in self.workers:
                worker.start()
            self.wait_ready(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        for proc in (*self.workers, self.master):
            proc.terminate()  # all at once, then each waited for
        for proc in (*self.workers, self.master):
            proc.stop()
        if self._owns_dir:
            shutil.rmtree(self.base_dir, ignore_errors=True)

    def __enter__(self) -> SparkCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def state(self) -> dict:
        """The master's own view (its web UI's /json): workers, applications, status."""
        url = f"http://127.0.0.1:{self.web_port}/json"
        with urllib.request.urlopen(url, timeout=5) as answer:
            return json.load(answer)

    def alive_workers(self) -> list[dict]:
        return [w for w in self.state().get("workers", []) if w.get("state") == "ALIVE"]

    def wait_ready(self, timeout: float = 120.0) -> None:
        """Until the master lists every running worker process as ALIVE."""
        deadline = time.monotonic() + timeout
        last = "no answer yet"
        want = len(self.workers)
        while time.monotonic() < deadline:
            for proc in (self.master, *self.workers):
                if not proc.running():
                    raise DevstackError(
                        f"{proc.name} exited with {proc.returncode()}:\n{proc.tail()}"
                    )
            try:
                alive = len(self.alive_workers())
                if alive == want:
                    return
                last = f"{alive} of {want} workers alive"
            except (urllib.error.URLError, OSError, ValueError) as exc:
                last = str(exc)
            time.sleep(0.2)
        raise DevstackError(
            f"Spark master not ready after {timeout}s ({last}):\n{self.master.tail()}"
        )

    def kill_worker(self, n: int) -> None:
        """kill -9 worker n's JVM, its executors and their Python workers (its process
        group), as a machine that is lost; `restart_worker` brings a new one."""
        self.workers[n].kill()

    def restart_worker(self, n: int, timeout: float = 120.0) -> None:
        """A new worker process in place of n (new ports: the old ones may linger in the
        master's list as DEAD); returns once the master lists every worker ALIVE."""
        self.workers[n].stop()
        self.workers[n] = self._worker(n)
        self.workers[n].start()
        self.wait_ready(timeout)

    def worker_state(self, n: int) -> dict:
        """Worker n's own view (its web UI's /json): the executors it runs."""
        port = self.workers[n].argv[self.workers[n].argv.index("--webui-port") + 1]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json", timeout=5) as answer:
            return json.load(answer)


def deps_only_python(where: Path) -> Path:
    """A Python environment at `where` that holds this environment's packages but not
    tierproxy itself (whose code a job ships with --py-files): what docs/offload.md asks
    of each worker, made without a download. A venv of the same base interpreter whose
    site-packages names this one's with a .pth line: the packages import from there, and
    the editable install's finder, itself a .pth of that folder, is never run."""
    import site
    import subprocess
    import sysconfig

    python = where / "bin" / "python"
    if not python.exists():
        base = getattr(sys, "_base_executable", sys.executable)
        subprocess.run([base, "-m", "venv", "--without-pip", str(where)], check=True)
        purelib = sysconfig.get_path("purelib", vars={"base": str(where)})
        folders = dict.fromkeys(site.getsitepackages())
        Path(purelib, "tierproxy-deps.pth").write_text("".join(f"{f}\n" for f in folders))
    return python
