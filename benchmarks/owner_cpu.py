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

The baseline runs in each round first: the same producer, the same rate, straight to the
broker, on an untiered topic of one partition (RF 1) beside the tiered one. Its figures
are the broker's CPU (the JVM, all threads) per Produce request, the requests counted by
librdkafka's statistics. In the tiered phase the broker's CPU is shown too: the owner's
metadata commits and the fleet's heartbeats are its share of a tiered produce.

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
    jit_cpu_seconds,
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
        direct = f"direct-{os.urandom(3).hex()}"
        admin.create_topics([NewTopic(direct, 1, 1)])[direct].result(60)
        broker = kafka.nodes[0].process.pid
        assert broker is not None
        paced = {"linger.ms": "0"}
        librdkafka_produce(proxy.bootstrap, topic, 2000, args.record_size, args.rate, paced)
        # the broker's JIT compiles its produce path in the first tens of thousands of
        # records: warmed at full speed first, or its first round costs 2-4x the next
        librdkafka_produce(kafka.bootstrap, direct, 30000, args.record_size, None, paced)
        librdkafka_produce(kafka.bootstrap, direct, 2000, args.record_size, args.rate, paced)
        before, broker_before = sum(cpu_split(proxy.pid)), sum(cpu_split(broker))
        time.sleep(args.idle_s)
        idle = (sum(cpu_split(proxy.pid)) - before) / args.idle_s
        broker_idle = (sum(cpu_split(broker)) - broker_before) / args.idle_s
        print(f"idle: proxy {idle:.3f}, broker {broker_idle:.3f} CPU s per s", flush=True)
        for rnd in range(args.rounds):
            cpu0, jit0, load = sum(cpu_split(broker)), jit_cpu_seconds(broker), os.getloadavg()[0]
            base = librdkafka_produce(
                kafka.bootstrap, direct, args.records, args.record_size, args.rate, paced,
                count_requests=True,
            )  # fmt: skip
            base_cpu = sum(cpu_split(broker)) - cpu0
            jit = jit_cpu_seconds(broker) - jit0  # still compiling: counted, and shown
            base_requests = int(base.details["produce_requests"])
            print(
                f"r{rnd} direct: broker {base_cpu:.2f} CPU s over {base.seconds:.1f} s, "
                f"{base_requests} requests ({args.records / base_requests:.2f} records each): "
                f"{base_cpu / base_requests * 1e6:.0f} µs/request, "
                f"p50 {base.latency_ms['p50']:.1f} ms, JIT {jit:.2f} CPU s, load {load:.1f}",
                flush=True,
            )
            profiler = None
            if args.profile:
                args.profile.mkdir(parents=True, exist_ok=True)
                out = args.profile / f"owner-r{rnd}.py-spy"
                profiles.append(out)
                profiler = PySpy(proxy.pid, out, rate=500)
                profiler.start()
            requests0, (user0, sys0) = _produce_requests(url), cpu_split(proxy.pid)
            broker0 = sum(cpu_split(broker))
            load = os.getloadavg()[0]
            result = librdkafka_produce(
                proxy.bootstrap, topic, args.records, args.record_size, args.rate, paced
            )
            user, system = cpu_split(proxy.pid)
            broker_cpu = sum(cpu_split(broker)) - broker0
            if profiler is not None:
                profiler.stop()
            requests = _produce_requests(url) - requests0
            cpu = user - user0 + system - sys0
            row = {
                "round": rnd, "seconds": result.seconds, "latency_ms": result.latency_ms,
                "proxy_cpu_s": cpu, "system_s": system - sys0, "requests": requests,
                "load": load, "broker_cpu_s": broker_cpu,
                "direct": {
                    "broker_cpu_s": base_cpu, "jit_cpu_s": jit, "requests": base_requests,
                    "seconds": base.seconds, "latency_ms": base.latency_ms,
                },
            }  # fmt: skip
            rounds.append(row)
            print(
                f"r{rnd}: {cpu:.2f} CPU s over {result.seconds:.1f} s, {requests:.0f} requests "
                f"({args.records / requests:.2f} records each): "
                f"{cpu / requests * 1e6:.0f} µs/request, p50 {result.latency_ms['p50']:.1f} ms "
                f"p99 {result.latency_ms['p99']:.1f} ms, broker {broker_cpu:.2f} CPU s, "
                f"load {load:.1f}",
                flush=True,
            )
        del admin
    print(f"\nproxy code {facts['proxy_code']}; {facts['date']}\n")
    print(
        "| round | path | CPU µs per request | records per request | CPU s per GiB "
        "| and the broker's, beside the owner | p50 ms |"
    )
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: |")
    gib = args.records * args.record_size / 2**30
    for row in rounds:
        d = row["direct"]
        for path, cpu, jit, requests, beside, p50 in (
            ("direct (the broker)", d["broker_cpu_s"], d["jit_cpu_s"], d["requests"], None,
             d["latency_ms"]),
            ("tiered (the owner)", row["proxy_cpu_s"], 0.0, row["requests"], row["broker_cpu_s"],
             row["latency_ms"]),
        ):  # fmt: skip
            warm = f" ({(cpu - jit) / requests * 1e6:.0f} without JIT)" if jit else ""
            print(
                f"| {row['round']} | {path} | {cpu / requests * 1e6:.0f}{warm} "
                f"| {args.records / requests:.2f} | {cpu / gib:.1f} "
                f"| {'–' if beside is None else f'{beside / gib:.1f}'} | {p50['p50']:.1f} |"
            )
    print(f"\nbackground (idle, no client): proxy {idle:.3f}, broker {broker_idle:.3f} CPU s per s")
    if profiles:
        profile = summarize_pyspy(profiles, top=25)
        print(f"\npy-spy: {profile.samples} busy samples, {profile.idle_samples} idle")
        print("| self | where | | inclusive | function |\n| ---: | --- | --- | ---: | --- |")
        for i in range(max(len(profile.top), len(profile.groups))):
            a = profile.top[i] if i < len(profile.top) else ("", 0)
            b = profile.groups[i] if i < len(profile.groups) else ("", 0)
            share = lambda n: f"{n / profile.samples:.1%}" if n else ""  # noqa: E731
            print(f"| {share(a[1])} | `{a[0]}` | | {share(b[1])} | `{b[0]}` |")
    idles = {"idle_cpu_s_per_s": idle, "broker_idle_cpu_s_per_s": broker_idle}
    write_json(args.json, {**facts, **idles, "rounds": rounds})
    return 0


if __name__ == "__main__":
    sys.exit(main())
