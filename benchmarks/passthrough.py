"""Passthrough benchmark: the same clients and topic layout, direct to Kafka and through one proxy.

    .venv/bin/python -m benchmarks.passthrough [--records N] [--cluster-size 3] [--json out.json]
                                               [--rounds 2] [--profile DIR]

Starts a real Kafka (KRaft, from the cached jars) and one `tierproxy run` process in front
of it, then, per round and per client (Kafka's Java tools, librdkafka), runs each phase
direct and through the proxy back to back, alternating which goes first from one round to
the next so that drift on a shared machine falls on both sides:

- produce at full speed (`--records` records of 1 KiB, acks=all, idempotence on): MB/s,
  and latency percentiles, which at full speed are mostly time queued in the client;
- consume those records, direct, proxy, proxy, direct (reading is cheap, so ABBA cancels
  linear drift): MB/s from the assignment to the last record;
- produce paced at `--latency-rate` records/s: latency below saturation, the figure the
  "added p99" target is about.

Each phase gets fresh topics with the same partitions and replication factor. The proxy's
CPU time (utime + stime from /proc) and its time waiting for a CPU (schedstat) are read
before and after every phase, its peak RSS (VmHWM) at the end. The report is Markdown on
stdout (docs/benchmarks.md holds a run); `--json` also writes every phase's numbers.
`--profile DIR` samples the proxy during its proxied phases (`--profiler py-spy`: Python
and native frames; `--profiler perf`: native and kernel symbols) and adds its hottest
functions to the report (sampling slows the proxy: read throughput from a run without it).
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import tempfile
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

from confluent_kafka.admin import AdminClient, NewTopic

from benchmarks.common.clients import JavaTools, librdkafka_consume, librdkafka_produce
from benchmarks.common.procs import (
    PerfRecord,
    ProxyProcess,
    PySpy,
    cpu_seconds,
    jit_cpu_seconds,
    machine_cpu,
    machine_description,
    memory_bytes,
    sched_stats,
    summarize_perf,
    summarize_pyspy,
    wait_idle,
)
from benchmarks.common.report import render_markdown, summarize
from benchmarks.common.run import (
    git_state,
    run_facts,
    run_main,
    stop_on_signals,
    write_json,
)
from proxy.devstack import KafkaCluster
from proxy.devstack.paths import kafka_libs

PATHS = ("direct", "proxy")
CLIENTS = ("java", "librdkafka")
_CLIENT_NAMES = {"java": "Java", "librdkafka": "librdkafka"}


@dataclass
class Phase:
    kind: str  # produce | consume | latency
    client: str  # java | librdkafka
    path: str  # direct | proxy
    round: int
    topic: str
    payload_bytes: int
    wall_s: float
    cpu_s: dict[str, float]  # proxy, brokers, client
    settle_s: float  # waited before the phase for the brokers to be idle
    machine_busy_cores: float
    proxy_sched: dict[str, float]  # run_s, wait_s (runnable, no CPU), slices
    result: dict[str, object] = field(default_factory=dict)


class Bench:
    def __init__(self, args: argparse.Namespace, cluster: KafkaCluster, proxy: ProxyProcess):
        self.args = args
        self.cluster = cluster
        self.proxy = proxy
        self.admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
        self.java = JavaTools(kafka_libs())
        self.replication = min(3, args.cluster_size)
        self.phases: list[Phase] = []
        self.profiles: dict[str, list[Path]] = {}  # "<client> <kind>" -> profiler outputs
        self.run_id = os.urandom(3).hex()

    def close(self) -> None:
        del self.admin  # librdkafka's handle goes with the last reference

    def bootstrap(self, path: str) -> str:
        return self.cluster.bootstrap if path == "direct" else self.proxy.bootstrap

    # -- topics ------------------------------------------------------------------------

    def create_topics(self, names: list[str]) -> None:
        new = [NewTopic(n, self.args.partitions, self.replication) for n in names]
        for future in self.admin.create_topics(new, operation_timeout=30).values():
            future.result()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            meta = self.admin.list_topics(timeout=10).topics
            if all(
                n in meta
                and len(meta[n].partitions) == self.args.partitions
                and all(
                    p.leader >= 0 and len(p.isrs) == self.replication
                    for p in meta[n].partitions.values()
                )
                for n in names
            ):
                return
            time.sleep(0.2)
        raise RuntimeError(f"topics {names} lack leaders or in-sync replicas after 60s")

    def delete_topics(self, names: list[str]) -> None:
        for future in self.admin.delete_topics(names, operation_timeout=30).values():
            try:
                future.result()
            except Exception as exc:  # noqa: BLE001 - best effort: disk space only
                print(f"  (could not delete a topic: {exc})", file=sys.stderr)

    # -- phases ------------------------------------------------------------------------

    def settle(self, idle_cores: float = 0.3, timeout: float = 20.0) -> float:
        """Wait until the brokers are nearly idle (topic creation and deletion, the last
        phase's replication done), so that no phase pays for the one before. Returns the
        seconds waited."""
        pids = [n.process.pid for n in self.cluster.nodes if n.process.pid]
        return wait_idle(pids, idle_cores, timeout)

    def measure(self, kind: str, client: str, path: str, rnd: int, topic: str, run) -> Phase:
        broker_pids = [n.process.pid for n in self.cluster.nodes if n.process.pid]
        settled = self.settle()
        profiler = None
        if self.args.profile and path == "proxy":
            n = len(self.phases)  # consume runs twice a round: one file per phase
            out = self.args.profile / f"{n:02d}-{kind}-{client}-r{rnd}.{self.args.profiler}"
            if self.args.profiler == "perf":
                profiler = PerfRecord(out, frequency=1999)
            else:
                native = not self.args.profile_python_only
                profiler = PySpy(self.proxy.pid, out, rate=200, native=native)
            self.profiles.setdefault(f"{_CLIENT_NAMES[client]} {kind}", []).append(out)
            profiler.start()
        before = self._cpu(broker_pids)
        sched0 = sched_stats(self.proxy.pid)
        busy0, total0 = machine_cpu()
        started = time.perf_counter()
        try:
            result = run()
        finally:
            if profiler is not None:
                profiler.stop()
        wall = time.perf_counter() - started
        after = self._cpu(broker_pids)
        sched1 = sched_stats(self.proxy.pid)
        busy1, total1 = machine_cpu()
        phase = Phase(
            kind=kind,
            client=client,
            path=path,
            round=rnd,
            topic=topic,
            payload_bytes=result.records * self.args.record_size,
            wall_s=wall,
            settle_s=settled,
            cpu_s={k: after[k] - before[k] for k in before},
            machine_busy_cores=(busy1 - busy0) / max(1, total1 - total0) * (os.cpu_count() or 1),
            proxy_sched={
                "run_s": (sched1[0] - sched0[0]) / 1e9,
                "wait_s": (sched1[1] - sched0[1]) / 1e9,
                "slices": sched1[2] - sched0[2],
            },
            result=result.to_json(),
        )
        self.phases.append(phase)
        print(f"  {_describe(phase)}", flush=True)
        return phase

    def _cpu(self, broker_pids: list[int]) -> dict[str, float]:
        children = resource.getrusage(resource.RUSAGE_CHILDREN)  # the Java tools, once reaped
        own = resource.getrusage(resource.RUSAGE_SELF)  # librdkafka runs in this process
        return {
            "proxy": cpu_seconds(self.proxy.pid),
            "brokers": sum(cpu_seconds(pid) for pid in broker_pids),
            "brokers_jit": sum(jit_cpu_seconds(pid) for pid in broker_pids),
            "client": children.ru_utime + children.ru_stime + own.ru_utime + own.ru_stime,
        }

    def produce(self, client: str, path: str, topic: str, records: int, rate: int | None):
        bootstrap = self.bootstrap(path)
        if client == "java":
            return lambda: self.java.produce(bootstrap, topic, records, self.args.record_size, rate)
        return lambda: librdkafka_produce(bootstrap, topic, records, self.args.record_size, rate)

    def consume(self, client: str, path: str, topic: str, records: int):
        bootstrap = self.bootstrap(path)
        group = f"{topic}-reader-{os.urandom(3).hex()}"  # each read from the start
        if client == "java":
            return lambda: self.java.consume(bootstrap, topic, records, group)
        return lambda: librdkafka_consume(bootstrap, topic, records, group)

    def warm_up(self, max_passes: int = 6) -> None:
        """Run unmeasured traffic until the brokers' JIT has settled.

        In trial runs the first measured phase cost the brokers twice the CPU of its twin,
        half of it in C2 compiler threads, which, direct going first in round 1, flattered
        the proxy. A pass sends `--warmup-records` with every client through one path
        (the paths take turns), and passes repeat until the compiler threads used less
        than a tenth of the brokers' CPU."""
        topic = f"bench-{self.run_id}-warmup"
        self.create_topics([topic])
        records, size = self.args.warmup_records, self.args.record_size
        pids = [n.process.pid for n in self.cluster.nodes if n.process.pid]
        for n in range(max_passes):
            path = PATHS[n % 2]
            bootstrap = self.bootstrap(path)
            cpu0 = sum(cpu_seconds(pid) for pid in pids)
            jit0 = sum(jit_cpu_seconds(pid) for pid in pids)
            if "java" in self.args.clients:
                self.java.produce(bootstrap, topic, records, size)
                self.java.consume(bootstrap, topic, records, f"{topic}-java-{n}")
            librdkafka_produce(bootstrap, topic, records, size)
            librdkafka_consume(bootstrap, topic, records, f"{topic}-{n}")
            cpu = sum(cpu_seconds(pid) for pid in pids) - cpu0
            jit = sum(jit_cpu_seconds(pid) for pid in pids) - jit0
            print(f"  warm-up pass {n + 1} ({path}): brokers {cpu:.1f} CPU s, JIT {jit:.1f} s")
            if n >= 1 and jit < 0.1 * cpu:
                break
        self.delete_topics([topic])

    def run_round(self, rnd: int) -> None:
        order = PATHS if rnd % 2 == 0 else PATHS[::-1]
        args = self.args
        for client in args.clients:
            name = f"bench-{self.run_id}-r{rnd}-{client}"
            full = {path: f"{name}-{path}" for path in PATHS}
            paced = {path: f"{name}-{path}-paced" for path in PATHS}
            self.create_topics([*full.values(), *paced.values()])
            for path in order:
                run = self.produce(client, path, full[path], args.records, None)
                self.measure("produce", client, path, rnd, full[path], run)
            for path in (*order, *order[::-1]):  # reading is cheap: ABBA, drift cancels
                run = self.consume(client, path, full[path], args.records)
                self.measure("consume", client, path, rnd, full[path], run)
            for path in order:
                run = self.produce(
                    client, path, paced[path], args.latency_records, args.latency_rate
                )
                self.measure("latency", client, path, rnd, paced[path], run)
            self.delete_topics([*full.values(), *paced.values()])


def _describe(phase: Phase) -> str:
    r = phase.result
    text = (
        f"r{phase.round} {phase.client:10} {phase.kind:7} {phase.path:6} {r['mb_per_s']:7.1f} MB/s"
    )
    if "latency_ms" in r:
        lat = r["latency_ms"]
        text += f"  p50 {lat['p50']:.1f} p99 {lat['p99']:.1f} p99.9 {lat['p99.9']:.1f} ms"
    batching = r.get("details", {}).get("producer_metrics")
    if batching:
        text += (
            f"  {batching.get('records-per-request-avg', 0):.0f} rec/request"
            f" (request latency avg {batching.get('request-latency-avg', 0):.0f} ms)"
        )
    cpu = phase.cpu_s
    text += (
        f"  cpu s: proxy {cpu['proxy']:.1f} brokers {cpu['brokers']:.1f} "
        f"(jit {cpu['brokers_jit']:.1f}) client {cpu['client']:.1f}"
        f"  machine {phase.machine_busy_cores:.2f} cores busy  ({phase.wall_s:.0f} s, "
        f"settled {phase.settle_s:.0f} s)"
    )
    return text


def _report_failure(proxy: ProxyProcess, kind: type | None) -> None:
    """On the way out of a failed run, the proxy's last words (its log is deleted next)."""
    if kind is not None and kind is not KeyboardInterrupt:
        print(f"--- proxy log tail ---\n{proxy.process.tail(30)}", file=sys.stderr)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--records",
        type=int,
        default=200_000,
        help="records per full-speed produce/consume phase (default 200000)",
    )
    parser.add_argument("--record-size", type=int, default=1024)
    parser.add_argument(
        "--warmup-records",
        type=int,
        default=100_000,
        help="unmeasured records through each path and client first (default 100000)",
    )
    parser.add_argument(
        "--latency-records",
        type=int,
        default=30_000,
        help="records per paced latency phase (default 30000)",
    )
    parser.add_argument(
        "--latency-rate",
        type=int,
        default=5_000,
        help="records/s of the paced latency phases (default 5000)",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=2,
        help="direct/proxy pairs per phase; the order flips each round",
    )
    parser.add_argument("--cluster-size", type=int, default=3)
    parser.add_argument("--partitions", type=int, default=6)
    parser.add_argument(
        "--clients", default=",".join(CLIENTS), help="comma-separated subset of java,librdkafka"
    )
    parser.add_argument("--json", type=Path, help="also write every phase's numbers here")
    parser.add_argument(
        "--profile",
        type=Path,
        help="profile the proxy in its proxied phases, profiler output here",
    )
    parser.add_argument(
        "--profiler",
        choices=("py-spy", "perf"),
        default="py-spy",
        help="with --profile: py-spy (Python and native frames of the proxy) or perf "
        "(machine-wide cpu-clock, the proxy's native and kernel symbols picked out)",
    )
    parser.add_argument(
        "--profile-python-only",
        action="store_true",
        help="with --profile: no native frames (uvloop, CPython, libc); idle is then not "
        "told apart from work inside the event loop",
    )
    args = parser.parse_args(argv)
    args.clients = [c for c in args.clients.split(",") if c]
    if not set(args.clients) <= set(CLIENTS):
        parser.error(f"--clients: choose among {', '.join(CLIENTS)}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.monotonic()
    stop_on_signals()
    machine = machine_description()
    if args.profile:
        args.profile.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="tierproxy-bench-") as tmp, ExitStack() as stack:
        print(f"starting Kafka ({args.cluster_size} nodes)...", flush=True)
        # Deleted topics leave the disk at once, not a minute later in some other phase.
        extra = {"file.delete.delay.ms": "1000"}
        cluster = KafkaCluster(size=args.cluster_size, name="kafka-bench", extra_config=extra)
        stack.callback(cluster.stop)
        cluster.start()
        proxy = ProxyProcess(cluster.bootstrap, [n.node_id for n in cluster.nodes], Path(tmp))
        stack.callback(proxy.stop)
        stack.push(lambda kind, exc, tb: _report_failure(proxy, kind))
        proxy.start()
        proxy_code = git_state()  # what the proxy process has just loaded
        print(f"Kafka at {cluster.bootstrap}; proxy (pid {proxy.pid}) at {proxy.bootstrap}")
        bench = Bench(args, cluster, proxy)
        stack.callback(bench.close)  # before Kafka stops, or its admin client logs the stop
        rss_at_start = memory_bytes(proxy.pid)["VmRSS"]
        bench.warm_up()
        for rnd in range(args.rounds):
            print(f"round {rnd + 1} of {args.rounds}", flush=True)
            bench.run_round(rnd)
        memory = memory_bytes(proxy.pid)
        problems = proxy.problems()
        at_end = machine | {"loadavg_at_end": os.getloadavg()}
        run = run_facts(args, proxy_code, at_end, minio=False) | {
            "proxy_rss_bytes": {
                "after_start": rss_at_start,
                "end": memory["VmRSS"],
                "peak": memory["VmHWM"],
            },
            "proxy_log_problems": problems[:50],
            "runtime_s": time.monotonic() - started,
        }
    run["runtime_s"] = time.monotonic() - started  # with the shutdown
    summary = summarize(bench.phases, args)
    profiles = {
        kind: summarize_perf(paths, proxy.pid)
        if args.profiler == "perf"
        else summarize_pyspy(paths)
        for kind, paths in bench.profiles.items()
        if paths
    }
    print()
    print(render_markdown(run, summary, profiles, args))
    if args.json:
        phases = [vars(phase) for phase in bench.phases]
        profile_json = {kind: vars(p) for kind, p in profiles.items()}
        out = {"run": run, "summary": summary, "phases": phases, "profiles": profile_json}
        write_json(args.json, out)
    return 0


if __name__ == "__main__":
    run_main(main)
