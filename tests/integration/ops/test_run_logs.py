"""`tierproxy run`'s log output as an operator reads it: JSON lines with
`logging.format: json`, one line per connection error naming the client and the reason,
nothing per request; and a refused SASL password never written, even at debug level.
"""

from __future__ import annotations

import json
import queue
import socket
import struct
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
import yaml
from confluent_kafka import Producer

from proxy.devstack.paths import free_port, free_port_block

pytestmark = pytest.mark.kafka

TIERPROXY = [sys.executable, "-m", "proxy.cli"]


def _start(tmp_path: Path, settings: dict) -> tuple[subprocess.Popen, queue.Queue]:
    config = tmp_path / "proxy.yaml"
    config.write_text(yaml.safe_dump(settings))
    proc = subprocess.Popen(
        [*TIERPROXY, "run", "--config", str(config)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: queue.Queue = queue.Queue()

    def pump(stream, tag: str) -> None:
        for line in stream:
            lines.put((tag, line.rstrip("\n")))
        lines.put((tag, None))

    proc.pumps = []  # type: ignore[attr-defined]
    for stream, tag in ((proc.stdout, "out"), (proc.stderr, "err")):
        thread = threading.Thread(target=pump, args=(stream, tag), daemon=True)
        thread.start()
        proc.pumps.append(thread)  # type: ignore[attr-defined]
    return proc, lines


def _until(lines: queue.Queue, match, timeout_s: float = 60) -> tuple[list[str], str | None]:
    """stderr lines read until a stdout or stderr line for which `match(tag, line)`."""
    seen: list[str] = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            tag, line = lines.get(timeout=0.5)
        except queue.Empty:
            continue
        if line is None:
            continue
        if tag == "err":
            seen.append(line)
        if match(tag, line):
            return seen, line
    return seen, None


def _stop(proc: subprocess.Popen) -> None:
    """Stop it if it runs, read its output to the end, close the pipes."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
    for thread in proc.pumps:  # type: ignore[attr-defined]
        thread.join(10)
    proc.stdout.close()
    proc.stderr.close()


def test_json_lines_one_per_connection_error_none_per_request(kafka_cluster, tmp_path):
    port = free_port()
    proc, lines = _start(
        tmp_path,
        {
            "upstream": {"bootstrap": kafka_cluster.bootstrap},
            "listeners": {"bootstrap_port": port, "broker_port_base": free_port_block(8)},
            "logging": {"format": "json"},
        },
    )
    try:
        startup, ready = _until(lines, lambda tag, line: "proxy ready at" in line)
        assert ready is not None, startup
        if not startup:  # the stderr reader is behind the stdout one: it has them to come
            startup, _ = _until(lines, lambda tag, line: tag == "err", 10)
        assert startup and all(json.loads(line)["level"] for line in startup)
        bootstrap = ready.rsplit(" ", 1)[-1]
        producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
        topic = f"logs-{uuid.uuid4().hex[:8]}"
        for n in range(200):
            producer.produce(topic, b"%d" % n)
        assert producer.flush(60) == 0
        del producer
        with socket.create_connection(("127.0.0.1", port)) as bad:
            bad.sendall(struct.pack(">i", -5))
            host, bound = bad.getsockname()
            bad_address = f"{host}:{bound}"
            bad.recv(1)  # the proxy closes it
        logged, line = _until(lines, lambda tag, line: tag == "err" and bad_address in line)
    finally:
        _stop(proc)
    assert line is not None, logged
    error = json.loads(line)
    assert error["level"] == "warning" and error["logger"] == "tierproxy.connection"
    assert error["client"] == bad_address and error["reason"] == "negative_frame_size"
    assert error["ts"].endswith("+00:00") and "negative frame size -5" in error["message"]
    # 200 records produced through the proxy: no line for any of their requests
    per_request = [x for x in logged if json.loads(x)["logger"].startswith("tierproxy.conn")]
    assert per_request == [line]


def test_a_refused_sasl_password_is_never_logged(kafka_cluster, tmp_path):
    password = "sasl-password-" + uuid.uuid4().hex
    proc, lines = _start(
        tmp_path,
        {
            "upstream": {
                "bootstrap": kafka_cluster.bootstrap,
                "sasl": {"mechanism": "PLAIN", "username": "ops-user", "password": password},
            },
            "listeners": {"bootstrap_port": free_port(), "broker_port_base": free_port_block(8)},
            "log_level": "debug",  # the most it could ever write
        },
    )
    try:
        assert proc.wait(60) == 1
    finally:
        _stop(proc)
    logged, _ = _until(lines, lambda tag, line: False, timeout_s=1)
    text = "\n".join(logged)
    assert "cannot start" in text and "PLAIN" in text  # the reason is there...
    assert password not in text  # ...the password is not
