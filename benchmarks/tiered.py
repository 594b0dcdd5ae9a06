"""Tiered benchmark: one workload direct to Kafka, through a proxy, and tiered three ways.

    .venv/bin/python -m benchmarks.tiered [--records N] [--rounds 2] [--json out.json]

The same producers (Kafka's ProducerPerformance, librdkafka; 1 KiB records, acks=all,
idempotence on) and topic layout (6 partitions, replication factor 3, min.insync.replicas
2) in five modes: `direct`, a client in zone-a to the brokers; `passthrough`, the same
client through the zone-a proxy; `local`, tiered, through the zone-a proxy, which owns
every tiered partition (its WAL, then objects in S3); `s3`, tiered, a client in zone-b
through the zone-b proxy, which PUTs each batch into an S3-WAL object and tells the owner
where it is; `direct-notify`, the same from zone-c, the batch sent to the owner inline.

One 3-broker Kafka (broker.rack zone-a/b/c), one MinIO (the object store of every tiered
mode, so a real S3 server counts the requests), three `tierproxy run` processes on
127.0.1.1 / 127.0.2.1 / 127.0.3.1 sharing a fresh metadata topic of one shard, which the
zone-a proxy owns (started first, checked before every tiered phase). Per round and
client, each mode gets fresh topics and runs a full-speed phase (MB/s) and one paced at
`--latency-rate` (latency percentiles), the modes back to back, in reverse order every
other round. Around each phase, once the metadata says every record is committed in
objects, see `Bench.counts`: S3 requests (MinIO's metrics), objects by kind (bucket
listing), the proxies' zone and peer byte counters, the kernel's byte counts of the
connections to the owner's peer port, the .log bytes of the topic and of the metadata.
The report is Markdown on stdout (docs/benchmarks.md holds a run); `--json` has it all.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field
from pathlib import Path
from statistics import fmean

from benchmarks.common import stages
from benchmarks.common.clients import JavaTools, librdkafka_produce
from benchmarks.common.cluster import Cluster
from benchmarks.common.procs import (
    ProxyProcess,
    cpu_seconds,
    increases,
    jit_cpu_seconds,
    machine_cpu,
    machine_description,
    scrape,
    tcp_bytes,
    tierproxy_argv,
    wait_idle,
)
from benchmarks.common.report import cell, fmt
from benchmarks.common.run import (
    git_state,
    publish,
    run_facts,
    run_main,
    stop_on_signals,
    wait_until,
)
from proxy.config.tiering import TieringConfig
from proxy.devstack import KafkaCluster, MinioServer
from proxy.devstack.paths import free_port, kafka_libs
from proxy.metadata.store import ShardReader
from proxy.objects.keys import ObjectKind
from proxy.peer.codec import frame_size
from proxy.peer.messages import AppendResponse

ZONES = ("zone-a", "zone-b", "zone-c")
MODES = ("direct", "passthrough", "local", "s3", "direct-notify")
TIERED = ("local", "s3", "direct-notify")
NAMES = ("direct (RF 3)", "passthrough", "tiered, local WAL", "tiered, S3 notify")
MODE_NAMES = dict(zip(MODES, (*NAMES, "tiered, direct notify"), strict=True))
CLIENT_ZONE = dict(zip(MODES, ("zone-a", "zone-a", "zone-a", "zone-b", "zone-c"), strict=True))
PROXY_OF = {"passthrough": "a", "local": "a", "s3": "b", "direct-notify": "c"}
CLIENTS = ("java", "librdkafka")
CLIENT_NAMES = {"java": "ProducerPerformance", "librdkafka": "librdkafka"}
PCTS = ("p50", "p99", "p99.9")
KINDS = {"produce": "full speed", "latency": "paced"}
GB, GIB, MIB = 10**9, 1 << 30, 1 << 20
P99_TARGET_MS = 10.0  # tiered local WAL, at 20 MB/s
PUTS_PER_GB_TARGET = 150
# S3 APIs billed as PUTs and as GETs, by MinIO's names
PUT_APIS = {"PutObject", "PutObjectPart", "NewMultipartUpload", "CompleteMultipartUpload"}
PUT_APIS |= {"CopyObject", "CopyObjectPart"}
GET_APIS = {"GetObject", "HeadObject"}
# an owner's answer to a peer append with no error message: counts the batches handed over
ANSWER_BYTES = frame_size(AppendResponse(0, 0))
UPLOAD_SETTINGS = ("upload_bytes", "upload_interval_s", "s3wal_max_delay_ms", "s3wal_max_bytes")
UPLOAD_SETTINGS += ("s3wal_idle_ms", "owner_takes_references")
IO = ("received", "sent")
# PUTs by what made them, as the proxies count them (summed over the fleet): listing the
# bucket cannot say, since the owner deletes S3-WAL objects once uploaded and compaction
# deletes the uploads it rewrote, both while a phase runs.
OBJECT_PUTS = {
    "s3wal_objects": "tierproxy_s3wal_puts_total",  # each attempt, as MinIO counts
    "upload_objects": "tierproxy_uploader_objects_total",
    "compaction_objects": "tierproxy_compaction_objects_written_total",
}
PROXY_COUNTERS = ("tierproxy_zone_bytes_total", "tierproxy_peer_bytes_total")
PROXY_COUNTERS += ("tierproxy_s3wal_reader_gets_total",)  # the owners' S3-WAL GETs
CROSSING = ("client_proxy", "to_brokers", "owner_hop", "replication", "metadata")


def total(samples: list[dict], keep) -> float:
    return sum(sample["value"] for sample in samples if keep(sample))


class MetadataWatch:
    """The fleet's metadata (one shard), followed by a `ShardReader` in a thread of its
    own: who owns the shard, and each tiered topic's streams."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, daemon=True).start()
        self.reader = ShardReader({"bootstrap_servers": bootstrap}, topic, 0, 1)
        self._call(self.reader.start())

    def _call(self, coroutine, timeout: float = 60.0):
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout)

    def read(self, query):
        """`query(state)`, run in the reader's loop once it holds everything committed."""

        async def fresh():
            await self.reader.read_to_end()
            return query(self.reader.state)

        return self._call(fresh())

    def shard(self) -> dict:
        return self.read(lambda s: {"owner": s.owner, "epoch": s.epoch, "released": s.released})

    def streams(self, topic: str) -> list:
        """The StreamInfo of each partition of `topic` that is cut over."""

        def query(state) -> list:
            ids = [t for t in state.topic_ids() if state.topic(t).topic == topic]
            infos = (state.stream(s) for s in state.stream_ids())
            return [i for i in infos if ids and i is not None and i.topic_id == ids[-1]]

        return self.read(query)

    def close(self) -> None:
        self._call(self.reader.close(), timeout=15)
        self.loop.call_soon_threadsafe(self.loop.stop)  # its thread is a daemon


