"""`tierproxy dev`, what `make run` starts, as a newcomer meets it: a quiet start, a
banner whose commands work when pasted, and a tiered topic that survives a restart."""

from __future__ import annotations

import json
import os
import pty
import queue
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition

from proxy.devstack.dev import MARKER, DevError, prepare
from proxy.devstack.paths import free_port, free_port_block, repo_root

pytestmark = pytest.mark.kafka


class Dev:
    """One `tierproxy dev` process: its stdout (the banner) and stderr (the logs)."""

    def __init__(self, data: Path, ports: list[str], *extra: str) -> None:
        argv = [sys.executable, "-m", "proxy.cli", "dev", "--data-dir", str(data), *ports]
        self.proc = subprocess.Popen(
            [*argv, *extra],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=repo_root(),
        )
        self.out: list[str] = []
        self.err: list[str] = []
        self._lines: queue.Queue = queue.Queue()
        self._pumps = [
            threading.Thread(target=self._pump, args=(s, into), daemon=True)
            for s, into in ((self.proc.stdout, self.out), (self.proc.stderr, self.err))
        ]
        for pump in self._pumps:
            pump.start()

    def _pump(self, stream, into: list[str]) -> None:
        for line in stream:
            into.append(line.rstrip("\n"))
            self._lines.put(line)
        self._lines.put(None)

    def wait_banner(self, timeout: float = 180) -> str:
        deadline = time.monotonic() + timeout
        while not any("Press Ctrl-C" in line for line in self.out):
            assert self.proc.poll() is None, "\n".join(self.out + self.err[-30:])
            assert time.monotonic() < deadline, "\n".join(self.out + self.err[-30:])
            try:
                self._lines.get(timeout=0.5)
            except queue.Empty:
                pass
        return "\n".join(self.out)

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)  # Ctrl-C
        code = self.proc.wait(60)
        for pump in self._pumps:
            pump.join(10)
        self.proc.stdout.close()
        self.proc.stderr.close()
        return code


