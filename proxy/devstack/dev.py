"""`tierproxy dev` (what `make run` starts): a local Kafka and a proxy in front of it.

Everything lives in one data folder, kept across restarts so a tiered topic and its
records are still there the next time (`make run` uses `.data/` of the checkout):

    <data>/kafka/       Kafka's node folder (node-1/logs: its partitions) and its log
    <data>/wal/         the proxy's WAL
    <data>/objects/     the object store (a local directory standing in for S3)
    <data>/proxy.yaml   the proxy's config, as `tierproxy run`, `migrate`, `verify` and
                        `export` take it (`--config`)

Without a data folder everything goes to a temporary one, deleted on exit. `--fresh`
empties the data folder first; it refuses a folder that `tierproxy dev` did not create.
The banner says where all of it is, with commands that work when pasted.
"""

from __future__ import annotations

import asyncio
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import yaml

MARKER = ".tierproxy-dev"  # written in a data folder this command created


class DevError(RuntimeError):
    """The data folder cannot be used as asked (--fresh on a folder that is not ours)."""


@dataclass(frozen=True)
class DevPorts:
    bootstrap: int = 19092
    broker_base: int = 19100
    admin: int = 19644

    @property
    def peer(self) -> int:
        return self.broker_base - 1


@dataclass(frozen=True)
class DevLayout:
    data: Path

    @property
    def kafka(self) -> Path:
        return self.data / "kafka"

    @property
    def kafka_logs(self) -> Path:
        """Kafka's log.dirs: the `<topic>-<partition>/` folders migrate --from-segments reads."""
        return self.kafka / "node-1" / "logs"

    @property
    def wal(self) -> Path:
        return self.data / "wal"

    @property
    def objects(self) -> Path:
        return self.data / "objects"

    @property
    def config(self) -> Path:
        return self.data / "proxy.yaml"


def prepare(data: Path, fresh: bool) -> bool:
    """Create (or with `fresh`, empty) the data folder; whether it held data before."""
    marker = data / MARKER
    if data.exists() and any(data.iterdir()) and not marker.exists():
        if fresh:
            raise DevError(
                f"--fresh: {data} was not created by `tierproxy dev` (no {MARKER} in it): "
                "not emptied; remove it yourself or choose another --data-dir"
            )
        had_data = True
    else:
        had_data = marker.exists() and (data / "kafka").exists()
    if fresh and data.exists():
        shutil.rmtree(data)
        had_data = False
    data.mkdir(parents=True, exist_ok=True)
    marker.touch()
    return had_data


def proxy_settings(layout: DevLayout, kafka_bootstrap: str, ports: DevPorts) -> dict:
    return {
        "upstream": {"bootstrap": kafka_bootstrap},
        "listeners": {"bootstrap_port": ports.bootstrap, "broker_port_base": ports.broker_base},
        "fleet": {"name": "dev", "zone": "local"},
        "tiering": {
            "peer_port": ports.peer,
            "wal": {"directory": str(layout.wal)},
            "object_store": {"kind": "local", "directory": str(layout.objects)},
            "session_timeout_ms": 6000,
        },
        "admin": {"bind_host": "127.0.0.1", "port": ports.admin},
    }


def write_config(layout: DevLayout, settings: dict) -> Path:
    header = (
        "# Written by `tierproxy dev` at each start (its Kafka's port changes): the config\n"
        "# of the proxy it runs, for `tierproxy migrate|verify|export --config` this file.\n"
    )
    layout.config.write_text(header + yaml.safe_dump(settings, sort_keys=False))
    return layout.config


def self_command() -> str:
    """How to run `tierproxy` from the shell this was started from: `tierproxy` when it
    is on the PATH, else its path (relative to the current folder when inside it)."""
    script = Path(sys.argv[0])
    if script.name != "tierproxy" or not script.exists():
        script = Path(sys.executable).parent / "tierproxy"
        if not script.exists():
            return f"{sys.executable} -m proxy.cli"
    found = shutil.which("tierproxy")
    if found is not None and Path(found).resolve() == script.resolve():
        return "tierproxy"
    absolute = script.absolute()
    try:
        return str(absolute.relative_to(Path.cwd()))
    except ValueError:
        return str(absolute)


