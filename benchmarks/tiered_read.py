"""Tiered read benchmark: catch-up and tail reads, direct from Kafka and tiered, in one run.

    .venv/bin/python -m benchmarks.tiered_read [--bytes 2000000000] [--rounds 2]
        [--clients librdkafka,java] [--tail-rate 5] [--tail-seconds 60] [--json out.json]
        [--catchup-readers 1,6]

On the stack of benchmarks/tiered.py (3 brokers in racks zone-a/b/c, MinIO counting its
requests, proxies a, b, c, a owning every tiered partition), two topics of `--bytes` of
1 KiB records (6 partitions, replication factor 3): one written direct to Kafka, the
baseline; one tiered at offset 0, written through a, read once all of it is committed in
objects. Per round, in reverse order every other round:

- catch-up, every partition from offset 0, no group: `direct` from Kafka; `cold` through
  b just restarted (it owns nothing: every byte comes from S3 through its block cache);
  `warm` through b right after. MB/s, S3 GETs per GB read, b's block-cache hit ratio;
  with `--catchup-readers 1,6`, the tiered reads again of the first 1 (then 6) partitions
  only: that many streams read at once through b's cache (modes `cold x1`, `warm x1`);
- tail, a producer in zone-a paced at `--tail-rate` MB/s stamping each value, a consumer
  at the end: `direct`; `local` (through a, the owner); `remote` (the consumer through b:
  the tail over the peer protocol); `storm` (`local` while three catch-up readers, through
  a, b and c, re-read the tiered topic). End-to-end and produce percentiles. None with
  `--tail-seconds 0`.

Every consumer runs in a process of its own (this module with --worker), apart from the
producer's interpreter. Markdown report on stdout; `--json` has it all.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import tempfile
import time
from collections import defaultdict
from contextlib import ExitStack, closing
from dataclasses import asdict, dataclass, field
from pathlib import Path
from statistics import fmean

import yaml
from confluent_kafka import Consumer, TopicPartition

from benchmarks.common import stages
from benchmarks.common.clients import MIB, PERCENTILES, librdkafka_produce, percentiles
from benchmarks.common.cluster import Cluster
from benchmarks.common.procs import machine_description, scrape, wait_idle
from benchmarks.common.report import CONSUMER_NAMES, GIB, cell
from benchmarks.common.run import (
    git_state,
    publish,
    run_facts,
    run_main,
    stop_on_signals,
    wait_until,
)
from benchmarks.tiered import (
    GB,
    P99_TARGET_MS,
    UPLOAD_SETTINGS,
    ZONES,
    Bench,
    TieredFleet,
)
from proxy.config.tiering import TieringConfig
from proxy.devstack import KafkaCluster, ManagedProcess, MinioServer
from proxy.devstack.paths import repo_root

CATCHUP = ("direct", "cold", "warm")
CATCHUP_NAMES = {"direct": "direct (RF 3)", "cold": "tiered, cold (b)", "warm": "tiered, warm (b)"}
TAIL = ("direct", "local", "remote", "storm")
TAIL_NAMES = {
    "direct": "direct (RF 3)",
    "local": "tiered, via owner a",
    "remote": "tiered, via non-owner b",
    "storm": "tiered, via a, read storm",
}
TAIL_VIA = {"direct": None, "local": "a", "remote": "b", "storm": "a"}  # the consumer's proxy
CLIENTS = ("librdkafka", "java")
SIDES = {"direct": "direct", "tiered": "local"}  # each topic pair: tiered.Bench's mode
COLD_SHARE_TARGET = 0.5  # cold catch-up MB/s, of direct's
GETS_PER_GB_TARGET = 100
TAIL_P99_TARGET_MS = 50.0  # end to end, local WAL
CACHE = "tierproxy_block_cache_"
CPU_OF = ("proxy b", "minio", "brokers", "client")


# -- the consumers, each in a process of its own ------------------------------------------


def consume(spec: dict) -> dict:
    """One librdkafka consumer, every partition assigned, no group (nothing committed):
    from offset 0 until `records` are read (`wrap`: again from 0, until told to stop), or
    from the end (`tail`: latency of each value's stamp). Touches `ready` after its first
    poll; stops early once `stop` exists or after `timeout_s`."""
    topic, want, tail, wrap = spec["topic"], spec["records"], spec["tail"], spec["wrap"]
    ready, stop = Path(spec["ready"]), Path(spec["stop"])
    settings = {"bootstrap.servers": spec["bootstrap"], "enable.auto.commit": False}
    settings |= {"client.id": spec["client_id"], "group.id": spec["client_id"]}
    consumer = Consumer(settings | {"enable.auto.offset.store": False})
    start = [TopicPartition(topic, p, 0) for p in range(spec["partitions"])]
    consumer.list_topics(topic, timeout=30)  # connections and metadata before the clock
    if want < 0:  # every record of the partitions assigned, as their ends say
        want = sum(consumer.get_watermark_offsets(tp, timeout=30)[1] for tp in start)
    if tail:  # the ends before the producer starts: nothing it sends is skipped
        for tp in start:
            tp.offset = consumer.get_watermark_offsets(tp, timeout=30)[1]
    latencies: list[int] = []
    count = in_pass = nbytes = passes = 0
    deadline, check_at = time.monotonic() + spec["timeout_s"], 0.0
    started = last = time.perf_counter()
    consumer.assign(start)
    try:
        while wrap or count < want:
            if tail:  # one at a time: consume() waits to fill its batch
                msgs = [m for m in (consumer.poll(0.2),) if m is not None]
            else:
                msgs = consumer.consume(min(10_000, max(1, want - in_pass)), 0.2)
            now_ns = time.time_ns()
            for msg in msgs:
                if msg.error() is not None:
                    raise RuntimeError(f"consume {topic}: {msg.error()}")
                value = msg.value()
                nbytes += len(value)
                if tail:
                    latencies.append(now_ns - int.from_bytes(value[:8], "big"))
            if msgs:
                count, in_pass, last = count + len(msgs), in_pass + len(msgs), time.perf_counter()
            if wrap and in_pass >= want:
                consumer.assign([TopicPartition(topic, tp.partition, 0) for tp in start])
                in_pass, passes = 0, passes + 1
            if time.monotonic() >= check_at:
                ready.touch()
                if stop.exists() or time.monotonic() > deadline:
                    break
                check_at = time.monotonic() + 0.2
    finally:
        consumer.close()
    seconds, own = max(last - started, 1e-9), resource.getrusage(resource.RUSAGE_SELF)
    found = {"records": count, "bytes": nbytes, "passes": passes, "complete": wrap or count >= want}
    found |= {"seconds": seconds, "mb_per_s": nbytes / MIB / seconds}  # assignment to last record
    found["latency_ms"] = percentiles(latencies) if latencies else {}
    return found | {"cpu_s": own.ru_utime + own.ru_stime}


def worker(text: str) -> int:
    spec = json.loads(text)
    out = Path(spec["out"])
    out.with_suffix(".tmp").write_text(json.dumps(consume(spec)))
    out.with_suffix(".tmp").replace(out)  # whole or absent
    return 0


class Reader:
    """`consume` in a process of its own (this module with --worker) that dies with the
    benchmark; its spec, ready and stop files, result and log in a folder of its own."""

    started = 0

    def __init__(self, work_dir: Path, **spec) -> None:
        Reader.started += 1
        folder = work_dir / "readers" / str(Reader.started)
        folder.mkdir(parents=True)
        self.ready, self.stop_file, self.out = (folder / n for n in ("ready", "stop", "out.json"))
        spec |= {"ready": str(self.ready), "stop": str(self.stop_file), "out": str(self.out)}
        argv = [sys.executable, "-m", "benchmarks.tiered_read", "--worker", json.dumps(spec)]
        log = folder / "log"
        self.process = ManagedProcess(f"reader-{Reader.started}", argv, log, cwd=repo_root())
        self.process.start()

    def wait_ready(self, timeout: float = 120.0) -> None:
        ready, running = self.ready.exists, self.process.running
        wait_until(f"{self.process.name} ready", lambda: ready() or not running(), timeout)
        if not ready():
            raise RuntimeError(f"{self.process.name} exited:\n{self.process.tail()}")

    def result(self, timeout: float) -> dict:
        """What it read once it is done; if not done within `timeout`, told to stop."""
        done = lambda: not self.process.running()  # noqa: E731
        try:
            wait_until(f"{self.process.name} done", done, timeout, interval=0.1)
        except RuntimeError:
            self.stop_file.touch()
            wait_until(f"{self.process.name} stopped", done, 30)
        if not self.out.exists():
            raise RuntimeError(f"{self.process.name} wrote no result:\n{self.process.tail()}")
        return json.loads(self.out.read_text())

    def stop(self) -> None:
        self.process.stop(timeout=5)


# -- phases ----------------------------------------------------------------------------------


@dataclass
class ReadPhase:
    kind: str  # catchup | tail
    client: str
    mode: str  # CATCHUP or TAIL
    round: int
    topic: str
    read_bytes: int  # record values read by the phase's consumers
    result: dict  # catch-up: the consumer's; tail: {"tail", "produce", "storm": [...]}
    counts: dict[str, float]  # S3 GETs and bytes out (MinIO), block-cache counters by proxy
    seconds: dict[str, float] = field(default_factory=dict)
    cpu_s: dict[str, float] = field(default_factory=dict)
    machine_busy_cores: float = 0.0
    # where the time went: proxy and path -> stage -> count, mean, p50, p99 (stages.py)
    stages: dict = field(default_factory=dict)


def busy_cores(before: dict, after: dict) -> float:
    busy, jiffies = (a - b for a, b in zip(after["machine"], before["machine"], strict=True))
    return busy / max(1, jiffies) * (os.cpu_count() or 1)


class ReadBench:
    """The phases, on tiered.py's `Bench` (topics, producers, snapshots of MinIO's
    counters and of every process's CPU) and `TieredFleet`."""

    def __init__(self, args, base: Bench, work_dir: Path) -> None:
        self.args, self.base, self.work_dir = args, base, work_dir
        self.kafka, self.fleet = base.kafka, base.fleet
        name = f"tr-{base.run_id}"
        self.topics = {(k, s): f"{name}-{k}-{s}" for k in ("catchup", "tail") for s in SIDES}
        self.records = args.bytes // args.record_size
        self.tail_rate = round(args.tail_rate * MIB / args.record_size)  # records/s
        self.phases: list[ReadPhase] = []
        self.written: dict[str, object] = {}

    def bootstrap(self, via: str | None) -> str:
        return self.kafka.bootstrap if via is None else self.fleet.by_name[via].proxy.bootstrap

    def reader(self, via: str | None, topic: str, records: int, **how) -> Reader:
        """A consumer in the zone of proxy `via` (None: direct, in zone-a)."""
        zone = "zone-a" if via is None else self.fleet.by_name[via].zone
        spec = {"bootstrap": self.bootstrap(via), "topic": topic, "records": records}
        spec |= {"partitions": self.args.partitions, "tail": False, "wrap": False}
        spec |= {"client_id": f"tierproxy-bench,tierproxy_az={zone}"}
        spec |= {"timeout_s": max(600.0, records / 1000)} | how
        return Reader(self.work_dir, **spec)

    def read(self, via: str | None, topic: str, records: int) -> dict:
        reader = self.reader(via, topic, records)
        try:
            return reader.result(timeout=max(660.0, records / 1000 + 60))
        finally:
            reader.stop()

    def write(self) -> None:
        """The topics; the catch-up data direct to Kafka, then through a into the tiered
        topic, until the metadata says all of it is committed in objects."""
        self.base.create_topics({t: SIDES[side] for (_, side), t in self.topics.items()})
        for side, mode in SIDES.items():
            topic = self.topics["catchup", side]
            result = self.base.produce("librdkafka", mode, topic, self.records, None)
            self.written[side] = result.mb_per_s
            print(f"  wrote {topic}: {result.mb_per_s:.1f} MB/s", flush=True)
        tiered, started = self.topics["catchup", "tiered"], time.monotonic()
        committed = lambda: self.fleet.cut_over(tiered)[1] >= self.records  # noqa: E731
        wait_until(f"{tiered} committed", committed, max(300.0, self.records / 2000))
        self.written["commit_wait_s"] = time.monotonic() - started
        if self.args.compacted:
            started = time.monotonic()
            compacted = lambda: self.fleet.compacted(tiered)  # noqa: E731
            # the last uploads can be no more small objects than the streams they hold:
            # rewriting them would not leave fewer objects (compaction_plan.py, rule 5),
            # and compaction waits for more. A record per partition more, an upload of its
            # own, until there are more of them
            self.written["nudged"] = 0
            for _ in range(3 * self.args.partitions):
                try:
                    wait_until(f"{tiered} compacted", compacted, 15.0)
                    break
                except RuntimeError:
                    self.base.produce("librdkafka", "local", tiered, self.args.partitions, None)
                    self.written["nudged"] += self.args.partitions
            else:
                wait_until(f"{tiered} compacted", compacted, 60.0)
            self.written["compaction_wait_s"] = time.monotonic() - started

    def warm_up(self) -> None:
        """Unmeasured reads of the first records of both topics (the brokers' JIT)."""
        records = min(self.args.warmup_records, self.records)
        for via, side in ((None, "direct"), ("b", "tiered")):
            self.read(via, self.topics["catchup", side], records)

    def restart(self, name: str) -> None:
        """A cold proxy: stopped and started again, the fleet whole, a still the owner."""
        fleet = self.fleet
        fleet.by_name[name].proxy.stop()
        fleet.by_name[name].proxy.start(timeout=180)
        whole = lambda: all(fleet.live(m) == len(fleet.members) for m in fleet.members)  # noqa: E731
        wait_until(f"proxy {name} back in the fleet", whole, 60)
        fleet.wait_owned(timeout=120, stable_s=3.0)

    def caches(self) -> dict[str, dict[str, float]]:
        """Each proxy's block-cache counters (tierproxy_block_cache_*_total)."""
        return {
            m.name: {
                name.removeprefix(CACHE).removesuffix("_total"): sum(samples.values())
                for name, samples in scrape(m.metrics_url, (CACHE,)).items()
                if name.endswith("_total")
            }
            for m in self.fleet.members
        }

    def measure(self, kind: str, client: str, mode: str, rnd: int, topic: str, run) -> None:
        """`run()` -> (result, bytes read), between two snapshots once everything is idle."""
        settled = wait_idle([pid for pids in self.base.pids().values() for pid in pids])
        before, caches = self.base.snapshot(), self.caches()
        started = time.perf_counter()
        result, read_bytes = run()
        wall = time.perf_counter() - started
        after = self.base.snapshot()
        counts = {key: after["totals"][key] - before["totals"][key] for key in ("gets", "s3_out")}
        for proxy, now in self.caches().items():
            counts |= {f"{proxy} {k}": v - caches[proxy].get(k, 0.0) for k, v in now.items()}
        phase = ReadPhase(kind, client, mode, rnd, topic, read_bytes, result, counts)
        phase.seconds = {"settle": settled, "wall": wall}
        phase.cpu_s = {who: s - before["cpu"][who] for who, s in after["cpu"].items()}
        phase.machine_busy_cores = busy_cores(before, after)
        phase.stages = stages.summary(before["stages"], after["stages"])
        self.phases.append(phase)
        print(f"  {describe(phase)}", flush=True)
        for line in stages.describe(phase.stages):
            print(f"    {line}", flush=True)

    def catchup(self, client: str, mode: str, rnd: int, readers: int | None = None) -> None:
        """`readers`: the first that many partitions only, every record of them (librdkafka);
        the phase's mode is then e.g. `cold x1`."""
        topic = self.topics["catchup", "direct" if mode == "direct" else "tiered"]
        via = None if mode == "direct" else "b"
        if mode == "cold":
            self.restart("b")

        def run() -> tuple[dict, int]:
            if readers is not None:
                reader = self.reader(via, topic, -1, partitions=readers)
                try:
                    result = reader.result(timeout=max(660.0, self.records / 1000 + 60))
                finally:
                    reader.stop()
                return result, result["bytes"]
            if client == "librdkafka":
                result = self.read(via, topic, self.records)
                return result, result["bytes"]
            group = f"{topic}-{client}-{mode}-r{rnd}"
            java = self.base.java.consume(self.bootstrap(via), topic, self.records, group)
            return java.to_json(), self.records * self.args.record_size

        self.measure("catchup", client, catchup_mode(mode, readers), rnd, topic, run)

    def tail(self, mode: str, rnd: int) -> None:
        """A paced producer in zone-a (through a when tiered), a consumer at the end;
        with `storm`, three catch-up readers of the tiered catch-up topic meanwhile."""
        topic = self.topics["tail", "direct" if mode == "direct" else "tiered"]
        records = round(self.tail_rate * self.args.tail_seconds)
        producer = {"client.id": "tierproxy-bench,tierproxy_az=zone-a"}

        def run() -> tuple[dict, int]:
            readers = [self.reader(TAIL_VIA[mode], topic, records, tail=True)]
            if mode == "storm":
                big, seconds = self.topics["catchup", "tiered"], self.args.tail_seconds + 600
                storm = dict(wrap=True, timeout_s=seconds)
                readers += [
                    self.reader(m.name, big, self.records, **storm) for m in self.fleet.members
                ]
            try:
                for reader in readers:
                    reader.wait_ready()
                bootstrap = self.bootstrap(None if mode == "direct" else "a")
                size = self.args.record_size
                produced = librdkafka_produce(
                    bootstrap, topic, records, size, self.tail_rate, producer, stamp=True
                )
                for reader in readers[1:]:
                    reader.stop_file.touch()
                results = [reader.result(timeout=60) for reader in readers]
            finally:
                for reader in readers:
                    reader.stop()
            if not results[0]["complete"]:
                note = f"r{rnd} tail {mode}: read {results[0]['records']} of {records} records"
                self.base.warnings.append(note)
            result = {"tail": results[0], "produce": produced.to_json(), "storm": results[1:]}
            return result, sum(r["bytes"] for r in results)

        self.measure("tail", "librdkafka", mode, rnd, topic, run)

    def run_round(self, rnd: int) -> None:
        flip = rnd % 2 == 1
        for client in self.args.clients:
            for mode in ("cold", "warm", "direct") if flip else CATCHUP:  # warm after cold
                self.catchup(client, mode, rnd)
        for readers in self.args.catchup_readers:
            for mode in ("cold", "warm"):
                self.catchup("librdkafka", mode, rnd, readers)
        for mode in (TAIL[::-1] if flip else TAIL) if self.args.tail_seconds > 0 else ():
            self.tail(mode, rnd)


def catchup_mode(mode: str, readers: int | None) -> str:
    return mode if readers is None else f"{mode} x{readers}"


def catchup_names(args) -> dict[str, str]:
    """CATCHUP_NAMES and, with --catchup-readers, the modes of those reads."""
    names = dict(CATCHUP_NAMES)
    for readers in args.catchup_readers:
        for mode in ("cold", "warm"):
            names[catchup_mode(mode, readers)] = f"{mode}, {readers} partition(s) (b)"
    return names


def describe(p: ReadPhase) -> str:
    c, s, r = p.counts, p.seconds, p.result
    text = f"r{p.round} {p.client:10} {p.kind:7} {p.mode:6} "
    if p.kind == "catchup":
        text += f"{r['mb_per_s']:7.1f} MB/s, b's block cache {c.get('b hits', 0):.0f} hits "
        text += f"{c.get('b misses', 0):.0f} misses"
    else:
        e2e = " ".join(f"{k} {r['tail']['latency_ms'].get(k, -1):.1f}" for k in PERCENTILES)
        text += f"end to end {e2e} ms, produce p99 {r['produce']['latency_ms']['p99']:.1f} ms"
        text += f" at {r['produce']['mb_per_s']:.1f} MB/s"
        text += f", readers {sum(x['mb_per_s'] for x in r['storm']):.1f} MB/s" if r["storm"] else ""
    text += f", GETs {c['gets']:.0f} ({s['wall']:.0f} s, settled {s['settle']:.0f} s, "
    return text + f"{p.machine_busy_cores:.2f} cores busy)"


# -- figures and the report ------------------------------------------------------------------


def catchup_figures(p: ReadPhase) -> dict[str, float | None]:
    c, gb, gib, tiered = p.counts, p.read_bytes / GB, p.read_bytes / GIB, p.mode != "direct"
    wanted = c.get("b hits", 0.0) + c.get("b misses", 0.0)
    return {
        "MB/s": p.result["mb_per_s"],
        "S3 GETs per GB read": c["gets"] / gb,
        "bytes out of S3 per byte read": c["s3_out"] / p.read_bytes,
        "block-cache hit ratio (b)": c["b hits"] / wanted if tiered and wanted else None,
        "block-cache GETs per GB (b's count)": c.get("b gets", 0.0) / gb if tiered else None,
        "of which index reads per GB (b's count)": (
            c.get("b index_gets", 0.0) / gb if tiered else None
        ),
        "blocks that came with an index read of an object's first window (b)": (
            c.get("b head_blocks", 0.0) if tiered else None
        ),
        "blocks that came with an index read of an object's tail (b)": (
            c.get("b tail_blocks", 0.0) if tiered else None
        ),
        "block-cache misses (b)": c.get("b misses", 0.0) if tiered else None,
        **{f"CPU s per GiB read: {who}": p.cpu_s[who] / gib for who in CPU_OF},
    }


def tail_figures(p: ReadPhase) -> dict[str, float | None]:
    e2e, produce, storm = p.result["tail"]["latency_ms"], p.result["produce"], p.result["storm"]
    out: dict[str, float | None] = {f"end-to-end {k} ms": e2e.get(k) for k in PERCENTILES}
    out |= {f"produce {k} ms": produce["latency_ms"][k] for k in PERCENTILES}
    out["producer MB/s reached"] = produce["mb_per_s"]
    read = sum(r["bytes"] for r in storm)
    out["catch-up readers' MB/s (sum of 3)"] = sum(r["mb_per_s"] for r in storm) if storm else None
    out["their S3 GETs per GB read"] = p.counts["gets"] / (read / GB) if read else None
    return out


def collect(phases: list[ReadPhase], figures) -> dict[str, dict[str, list[float]]]:
    """{row: {mode: [value per round]}}, rows in the order `figures` gives them."""
    rows: dict[str, dict[str, list[float]]] = {}
    for p in phases:
        for label, value in figures(p).items():
            by_mode = rows.setdefault(label, defaultdict(list))
            if value is not None:
                by_mode[p.mode].append(value)
    return {label: dict(by_mode) for label, by_mode in rows.items()}


def summarize(phases: list[ReadPhase], args) -> dict:
    def of(kind: str, client: str) -> list[ReadPhase]:
        return [p for p in phases if (p.kind, p.client) == (kind, client)]

    catchup = {client: collect(of("catchup", client), catchup_figures) for client in args.clients}
    tail = collect(of("tail", "librdkafka"), tail_figures)
    return {"catchup": catchup, "tail": tail, "targets": targets(catchup, tail)}


def targets(catchup: dict, tail: dict) -> list[tuple[str, bool, str]]:
    """(target, met, figures) of each target the issue sets."""
    out = []
    for client, rows in catchup.items():
        name, speed = CONSUMER_NAMES[client], rows["MB/s"]
        if speed.get("direct") and speed.get("cold"):
            direct, cold = fmean(speed["direct"]), fmean(speed["cold"])
            label = f"{name}: cold catch-up ≥ {COLD_SHARE_TARGET:.0%} of direct's MB/s"
            figures = f"{cold:.1f} vs {direct:.1f} MB/s ({cold / direct:.0%})"
            out.append((label, cold >= COLD_SHARE_TARGET * direct, figures))
        for mode in ("cold", "warm"):
            if gets := rows["S3 GETs per GB read"].get(mode):
                label = f"{name}, {mode}: S3 GETs per GB read ≤ {GETS_PER_GB_TARGET}"
                figures = f"{fmean(gets):.0f} (worst round {max(gets):.0f})"
                out.append((label, fmean(gets) <= GETS_PER_GB_TARGET, figures))
    if p99 := tail.get("end-to-end p99 ms", {}).get("local"):
        label = f"tail end-to-end p99 ≤ {TAIL_P99_TARGET_MS:g} ms with the local WAL (via owner a)"
        figures = f"p99 {fmean(p99):.1f} ms (worst round {max(p99):.1f})"
        out.append((label, fmean(p99) <= TAIL_P99_TARGET_MS, figures))
    produce = tail.get("produce p99 ms", {})
    if produce.get("storm") and produce.get("local"):
        storm, calm = fmean(produce["storm"]), fmean(produce["local"])
        label = f"produce p99 during a catch-up read storm ≤ {P99_TARGET_MS:g} ms (tiered.py's)"
        figures = f"{storm:.1f} ms with 3 catch-up readers, {calm:.1f} ms without"
        out.append((label, storm <= P99_TARGET_MS, f"{figures} ({storm - calm:+.1f} ms)"))
    return out


DERIVED = {  # row -> (its comparison to direct, how)
    "MB/s": ("MB/s vs direct", lambda value, direct: f"{value / direct:.2f}"),
    "end-to-end p99 ms": ("end-to-end p99 added to direct, ms", lambda v, d: f"{v - d:+.1f}"),
}


def table(rows: dict[str, dict[str, list[float]]], names: dict[str, str]) -> list[str]:
    modes = list(names)
    out = ["| | " + " | ".join(names.values()) + " |", "| --- |" + " ---: |" * len(modes)]
    for label, values in rows.items():
        cells = (cell(values[x]) if values.get(x) else "–" for x in modes)
        out.append(f"| {label} | " + " | ".join(cells) + " |")
        if label in DERIVED and values.get("direct"):
            name, how = DERIVED[label]
            direct = fmean(values["direct"])
            cells = (how(fmean(values[x]), direct) if values.get(x) else "–" for x in modes)
            out.append(f"| {name} | " + " | ".join(cells) + " |")
    return out


def render(run: dict, summary: dict, args) -> str:
    m, w = run["machine"], run["written"]
    loads = [", ".join(f"{x:.2f}" for x in m[k]) for k in ("loadavg_at_start", "loadavg_at_end")]
    tiering = {key: getattr(args, key) for key in (*UPLOAD_SETTINGS, "block_cache_bytes")}
    tiering["bandwidth_bytes_per_s"] = args.bandwidth  # 0: unlimited
    out = [
        "### Run",
        "",
        f"- command: `{run['command']}`",
        f"- proxy code at {run['proxy_code']}; {run['date']}",
        f"- machine: {m['nproc']} cores ({m['cpu_model']}), {m['memory_gib']} GiB, Linux "
        f"{m['kernel']}, Python {m['python']}; load average at start {loads[0]}, at end "
        f"{loads[1]}",
        f"- Kafka {run['kafka']} (3 nodes, KRaft, broker.rack zone-a/b/c, min.insync.replicas "
        f"2); MinIO {run['minio']}, the object store; librdkafka {run['librdkafka']}",
        f"- catch-up topics: {args.bytes // args.record_size:,} records of {args.record_size} B "
        f"({args.bytes / GB:.2f} GB), {args.partitions} partitions; direct: replication "
        f"factor 3, written at {w['direct']:.1f} MB/s; tiered at offset 0, written through a "
        f"at {w['tiered']:.1f} MB/s, all in objects {w['commit_wait_s']:.0f} s after the last "
        "acknowledgement; librdkafka producers, acks=all, idempotence on",
        (
            f"- read as compacted: every range in a stream object {w['compaction_wait_s']:.0f} s "
            "after the upload (compaction every 2 s once two objects are small)"
            if "compaction_wait_s" in w
            else "- read as uploaded: stream set objects holding every partition (--no-compacted)"
        ),
        "- proxies a, b, c in zone-a, -b, -c, one metadata shard owned by a; catch-up "
        "consumers assign every partition at offset 0, no group, client defaults",
        f"- tail phases: {args.tail_seconds:g} s at {args.tail_rate:g} MB/s "
        f"({round(args.tail_rate * MIB / args.record_size):,} rec/s) from zone-a",
        "- tiering: " + ", ".join(f"{key} {value:,}" for key, value in tiering.items()),
        f"- {args.rounds} round(s), the order reversed every other one; total runtime "
        f"{run['runtime_s']:.0f} s",
        "",
        "Mean of the rounds (lowest–highest). MB = 2^20 bytes of record values; GB = 10^9.",
        "",
        "#### Catch-up reads",
        "",
        "MB/s from the assignment to the last record (ConsumerPerformance: its fetch.MB.sec). "
        "S3 GETs: GetObject + HeadObject as MinIO counted them during the read; bytes out: "
        "MinIO's bytes sent. Cold: b restarted just before, its block cache empty; warm: "
        "the read right after. Hit ratio: of the blocks b's reads wanted, those cached "
        "(readahead GETs still in flight count as misses). CPU per GiB of record values read; "
        "client = the consumer's process.",
        *(
            [f"b's block cache holds {args.block_cache_bytes / args.bytes:.0%} of the topic."]
            if args.block_cache_bytes < args.bytes
            else []
        ),
    ]
    for client, rows in summary["catchup"].items():
        out += ["", f"##### {CONSUMER_NAMES[client]}", "", *table(rows, catchup_names(args))]
    out += [
        "",
        "#### Tail end-to-end latency (librdkafka)",
        "",
        "End to end: the consumer's clock when poll() returned the record minus the time "
        "stamped in its value at produce() (one machine, one clock). Produce: send to "
        "acknowledgement. The consumer is in the zone of the proxy it reads through; with "
        "`storm`, three catch-up readers (through a, b, c) re-read the tiered catch-up "
        "topic from offset 0 while the producer runs: the phase's S3 GETs per GB they read.",
        "",
        *table(summary["tail"], TAIL_NAMES),
        "",
        "#### Targets",
        "",
        *(
            f"- {label}: {fig}: {'met' if ok else 'NOT met'}"
            for label, ok, fig in summary["targets"]
        ),
    ]
    problems = run["warnings"] + run["proxy_log_problems"][:20]
    if problems:
        out += ["", "#### Warnings", "", "```", *problems, "```"]
    return "\n".join(out)


# -- the run ---------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add = parser.add_argument
    add("--bytes", type=int, default=2 * GB, help="record values per catch-up topic (2 GB)")
    add("--record-size", type=int, default=1024)
    add("--partitions", type=int, default=6)
    add("--rounds", type=int, default=2, help="the phases' order flips each round")
    add("--clients", default="librdkafka", help="catch-up consumers: librdkafka[,java]")
    add("--tail-rate", type=float, default=5.0, help="MB/s of the paced producer (5)")
    add("--tail-seconds", type=float, default=60.0, help="per tail phase (60)")
    add("--warmup-records", type=int, default=100_000, help="read of each topic, unmeasured")
    cache = TieringConfig().block_cache_bytes
    add("--block-cache-bytes", type=int, default=cache, help=f"every proxy's ({cache})")
    add(
        "--compacted",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="read the catch-up topic once compaction made it stream objects (default), "
        "or as uploaded (--no-compacted: stream set objects of every partition)",
    )
    add(
        "--bandwidth",
        type=int,
        default=0,
        help="every proxy's tiering.bandwidth_bytes_per_s (0: unlimited, the default): "
        "produce never waits for it, reads do",
    )
    add(
        "--catchup-readers",
        default="",
        help="also read the tiered topic's first N partitions only, cold and warm, for each "
        "N listed (e.g. 1,6): N streams read at once through b's block cache",
    )
    more = "the object store's sign_payload (auto: over http, which MinIO here is)"
    add("--sign-payload", choices=("auto", "true", "false"), default="auto", help=more)
    add("--json", type=Path, help="also write every phase's figures here")
    args = parser.parse_args(argv)
    args.catchup_readers = [int(n) for n in args.catchup_readers.split(",") if n]
    if not all(1 <= n <= args.partitions for n in args.catchup_readers):
        parser.error("--catchup-readers: each between 1 and --partitions")
    args.clients = [c for c in CLIENTS if c in args.clients.split(",")]
    if not args.clients or "librdkafka" not in args.clients:
        parser.error("--clients: librdkafka, and java if wanted")
    if args.record_size < 8 or args.bytes < args.record_size * args.partitions:
        parser.error("--record-size: at least 8 (the stamp); --bytes: a record per partition")
    args.client_config = {}  # tiered.Bench's producers: client defaults
    vars(args).update({key: getattr(TieringConfig(), key) for key in UPLOAD_SETTINGS})
    return args


def set_tiering(fleet: TieredFleet, args: argparse.Namespace) -> None:
    """Every proxy's `tiering.block_cache_bytes` (TieredFleet leaves the default) and, with
    --compacted, a compaction pass every few seconds once two objects are small."""
    settings = {"block_cache_bytes": args.block_cache_bytes}
    settings["bandwidth_bytes_per_s"] = args.bandwidth
    if args.compacted:
        settings |= {"compaction_interval_s": 2.0, "compaction_min_objects": 2}
    for proxy in (member.proxy for member in fleet.members):
        proxy.config["tiering"].update(settings)
        proxy.config_path.write_text(yaml.safe_dump(proxy.config))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.monotonic()
    stop_on_signals()
    machine, run_id = machine_description(), os.urandom(3).hex()
    with tempfile.TemporaryDirectory(prefix="tierproxy-read-") as tmp, ExitStack() as stack:
        work = Path(tmp)
        print("starting Kafka (racks zone-a/b/c), MinIO, proxies a, b, c...", flush=True)
        settings = {"min.insync.replicas": "2", "file.delete.delay.ms": "1000"}
        kafka = KafkaCluster(size=3, racks=list(ZONES), name="kafka-read", extra_config=settings)
        minio = MinioServer(base_dir=work / "minio", name="minio-read")
        minio.process.env["MINIO_PROMETHEUS_AUTH_TYPE"] = "public"  # its request counters
        for service in (kafka, minio):
            stack.callback(service.stop)
            service.start()
        cluster = stack.enter_context(closing(Cluster(kafka)))
        fleet = TieredFleet(kafka, minio, work, run_id, args)
        set_tiering(fleet, args)
        stack.callback(fleet.stop)
        fleet.start()
        proxy_code = git_state()  # what the proxies have just loaded
        base = Bench(args, kafka, cluster, minio, fleet)
        bench = ReadBench(args, base, work)
        print(f"writing {args.bytes / GB:.2f} GB direct and through a...", flush=True)
        bench.write()
        bench.warm_up()
        for rnd in range(args.rounds):
            print(f"round {rnd + 1} of {args.rounds}", flush=True)
            bench.run_round(rnd)
        at_end = machine | {"loadavg_at_end": os.getloadavg()}
        run = run_facts(args, proxy_code, at_end, minio=True) | {
            "written": bench.written,
            "warnings": base.warnings,
            "proxy_log_problems": fleet.problems()[:50],
        }
    run["runtime_s"] = time.monotonic() - started  # with the shutdown
    summary = summarize(bench.phases, args)
    phases = [asdict(p) for p in bench.phases]
    return publish(run, summary, render(run, summary, args), args.json, phases=phases)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--worker"]:
        sys.exit(worker(sys.argv[2]))
    run_main(main)