# -- the fleet -------------------------------------------------------------------------------


@dataclass
class Member:
    name: str  # a, b, c
    zone: str
    host: str
    metrics_port: int
    peer_port: int
    proxy: ProxyProcess

    @property
    def metrics_url(self) -> str:
        return f"http://{self.host}:{self.metrics_port}/metrics"


class TieredFleet:
    """Three proxies, one per zone, tiering on, objects in MinIO. `a` (zone-a) owns the
    metadata's one shard, so every tiered partition; `b` hands batches over through
    S3-WAL objects (`notify: s3`), `c` sends them inline (`notify: direct`)."""

    def __init__(self, kafka: KafkaCluster, minio: MinioServer, work_dir: Path, run_id: str, args):
        self.kafka = kafka
        self.meta_topic = f"__tierproxy_bench_meta_{run_id}"
        store = {"kind": "s3", "bucket": minio.bucket, "endpoint_url": minio.endpoint}
        store |= {"access_key_id": minio.access_key, "secret_access_key": minio.secret_key}
        store |= {"region": "us-east-1", "path_style": True}
        if args.sign_payload != "auto":  # MinIO here is http: auto signs every body
            store["sign_payload"] = args.sign_payload == "true"
        self.members: list[Member] = []
        fleet_topic = f"__tierproxy_bench_fleet_{run_id}"
        for number, (name, notify) in enumerate((("a", "s3"), ("b", "s3"), ("c", "direct")), 1):
            host, zone = f"127.0.{number}.1", ZONES[number - 1]
            metrics_port, peer_port = free_port(), free_port()
            tiering = {"metadata_topic": self.meta_topic, "shard_count": 1, "notify": notify}
            tiering |= {"peer_bind_host": host, "peer_port": peer_port, "object_store": store}
            tiering |= {"wal": {"directory": str(work_dir / name / "wal")}}
            tiering |= {key: getattr(args, key) for key in UPLOAD_SETTINGS}
            settings = {
                "listeners": {"bind_host": host, "advertised_host": host},
                "fleet": {"name": f"tiered-bench-{name}", "zone": zone, "topic": fleet_topic},
                "metrics": {"bind_host": host, "port": metrics_port},
                "tiering": tiering,
            }
            nodes = [n.node_id for n in kafka.nodes]
            proxy = ProxyProcess(kafka.bootstrap, nodes, work_dir, name=name, settings=settings)
            self.members.append(Member(name, zone, host, metrics_port, peer_port, proxy))
        self.by_name = {m.name: m for m in self.members}
        self.owner = self.members[0]
        self.watch: MetadataWatch | None = None

    def start(self) -> None:
        """The owner first, the others once it holds the shard; then until the group has
        settled with the owner still holding it."""
        self.owner.proxy.start(timeout=180)
        self.watch = MetadataWatch(self.kafka.bootstrap, self.meta_topic)
        self.wait_owned(timeout=120)
        for member in self.members[1:]:
            member.proxy.start(timeout=180)
        wait_until(
            "all see 3 live members", lambda: all(self.live(m) == 3 for m in self.members), 60
        )
        time.sleep(3)  # the shard group rebalances as the others join
        self.wait_owned(timeout=120, stable_s=3.0)

    def wait_owned(self, timeout: float, stable_s: float = 0.0) -> dict:
        """The shard's state once `a` has held it, unreleased, for `stable_s`."""
        assert self.watch is not None
        since, last = 0.0, None
        deadline = time.monotonic() + timeout
        while True:
            shard = self.watch.shard()
            held = shard["owner"] == f"tiered-bench-{self.owner.name}" and not shard["released"]
            if held and shard == last and time.monotonic() - since >= stable_s:
                return shard
            if not held or shard != last:
                since, last = time.monotonic(), shard
            if time.monotonic() > deadline:
                raise RuntimeError(f"proxy a does not hold the metadata shard: {shard}")
            time.sleep(0.5)

    def live(self, member: Member) -> float:
        """The live members of the fleet, as `member` sees them."""
        name = "tierproxy_fleet_live_members"
        return sum(scrape(member.metrics_url, (name,)).get(name, {}).values())

    def tier(self, topic: str) -> None:
        argv = [*tierproxy_argv(), "topics", "tier", topic]
        argv += ["--peer", f"{self.owner.host}:{self.owner.peer_port}"]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise RuntimeError(f"tierproxy topics tier {topic}: {done.stdout}{done.stderr}")

    def compacted(self, topic: str) -> bool:
        """Whether every committed range of `topic`'s streams is in a stream object."""
        assert self.watch is not None
        streams = [i.stream_id for i in self.watch.streams(topic)]

        def kinds(state) -> set:
            return {r.object_kind for s in streams for r in state.committed_ranges(s)}

        return bool(streams) and self.watch.read(kinds) == {ObjectKind.STREAM}

    def cut_over(self, topic: str) -> tuple[int, int]:
        """(partitions of `topic` cut over, records of them committed in objects)."""
        assert self.watch is not None
        streams = self.watch.streams(topic)
        return len(streams), sum(i.end_offset - i.cutover_offset for i in streams)

    def stop(self) -> None:
        if self.watch is not None:
            self.watch.close()
        for member in reversed(self.members):  # the owner last: it uploads and releases
            member.proxy.stop()

    def problems(self) -> list[str]:
        return [f"{m.name}: {line}" for m in self.members for line in m.proxy.problems()]


