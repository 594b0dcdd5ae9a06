"""Relay CPU benchmark: the passthrough proxy's CPU per Produce request, small requests.

What the passthrough benchmark's paced phases measure (a proxy CPU s per GiB dominated by
the cost of each request), in isolation and in less time: one Kafka broker, one proxy,
one librdkafka producer in this process (its CPU is not the proxy's), and the proxy's CPU
read from /proc before and after each phase and divided by the Produce requests the
proxy counted (`tierproxy_requests_total{api_key="0"}`). Each proxied phase has a twin
with the producer direct to Kafka, the proxy idle, for its background CPU over the same
time (timers, metadata refresh, fleet heartbeats); that is reported beside, not
subtracted.

    .venv/bin/python -m benchmarks.relay_cpu --json relay.json

Phases (`--records` each): `paced`: `--rate` records/s, linger 0, about one request per
record (a request, its answer, and an idle wait between); `small batches`: full speed,
`batch.size` 16 KiB, 1 KiB records (~15 records a request, up to five in flight per
connection, as Java's ProducerPerformance sends); `java paced`: the paced phase sent by
Java's ProducerPerformance (acks=all, idempotent, linger 0). Each proxied phase also
reports the share of requests the relay forwarded (`tierproxy_relayed_frames_total`):
the rest took the connection loop.

The librdkafka phases also run through `native_relay.c` (path `native`): a byte relay in
C, one thread and epoll, built here with the machine's `cc`, between the producer and a
second listener of the broker that advertises the relay's port. It makes the system
calls any user-space relay makes per request (a read and a write each way, the epoll
wake-ups) and nothing else: the floor under the proxy's figure on this machine. Its
requests are librdkafka's own count (`req.Produce`).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

from confluent_kafka.admin import AdminClient, NewTopic

from benchmarks.common.clients import JavaTools, librdkafka_produce
from benchmarks.common.procs import (
    PerfRecord,
    ProxyProcess,
    PySpy,
    cpu_split,
    machine_description,
    pick_port_base,
    scrape,
    summarize_perf,
    summarize_pyspy,
    syscalls,
)
from benchmarks.common.run import git_state, run_facts, write_json
from proxy.devstack import KafkaCluster
from proxy.devstack.paths import free_port, kafka_libs

REQUESTS = "tierproxy_requests_total"
PUBLISH_WAIT_S = 0.3  # > the connections' PUBLISH_DELAY_S
RELAYED = "tierproxy_relayed_frames_total"
NATIVE_SOURCE = Path(__file__).with_name("native_relay.c")
NATIVE_LISTENER = "RELAYED"  # the broker's listener behind the native relay


def _start_native(tmp: Path, listen_port: int, upstream_port: int) -> subprocess.Popen | None:
    """Build and start native_relay.c; None (and why, on stderr) without a C compiler."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        print("no C compiler: the native relay's phases are left out", file=sys.stderr)
        return None
    binary = tmp / "native_relay"
    subprocess.run([compiler, "-O2", "-o", str(binary), str(NATIVE_SOURCE)], check=True)
    argv = [str(binary), str(listen_port), "127.0.0.1", str(upstream_port)]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    if not proc.stdout.readline().startswith("listening"):  # bound before any client
        proc.kill()
        raise RuntimeError(f"{binary} did not start")
    return proc


def _produce_requests(url: str) -> tuple[float, float]:
    """The Produce requests the proxy read, and the requests of any API its relay
    forwarded (the rest took the connection loop)."""
    samples = scrape(url, (REQUESTS, RELAYED))
    produce = sum(v for k, v in samples.get(REQUESTS, {}).items() if ("api_key", "0") in k)
    relayed = sum(v for k, v in samples.get(RELAYED, {}).items() if ("direction", "request") in k)
    return produce, relayed


def _native_phase(
    pid: int,
    rnd: int,
    kind: str,
    bootstrap: str,
    topic: str,
    rate: int | None,
    settings: dict[str, str],
    args: argparse.Namespace,
) -> dict:
    """One librdkafka phase through the native relay: its CPU per request."""
    (user0, sys0), (reads0, writes0) = cpu_split(pid), syscalls(pid)
    load = os.getloadavg()[0]
    result = librdkafka_produce(
        bootstrap, topic, args.records, args.record_size, rate, settings, count_requests=True
    )
    user, sys_ = (a - b for a, b in zip(cpu_split(pid), (user0, sys0), strict=True))
    reads, writes = (a - b for a, b in zip(syscalls(pid), (reads0, writes0), strict=True))
    requests = int(str(result.details["produce_requests"]))
    cpu = user + sys_
    per = f"{cpu / requests * 1e6:.0f} µs/request" if requests else "no requests"
    print(
        f"r{rnd} {kind:13s} native {result.mb_per_s:6.1f} MB/s "
        f"p50 {result.latency_ms['p50']:.1f} ms  relay {cpu:.2f} CPU s over "
        f"{result.seconds:.1f} s, {requests} requests ({reads} reads, {writes} writes): {per}  "
        f"load {load:.1f}",
        flush=True,
    )
    return {
        "round": rnd, "kind": kind, "path": "native", "seconds": result.seconds,
        "mb_per_s": result.mb_per_s, "latency_ms": result.latency_ms,
        "proxy_cpu_s": cpu, "requests": requests, "relayed": requests,
        "reads": reads, "writes": writes, "user_s": user, "system_s": sys_, "load": load,
    }  # fmt: skip


