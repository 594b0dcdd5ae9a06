"""A proxy whose start fails midway leaves nothing behind (issue 18).

`Proxy.start()` and `TieringService.start()` start many parts in order; when a step
fails, what the steps before it started is stopped, in the reverse order, and the error
is raised to the caller (`async with Proxy(...)` here). Afterwards no asyncio task of the
proxy remains, no socket it opened (listening, or a connection to Kafka or MinIO), no
thread it started.

Each step is failed in turn by a twin of its part that raises (`StartFault`), some after
the real part did its work (a part that failed halfway); Kafka, MinIO and every other
part are real. Real faults too: an occupied port, an unreachable object store.

Each start runs in a child process (start_undo_child.py), so that a socket another test's
leftover client opens meanwhile is never taken for this start's.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from cutover_load import proxy_config
from start_undo_child import STEPS
from tieredfleet import s3_settings

from proxy.devstack.paths import free_port, free_port_block

pytestmark = [pytest.mark.kafka, pytest.mark.minio]

HERE = Path(__file__).parent
CHILD_TIMEOUT_S = 240


def _config(kafka_cluster, s3_server, tmp_path, **tiering_settings) -> dict:
    suffix = uuid.uuid4().hex[:8]
    settings = {"object_store": s3_settings(s3_server)}
    settings.update(tiering_settings)
    config = proxy_config(
        kafka_cluster, tmp_path, "p", "zone-a", suffix, free_port_block(8), **settings
    )
    config["fleet"]["membership"] = "kafka"
    config["metrics"] = {"port": free_port()}
    config["admin"] = {"port": 0}
    return config


def _start_fails(config: dict, tmp_path: Path, step: str = "") -> dict:
    """Run the failing start in a child process; what it raised and left behind."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    root = HERE.parents[2]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(root), str(HERE)]))
    done = subprocess.run(
        [sys.executable, str(HERE / "start_undo_child.py"), str(path), step],
        capture_output=True,
        text=True,
        env=env,
        timeout=CHILD_TIMEOUT_S,
    )
    lines = done.stdout.strip().splitlines()
    assert done.returncode == 0 and lines, (
        f"the child exited {done.returncode}:\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
    )
    result = json.loads(lines[-1])
    assert result["left"] == {"tasks": [], "sockets": [], "threads": []}, (
        f"left behind by a failed start: {result['left']}\n{done.stderr[-4000:]}"
    )
    return result


@pytest.mark.parametrize("step", STEPS)
def test_a_failed_start_step_leaves_nothing(step, kafka_cluster, s3_server, tmp_path):
    result = _start_fails(_config(kafka_cluster, s3_server, tmp_path), tmp_path, step)
    assert result["error_type"][0] == "StartFault", result


def test_an_occupied_peer_port_leaves_nothing(kafka_cluster, s3_server, tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        config = _config(kafka_cluster, s3_server, tmp_path, peer_port=port)
        result = _start_fails(config, tmp_path)
    assert "OSError" in result["error_type"], result
    assert str(port) in result["error"]


def test_an_occupied_admin_port_leaves_nothing(kafka_cluster, s3_server, tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        config = _config(kafka_cluster, s3_server, tmp_path)
        config["admin"] = {"port": taken.getsockname()[1]}
        result = _start_fails(config, tmp_path)
    assert "OSError" in result["error_type"], result


def test_an_unreachable_object_store_leaves_nothing(kafka_cluster, s3_server, tmp_path):
    """S3 WAL mode lists the store at start: nothing answers on the endpoint."""
    config = _config(kafka_cluster, s3_server, tmp_path)
    config["tiering"]["wal"]["mode"] = "s3"
    config["tiering"]["object_store"]["endpoint_url"] = f"http://127.0.0.1:{free_port()}"
    result = _start_fails(config, tmp_path)
    assert result["error_type"] is not None, result