# -- phases ----------------------------------------------------------------------------------


@dataclass
class Phase:
    kind: str  # produce (full speed) | latency (paced)
    client: str
    mode: str
    round: int
    topic: str
    payload_bytes: int
    result: dict  # the client's: MB/s, latency percentiles
    counts: dict[str, float]  # S3 requests and objects, bytes by hop: `Bench.counts`
    seconds: dict[str, float] = field(default_factory=dict)  # settle, produce, commit
    cpu_s: dict[str, float] = field(default_factory=dict)
    machine_busy_cores: float = 0.0
    raw: dict = field(default_factory=dict)  # S3 requests by API, proxy counters, shard
    # where the time went: proxy and path -> stage -> count, mean, p50, p99 (stages.py)
    stages: dict = field(default_factory=dict)


class Bench:
    def __init__(self, args, kafka, cluster: Cluster, minio: MinioServer, fleet: TieredFleet):
        self.args, self.kafka, self.cluster = args, kafka, cluster
        self.minio, self.fleet = minio, fleet
        self.java = JavaTools(kafka_libs())
        self.racks = {n.node_id: n.rack for n in kafka.nodes}
        self.partitions = args.partitions
        self.phases: list[Phase] = []
        self.warnings: list[str] = []
        self.run_id = os.urandom(3).hex()

    # -- snapshots ---------------------------------------------------------------------------

    def pids(self) -> dict[str, list[int]]:
        pids = {f"proxy {m.name}": [m.proxy.pid] for m in self.fleet.members}
        pids["brokers"] = [n.process.pid for n in self.kafka.nodes if n.process.pid]
        pids["minio"] = [self.minio.process.pid]
        return pids

    def cpu(self) -> dict[str, float]:
        out = {who: sum(cpu_seconds(pid) for pid in pids) for who, pids in self.pids().items()}
        out["brokers_jit"] = sum(jit_cpu_seconds(pid) for pid in self.pids()["brokers"])
        own = resource.getrusage(resource.RUSAGE_SELF)  # librdkafka runs in this process
        children = resource.getrusage(resource.RUSAGE_CHILDREN)  # the Java tools, once reaped
        out["client"] = own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime
        return out

    def snapshot(self) -> dict:
        """Every counter a phase is measured by; `totals` only grow."""
        totals: Counter = Counter(dict.fromkeys(OBJECT_PUTS, 0))  # a run may lack a kind
        for member in self.fleet.members:
            samples = scrape(member.metrics_url, tuple(OBJECT_PUTS.values()))
            for key, metric in OBJECT_PUTS.items():
                totals[key] += sum(samples.get(metric, {}).values())
        minio = scrape(f"{self.minio.endpoint}/minio/metrics/v3/api/requests", ("minio_api",))
        api: Counter = Counter()
        for labels, value in minio.get("minio_api_requests_total", {}).items():
            api[dict(labels)["name"]] += value
        totals["puts"] = sum(v for k, v in api.items() if k in PUT_APIS)
        totals["gets"] = sum(v for k, v in api.items() if k in GET_APIS)
        received, sent = (minio.get(f"minio_api_requests_traffic_{d}_bytes", {}) for d in IO)
        totals.update(s3_in=sum(received.values()), s3_out=sum(sent.values()))
        logs = self.cluster.replica_logs(self.fleet.meta_topic, timeout=10)
        totals.update(metadata_written=logs["leader_bytes"], metadata_copied=logs["follower_bytes"])
        proxies: dict[str, dict[tuple, float]] = defaultdict(dict)
        for member in self.fleet.members:
            for name, samples in scrape(member.metrics_url, PROXY_COUNTERS).items():
                proxies[name] |= {(*k, ("proxy", member.name)): v for k, v in samples.items()}
        owner, zones = self.fleet.owner, {m.proxy.pid: m.zone for m in self.fleet.members}
        return {
            "totals": totals,
            "api": api,
            "proxies": proxies,
            "owner_connections": tcp_bytes(owner.host, owner.peer_port, zones),
            "metadata_leader": next(iter(logs["by_partition"].values()))["leader"],
            "cpu": self.cpu(),
            "machine": machine_cpu(),
            "stages": stages.snapshot({m.name: m.metrics_url for m in self.fleet.members}),
        }

    def counts(self, mode: str, before: dict, after: dict, logs: dict) -> tuple[dict, dict]:
        """A phase's figures from the snapshots around it and its topic's .log files, and
        the raw counters they come from.

        Crossing zones: client <-> proxy and proxy <-> brokers by `tierproxy_zone_bytes`
        (direct: the .log bytes of the partitions led from another zone than the
        client's); the owner hop by the kernel's count of the non-owners' connections to
        the owner's peer port; replication by the topic's followers' .log bytes; the
        metadata topic estimated from its growth (written by the owner, copied by two
        followers, read by the three proxies). S3 is in-region: counted, never crossing."""
        counts = {k: v - before["totals"][k] for k, v in after["totals"].items()}
        raw = {
            metric.removeprefix("tierproxy_").removesuffix("_total"): increases(
                after["proxies"].get(metric, {}), before["proxies"].get(metric, {})
            )
            for metric in PROXY_COUNTERS
        }
        raw["s3_api"] = {
            k: v - before["api"][k] for k, v in after["api"].items() if v > before["api"][k]
        }
        to_owner = from_owner = 0
        for key, (acked, received) in after["owner_connections"].items():
            old = before["owner_connections"].get(key, (0, 0))
            if key[2] != self.fleet.owner.zone:  # the owner's own zone crosses nothing
                to_owner, from_owner = to_owner + acked - old[0], from_owner + received - old[1]
        zone_bytes, led = raw["zone_bytes"], logs["by_partition"].values()
        to_brokers = (
            sum(p["bytes"][p["leader"]] for p in led if self.racks[p["leader"]] != "zone-a")
            if mode == "direct"  # the client is in zone-a
            else total(zone_bytes, lambda z: z["broker_zone"] not in (z["proxy_zone"], "none"))
        )
        rack = self.racks[after["metadata_leader"]]  # times a metadata byte crosses, copies aside:
        crossings = (rack != self.fleet.owner.zone) + sum(z != rack for z in ZONES)  # in, out
        written, copied = counts.pop("metadata_written"), counts.pop("metadata_copied")
        counts |= {
            "client_proxy": total(zone_bytes, lambda z: z["client_zone"] != z["proxy_zone"]),
            "to_brokers": to_brokers,
            "owner_hop": to_owner + from_owner,
            "to_owner": to_owner,
            "from_owner": from_owner,
            "owner_hop_counted": total(raw["peer_bytes"], lambda p: p["from_zone"] != p["to_zone"]),
            "replication": logs["follower_bytes"],
            "metadata": copied + written * crossings,
        }
        return counts, raw

    # -- topics, clients, phases -------------------------------------------------------------

    def create_topics(self, topics: dict[str, str]) -> None:
        """{topic: mode}: each with the same layout; the tiered ones tiered and cut over."""
        for topic in topics:
            self.cluster.create_topic(topic, self.args.partitions)
        tiered = [t for t, mode in topics.items() if mode in TIERED]
        for topic in tiered:
            self.fleet.tier(topic)
        for t in tiered:
            wait_until(
                f"{t} cut over", lambda t=t: self.fleet.cut_over(t)[0] == self.partitions, 120
            )
        if tiered:
            time.sleep(1.0)  # the owner starts each partition as it writes its cutover

    def produce(self, client: str, mode: str, topic: str, records: int, rate: int | None):
        bootstrap = self.kafka.bootstrap
        if mode != "direct":
            bootstrap = self.fleet.by_name[PROXY_OF[mode]].proxy.bootstrap
        settings = {"client.id": f"tierproxy-bench,tierproxy_az={CLIENT_ZONE[mode]}"}
        settings |= self.args.client_config
        size = self.args.record_size
        if client == "java":
            return self.java.produce(bootstrap, topic, records, size, rate, settings)
        return librdkafka_produce(bootstrap, topic, records, size, rate, settings)

    def measure(self, kind: str, client: str, mode: str, rnd: int, topic: str, records: int):
        rate = self.args.latency_rate if kind == "latency" else None
        settled = wait_idle(self.pids()["brokers"])  # brokers idle, as in passthrough.py
        tiered = mode in TIERED
        shard = {"before": self.fleet.wait_owned(timeout=60) if tiered else {}}
        before = self.snapshot()
        started = time.perf_counter()
        result = self.produce(client, mode, topic, records, rate)
        wall = time.perf_counter() - started
        if tiered:
            done = self.fleet.cut_over  # every record in objects: all the phase's uploads
            try:
                wait_until(f"{topic} committed", lambda: done(topic)[1] >= records, 180)
            except RuntimeError as exc:
                self.warnings.append(str(exc))
            shard["after"] = self.fleet.watch.shard()
            if shard["after"]["epoch"] != shard["before"]["epoch"]:
                self.warnings.append(f"{topic}: the metadata shard changed hands: {shard}")
        waited = time.perf_counter() - started - wall
        after = self.snapshot()
        counts, raw = self.counts(mode, before, after, self.cluster.replica_logs(topic, timeout=30))
        size = records * self.args.record_size
        phase = Phase(kind, client, mode, rnd, topic, size, result.to_json(), counts)
        phase.seconds = {"settle": settled, "produce": wall, "commit_wait": waited}
        phase.cpu_s = {k: after["cpu"][k] - before["cpu"][k] for k in before["cpu"]}
        (b0, t0), (b1, t1) = before["machine"], after["machine"]
        phase.machine_busy_cores = (b1 - b0) / max(1, t1 - t0) * (os.cpu_count() or 1)
        phase.raw = raw | {"shard": shard}
        phase.stages = stages.summary(before["stages"], after["stages"])
        self.phases.append(phase)
        print(f"  {describe(phase)}", flush=True)
        for line in stages.describe(phase.stages):
            print(f"    {line}", flush=True)

    def warm_up(self, max_passes: int = 4) -> None:
        """Unmeasured passes of every mode and client until the brokers' JIT has settled
        (see benchmarks/passthrough.py): less than a tenth of their CPU, from pass 2."""
        topics = {f"tb-{self.run_id}-warmup-{mode}": mode for mode in self.args.modes}
        self.create_topics(topics)
        brokers = self.pids()["brokers"]
        for n in range(max_passes):
            cpu0 = sum(cpu_seconds(p) for p in brokers)
            jit0 = sum(jit_cpu_seconds(p) for p in brokers)
            for topic, mode in topics.items():
                for client in self.args.clients:
                    self.produce(client, mode, topic, self.args.warmup_records, None)
            cpu = sum(cpu_seconds(p) for p in brokers) - cpu0
            jit = sum(jit_cpu_seconds(p) for p in brokers) - jit0
            print(f"  warm-up pass {n + 1}: brokers {cpu:.1f} CPU s, JIT {jit:.1f} s", flush=True)
            if n >= 1 and jit < 0.1 * cpu:
                break
        self.drop([t for t, mode in topics.items() if mode not in TIERED])

    def drop(self, topics: list[str]) -> None:
        for topic in topics:  # tiered topics stay: their records are in S3, not Kafka
            try:
                self.cluster.delete_topic(topic)
            except Exception as exc:  # noqa: BLE001 - best effort: disk space only
                print(f"  (could not delete {topic}: {exc})", file=sys.stderr)

    def run_round(self, rnd: int) -> None:
        modes = self.args.modes
        order = modes if rnd % 2 == 0 else modes[::-1]
        phases = (("produce", self.args.records), ("latency", self.args.latency_records))
        for client in self.args.clients:
            name = f"tb-{self.run_id}-r{rnd}-{client}"
            topics = {(kind, m): f"{name}-{m}-{kind}" for kind, _ in phases for m in modes}
            self.create_topics({topic: mode for (_, mode), topic in topics.items()})
            for kind, records in phases:
                for mode in order:
                    self.measure(kind, client, mode, rnd, topics[kind, mode], records)
            self.drop([t for (_, mode), t in topics.items() if mode not in TIERED])


