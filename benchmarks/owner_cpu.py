"""Owner CPU benchmark: a tiered partition's owner's CPU per Produce request, paced.

What the tiered benchmark's paced local-WAL phases measure (an owner CPU s per GiB
dominated by the cost of each request), in isolation: one Kafka broker, one proxy that
owns the metadata's one shard (local WAL, objects in a local directory), one tiered
topic of one partition, and one librdkafka producer in this process (acks=all,
idempotent, linger 0) at `--rate` records/s. The proxy's CPU is read from /proc before
and after each round and divided by the Produce requests it counted
(`tierproxy_requests_total{api_key="0"}`); how many records share a request depends on
the WAL's fsync time, so the figure is per request, with the records per request beside.
Before the rounds, the proxy's CPU over `--idle-s` seconds with no client says what its
background work (heartbeats, the metadata reader, timers) adds.

    .venv/bin/python -m benchmarks.owner_cpu --json owner.json
    .venv/bin/python -m benchmarks.owner_cpu --profile /tmp/owner-prof   # py-spy, 500 Hz
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

from confluent_kafka.admin import AdminClient, NewTopic

from benchmarks.common.clients import librdkafka_produce
from benchmarks.common.procs import (
    ProxyProcess,
    PySpy,
    cpu_split,
    machine_description,
    scrape,
    summarize_pyspy,
    tierproxy_argv,
)
from benchmarks.common.run import git_state, run_facts, write_json
from proxy.devstack import KafkaCluster
from proxy.devstack.paths import free_port

REQUESTS = "tierproxy_requests_total"


def _produce_requests(url: str) -> float:
    samples = scrape(url, (REQUESTS,)).get(REQUESTS, {})
    return sum(v for labels, v in samples.items() if ("api_key", "0") in labels)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=10000, help="records per round")
    parser.add_argument("--record-size", type=int, default=1000)
    parser.add_argument("--rate", type=int, default=1000, help="records/s")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--idle-s", type=float, default=10.0)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--profile", type=Path, help="py-spy the proxy in each round, here")
    args = parser.parse_args()
    facts = run_facts(args, git_state(), machine_description(), minio=False)
    rounds: list[dict] = []
    profiles: list[Path] = []
    with tempfile.TemporaryDirectory(prefix="tierproxy-owner-") as tmp, ExitStack() as stack:
        kafka = KafkaCluster(size=1, name="kafka-owner")
        stack.callback(kafka.stop)
        kafka.start()
        metrics_port, peer_port = free_port(), free_port()
        tiering = {
            "metadata_topic": f"__tierproxy_owner_meta_{os.urandom(3).hex()}",
            "shard_count": 1,
            "peer_bind_host": "127.0.0.1",
            "peer_port": peer_port,
            "object_store": {"kind": "local", "directory": f"{tmp}/objects"},
            "wal": {"directory": f"{tmp}/wal"},
        }
        settings = {
            "metrics": {"bind_host": "127.0.0.1", "port": metrics_port},
            "fleet": {"name": "owner-bench", "zone": "zone-a", "topic": "__owner_bench_fleet"},
            "tiering": tiering,
        }
        proxy = ProxyProcess(
            kafka.bootstrap, [n.node_id for n in kafka.nodes], Path(tmp), settings=settings
        )
        stack.callback(proxy.stop)
        proxy.start(timeout=180)
        url = f"http://127.0.0.1:{metrics_port}/metrics"
        admin = AdminClient({"bootstrap.servers": kafka.bootstrap})
        topic = f"owner-{os.urandom(3).hex()}"
        admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(60)
        argv = [*tierproxy_argv(), "topics", "tier", topic, "--peer", f"127.0.0.1:{peer_port}"]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise RuntimeError(f"tierproxy topics tier {topic}: {done.stdout}{done.stderr}")
        paced = {"linger.ms": "0"}
        librdkafka_produce(proxy.bootstrap, topic, 2000, args.record_size, args.rate, paced)
        before = sum(cpu_split(proxy.pid))
        time.sleep(args.idle_s)
        idle = (sum(cpu_split(proxy.pid)) - before) / args.idle_s
        print(f"idle: {idle:.3f} CPU s per s", flush=True)
        for rnd in range(args.rounds):
            profiler = None
            if args.profile:
                args.profile.mkdir(parents=True, exist_ok=True)
                out = args.profile / f"owner-r{rnd}.py-spy"
                profiles.append(out)
                profiler = PySpy(proxy.pid, out, rate=500)
                profiler.start()
            requests0, (user0, sys0) = _produce_requests(url), cpu_split(proxy.pid)
            load = os.getloadavg()[0]
            result = librdkafka_produce(
                proxy.bootstrap, topic, args.records, args.record_size, args.rate, paced
            )
            user, system = cpu_split(proxy.pid)
            if profiler is not None:
                profiler.stop()
            requests = _produce_requests(url) - requests0
            cpu = user - user0 + system - sys0
            row = {
                "round": rnd, "seconds": result.seconds, "latency_ms": result.latency_ms,
                "proxy_cpu_s": cpu, "system_s": system - sys0, "requests": requests,
                "load": load,
            }  # fmt: skip
            rounds.append(row)
            print(
                f"r{rnd}: {cpu:.2f} CPU s over {result.seconds:.1f} s, {requests:.0f} requests "
                f"({args.records / requests:.2f} records each): "
                f"{cpu / requests * 1e6:.0f} µs/request, p50 {result.latency_ms['p50']:.1f} ms "
                f"p99 {result.latency_ms['p99']:.1f} ms, load {load:.1f}",
                flush=True,
            )
        del admin
    print(f"\nproxy code {facts['proxy_code']}; {facts['date']}\n")
    print("| round | owner CPU µs per request | records per request | CPU s per GiB | p50 ms |")
    print("| --- | ---: | ---: | ---: | ---: |")
    gib = args.records * args.record_size / 2**30
    for row in rounds:
        print(
            f"| {row['round']} | {row['proxy_cpu_s'] / row['requests'] * 1e6:.0f} | "
            f"{args.records / row['requests']:.2f} | {row['proxy_cpu_s'] / gib:.1f} | "
            f"{row['latency_ms']['p50']:.1f} |"
        )
    print(f"\nbackground (idle, no client): {idle:.3f} CPU s per s")
    if profiles:
        profile = summarize_pyspy(profiles, top=25)
        print(f"\npy-spy: {profile.samples} busy samples, {profile.idle_samples} idle")
        print("| self | where | | inclusive | function |\n| ---: | --- | --- | ---: | --- |")
        for i in range(max(len(profile.top), len(profile.groups))):
            a = profile.top[i] if i < len(profile.top) else ("", 0)
            b = profile.groups[i] if i < len(profile.groups) else ("", 0)
            share = lambda n: f"{n / profile.samples:.1%}" if n else ""  # noqa: E731
            print(f"| {share(a[1])} | `{a[0]}` | | {share(b[1])} | `{b[0]}` |")
    write_json(args.json, {**facts, "idle_cpu_s_per_s": idle, "rounds": rounds})
    return 0


if __name__ == "__main__":
    sys.exit(main())
