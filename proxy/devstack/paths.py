"""Where the devstack finds its pinned versions and its cache."""

from __future__ import annotations

import functools
import os
import random
import socket
from pathlib import Path

_VERSIONS_FILE = Path(__file__).with_name("versions.env")


class DevstackError(RuntimeError):
    """A component of the local runtime is missing or would not start."""


@functools.cache
def versions() -> dict[str, str]:
    """The pinned versions, from versions.env (the one place they are written)."""
    pins: dict[str, str] = {}
    for line in _VERSIONS_FILE.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            pins[key.strip()] = value.strip()
    return pins


def repo_root() -> Path:
    return Path(__file__).resolve().parents[2]


def cache_dir() -> Path:
    """The ignored folder holding downloads and builds; TIERPROXY_CACHE overrides it."""
    override = os.environ.get("TIERPROXY_CACHE")
    return Path(override) if override else repo_root() / ".cache"


def kafka_libs() -> Path:
    pins = versions()
    libs = cache_dir() / f"kafka-{pins['KAFKA_VERSION']}" / "libs"
    if not any(libs.glob("kafka_*.jar")):
        raise DevstackError(
            f"Kafka jars not found in {libs}: run `scripts/setup.sh` (or `make test`) first"
        )
    return libs


def kafka_streams_libs() -> Path:
    """Kafka Streams' jar and RocksDB's, beside Kafka's own (scripts/kafka-streams/pom.xml):
    run with `kafka_libs()` on the class path."""
    libs = cache_dir() / f"kafka-{versions()['KAFKA_VERSION']}" / "streams-libs"
    if not any(libs.glob("kafka-streams-*.jar")):
        raise DevstackError(f"Kafka Streams jars not found in {libs}: run `scripts/setup.sh` first")
    return libs


def minio_binary() -> Path:
    binary = cache_dir() / "bin" / "minio"
    if not binary.exists():
        raise DevstackError(f"MinIO binary not found at {binary}: run `scripts/setup.sh --minio`")
    return binary


# Ports this process has handed out: never handed out twice, as a caller may bind its port
# only after asking for the next one.
_handed_out: set[int] = set()


def free_port(host: str = "127.0.0.1") -> int:
    """A port free on `host` now, for a server the caller starts soon after: chosen as
    `free_port_block` chooses (below the kernel's ephemeral range, where no outgoing
    connection can take it between this check and the bind)."""
    return free_port_block(1, host) + 1


def free_port_block(count: int, host: str = "127.0.0.1", attempts: int = 200) -> int:
    """A base port such that base+1 .. base+count are free now.

    Chosen below the kernel's ephemeral range, where no outgoing connection takes a
    port: on a busy machine thousands of ephemeral ports sit in TIME_WAIT, and a port
    the kernel hands out for a bind to 0 is the next one it hands to a connection (a
    fresh clone's run of 2026-11-28 lost a test to one). None of the ports was handed
    out before by this process; with TIERPROXY_PORT_RANGE set (`port_share`), the ports
    come from this process's share of that range only, so processes that each hand out
    ports (the suite's xdist workers) never hand out the same one (a child process
    inherits its parent's share, not its record of ports handed out).
    """
    low, high = _port_range()
    for _ in range(attempts):
        base = random.randrange(low, high - count - 1)
        ports = range(base + 1, base + count + 1)
        if _handed_out.intersection(ports):
            continue
        sockets = []
        try:
            for port in ports:
                sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                sockets.append(sock)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the proxy
                sock.bind((host, port))
        except OSError:
            continue
        finally:
            for sock in sockets:
                sock.close()
        _handed_out.update(ports)
        return base
    raise RuntimeError(f"no block of {count} free ports found")


PORT_RANGE_ENV = "TIERPROXY_PORT_RANGE"


def _port_range() -> tuple[int, int]:
    share = os.environ.get(PORT_RANGE_ENV)
    if share:
        first, _, last = share.partition("-")
        return int(first), int(last)
    try:
        high = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        high = 32_768
    return 10_000, high


def port_share(index: int, count: int) -> str:
    """The TIERPROXY_PORT_RANGE value for process `index` of `count` processes handing
    out ports at once: `count` disjoint slices of the range below the ephemeral ports."""
    if not 0 <= index < count:
        raise ValueError(f"process {index} of {count}")
    low, high = _port_range()
    size = (high - low) // count
    return f"{low + index * size}-{low + (index + 1) * size}"