def describe(phase: Phase) -> str:
    lat, c, s = phase.result["latency_ms"], phase.counts, phase.seconds
    return (
        f"r{phase.round} {phase.client:10} {phase.kind:7} {phase.mode:13} "
        f"{phase.result['mb_per_s']:7.1f} MB/s  p50 {lat['p50']:.1f} p99 {lat['p99']:.1f} "
        f"p99.9 {lat['p99.9']:.1f} ms  PUTs {c['puts']:.0f} (S3-WAL {c['s3wal_objects']:.0f}, "
        f"upload {c['upload_objects']:.0f}, compaction {c['compaction_objects']:.0f}) "
        f"GETs {c['gets']:.0f} "
        f"(S3-WAL {total(phase.raw.get('s3wal_reader_gets', []), bool):.0f})  "
        f"({s['produce']:.0f} s + {s['commit_wait']:.0f} s to commit, settled "
        f"{s['settle']:.0f} s, {phase.machine_busy_cores:.2f} cores busy)"
    )


# -- figures and the report ------------------------------------------------------------------


def summarize(phases: list[Phase], args) -> dict:
    """Per client, each latency row's values by mode (one per round); per mode, every
    count summed over its phases (and per client and phase kind, for the S3 table)."""
    latency = {}
    for client in args.clients:
        specs = [("MB/s, full speed", "produce", "mb_per_s")]
        specs += [(f"{p} ms at {args.latency_rate} rec/s", "latency", p) for p in PCTS]
        specs += [("MB/s reached in the paced phase", "latency", "mb_per_s")]
        specs += [("p99 ms at full speed (queueing)", "produce", "p99")]
        latency[client] = {
            label: {
                mode: [
                    p.result["mb_per_s"] if key == "mb_per_s" else p.result["latency_ms"][key]
                    for p in phases
                    if (p.kind, p.client, p.mode) == (kind, client, mode)
                ]
                for mode in args.modes
            }
            for label, kind, key in specs
        }
    modes: dict[str, dict] = {}
    for mode in args.modes:
        totals: Counter = Counter()
        for p in (p for p in phases if p.mode == mode):
            counts = p.counts | {"produced": p.payload_bytes}
            totals.update(counts)
            totals.update({f"{p.client} {p.kind} {k}": v for k, v in counts.items()})
            totals.update({f"cpu {who}": s for who, s in p.cpu_s.items()})
            totals.update(busy_cores=p.machine_busy_cores, phases=1)
        totals["total"] = sum(totals[k] for k in CROSSING)
        modes[mode] = dict(totals)
    where = {
        f"r{p.round} {CLIENT_NAMES[p.client]} {KINDS[p.kind]} {p.mode}": p.stages
        for p in phases
        if p.mode in TIERED and p.stages
    }
    return {
        "latency": latency,
        "modes": modes,
        "targets": targets(latency, modes, args),
        "stages": where,
    }


