"""Transactions benchmark: transactional produce direct to Kafka vs through the proxy on
a tiered topic (local WAL, S3 notify), in one run.

    .venv/bin/python -m benchmarks.transactions [--seconds 30] [--rounds 2] [--json out.json]

The fleet of benchmarks/tiered.py (one 3-broker Kafka with racks zone-a/b/c, MinIO, three
proxies; `a` owns every tiered partition), its modes: `direct` (a client in zone-a to
the brokers), `local` (tiered, through a, the owner, whose WAL takes the batches), `s3`
(tiered, a client in zone-b through b, which PUTs batches into S3-WAL objects and
notifies a); `passthrough` on request. Per round each mode gets a fresh topic (6
partitions, RF 3) and runs, back to back, in reverse order every other round:

- librdkafka: transactions of `--records-per-txn` records of `--record-size` bytes, no
  key (librdkafka's sticky partitioner puts a transaction mostly in one partition), back
  to back for `--seconds`: begin, produce, flush, commit (common/transactional.py). MB/s;
  the commit latency (`commit_transaction()` call to return: EndTxn, as the flush was
  done before it); the flush (AddPartitionsToTxn, the records acknowledged). Beside it a
  read_committed consumer through the same proxy (or direct): per record, produce to
  read; per transaction, commit's return to its last record read ("visible after
  commit").
- the marker lag, tiered modes: the owner's `tierproxy_txn_marker_lag_seconds` histogram
  (a marker's timestamp, written by the partition leader as it appends the marker, to
  its append to the stream), the increase over the phase; and the markers appended and
  catch-ups done (`tierproxy_txn_markers_appended_total`, `tierproxy_txn_catch_ups_total`);
  every mode: Kafka's half of it, measured beside the follower by `MarkerWatch` (the same
  long-polled raw Fetch of Kafka's log of the topic): marker timestamp to readable.
- `--java`: Kafka's ProducerPerformance with `--transaction-duration-ms` too (MB/s and
  record latency; it does not time the commit).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field
from pathlib import Path
from statistics import fmean

from benchmarks.common.clients import JavaTools
from benchmarks.common.cluster import Cluster
from benchmarks.common.procs import machine_description, scrape, wait_idle
from benchmarks.common.report import cell
from benchmarks.common.run import (
    git_state,
    publish,
    run_facts,
    run_main,
    stop_on_signals,
    wait_until,
)
from benchmarks.common.transactional import (
    CommittedReader,
    MarkerWatch,
    quantiles,
    transactional_produce,
)
from benchmarks.tiered import (
    CLIENT_ZONE,
    MODE_NAMES,
    PROXY_OF,
    TIERED,
    UPLOAD_SETTINGS,
    TieredFleet,
    start_fleet,
)
from proxy.config.tiering import TieringConfig
from proxy.devstack import KafkaCluster
from proxy.devstack.paths import kafka_libs

MODES = ("direct", "passthrough", "local", "s3")
DEFAULT_MODES = ("direct", "local", "s3")
LAG = "tierproxy_txn_marker_lag_seconds"
FOLLOWER = ("tierproxy_txn_marker", "tierproxy_txn_catch_ups")
FSYNC = "tierproxy_wal_fsync_seconds"  # the owner's WAL: what a marker's append waits for
PCTS = ("p50", "p99")
nan = float("nan")


@dataclass
class Phase:
    client: str  # librdkafka | java
    mode: str
    round: int
    topic: str
    result: dict  # TxnResult.to_json() or ProducerPerformance's ProduceResult
    visible_ms: dict[str, float] = field(default_factory=dict)  # commit return -> last read
    e2e_ms: dict[str, float] = field(default_factory=dict)  # produce -> read, per record
    read: int = 0  # records read by the read_committed consumer
    marker_lag: dict = field(default_factory=dict)  # the histogram's increase, and estimates
    kafka_marker_ms: dict[str, float] = field(default_factory=dict)  # MarkerWatch's
    follower: dict[str, float] = field(default_factory=dict)  # markers appended, catch-ups
    loadavg: dict[str, list[float]] = field(default_factory=dict)


def histogram_delta(after: dict, before: dict) -> dict:
    """The increase of a Prometheus histogram between two scrapes: {"buckets": [(le,
    count)], "count", "sum"}, and its p50/p99 by linear interpolation inside a bucket
    (as Prometheus' histogram_quantile) and the bucket bound it lies under."""

    def grown(suffix: str) -> dict:
        now, then = after.get(LAG + suffix, {}), before.get(LAG + suffix, {})
        return {labels: v - then.get(labels, 0.0) for labels, v in now.items()}

    buckets = sorted((float(dict(labels)["le"]), v) for labels, v in grown("_bucket").items())
    count = sum(grown("_count").values())
    out: dict = {"buckets": buckets, "count": count, "sum": sum(grown("_sum").values())}
    if not count:
        return out
    out["avg_ms"] = out["sum"] / count * 1000
    for name, q in (("p50", 0.5), ("p99", 0.99)):
        rank, lower, below = q * count, 0.0, 0.0
        for le, cumulative in buckets:
            if cumulative >= rank:
                share = (rank - below) / (cumulative - below) if cumulative > below else 1.0
                upper = le if le != float("inf") else lower
                out[f"{name}_ms"] = (lower + (upper - lower) * share) * 1000
                out[f"{name}_under_s"] = le
                break
            lower, below = le, cumulative
    return out


class Bench:
    def __init__(self, args, kafka: KafkaCluster, cluster: Cluster, fleet: TieredFleet):
        self.args, self.kafka, self.cluster, self.fleet = args, kafka, cluster, fleet
        self.java = JavaTools(kafka_libs())
        self.phases: list[Phase] = []
        self.warnings: list[str] = []
        self.run_id = os.urandom(3).hex()

    def bootstrap(self, mode: str) -> str:
        if mode == "direct":
            return self.kafka.bootstrap
        return self.fleet.by_name[PROXY_OF[mode]].proxy.bootstrap

    def create_topic(self, topic: str, mode: str) -> None:
        self.cluster.create_topic(topic, self.args.partitions)
        if mode in TIERED:
            self.fleet.tier(topic)
            wait_until(
                f"{topic} cut over",
                lambda: self.fleet.cut_over(topic)[0] == self.args.partitions,
                120,
            )
            time.sleep(1.0)  # the owner starts each partition as it writes its cutover

    def follower_metrics(self) -> dict:
        return scrape(self.fleet.owner.metrics_url, (LAG, *FOLLOWER, FSYNC))

    def measure(self, client: str, mode: str, rnd: int, seconds: float, keep: bool = True):
        topic = f"tx-{self.run_id}-r{rnd}-{client}-{mode}" + ("" if keep else "-warmup")
        self.create_topic(topic, mode)
        wait_idle([n.process.pid for n in self.kafka.nodes if n.process.pid])
        settings = {"client.id": f"tierproxy-bench,tierproxy_az={CLIENT_ZONE[mode]}"}
        load0 = list(os.getloadavg())
        before = self.follower_metrics()
        args, bootstrap = self.args, self.bootstrap(mode)
        reader = None
        watch = MarkerWatch(self.kafka.bootstrap, topic, args.partitions)
        if client == "librdkafka":
            reader = CommittedReader(bootstrap, topic, args.partitions, settings["client.id"])
            try:
                txn = transactional_produce(
                    bootstrap, topic, seconds, args.records_per_txn, args.record_size, settings
                )
                if not reader.wait_for(txn.records, timeout=60):
                    self.warnings.append(f"{topic}: read {reader.records} of {txn.records}")
            finally:
                reader.close()
            result = txn.to_json()
        else:
            records = int(seconds * args.java_rate)
            settings["transactional.id"] = f"tierproxy-bench-{topic}"
            extra = ("--transaction-duration-ms", str(args.transaction_duration_ms))
            result = self.java.produce(
                bootstrap, topic, records, args.record_size, None, settings, extra
            ).to_json()
        after = self.follower_metrics()
        kafka_lag = watch.close()
        if not keep:
            return
        phase = Phase(client, mode, rnd, topic, result)
        phase.loadavg = {"before": load0, "after": list(os.getloadavg())}
        phase.kafka_marker_ms = quantiles(kafka_lag) | {"count": len(kafka_lag)}
        if reader is not None:
            phase.read = reader.records
            phase.visible_ms = quantiles(reader.visible_ms(txn.committed_at_ns))
            phase.e2e_ms = quantiles([v / 1e6 for v in reader.e2e_ns])
        if mode in TIERED:
            phase.marker_lag = histogram_delta(after, before)
            for name in ("tierproxy_txn_markers_appended_total", "tierproxy_txn_catch_ups_total"):
                now, then = after.get(name, {}), before.get(name, {})
                for labels, v in now.items():
                    label = name + "".join(f"{{{k}={x}}}" for k, x in labels)
                    phase.follower[label] = v - then.get(labels, 0.0)
            count, total = (
                sum(after.get(FSYNC + k, {}).values()) - sum(before.get(FSYNC + k, {}).values())
                for k in ("_count", "_sum")
            )
            if count:
                phase.follower["owner WAL fsyncs"] = count
                phase.follower["mean fsync ms"] = total / count * 1000
        self.phases.append(phase)
        print(f"  {describe(phase)}", flush=True)

    def run(self) -> None:
        clients = ["librdkafka", *(["java"] if self.args.java else [])]
        if self.args.warmup_seconds:
            print("warm-up (unmeasured)", flush=True)
            for mode in self.args.modes:
                for client in clients:
                    self.measure(client, mode, 0, self.args.warmup_seconds, keep=False)
        for rnd in range(self.args.rounds):
            print(f"round {rnd + 1} of {self.args.rounds}", flush=True)
            order = self.args.modes if rnd % 2 == 0 else self.args.modes[::-1]
            for client in clients:
                for mode in order:
                    self.measure(client, mode, rnd, self.args.seconds)


def describe(p: Phase) -> str:
    r = p.result
    if p.client == "java":
        lat = r["latency_ms"]
        text = f"r{p.round} java {p.mode:11} {r['mb_per_s']:6.1f} MB/s  "
        text += f"record p50 {lat['p50']:.0f} p99 {lat['p99']:.0f} ms"
        return text + marker_lag(p) + load(p)
    text = (
        f"r{p.round} librdkafka {p.mode:11} {r['mb_per_s']:6.2f} MB/s  {r['transactions']} txns  "
        f"commit p50 {r['commit_ms']['p50']:.1f} p99 {r['commit_ms']['p99']:.1f} ms  "
        f"flush p50 {r['flush_ms']['p50']:.1f} ms  visible after commit p50 "
        f"{p.visible_ms.get('p50', nan):.1f} p99 {p.visible_ms.get('p99', nan):.1f} ms"
    )
    return text + marker_lag(p) + load(p)


def marker_lag(p: Phase) -> str:
    lag, kafka = p.marker_lag, p.kafka_marker_ms
    text = f"  Kafka readable p50 {kafka.get('p50', nan):.0f} p99 {kafka.get('p99', nan):.0f} ms"
    if not lag.get("count"):
        return text
    return (
        text
        + f", marker lag p50 {lag['p50_ms']:.0f} p99 {lag['p99_ms']:.0f} ms ({lag['count']:.0f})"
    )


def load(p: Phase) -> str:
    return f"  load {p.loadavg['before'][0]:.1f} -> {p.loadavg['after'][0]:.1f}"


# -- figures and the report ------------------------------------------------------------------


def rows(args) -> list[tuple[str, str, object]]:
    """(label, client, how to read the figure of a phase)."""
    out: list[tuple[str, str, object]] = [
        ("MB/s", "librdkafka", lambda p: p.result["mb_per_s"]),
        ("transactions/s", "librdkafka", lambda p: p.result["transactions"] / p.result["seconds"]),
    ]
    for pct in PCTS:
        out.append((f"commit {pct} ms", "librdkafka", lambda p, k=pct: p.result["commit_ms"][k]))
    for pct in PCTS:
        out.append((f"flush {pct} ms", "librdkafka", lambda p, k=pct: p.result["flush_ms"][k]))
    for pct in PCTS:
        label = f"visible after commit {pct} ms"
        out.append((label, "librdkafka", lambda p, k=pct: p.visible_ms.get(k)))
    for pct in PCTS:
        label = f"produce to read_committed read {pct} ms"
        out.append((label, "librdkafka", lambda p, k=pct: p.e2e_ms.get(k)))
    for pct in PCTS:
        label = f"marker lag {pct} ms (histogram)"
        out.append((label, "librdkafka", lambda p, k=pct: p.marker_lag.get(f"{k}_ms")))
    out.append(("marker lag mean ms", "librdkafka", lambda p: p.marker_lag.get("avg_ms")))
    for pct in PCTS:
        label = f"of which Kafka (marker readable) {pct} ms"
        out.append((label, "librdkafka", lambda p, k=pct: p.kafka_marker_ms.get(k)))
    if args.java:
        out.append(("ProducerPerformance MB/s", "java", lambda p: p.result["mb_per_s"]))
        for pct in PCTS:
            label = f"ProducerPerformance record {pct} ms"
            out.append((label, "java", lambda p, k=pct: p.result["latency_ms"][k]))
        for pct in PCTS:
            label = f"ProducerPerformance marker lag {pct} ms"
            out.append((label, "java", lambda p, k=pct: p.marker_lag.get(f"{k}_ms")))
        for pct in PCTS:
            label = f"ProducerPerformance: of which Kafka {pct} ms"
            out.append((label, "java", lambda p, k=pct: p.kafka_marker_ms.get(k)))
    return out


def summarize(phases: list[Phase], args) -> dict:
    """Each row's values by mode, one per round (None left out)."""
    table = {}
    for label, client, read in rows(args):
        table[label] = {
            mode: [
                v
                for p in phases
                if (p.client, p.mode) == (client, mode) and (v := read(p)) is not None
            ]
            for mode in args.modes
        }
    return {"table": table}


def render(run: dict, summary: dict, phases: list[Phase], args) -> str:
    m, modes = run["machine"], args.modes
    loads = [", ".join(f"{x:.2f}" for x in m[k]) for k in ("loadavg_at_start", "loadavg_at_end")]
    java = (
        f"; ProducerPerformance, `--transaction-duration-ms {args.transaction_duration_ms}`, "
        f"{args.java_rate:,} records per second of phase"
        if args.java
        else ""
    )
    out = [
        "### Run",
        "",
        f"- command: `{run['command']}`",
        f"- proxy code at {run['proxy_code']}; {run['date']}",
        f"- machine: {m['nproc']} cores ({m['cpu_model']}), {m['memory_gib']} GiB, Python "
        f"{m['python']}; load average at start {loads[0]}, at end {loads[1]}",
        f"- Kafka {run['kafka']} (3 nodes, KRaft, racks zone-a/b/c, min.insync.replicas 2); "
        f"MinIO {run['minio']}; librdkafka {run['librdkafka']}",
        f"- topics of {args.partitions} partitions, RF 3, a fresh one per phase; "
        f"{args.rounds} round(s) of {args.seconds:g} s per mode (order reversed every other "
        f"round), after a {args.warmup_seconds:g} s warm-up per mode; librdkafka: "
        f"transactions of {args.records_per_txn} records of {args.record_size} B, back to "
        f"back, acks=all, no key (librdkafka's sticky partitioner: a transaction's records "
        f"mostly land in one partition){java}",
        f"- total runtime {run['runtime_s']:.0f} s",
        "",
        "Mean of the rounds (lowest–highest).",
        "",
        "| | " + " | ".join(MODE_NAMES[x] for x in modes) + " |",
        "| --- |" + " ---: |" * len(modes),
    ]
    for label, values in summary["table"].items():
        if not any(values.values()):
            continue
        out.append(
            f"| {label} | "
            + " | ".join(cell(values[x]) if values[x] else "–" for x in modes)
            + " |"
        )
        direct = fmean(values["direct"]) if values.get("direct") else None
        if direct and label.endswith("MB/s"):
            ratios = (f"{fmean(values[x]) / direct:.2f}" if values[x] else "–" for x in modes)
            out.append(f"| {label} vs direct | " + " | ".join(ratios) + " |")
    out += ["", "Per phase (load average: 1-minute, before → after the phase):", ""]
    out += [f"- {describe(p)}" for p in phases]
    lag = [p for p in phases if p.marker_lag.get("count")]
    if lag:
        out += ["", "Marker lag histogram, increase per phase (upper bound s: markers):", ""]
        for p in lag:
            cum, prev, parts = p.marker_lag["buckets"], 0.0, []
            for le, c in cum:
                if c - prev:
                    parts.append(f"≤{le:g}: {c - prev:.0f}")
                prev = c
            extra = ", ".join(f"{k} {v:.0f}" for k, v in p.follower.items())
            out.append(f"- r{p.round} {p.client} {p.mode}: " + ", ".join(parts) + f" ({extra})")
    problems = run["warnings"] + run["proxy_log_problems"][:20]
    if problems:
        out += ["", "#### Warnings", "", "```", *problems, "```"]
    return "\n".join(out)


# -- the run ---------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add = parser.add_argument
    add("--seconds", type=float, default=30.0, help="per mode and round (default 30)")
    add("--rounds", type=int, default=2, help="the modes' order flips each round")
    add("--warmup-seconds", type=float, default=10.0, help="per mode, unmeasured")
    add("--records-per-txn", type=int, default=100)
    add("--record-size", type=int, default=1024)
    add("--partitions", type=int, default=6)
    add("--modes", default=",".join(DEFAULT_MODES), help=f"subset of {','.join(MODES)}")
    add("--java", action="store_true", help="ProducerPerformance with transactions too")
    add("--transaction-duration-ms", type=int, default=100, help="ProducerPerformance's")
    add("--java-rate", type=int, default=500, help="ProducerPerformance: records = rate × s")
    add("--json", type=Path, help="also write every phase's figures here")
    args = parser.parse_args(argv)
    args.modes = [m for m in MODES if m in args.modes.split(",")]
    if "direct" not in args.modes:
        parser.error("--modes: direct is the reference, keep it")
    vars(args).update({key: getattr(TieringConfig(), key) for key in UPLOAD_SETTINGS})
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.monotonic()
    stop_on_signals()
    machine = machine_description()
    run_id = os.urandom(3).hex()
    with tempfile.TemporaryDirectory(prefix="tierproxy-txn-") as tmp, ExitStack() as stack:
        kafka, _, cluster, fleet = start_fleet(stack, Path(tmp), run_id, args, "txn")
        proxy_code = git_state()
        bench = Bench(args, kafka, cluster, fleet)
        bench.run()
        at_end = machine | {"loadavg_at_end": os.getloadavg()}
        run = run_facts(args, proxy_code, at_end, minio=True) | {
            "warnings": bench.warnings,
            "proxy_log_problems": fleet.problems()[:50],
        }
    run["runtime_s"] = time.monotonic() - started
    summary = summarize(bench.phases, args)
    phases = [asdict(p) for p in bench.phases]
    return publish(run, summary, render(run, summary, bench.phases, args), args.json, phases=phases)


if __name__ == "__main__":
    run_main(main)
