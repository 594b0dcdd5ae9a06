"""`workers: N`: N proxy processes on one host, one fleet member each (docs/operations.md,
"Every core of a host").

Pure: what worker `i` of N is told differs from the file only in what must be its own:
its member name (`<fleet.name>/w<i>`), its WAL directory (`<wal.directory>/worker-<i>`),
and the ports a sibling or a scraper must reach it on, each configured port plus `i`
(`tiering.peer_port`, `tiering.advertised_peer_port`, `admin.port`, `metrics.port`; 0 stays
0: any free port, told to the fleet in the heartbeat). The client ports are shared
(SO_REUSEPORT), so every worker answers Metadata with the same addresses.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import TYPE_CHECKING

from proxy.config.section import ConfigError, Section

if TYPE_CHECKING:
    from proxy.config import ProxyConfig

MAX_WORKERS = 64


def parse_workers(root: Section) -> int:
    value = root.get("workers")
    if value is None:
        return 1
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_WORKERS:
        raise ConfigError("workers", f"{value!r} is not a whole number 1..{MAX_WORKERS}")
    return value


def check_workers(config: ProxyConfig) -> None:
    """With more than one worker: the client ports must be fixed (every worker binds the
    same ones), and each port range `port .. port + N - 1` a worker takes its own port
    from must be valid and overlap no other."""
    n = config.workers
    if n == 1:
        return
    if config.listeners.bootstrap_port == 0:
        raise ConfigError(
            "listeners.bootstrap_port",
            f"0 (any free port) with workers: {n}: the workers must share one fixed port",
        )
    ranges = [("listeners.bootstrap_port", config.listeners.bootstrap_port, 1)]
    for key, port in (
        ("tiering.peer_port", config.tiering.peer_port),
        ("tiering.advertised_peer_port", config.tiering.advertised_peer_port),
        ("metrics.port", config.metrics.port),
        ("admin.port", config.admin.port or 0),
    ):
        if port and port + n - 1 > 65535:
            raise ConfigError(key, f"{port} + {n - 1} (worker {n - 1}'s port) is not a port")
        if port and key != "tiering.advertised_peer_port":  # advertised: another host's
            ranges.append((key, port, n))
    for i, (key, port, count) in enumerate(ranges):
        for other, other_port, other_count in ranges[:i]:
            if port < other_port + other_count and other_port < port + count:
                raise ConfigError(
                    key,
                    f"{port}..{port + count - 1} (one port per worker) overlaps "
                    f"{other} {other_port}..{other_port + other_count - 1}",
                )


def worker_name(fleet_name: str, index: int) -> str:
    return f"{fleet_name}/w{index}"


def worker_wal_directory(wal_directory: Path, index: int) -> Path:
    return wal_directory / f"worker-{index}"


def wal_directories(config: ProxyConfig) -> list[Path]:
    """The local WAL directories this configuration replays: the file's own with one
    worker (today's layout), else one per worker beneath it."""
    base = config.tiering.wal_directory
    if config.workers == 1:
        return [base]
    return [worker_wal_directory(base, i) for i in range(config.workers)]


def worker_config(config: ProxyConfig, index: int) -> ProxyConfig:
    """What worker `index` runs: the file's config with its own name, WAL and ports."""
    if not 0 <= index < config.workers:
        raise ConfigError("--worker", f"{index} is not a worker of {config.workers}")
    if config.workers == 1:
        return config

    def plus(port: int) -> int:
        return port + index if port else 0

    tiering = config.tiering
    admin = config.admin
    return dataclasses.replace(
        config,
        fleet=dataclasses.replace(config.fleet, name=worker_name(config.fleet.name, index)),
        tiering=dataclasses.replace(
            tiering,
            wal_directory=worker_wal_directory(tiering.wal_directory, index),
            peer_port=plus(tiering.peer_port),
            advertised_peer_port=plus(tiering.advertised_peer_port),
        ),
        metrics=dataclasses.replace(config.metrics, port=plus(config.metrics.port)),
        admin=admin if admin.port is None else dataclasses.replace(admin, port=plus(admin.port)),
    )


def unused_wal_directories(config: ProxyConfig, names: list[str]) -> list[Path]:
    """Of the names in `wal.directory`, the WAL directories an earlier `workers` count left
    that this one does not replay: every `worker-<k>` with k >= N, and the directory
    itself (the single process's WAL) when N > 1. The parent refuses to start while one
    holds records not uploaded (`server/supervisor.py`, `check_wal_directories`)."""
    base = config.tiering.wal_directory
    used = set(wal_directories(config))
    found = [base] if config.workers > 1 else []
    for name in sorted(names):
        match = _WORKER_DIRECTORY.fullmatch(name)
        if match is not None and worker_wal_directory(base, int(match[1])) not in used:
            found.append(base / name)
    return found


_WORKER_DIRECTORY = re.compile(r"worker-(\d+)")