def per_gb(count: float, produced: float) -> float:
    return count / (produced / GB) if produced else 0.0


def per_notification(m: dict) -> float:
    """Bytes sent to the owner per batch handed over (0: none was)."""
    notifications = m.get("from_owner", 0) / ANSWER_BYTES
    return m["to_owner"] / notifications if notifications else 0.0


def targets(latency: dict, modes: dict, args) -> list[tuple[str, bool, str]]:
    """(target, met, figures) of each target the issue sets."""
    out = []
    rate_mb = args.latency_rate * args.record_size / MIB
    for client, rows in latency.items():
        p99 = rows[f"p99 ms at {args.latency_rate} rec/s"].get("local")
        if p99:
            reached = min(rows["MB/s reached in the paced phase"]["local"])
            short = f", the paced rate NOT reached ({reached:.1f} MB/s)"
            figures = f"p99 {fmean(p99):.1f} ms (worst round {max(p99):.1f})"
            figures += "" if reached >= 0.95 * rate_mb else short
            label = f"tiered local WAL p99 ≤ {P99_TARGET_MS:g} ms at {rate_mb:.0f} MB/s"
            out.append((f"{CLIENT_NAMES[client]}: {label}", fmean(p99) <= P99_TARGET_MS, figures))
    for mode in (m for m in TIERED if modes.get(m, {}).get("produced")):
        n = per_gb(modes[mode]["puts"], modes[mode]["produced"])
        label = f"{MODE_NAMES[mode]}: S3 PUTs per GB ≤ {PUTS_PER_GB_TARGET}"
        out.append((label, n <= PUTS_PER_GB_TARGET, f"{n:.0f} PUTs per GB"))
    if modes.get("s3", {}).get("produced"):
        m, per = modes["s3"], per_notification(modes["s3"])
        ok = m["client_proxy"] == 0 and 0 < per < args.record_size
        hop = f"{per:.0f} B per batch handed over" if per else "not seen"
        figures = f"client ↔ proxy across zones {m['client_proxy']:,.0f} B; owner hop {hop}"
        label = "tiered, S3 notify: zero record bytes across zones"
        out.append((label, ok, f"{figures} (one record alone is {args.record_size} B)"))
    return out


