"""The child process of test_start_undo.py: one proxy start, failed on purpose, and
what it left behind, printed as one JSON line.

Run in a process of its own so that nothing another test left running (a client it did
not close, reconnecting to Kafka now and then) is counted as this start's leak: a socket
such a client opened while a start was being undone once failed the suite. Usage:
`python start_undo_child.py CONFIG.json STEP`, STEP "" for a real fault in the config.
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import sys
import threading
import time

import pytest

from proxy.config import parse_config
from proxy.server import app, membership
from proxy.tiered import service as tiering
from proxy.tiered import startup


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


def inject(step: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Make `step` of the start fail."""
    patch = monkeypatch.setattr
    if step == "upstream refresh":  # broker listeners being opened
        patch(app.Proxy, "refresh_upstream", _after(app.Proxy.refresh_upstream))
    elif step == "metadata topic":
        patch(startup, "ensure_metadata_topic", _fail_async)
    elif step == "metadata readers":  # shard 0's reader started, shard 1's too, then fails
        patch(tiering.ShardReader, "start", _reader_after(tiering.ShardReader.start, 1))
    elif step == "metadata catch-up":
        patch(tiering.ShardReader, "caught_up", _reader_after(tiering.ShardReader.caught_up, 0))
    elif step == "object store":
        patch(startup, "open_store", _fail_async)
    elif step == "WAL":
        patch(startup.WriteAheadLog, "open", _fail_async)
    elif step == "peer listener":
        patch(startup.PeerServer, "start", _after(startup.PeerServer.start))
    elif step == "S3-WAL writer":
        patch(startup, "S3WalWriter", _fail_before)
    elif step == "group membership":  # the uploader runs; the member joined the group
        patch(startup.ShardAssignment, "start", _after(startup.ShardAssignment.start))
    elif step == "compactor":
        patch(startup.Compactor, "for_service", _fail_before)
    elif step == "background loops":
        patch(startup.OrphanSweep, "for_service", _fail_before)
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


async def start_fails(config: dict) -> dict:
    """Start a proxy on `config`, expecting the start to fail; what it raised and what it
    left behind, as JSON-ready lists."""
    tasks, sockets, threads = asyncio.all_tasks(), _sockets(), _threads()
    proxy = app.Proxy(parse_config(config))
    try:
        async with proxy:
            return {"error_type": None, "error": "the start succeeded", "left": {}}
    except Exception as exc:  # the start's error, raised after it undid itself
        raised = exc
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
    await proxy.stop()  # a second stop is a no-op
    return {
        "error_type": [cls.__name__ for cls in type(raised).__mro__],
        "error": str(raised),
        "left": {kind: sorted(map(str, found)) for kind, found in left.items()},
    }


def main() -> None:
    config_path, step = sys.argv[1], sys.argv[2]
    with open(config_path) as f:
        config = json.load(f)
    with pytest.MonkeyPatch.context() as monkeypatch:
        if step:
            inject(step, monkeypatch)
        result = asyncio.run(start_fails(config))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