def banner(
    layout: DevLayout,
    ports: DevPorts,
    kafka_bootstrap: str,
    kafka_log: Path,
    proxy_bootstrap: str,
    admin_url: str,
    kept: bool,
    had_data: bool,
) -> str:
    cmd = self_command()
    peer = f"127.0.0.1:{ports.peer}"
    if kept:
        where = (
            f"Data: {layout.data} ({'found from the last run' if had_data else 'new'}; "
            "kept when you stop; `make run ARGS=--fresh` starts empty)"
        )
    else:
        where = f"Data: {layout.data} (a temporary folder, deleted when you stop)"
    return "\n".join(
        [
            f"Kafka is up at {kafka_bootstrap} (its log: {kafka_log})",
            f"tierproxy is up: point your clients at bootstrap.servers={proxy_bootstrap}",
            where,
            f"  Kafka's partitions: {layout.kafka_logs}",
            f"  the proxy's WAL: {layout.wal}, objects: {layout.objects}",
            f"  the proxy's config: {layout.config}",
            f"Admin API: {admin_url}",
            "Topics pass through to Kafka until tiered. Try:",
            f"  {cmd} topics tier <topic> --peer {peer}",
            f"  {cmd} topics list --admin {admin_url}",
            f"  {cmd} topics status <topic> --admin {admin_url}",
            f"  {cmd} migrate <topic> --config {layout.config} --peer {peer} "
            f"--from-segments {layout.kafka_logs}",
            f"  {cmd} verify <topic> --config {layout.config}",
            "Press Ctrl-C to stop both.",
        ]
    )


async def tiering_ready(proxy, timeout_s: float = 120.0) -> str | None:
    """Until the proxy can tier a topic (its readiness checks pass and every metadata
    shard has a live owner), so the banner's first command works; None then, else what
    still is not after `timeout_s`."""
    from proxy.admin.views import readiness

    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        ready, body = readiness(proxy)
        tiering = body["checks"].get("tiering", {})
        if ready and not tiering.get("shards_without_live_owner"):
            return None
        if loop.time() > deadline:
            failing = {name: c for name, c in body["checks"].items() if not c.get("ok")}
            return str(failing or tiering)
        await asyncio.sleep(0.1)  # the checks read the proxy's state: nothing to wait on


def run_dev(data_dir: Path | None, fresh: bool, ports: DevPorts) -> int:
    from proxy.config import load_config
    from proxy.devstack import DevstackError, KafkaCluster
    from proxy.server.main import run

    kept = data_dir is not None
    if data_dir is None:
        if fresh:
            print("tierproxy dev: --fresh needs --data-dir", file=sys.stderr)
            return 2
        data_dir = Path(tempfile.mkdtemp(prefix="tierproxy-dev-"))
    layout = DevLayout(data_dir.absolute())
    try:
        had_data = prepare(layout.data, fresh)
    except DevError as exc:
        print(f"tierproxy dev: {exc}", file=sys.stderr)
        return 2
    cluster = KafkaCluster(size=1, base_dir=layout.kafka, name="kafka-dev")
    print(
        f"starting Apache Kafka (single node, KRaft) in {layout.kafka}"
        + (" with the data of the last run..." if had_data else "..."),
        flush=True,
    )
    try:
        try:
            cluster.start()
        except DevstackError as exc:
            print(f"tierproxy dev: {exc}", file=sys.stderr)
            return 1
        settings = proxy_settings(layout, cluster.bootstrap, ports)
        config = load_config(write_config(layout, settings))

        announce: list[asyncio.Task] = []  # held so the task is not collected

        async def when_ready(proxy) -> None:
            problem = await tiering_ready(proxy)
            admin_url = f"http://127.0.0.1:{proxy.admin.port}"
            text = banner(
                layout, ports, cluster.bootstrap, cluster.log_files()[0],
                proxy.bootstrap, admin_url, kept, had_data,
            )  # fmt: skip
            if problem is not None:
                text += f"\n(not ready to tier topics yet: {problem})"
            print(text, flush=True)

        def ready(proxy) -> None:
            announce.append(asyncio.get_running_loop().create_task(when_ready(proxy)))

        try:
            run(config, on_ready=ready)
        finally:
            print("stopping Kafka...", flush=True)
            cluster.stop()
    finally:
        if not kept:
            shutil.rmtree(layout.data, ignore_errors=True)
    return 0