def render(run: dict, summary: dict, args) -> str:
    m, modes, ms = run["machine"], args.modes, summary["modes"]
    tiered = [x for x in modes if x in TIERED]

    def table(columns: list[str]) -> list[str]:
        names = " | ".join(MODE_NAMES[x] for x in columns)
        return [f"| | {names} |", "| --- |" + " ---: |" * len(columns)]

    def row(label: str, cell, columns=modes) -> str:
        return f"| {label} | " + " | ".join(cell(ms[x]) for x in columns) + " |"

    def share(key: str, digits: int = 4):
        return lambda x: f"{x[key] / x['produced']:.{digits}f}" if x["produced"] else "–"

    def puts(x: dict) -> str:
        kinds = (x.get(key, 0) for key in OBJECT_PUTS)
        return f"{x['puts']:,.0f} (" + " + ".join(f"{n:,.0f}" for n in kinds) + ")"

    def per_batch(x: dict) -> str:
        return fmt(per_notification(x)) if x["from_owner"] else "–"

    def gb(key: str, prefix: str = ""):
        return lambda x: f"{per_gb(x.get(prefix + key, 0), x.get(prefix + 'produced', 0)):.0f}"

    loads = [", ".join(f"{x:.2f}" for x in m[k]) for k in ("loadavg_at_start", "loadavg_at_end")]
    out = [
        "### Run",
        "",
        f"- command: `{run['command']}`",
        f"- proxy code at {run['proxy_code']}; {run['date']}",
        f"- machine: {m['nproc']} cores ({m['cpu_model']}), {m['memory_gib']} GiB, Linux "
        f"{m['kernel']}, Python {m['python']}; load average at start {loads[0]}, at end "
        f"{loads[1]}",
        f"- Kafka {run['kafka']} (3 nodes, KRaft, broker.rack zone-a/b/c, min.insync.replicas "
        f"2); MinIO {run['minio']}, the object store of every tiered mode; librdkafka "
        f"{run['librdkafka']}",
        f"- topics of {args.partitions} partitions, replication factor 3, partition p led by "
        "broker p mod 3 + 1; proxies a, b, c in zone-a, -b, -c; one metadata shard, owned "
        "by a; clients: direct, passthrough and local in zone-a (the last two through a), "
        "S3 notify in zone-b (through b), direct notify in zone-c (through c)",
        f"- {args.rounds} round(s); full-speed phases {args.records:,} records of "
        f"{args.record_size} B, paced phases {args.latency_records:,} records at "
        f"{args.latency_rate:,} rec/s ({args.latency_rate * args.record_size / MIB:.0f} MB/s); "
        "acks=all, idempotence on, client defaults otherwise"
        + (f" but {args.client_config}" if args.client_config else ""),
        "- tiering: "
        + ", ".join(f"{key} {_setting(getattr(args, key))}" for key in UPLOAD_SETTINGS)
        + f"; object store sign_payload {getattr(args, 'sign_payload', 'auto')}",
        f"- total runtime {run['runtime_s']:.0f} s",
        "",
        "Mean of the rounds (lowest–highest). MB = 2^20 bytes of record values, as Kafka's "
        "tools count.",
    ]
    for client, rows in summary["latency"].items():
        out += ["", f"#### {CLIENT_NAMES[client]}", "", *table(modes)]
        for label, values in rows.items():
            out.append(f"| {label} | " + " | ".join(cell(values[x]) for x in modes) + " |")
            direct = fmean(values["direct"]) if values.get("direct") else None
            if direct and label == "MB/s, full speed":
                cells = (f"{fmean(values[x]) / direct:.2f}" if values[x] else "–" for x in modes)
                out.append("| MB/s vs direct | " + " | ".join(cells) + " |")
            if direct and label == f"p99 ms at {args.latency_rate} rec/s":
                cells = (f"{fmean(values[x]) - direct:+.1f}" if values[x] else "–" for x in modes)
                out.append("| p99 added to direct, ms | " + " | ".join(cells) + " |")
    out += [
        "",
        "#### S3 requests",
        "",
        "GB = 10^9 bytes of record values. Requests as MinIO counted them (each attempt), "
        "once the metadata said every record of the phase was committed in objects; by "
        "kind as the proxies counted them (`tierproxy_s3wal_puts`, "
        "`tierproxy_uploader_objects`, `tierproxy_compaction_objects_written`). "
        "Compaction runs when its timer says, so its PUTs land in whichever phase runs "
        "then; MinIO's count also holds any PUT of another kind (the log cleaner's, an "
        "S3-backed WAL's).",
        "",
        *table(modes),
        row("record values produced", lambda x: f"{x['produced'] / GB:.3f} GB"),
        row("PUT requests (S3-WAL + upload + compaction)", puts),
        row("**PUTs per GB**", lambda x: f"**{per_gb(x['puts'], x['produced']):.0f}**"),
        row("S3-WAL PUTs per GB", gb("s3wal_objects")),
        row("upload PUTs per GB", gb("upload_objects")),
        row("compaction PUTs per GB", gb("compaction_objects")),
        row("GETs per GB", gb("gets")),
        row("bytes into S3 per produced byte", share("s3_in", 2)),
        row("bytes out of S3 per produced byte", share("s3_out", 2)),
        "",
        "PUTs per GB by phase (S3-WAL + upload; compaction's aside):",
        "",
        *table(tiered),
    ]
    for client, (kind, what) in itertools.product(args.clients, KINDS.items()):
        prefix = f"{client} {kind} "
        split = lambda x, k=prefix: f"{gb('s3wal_objects', k)(x)} + {gb('upload_objects', k)(x)}"  # noqa: E731
        out.append(row(f"{CLIENT_NAMES[client]}, {what}", split, tiered))
    if not run["proxies_export_store_metrics"]:
        note = "the proxies' /metrics have no `tierproxy_object_store_*`, `tierproxy_s3wal_*`"
        out += ["", f"({note}: not on the proxy's registry; MinIO's counts are the ones)"]
    out += [
        "",
        "#### Cross-zone bytes per produced byte",
        "",
        "Client ↔ proxy and proxy ↔ brokers: the proxies' `tierproxy_zone_bytes` (direct: "
        "the .log bytes of the partitions led from another zone than the client's). Owner "
        "hop: bytes both ways on the non-owners' connections to the owner's peer port, as "
        "the kernel counted them (`ss`). Replication: the topic's followers' .log bytes. "
        "Metadata: estimated from the metadata topic's growth (written by the owner, copied "
        "by two followers, read by three proxies). S3 traffic is in-region, not counted.",
        "",
        *table(modes),
        row("client ↔ proxy", share("client_proxy")),
        row("client/proxy ↔ brokers", share("to_brokers")),
        row("proxy ↔ owner (sockets)", share("owner_hop")),
        row("proxy ↔ owner (`tierproxy_peer_bytes`)", share("owner_hop_counted")),
        row("replication", share("replication")),
        row("metadata topic", share("metadata")),
        row("**total**", lambda x: f"**{x['total'] / x['produced']:.3f}**"),
        row("owner hop: bytes per batch handed over", per_batch),
        "",
        "#### Targets",
        "",
        *(
            f"- {label}: {fig}: {'met' if ok else 'NOT met'}"
            for label, ok, fig in summary["targets"]
        ),
        "",
        "#### CPU s per GiB of record values",
        "",
        *table(modes),
    ]
    for who in ("proxy a", "proxy b", "proxy c", "minio", "brokers", "client"):
        out.append(row(who, lambda x, w=who: f"{x[f'cpu {w}'] / (x['produced'] / GIB):.1f}"))
    out.append(row("machine busy (cores)", lambda x: f"{x['busy_cores'] / x['phases']:.2f}"))
    if summary.get("stages"):
        out += ["", "#### Where the time goes (tierproxy_stage_seconds, per phase)", ""]
        out += stages.table(summary["stages"])
    problems = run["warnings"] + run["proxy_log_problems"][:20]
    if problems:
        out += ["", "#### Warnings", "", "```", *problems, "```"]
    return "\n".join(out)


