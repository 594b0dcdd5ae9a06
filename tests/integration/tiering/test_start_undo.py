"""A proxy whose start fails midway leaves nothing behind (issue 18).

`Proxy.start()` and `TieringService.start()` start many parts in order; when a step
fails, what the steps before it started is stopped, in the reverse order, and the error
is raised to the caller (`async with Proxy(...)` here). Afterwards no asyncio task of the
proxy remains, no socket it opened (listening, or a connection to Kafka or MinIO), no
thread it started.

Each step is failed in turn by a twin of its part that raises (`StartFault`), some after
the real part did its work (a part that failed halfway); Kafka, MinIO and every other
part are real. Real faults too: an occupied port, an unreachable object store.
"""

from __future__ import annotations

import asyncio
import gc
import os
import socket
import threading
import time
import uuid

import pytest
from cutover_load import proxy_config
from tieredfleet import s3_settings

from proxy.config import parse_config
from proxy.devstack.paths import free_port, free_port_block
from proxy.server import app, membership
from proxy.tiered import service as tiering

pytestmark = [pytest.mark.kafka, pytest.mark.minio]


class StartFault(RuntimeError):
    """The injected failure."""


def _fail_before(*_args, **_kwargs):
    raise StartFault("injected before the step")


def _after(original):
    """A twin that does the real step, then fails (a part that started, then broke)."""

    async def twin(*args, **kwargs):
        await original(*args, **kwargs)
        raise StartFault("injected after the step")

    return twin


def _reader_after(original, shard: int):
    async def twin(self, *args, **kwargs):
        await original(self, *args, **kwargs)
        if self.shard == shard:
            raise StartFault(f"injected in metadata reader {shard}")

    return twin


async def _fail_async(*_args, **_kwargs):
    raise StartFault("injected before the step")


def _inject(step: str, monkeypatch) -> None:
    """Make `step` of the start fail."""
    patch = monkeypatch.setattr
    if step == "upstream refresh":  # broker listeners being opened
        patch(app.Proxy, "refresh_upstream", _after(app.Proxy.refresh_upstream))
    elif step == "metadata topic":
        patch(tiering, "ensure_metadata_topic", _fail_async)
    elif step == "metadata readers":  # shard 0's reader started, shard 1's too, then fails
        patch(tiering.ShardReader, "start", _reader_after(tiering.ShardReader.start, 1))
    elif step == "metadata catch-up":
        patch(tiering.ShardReader, "caught_up", _reader_after(tiering.ShardReader.caught_up, 0))
    elif step == "object store":
        patch(tiering, "open_store", _fail_async)
    elif step == "WAL":
        patch(tiering.WriteAheadLog, "open", _fail_async)
    elif step == "peer listener":
        patch(tiering.PeerServer, "start", _after(tiering.PeerServer.start))
    elif step == "S3-WAL writer":
        patch(tiering, "S3WalWriter", _fail_before)
    elif step == "group membership":  # the uploader runs; the member joined the group
        patch(tiering.ShardAssignment, "start", _after(tiering.ShardAssignment.start))
    elif step == "compactor":
        patch(tiering.Compactor, "for_service", _fail_before)
    elif step == "background loops":
        patch(tiering.OrphanSweep, "for_service", _fail_before)
    elif step == "bootstrap listener":
        original = app.Proxy._listen

        async def listen(self, node_id, port):
            if node_id is None:
                raise StartFault("injected in the bootstrap listener")
            await original(self, node_id, port)

        patch(app.Proxy, "_listen", listen)
    elif step == "fleet membership":  # producer and consumer started, the catch-up fails
        patch(membership.Membership, "_catch_up", _fail_async)
    elif step == "metrics server":
        patch(app, "serve_metrics", _fail_before)
    elif step == "admin server":
        patch(app.AdminServer, "start", _after(app.AdminServer.start))
    else:
        raise AssertionError(step)


STEPS = [
    "upstream refresh",
    "metadata topic",
    "metadata readers",
    "metadata catch-up",
    "object store",
    "WAL",
    "peer listener",
    "S3-WAL writer",
    "group membership",
    "compactor",
    "background loops",
    "bootstrap listener",
    "fleet membership",
    "metrics server",
    "admin server",
]


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


# -- what a process holds ------------------------------------------------------------------


def _sockets() -> set[tuple[str, str, str]]:
    """(local, remote, state) of every TCP socket this process has open (/proc)."""
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue  # closed meanwhile (the listing's own fd)
        if target.startswith("socket:["):
            inodes.add(int(target[len("socket:[") : -1]))
    found = set()
    for table in ("tcp", "tcp6"):
        with open(f"/proc/self/net/{table}") as lines:
            next(lines)
            for line in lines:
                fields = line.split()
                if int(fields[9]) in inodes:
                    state = "LISTEN" if fields[3] == "0A" else f"state {fields[3]}"
                    found.add((_address(fields[1]), _address(fields[2]), state))
    return found


def _address(hex_address: str) -> str:
    host, port = hex_address.split(":")
    return f"{host}:{int(port, 16)}"


def _threads() -> set[threading.Thread]:
    # the event loop's default executor belongs to the loop (to_thread, DNS lookups)
    return {t for t in threading.enumerate() if not t.name.startswith("asyncio_")}


async def _start_fails(config: dict, expected: type[BaseException]) -> BaseException:
    tasks, sockets, threads = asyncio.all_tasks(), _sockets(), _threads()
    proxy = app.Proxy(parse_config(config))
    with pytest.raises(expected) as raised:
        async with proxy:
            raise AssertionError("the start succeeded")
    deadline = time.monotonic() + 5
    while True:
        gc.collect()  # an unclosed client warns (an error here) when collected
        left = {
            "tasks": {t for t in asyncio.all_tasks() - tasks if t is not asyncio.current_task()},
            "sockets": _sockets() - sockets,
            "threads": _threads() - threads,
        }
        if not any(left.values()) or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.05)  # the loop's next turns close what was closed
    assert left == {"tasks": set(), "sockets": set(), "threads": set()}
    await proxy.stop()  # a second stop is a no-op
    return raised.value


@pytest.mark.parametrize("step", STEPS)
async def test_a_failed_start_step_leaves_nothing(
    step, kafka_cluster, s3_server, tmp_path, monkeypatch
):
    _inject(step, monkeypatch)
    await _start_fails(_config(kafka_cluster, s3_server, tmp_path), StartFault)


async def test_an_occupied_peer_port_leaves_nothing(kafka_cluster, s3_server, tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        config = _config(kafka_cluster, s3_server, tmp_path, peer_port=port)
        error = await _start_fails(config, OSError)
    assert str(port) in str(error)


async def test_an_occupied_admin_port_leaves_nothing(kafka_cluster, s3_server, tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        config = _config(kafka_cluster, s3_server, tmp_path)
        config["admin"] = {"port": taken.getsockname()[1]}
        await _start_fails(config, OSError)


async def test_an_unreachable_object_store_leaves_nothing(kafka_cluster, s3_server, tmp_path):
    """S3 WAL mode lists the store at start: nothing answers on the endpoint."""
    config = _config(kafka_cluster, s3_server, tmp_path)
    config["tiering"]["wal"]["mode"] = "s3"
    config["tiering"]["object_store"]["endpoint_url"] = f"http://127.0.0.1:{free_port()}"
    await _start_fails(config, Exception)