def _native_cell(native: list[dict]) -> str:
    """The native relay's figures for one kind's rounds ("–" where it did not run)."""
    rows = [
        f"{p['proxy_cpu_s'] / p['requests'] * 1e6:.0f} µs, {p['reads'] / p['requests']:.1f}, "
        f"{p['writes'] / p['requests']:.1f}, {p['system_s'] / max(p['proxy_cpu_s'], 1e-9):.0%}"
        for p in native
        if p["requests"]
    ]
    return "; ".join(rows) or "–"


def _share(count: int, samples: int) -> str:
    return f"{count / samples:.1%}" if count else ""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=20000)
    parser.add_argument("--record-size", type=int, default=1000)
    parser.add_argument("--rate", type=int, default=1000, help="records/s when paced")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--json", type=Path)
    parser.add_argument(
        "--profile", type=Path, help="profile the proxy in its proxied phases, output here"
    )
    parser.add_argument("--profiler", choices=("py-spy", "perf"), default="py-spy")
    args = parser.parse_args()
    facts = run_facts(args, git_state(), machine_description(), minio=False)
    phases: list[dict] = []
    profiles: dict[str, list[Path]] = {}
    with tempfile.TemporaryDirectory(prefix="tierproxy-relay-") as tmp, ExitStack() as stack:
        kafka = KafkaCluster(
            size=1, name="kafka-relay", extra_listeners={NATIVE_LISTENER: "PLAINTEXT"}
        )
        node = kafka.nodes[0]
        native_port = free_port()
        kafka.extra_config["advertised.listeners"] = (
            f"PLAINTEXT://127.0.0.1:{node.port},{NATIVE_LISTENER}://127.0.0.1:{native_port}"
        )
        stack.callback(kafka.stop)
        kafka.start()
        native = _start_native(Path(tmp), native_port, node.extra_ports[NATIVE_LISTENER])
        if native is not None:
            stack.callback(native.kill)
        native_bootstrap = f"127.0.0.1:{native_port}"
        metrics_port = pick_port_base([0])
        proxy = ProxyProcess(
            kafka.bootstrap,
            [n.node_id for n in kafka.nodes],
            Path(tmp),
            settings={"metrics": {"bind_host": "127.0.0.1", "port": metrics_port}},
        )
        stack.callback(proxy.stop)
        proxy.start()
        proxy_pid = proxy.pid
        url = f"http://127.0.0.1:{metrics_port}/metrics"
        admin = AdminClient({"bootstrap.servers": kafka.bootstrap})
        topic = f"relay-{os.urandom(3).hex()}"
        admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(60)
        kinds = {
            "paced": ("librdkafka", {"linger.ms": "0"}, args.rate),
            "small batches": ("librdkafka", {"linger.ms": "0", "batch.size": "16384"}, None),
            "java paced": ("java", {"linger.ms": "0"}, args.rate),
        }
        java = JavaTools(kafka_libs())
        # unmeasured: connections, metadata, the broker's JIT
        bootstraps = {"direct": kafka.bootstrap, "proxy": proxy.bootstrap}
        if native is not None:
            bootstraps["native"] = native_bootstrap
        for path, bootstrap in bootstraps.items():
            librdkafka_produce(
                bootstrap, topic, 20000, args.record_size, None, kinds["small batches"][1]
            )
            if path != "native":
                java.produce(bootstrap, topic, 5000, args.record_size, None, {"linger.ms": "0"})
        for rnd in range(args.rounds):
            for kind, (client, settings, rate) in kinds.items():
                paths = ["direct", "proxy"]
                if native is not None and client == "librdkafka":
                    paths.append("native")
                for path in paths if rnd % 2 == 0 else paths[::-1]:
                    bootstrap = bootstraps[path]
                    if path == "native":
                        assert native is not None
                        phases.append(
                            _native_phase(
                                native.pid, rnd, kind, bootstrap, topic, rate, settings, args
                            )
                        )
                        continue
                    profiler = None
                    if args.profile and path == "proxy":
                        args.profile.mkdir(parents=True, exist_ok=True)
                        out = args.profile / f"{kind.replace(' ', '-')}-r{rnd}.{args.profiler}"
                        profiles.setdefault(kind, []).append(out)
                        if args.profiler == "perf":
                            profiler = PerfRecord(out, frequency=1999)
                        else:
                            profiler = PySpy(proxy.pid, out, rate=500, native=True)
                        profiler.start()
                    (requests0, relayed0), (user0, sys0) = (
                        _produce_requests(url),
                        cpu_split(proxy_pid),
                    )
                    reads0, writes0 = syscalls(proxy.pid)
                    load = os.getloadavg()[0]
                    produce = librdkafka_produce if client == "librdkafka" else java.produce
                    result = produce(
                        bootstrap, topic, args.records, args.record_size, rate, settings
                    )
                    user, sys_ = cpu_split(proxy_pid)
                    user, sys_ = user - user0, sys_ - sys0
                    cpu = user + sys_
                    reads, writes = syscalls(proxy.pid)
                    reads, writes = reads - reads0, writes - writes0
                    if profiler is not None:
                        profiler.stop()
                    time.sleep(PUBLISH_WAIT_S)  # the relay's counts reach the metrics late
                    requests, relayed = _produce_requests(url)
                    requests, relayed = requests - requests0, relayed - relayed0
                    phase = {
                        "round": rnd, "kind": kind, "path": path, "seconds": result.seconds,
                        "mb_per_s": result.mb_per_s, "latency_ms": result.latency_ms,
                        "proxy_cpu_s": cpu, "requests": requests, "relayed": relayed,
                        "reads": reads, "writes": writes, "user_s": user, "system_s": sys_,
                        "load": load,
                    }  # fmt: skip
                    phases.append(phase)
                    per = f"{cpu / requests * 1e6:.0f} µs/request" if requests else "idle"
                    print(
                        f"r{rnd} {kind:13s} {path:6s} {result.mb_per_s:6.1f} MB/s "
                        f"p50 {result.latency_ms['p50']:.1f} ms  proxy {cpu:.2f} CPU s over "
                        f"{result.seconds:.1f} s, {requests:.0f} requests "
                        f"({relayed:.0f} relayed, {reads} reads, {writes} writes): {per}  "
                        f"load {load:.1f}",
                        flush=True,
                    )
        del admin
    print(f"\nproxy code {facts['proxy_code']}; {facts['date']}\n")
    print(
        "| phase | proxy CPU µs per request | proxy CPU s per GiB "
        "| background CPU s per s (direct twin) | requests relayed "
        "| reads, writes per request | of which system CPU "
        "| native relay: CPU µs per request, reads, writes per request, system share |"
    )
    print("| --- | ---: | ---: | ---: | ---: | --- | ---: | --- |")
    for kind in kinds:
        proxied = [p for p in phases if p["kind"] == kind and p["path"] == "proxy"]
        idle = [p for p in phases if p["kind"] == kind and p["path"] == "direct"]
        per_request = [p["proxy_cpu_s"] / p["requests"] * 1e6 for p in proxied]
        gib = args.records * args.record_size / 2**30
        per_gib = [p["proxy_cpu_s"] / gib for p in proxied]
        background = [p["proxy_cpu_s"] / p["seconds"] for p in idle]
        relayed_shares = [p["relayed"] / p["requests"] for p in proxied if p["requests"]]
        system_shares = [p["system_s"] / p["proxy_cpu_s"] for p in proxied if p["proxy_cpu_s"]]
        calls = [
            (p["reads"] / p["requests"], p["writes"] / p["requests"])
            for p in proxied
            if p["requests"]
        ]
        print(
            f"| {kind} | {', '.join(f'{v:.0f}' for v in per_request)} | "
            f"{', '.join(f'{v:.1f}' for v in per_gib)} | "
            f"{', '.join(f'{v:.3f}' for v in background)} | "
            f"{', '.join(f'{share:.0%}' for share in relayed_shares)} | "
            f"{', '.join(f'{r:.1f}, {w:.1f}' for r, w in calls)} | "
            f"{', '.join(f'{share:.0%}' for share in system_shares)} | "
            f"{_native_cell([p for p in phases if p['kind'] == kind and p['path'] == 'native'])} |"
        )
    for kind, paths in profiles.items():
        if args.profiler == "perf":
            profile = summarize_perf(paths, proxy_pid, top=25)
        else:
            profile = summarize_pyspy(paths, top=25)
        samples = profile.samples
        print(f"\n{args.profiler}, {kind}: {samples} busy samples, {profile.idle_samples} idle")
        print("| self | where | | share | grouped |\n| ---: | --- | --- | ---: | --- |")
        for i in range(max(len(profile.top), len(profile.groups))):
            a = profile.top[i] if i < len(profile.top) else ("", 0)
            b = profile.groups[i] if i < len(profile.groups) else ("", 0)
            print(f"| {_share(a[1], samples)} | `{a[0]}` | | {_share(b[1], samples)} | `{b[0]}` |")
    write_json(args.json, {**facts, "phases": phases})
    return 0


if __name__ == "__main__":
    sys.exit(main())