# -- the run ---------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add = parser.add_argument
    add("--records", type=int, default=200_000, help="per full-speed phase (default 200000)")
    add("--latency-records", type=int, default=200_000, help="per paced phase (default 200000)")
    add("--latency-rate", type=int, default=20_480, help="records/s when paced (20 MB/s)")
    add("--warmup-records", type=int, default=50_000, help="per mode and client, unmeasured")
    add("--record-size", type=int, default=1024)
    add("--rounds", type=int, default=2, help="the modes' order flips each round")
    add("--partitions", type=int, default=6)
    add("--clients", default=",".join(CLIENTS), help="subset of java,librdkafka")
    add("--modes", default=",".join(MODES), help=f"subset of {','.join(MODES)}")
    more = "a producer setting for every client and mode (batch.size=262144); repeatable"
    add("--client-config", action="append", default=[], metavar="KEY=VALUE", help=more)
    for key in UPLOAD_SETTINGS:  # the proxies' tiering settings, their defaults by default
        default = getattr(TieringConfig(), key)
        kind = _yes if isinstance(default, bool) else type(default)
        add(f"--{key.replace('_', '-')}", type=kind, default=default)
    more = "the object store's sign_payload (auto: over http, which MinIO here is)"
    add("--sign-payload", choices=("auto", "true", "false"), default="auto", help=more)
    add("--json", type=Path, help="also write every phase's figures here")
    args = parser.parse_args(argv)
    args.clients = [c for c in args.clients.split(",") if c]
    args.modes = [m for m in MODES if m in args.modes.split(",")]
    if not args.clients or not set(args.clients) <= set(CLIENTS):
        parser.error(f"--clients: choose among {', '.join(CLIENTS)}")
    if not args.modes:
        parser.error(f"--modes: choose among {', '.join(MODES)}")
    pairs = [item.partition("=") for item in args.client_config]
    if any(not key or not sep for key, sep, _ in pairs):
        parser.error("--client-config takes KEY=VALUE")
    args.client_config = {key: value for key, _, value in pairs}
    return args