def _pasted(banner: str, starts: str, topic: str) -> str:
    """Run the banner's command line containing `starts`, as pasted in a shell."""
    line = next(line.strip() for line in banner.splitlines() if starts in line)
    done = subprocess.run(
        line.replace("<topic>", topic), shell=True, capture_output=True, text=True,
        cwd=repo_root(), timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, f"{line}\n{done.stdout}{done.stderr}"
    return done.stdout


def _consume(bootstrap: str, topic: str, want: int) -> list[bytes]:
    """Partition 0 (the dev Kafka makes one) from its start, with no group."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "unused"})
    consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
    values: list[bytes] = []
    deadline = time.monotonic() + 90
    try:
        while len(values) < want and time.monotonic() < deadline:
            values += [m.value() for m in consumer.consume(100, 1.0) if m.error() is None]
    finally:
        consumer.close()
    return values


def _log_levels(lines: list[str]) -> list[tuple[str, str]]:
    """(level, logger) of each JSON log line (stderr is not a terminal here: JSON)."""
    found = []
    for line in lines:
        if line.startswith("{"):
            record = json.loads(line)
            found.append((record["level"], record["logger"]))
    return found


def test_a_tiered_topic_survives_a_restart_and_the_banner_commands_work(tmp_path):
    data = tmp_path / "data"
    base = free_port_block(3)  # base+1: the peer listener, base+3: broker 1
    bootstrap_port, admin_port = free_port(), free_port()
    ports = ["--port", str(bootstrap_port), "--broker-port-base", str(base + 2)]
    ports += ["--admin-port", str(admin_port)]
    topic = f"dev-{uuid.uuid4().hex[:8]}"
    bootstrap = f"127.0.0.1:{bootstrap_port}"

    first = Dev(data, ports)
    try:
        banner = first.wait_banner()
        admin = f"http://127.0.0.1:{admin_port}"
        assert f"Admin API: {admin}" in banner
        assert str(data) in banner and "new; kept when you stop" in banner
        assert f"--config {data / 'proxy.yaml'}" in banner
        assert f"--from-segments {data / 'kafka' / 'node-1' / 'logs'}" in banner
        assert (data / "proxy.yaml").is_file()
        assert "tierproxy topics tier <topic>" in banner
        producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
        for i in range(100):
            producer.produce(topic, key=b"%d" % i, value=b"v%d" % i)
            if i == 49:  # half in Kafka, half tiered: the topic exists, tier it
                assert producer.flush(60) == 0
                _pasted(banner, "topics tier <topic>", topic)
        assert producer.flush(60) == 0
        assert len(_consume(bootstrap, topic, 100)) == 100
        status = _pasted(banner, "topics status <topic>", topic)
        assert "tiered" in status, status
    finally:
        assert first.stop() == 0
    levels = _log_levels(first.err)
    assert levels, first.err[:20]  # JSON lines, since stderr is a pipe
    assert [x for x in levels if x[0] in ("error", "critical")] == [], first.err
    assert [x for x in levels if x[1] == "tierproxy.access"] == []  # off by default
    assert not any("Traceback" in line for line in first.err), first.err

    second = Dev(data, ports)
    try:
        banner = second.wait_banner()
        assert "found from the last run" in banner
        values = _consume(bootstrap, topic, 100)
        assert sorted(values) == sorted(b"v%d" % i for i in range(100))
        assert "tiered" in _pasted(banner, "topics status <topic>", topic)
    finally:
        assert second.stop() == 0
    assert [x for x in _log_levels(second.err) if x[0] == "error"] == [], second.err


def test_fresh_empties_only_a_folder_dev_created(tmp_path):
    data = tmp_path / "data"
    assert prepare(data, fresh=False) is False and (data / MARKER).exists()
    (data / "kafka").mkdir()
    (data / "wal").mkdir()
    assert prepare(data, fresh=False) is True  # a second start finds its data
    assert prepare(data, fresh=True) is False and not (data / "kafka").exists()
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep me")
    with pytest.raises(DevError, match="was not created by `tierproxy dev`"):
        prepare(foreign, fresh=True)
    assert (foreign / "notes.txt").read_text() == "keep me"


def test_setup_is_quiet(tmp_path: Path):
    """scripts/setup.sh prints its own lines only: no colour escapes from Maven (its
    output goes to a log shown on failure), no setuptools editable-install banner. Run
    for real with a cache of its own whose Maven repository is the session's (so the
    Kafka jars are copied, not downloaded); the venv is already there."""
    script = (repo_root() / "scripts" / "setup.sh").read_text()
    assert 'PYTHONWARNINGS="ignore:Editable installation"' in script  # pip's step: skipped here
    cache = tmp_path / "cache"
    cache.mkdir()
    real_cache = Path(os.environ.get("TIERPROXY_CACHE", repo_root() / ".cache"))
    (cache / "m2").symlink_to(real_cache / "m2")
    env = {**os.environ, "TIERPROXY_CACHE": str(cache)}
    done = subprocess.run(
        ["scripts/setup.sh"], cwd=repo_root(), env=env, capture_output=True, text=True,
        timeout=600,
    )  # fmt: skip
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert "\x1b[" not in output, repr(output)
    assert "BuildBackendWarning" not in output
    assert all(line.startswith("[setup] ") for line in output.splitlines()), output
    assert list(cache.glob("kafka-*/libs/kafka-clients-*.jar"))


def test_on_a_terminal_the_logs_are_text_lines_with_no_error(tmp_path):
    """stderr on a terminal (a pty), as in `make run` from a shell: the log lines are
    text (`logging.format: auto`), not JSON, and a healthy start has no ERROR line."""
    base = free_port_block(3)
    ports = ["--port", str(free_port()), "--broker-port-base", str(base + 2)]
    ports += ["--admin-port", str(free_port())]
    screen, terminal = pty.openpty()
    argv = [sys.executable, "-m", "proxy.cli", "dev", "--data-dir", str(tmp_path / "d"), *ports]
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=terminal, text=True, cwd=repo_root()
    )
    os.close(terminal)
    shown: list[bytes] = []

    def drain() -> None:  # the pty must be read while the process writes to it
        while True:
            try:
                chunk = os.read(screen, 65536)
            except OSError:  # EIO: the process closed its end
                return
            if not chunk:
                return
            shown.append(chunk)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 180
        for line in proc.stdout:
            if "Press Ctrl-C" in line or time.monotonic() > deadline:
                break
        assert proc.poll() is None, b"".join(shown).decode()
    finally:
        proc.send_signal(signal.SIGINT)
        code = proc.wait(60)
        reader.join(10)
        os.close(screen)
        proc.stdout.close()
    assert code == 0
    lines = [line for line in b"".join(shown).decode().splitlines() if line.strip()]
    logged = [line for line in lines if TEXT_LINE.match(line)]
    assert logged, lines  # the proxy's INFO lines, as text
    assert not any(line.lstrip().startswith("{") for line in lines), lines
    assert [line for line in logged if TEXT_LINE.match(line)[1] in ("ERROR", "CRITICAL")] == []


TEXT_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} ([A-Z]+) [\w.]+: ")
