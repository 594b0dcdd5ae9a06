"""The exactly-once Kafka Streams application of test_tiered_streams_eos.py (java/EosSum.java):
compiled once with the JDK against Kafka's jars and the kafka-streams jar, run as a JVM
the test can kill with SIGKILL and start again on the same state directory (so the same
Streams process id, hence the same transactional ids: the new instance fences the old).
"""

from __future__ import annotations

import shutil
import subprocess
import threading
import time
from pathlib import Path

from proxy.devstack.paths import kafka_libs, kafka_streams_libs

SOURCE = Path(__file__).parent / "java" / "EosSum.java"
_LOG4J2 = (
    "status = error\n"
    "appender.err.type = Console\nappender.err.name = err\nappender.err.target = SYSTEM_ERR\n"
    "appender.err.layout.type = PatternLayout\n"
    "appender.err.layout.pattern = %d{HH:mm:ss.SSS} %-5p [%t] %c{1}: %m%n\n"
    "rootLogger.level = WARN\nrootLogger.appenderRef.err.ref = err\n"
)


class StreamsApp:
    """EosSum on `input` -> `output`, with `application.id` `app_id`; `start()` starts a
    JVM (at most one at a time), `kill()` SIGKILLs it, `close()` stops it cleanly."""

    def __init__(
        self, workdir: Path, bootstrap: str, app_id: str, input: str, output: str, groups: int
    ) -> None:
        self.workdir = workdir
        self.classes = workdir / "classes"
        self.classes.mkdir(parents=True, exist_ok=True)
        self.classpath = f"{self.classes}:{kafka_streams_libs()}/*:{kafka_libs()}/*"
        self.argv = [bootstrap, app_id, input, output, str(workdir / "state")]
        self.argv += [f"tierproxy_az=zone-a,{app_id}", str(groups)]
        with open(workdir / "javac.err", "wb") as errors:
            self._javac = subprocess.Popen(
                [shutil.which("javac") or "javac", "-cp", self.classpath, "-d",
                 str(self.classes), str(SOURCE)],
                stdout=subprocess.DEVNULL, stderr=errors,
            )  # fmt: skip
        self.process: subprocess.Popen | None = None
        self.runs = 0
        self.lines: list[str] = []  # every instance's stdout, "<run> <line>"
        self._reader: threading.Thread | None = None

    @property
    def stderr_path(self) -> Path:
        return self.workdir / f"streams-{self.runs}.err"

    def start(self) -> None:
        assert self.process is None or self.process.poll() is not None, "one instance at a time"
        assert self._javac.wait(180) == 0, (self.workdir / "javac.err").read_text()[-3000:]
        log_config = self.workdir / "log4j2.properties"
        log_config.write_text(_LOG4J2)
        self.runs += 1
        with open(self.stderr_path, "wb") as errors:
            self.process = subprocess.Popen(
                [shutil.which("java") or "java", "-Xmx384m", "-XX:+UseSerialGC",
                 "-XX:TieredStopAtLevel=1", "-Djava.net.preferIPv4Stack=true",
                 f"-Dlog4j2.configurationFile={log_config}",
                 "-cp", self.classpath, "EosSum", *self.argv],
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=errors, text=True,
            )  # fmt: skip
        self._reader = threading.Thread(target=self._read, args=(self.process, self.runs))
        self._reader.start()

    def _read(self, process: subprocess.Popen, run: int) -> None:
        assert process.stdout is not None
        with process.stdout, open(self.workdir / "streams.out", "a") as out:
            for line in process.stdout:
                self.lines.append(f"{run} {line.rstrip()}")
                out.write(f"{time.strftime('%H:%M:%S')} {self.lines[-1]}\n")

    def wait_running(self, timeout: float = 120.0) -> None:
        """Until this instance says RUNNING (its first rebalance done)."""
        wanted = f"{self.runs} state RUNNING"
        deadline = time.monotonic() + timeout
        while not any(line.startswith(wanted) for line in self.lines):
            assert self.process is not None
            if self.process.poll() is not None:
                raise AssertionError(f"Streams exited: {self.tail()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"Streams not RUNNING in {timeout} s: {self.tail()}")
            time.sleep(0.1)

    def replaced_threads(self) -> list[str]:
        return [line for line in self.lines if " replaced " in line]

    def tail(self) -> str:
        return "\n".join(self.lines[-20:]) + "\n" + self.stderr_path.read_text()[-4000:]

    def kill(self) -> None:
        """SIGKILL: its open transactions stay open until the next instance fences them."""
        assert self.process is not None
        self.process.kill()
        self.process.wait(30)
        self._join()

    def close(self) -> None:
        if self._javac.poll() is None:
            self._javac.kill()
        self._javac.wait(10)
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(40)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        self._join()

    def _join(self) -> None:
        if self._reader is not None:
            self._reader.join(10)