def start_fleet(
    stack: ExitStack, work_dir: Path, run_id: str, args, name: str
) -> tuple[KafkaCluster, MinioServer, Cluster, TieredFleet]:
    """Kafka (3 nodes, racks zone-a/b/c), MinIO and the three proxies, started; `stack`
    stops them. `name` names the Kafka and MinIO processes (kafka-NAME, minio-NAME)."""
    print("starting Kafka (3 nodes, racks zone-a/b/c) and MinIO...", flush=True)
    extra = {"file.delete.delay.ms": "1000", "min.insync.replicas": "2"}
    kafka = KafkaCluster(size=3, racks=list(ZONES), name=f"kafka-{name}", extra_config=extra)
    stack.callback(kafka.stop)
    kafka.start()
    minio = MinioServer(base_dir=work_dir / "minio", name=f"minio-{name}")
    minio.process.env["MINIO_PROMETHEUS_AUTH_TYPE"] = "public"  # its request counts
    stack.callback(minio.stop)
    minio.start()
    cluster = Cluster(kafka)
    stack.callback(cluster.close)
    print("starting the proxies: a, then b and c once a owns the metadata shard...")
    fleet = TieredFleet(kafka, minio, work_dir, run_id, args)
    stack.callback(fleet.stop)
    fleet.start()
    return kafka, minio, cluster, fleet


def _setting(value: object) -> str:
    return str(value).lower() if isinstance(value, bool) else f"{value:,}"


def _yes(value: str) -> bool:
    """A boolean setting's value: true/false (argparse's bool() takes any word as true)."""
    if value.lower() not in ("true", "false"):
        raise argparse.ArgumentTypeError(f"{value!r}: true or false")
    return value.lower() == "true"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.monotonic()
    stop_on_signals()
    machine = machine_description()
    run_id = os.urandom(3).hex()
    with tempfile.TemporaryDirectory(prefix="tierproxy-tiered-") as tmp, ExitStack() as stack:
        kafka, minio, cluster, fleet = start_fleet(stack, Path(tmp), run_id, args, "tiered")
        proxy_code = git_state()  # what the proxies have just loaded
        bench = Bench(args, kafka, cluster, minio, fleet)
        bench.warm_up()
        for rnd in range(args.rounds):
            print(f"round {rnd + 1} of {args.rounds}", flush=True)
            bench.run_round(rnd)
        exported = scrape(fleet.owner.metrics_url, ("tierproxy_object_store", "tierproxy_s3wal"))
        at_end = machine | {"loadavg_at_end": os.getloadavg()}
        run = run_facts(args, proxy_code, at_end, minio=True) | {
            "proxies_export_store_metrics": bool(exported),
            "warnings": bench.warnings,
            "proxy_log_problems": fleet.problems()[:50],
        }
    run["runtime_s"] = time.monotonic() - started  # with the shutdown
    summary = summarize(bench.phases, args)
    phases = [asdict(p) for p in bench.phases]
    return publish(run, summary, render(run, summary, args), args.json, phases=phases)


if __name__ == "__main__":
    run_main(main)
