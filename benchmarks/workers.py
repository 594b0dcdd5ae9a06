"""Workers benchmark: proxy-bound tiered produce (local WAL) with `workers: 1` and `2`.

    .venv/bin/python -m benchmarks.workers [--workers 1 2] [--records N] [--producers 4]
        [--bootstrap HOST:PORT] [--json out.json]

One `tierproxy run` in front of a Kafka (`--bootstrap`, or a single-node one it starts),
a topic of 12 partitions tiered, the object store a local directory (no MinIO: the
proxy's own work is measured), the WAL on the local disk. Per workers count, a fresh
metadata topic, fleet topic and tiered topic; `--producers` librdkafka producers
(idempotent, acks=all, 1 KiB records), each a connection of its own through the shared
bootstrap port (SO_REUSEPORT spreads connections, not requests, over the workers), write
`--records` in all. Reported per count: MB/s from the first send to the last ack, and the
CPU seconds of the whole proxy (the parent and every worker, /proc) per GiB produced.
Figures belong on a quiet machine with more cores than workers (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path

from confluent_kafka.admin import AdminClient, NewTopic

from benchmarks.common.clients import librdkafka_produce
from benchmarks.common.procs import ProxyProcess, cpu_seconds, in_threads, tierproxy_argv
from benchmarks.common.run import run_main
from proxy.devstack import KafkaCluster
from proxy.devstack.paths import free_port_block

PARTITIONS = 12
RECORD_SIZE = 1024
GIB = 1 << 30


def proxy_pids(proxy: ProxyProcess) -> list[int]:
    """The proxy's process and its children (the workers)."""
    pid = proxy.pid
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    return [pid, *map(int, children)]


def ready(admin_port: int, workers: int) -> bool:
    for port in range(admin_port, admin_port + workers):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5):
                pass
        except OSError:  # 503 (an HTTPError) or nothing listening yet
            return False
    return True


def run_count(bootstrap: str, workers: int, args: argparse.Namespace, work: Path) -> dict:
    run_id = uuid.uuid4().hex[:8]
    ports = free_port_block(2 * workers)  # peer ports, then admin ports
    settings = {
        "workers": workers,
        "fleet": {"name": f"bench-{run_id}", "zone": "zone-a", "topic": f"fleet-{run_id}"},
        "admin": {"port": ports + workers},
        "tiering": {
            "metadata_topic": f"meta-{run_id}",
            "shard_count": 8,
            "peer_port": ports,
            "wal": {"directory": str(work / run_id / "wal")},
            "object_store": {"kind": "local", "directory": str(work / run_id / "objects")},
        },
    }
    proxy = ProxyProcess(bootstrap, [1, 2, 3], work, name=f"proxy-{run_id}", settings=settings)
    proxy.start()
    try:
        deadline = time.monotonic() + 60
        while not ready(ports + workers, workers):
            if time.monotonic() > deadline:
                raise RuntimeError("the workers were not ready in 60 s:\n" + proxy.process.tail())
            time.sleep(0.2)
        topic = f"workers-{run_id}"
        admin = AdminClient({"bootstrap.servers": bootstrap})
        admin.create_topics([NewTopic(topic, PARTITIONS, 1)])[topic].result(30)
        tier = [*tierproxy_argv(), "topics", "tier", topic, "--peer", f"127.0.0.1:{ports}"]
        subprocess.run(tier, check=True, capture_output=True, timeout=60)
        librdkafka_produce(proxy.bootstrap, topic, 100 * PARTITIONS, RECORD_SIZE)  # cut over
        pids = proxy_pids(proxy)
        cpu_before = sum(map(cpu_seconds, pids))
        each = args.records // args.producers
        started = time.perf_counter()
        in_threads(
            [
                lambda: librdkafka_produce(proxy.bootstrap, topic, each, RECORD_SIZE)
                for _ in range(args.producers)
            ]
        )
        seconds = time.perf_counter() - started
        cpu = sum(map(cpu_seconds, pids)) - cpu_before
        produced = each * args.producers * RECORD_SIZE
        return {
            "workers": workers,
            "records": each * args.producers,
            "seconds": round(seconds, 2),
            "mb_per_s": round(produced / (1 << 20) / seconds, 1),
            "proxy_cpu_s_per_gib": round(cpu / (produced / GIB), 1),
            "warnings": proxy.problems()[:5],
        }
    finally:
        proxy.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--records", type=int, default=400_000)
    parser.add_argument("--producers", type=int, default=4)
    parser.add_argument("--bootstrap", help="an existing Kafka (default: start one)")
    parser.add_argument("--json", type=Path, help="also write the rows to this file")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-workers-") as tmp:
        work = Path(tmp)
        kafka = None
        if args.bootstrap is None:
            kafka = KafkaCluster(size=1, name="kafka-bench-workers")
            kafka.start()
        try:
            bootstrap = args.bootstrap or kafka.bootstrap
            rows = [run_count(bootstrap, n, args, work) for n in args.workers]
        finally:
            if kafka is not None:
                kafka.stop()
    print("| workers | records | MB/s | proxy CPU s per GiB |")
    print("| ---: | ---: | ---: | ---: |")
    for row in rows:
        print(
            f"| {row['workers']} | {row['records']} | {row['mb_per_s']} | "
            f"{row['proxy_cpu_s_per_gib']} |"
        )
    for row in rows:
        for line in row["warnings"]:
            print(f"workers {row['workers']}: {line}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    run_main(main)
