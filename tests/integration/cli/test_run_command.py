"""`tierproxy run` as an operator starts it: a process, a YAML file, a printed address."""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import yaml
from confluent_kafka import Consumer, Producer

from proxy.devstack.paths import free_port, free_port_block

TIERPROXY = [sys.executable, "-m", "proxy.cli"]


def test_bad_config_exits_nonzero_naming_key_and_reason(tmp_path):
    config = tmp_path / "bad.yaml"
    config.write_text(
        yaml.safe_dump({"upstream": {"bootstrap": "127.0.0.1:9092"}, "limits": {"buffer": 1}})
    )
    result = subprocess.run(
        [*TIERPROXY, "run", "--config", str(config)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2
    assert "limits.buffer" in result.stderr
    assert "is not a known setting" in result.stderr


@pytest.mark.kafka
def test_run_serves_clients_and_stops_on_sigterm(kafka_cluster, tmp_path: Path):
    base = free_port_block(3)
    config = tmp_path / "proxy.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "upstream": {"bootstrap": kafka_cluster.bootstrap},
                "listeners": {"bootstrap_port": free_port(), "broker_port_base": base},
            }
        )
    )
    proc = subprocess.Popen(
        [*TIERPROXY, "run", "--config", str(config)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        line = proc.stdout.readline()
        deadline = time.monotonic() + 60
        while "proxy ready at" not in line and time.monotonic() < deadline:
            assert proc.poll() is None, f"proxy exited: {line}{proc.stdout.read()}"
            line = proc.stdout.readline()
        bootstrap = line.rsplit(" ", 1)[-1].strip()
        topic = f"cli-{uuid.uuid4().hex[:8]}"
        producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
        for i in range(100):
            producer.produce(topic, key=str(i), value=f"v{i}")
        assert producer.flush(60) == 0
        consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": topic,
                "auto.offset.reset": "earliest",
            }
        )
        consumer.subscribe([topic])
        values = set()
        deadline = time.monotonic() + 60
        while len(values) < 100 and time.monotonic() < deadline:
            for msg in consumer.consume(100, 1.0):
                assert msg.error() is None, msg.error()
                values.add(msg.value())
        consumer.close()
        assert values == {f"v{i}".encode() for i in range(100)}
    finally:
        proc.terminate()
        code = proc.wait(30)
        proc.stdout.close()
    assert code == 0
