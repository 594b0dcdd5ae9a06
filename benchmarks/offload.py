"""Offload benchmark: the migration job's MB/s at local[1] and local[2], against a raw copy
of the same bytes to MinIO at the same parallelism, in one run.

    .venv/bin/python -m benchmarks.offload [--bytes 2000000000] [--partitions 12]
        [--cluster] [--json out.json]

One Kafka broker (its log directory holds every partition), one MinIO, one
`tierproxy run` with tiering on MinIO (the shard owner the job commits through). Per
parallelism N in 1, 2: a topic of `--bytes` of 1 KiB records (`--partitions`, written
direct to Kafka with librdkafka, idempotent, acks=all), tiered at its end, so all of it
is below the cutover; then

- `raw copy`: every .log file of the topic's partitions PUT to MinIO as it is, by N
  processes (each its own S3Store, one file at a time): the physical limit here, the
  same bytes read from the same page cache into the same server;
- `migrate`: `offload_jobs.migrate.migrate` on a SparkSession of master local[N]
  (tasks read the segments byte-exact, cut ~64 MiB stream objects, PUT them; the driver
  commits them through the proxy), timed from the job's start to its last commit.
  With `--cluster` the job runs on a Spark standalone cluster of N one-core workers
  (`proxy.devstack.SparkCluster`, started for each N) instead of local[N]: the scaling
  figure of a real cluster, executors in processes of their own.

MB = 2^20 bytes of segment data (.log bytes for the copy, record batch bytes for the
job). Markdown on stdout; `--json` has it all.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from confluent_kafka.admin import AdminClient, NewTopic

from benchmarks.common.clients import MIB, librdkafka_produce
from benchmarks.common.procs import ProxyProcess, machine_description, tierproxy_argv, wait_idle
from benchmarks.common.run import command_line, git_state
from offload_jobs.migrate import MigrateJob, StoreSpec, migrate
from proxy.devstack import KafkaCluster, MinioServer, versions
from proxy.devstack.paths import free_port
from proxy.devstack.spark import spark_session
from proxy.devstack.sparkcluster import SparkCluster
from proxy.objects.s3 import S3Store
from proxy.objects.s3config import S3Config

GB = 10**9
PARALLELISM = (1, 2)
SHARDS = 2
TARGET_SHARE = 0.7  # migrate MB/s at local[2], of the raw copy's


@dataclass
class Result:
    parallelism: int
    copy_bytes: int
    copy_s: float
    copy_files: int
    migrate_bytes: int
    migrate_s: float
    objects: int
    batches: int
    records: int

    @property
    def copy_mb_s(self) -> float:
        return self.copy_bytes / MIB / self.copy_s

    @property
    def migrate_mb_s(self) -> float:
        return self.migrate_bytes / MIB / self.migrate_s


def s3_fields(minio: MinioServer) -> dict:
    kwargs = minio.client_kwargs()
    return {
        "bucket": minio.bucket,
        "endpoint_url": kwargs["endpoint_url"],
        "region": kwargs["region_name"],
        "access_key_id": kwargs["aws_access_key_id"],
        "secret_access_key": kwargs["aws_secret_access_key"],
        "path_style": True,
    }


def _copy_files(args: tuple[dict, list[str], str]) -> int:
    """One raw-copy worker: PUT each file under `prefix` as it is; the bytes put."""
    fields, paths, prefix = args

    async def run() -> int:
        store = await S3Store.open(S3Config(**fields))
        done = 0
        try:
            for path in paths:
                data = await asyncio.to_thread(Path(path).read_bytes)
                await store.put(f"{prefix}{Path(path).parent.name}/{Path(path).name}", data)
                done += len(data)
        finally:
            await store.close()
        return done

    return asyncio.run(run())


def raw_copy(fields: dict, files: list[Path], workers: int, prefix: str) -> tuple[int, float]:
    """(bytes, seconds) of PUTting `files` with `workers` processes, files dealt round."""
    shares = [[str(f) for f in files[i::workers]] for i in range(workers)]
    context = multiprocessing.get_context("spawn")
    with context.Pool(workers) as pool:
        started = time.monotonic()
        done = pool.map(_copy_files, [(fields, share, prefix) for share in shares])
        return sum(done), time.monotonic() - started


def create_and_fill(kafka: KafkaCluster, topic: str, args) -> None:
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap})
    admin.create_topics([NewTopic(topic, args.partitions, 1)])[topic].result(60)
    records = args.bytes // args.record_size
    result = librdkafka_produce(kafka.bootstrap, topic, records, args.record_size)
    print(f"  wrote {topic}: {records:,} records at {result.mb_per_s:.1f} MB/s", flush=True)


def tier(proxy_peer: str, topic: str) -> None:
    argv = [*tierproxy_argv(), "topics", "tier", topic, "--peer", proxy_peer]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise RuntimeError(f"tier {topic}: {done.stdout}{done.stderr}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bytes", type=int, default=2 * GB, help="record values per topic")
    parser.add_argument("--record-size", type=int, default=1024)
    parser.add_argument("--partitions", type=int, default=12)
    parser.add_argument(
        "--cluster", action="store_true", help="a standalone cluster of N workers, not local[N]"
    )
    parser.add_argument("--json", type=Path)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="tierproxy-bench-offload-"))
    run_id = f"off-{int(time.time()) % 100000}"
    machine = machine_description()
    print("starting Kafka (1 node), MinIO, a proxy...", flush=True)
    results: list[Result] = []
    with (
        KafkaCluster(size=1, name="bench-offload") as kafka,
        MinioServer(name="bench-offload") as minio,
    ):
        fields = s3_fields(minio)
        peer_port = free_port()
        tiering = {
            "metadata_topic": f"__{run_id}_meta",
            "shard_count": SHARDS,
            "peer_bind_host": "127.0.0.1",
            "peer_port": peer_port,
            "object_store": {"kind": "s3", **fields},
            "wal": {"directory": str(work / "wal")},
        }
        settings = {"fleet": {"name": "a", "zone": "zone-a", "topic": f"__{run_id}_fleet"}}
        settings["tiering"] = tiering
        proxy = ProxyProcess(kafka.bootstrap, [1], work, name="a", settings=settings).start(180)
        try:
            log_dir = Path(kafka.nodes[0].data_dir) / "logs"
            for n in PARALLELISM:
                topic = f"{run_id}-local{n}"
                create_and_fill(kafka, topic, args)
                tier(f"127.0.0.1:{peer_port}", topic)
                time.sleep(2.0)  # the owner writes the cutovers
                files = sorted(log_dir.glob(f"{topic}-*/*.log"))
                wait_idle([proxy.pid])
                copied, copy_s = raw_copy(fields, files, n, f"rawcopy/{topic}/")
                print(f"  raw copy x{n}: {copied / MIB / copy_s:.1f} MB/s", flush=True)
                wait_idle([proxy.pid])
                job = MigrateJob(
                    topic=topic,
                    bootstrap=kafka.bootstrap,
                    metadata_topic=tiering["metadata_topic"],
                    shard_count=SHARDS,
                    store=StoreSpec("s3", s3=fields | {"max_attempts": 5}),
                    peer=("127.0.0.1", peer_port),
                    segment_dirs=(str(log_dir),),
                )
                cluster = None
                if args.cluster:
                    cluster = SparkCluster(work / f"spark-{n}", workers=n, cores=1).start()
                master = cluster.master_url if cluster is not None else f"local[{n}]"
                try:
                    spark = spark_session(f"bench-offload-{n}", master=master)
                    try:
                        summary = migrate(spark, job, progress=lambda line: None)
                    finally:
                        spark.stop()
                finally:
                    if cluster is not None:
                        cluster.stop()
                if not summary.ok or summary.committed != summary.objects:
                    raise RuntimeError(f"migration of {topic} failed: {summary.line()}")
                result = Result(
                    n,
                    copied,
                    copy_s,
                    len(files),
                    summary.record_bytes,
                    summary.seconds,
                    summary.objects,
                    summary.batches,
                    summary.records,
                )
                print(f"  migrate {label(n, args)}: {result.migrate_mb_s:.1f} MB/s", flush=True)
                results.append(result)
        finally:
            proxy.stop()
    run = {
        "command": command_line(),
        "date": time.strftime("%Y-%m-%d %H:%M %Z"),
        "proxy_code": git_state(),
        "machine": machine,
        "kafka": versions()["KAFKA_VERSION"],
        "minio": versions()["MINIO_VERSION"],
        "runtime_s": time.monotonic() - started,
        "loadavg_at_end": os.getloadavg(),
    }
    print()
    print(render(run, results, args))
    if args.json:
        out = {"run": run, "results": [asdict(r) for r in results]}
        args.json.write_text(json.dumps(out, indent=2, default=str))
    return 0


def label(n: int, args) -> str:
    return f"cluster of {n} worker{'s' if n > 1 else ''}" if args.cluster else f"local[{n}]"


def render(run: dict, results: list[Result], args) -> str:
    m = run["machine"]
    by = {r.parallelism: r for r in results}
    lines = [
        "### Run",
        "",
        f"- command: `{run['command']}`",
        f"- code at {run['proxy_code']}; {run['date']}; total runtime {run['runtime_s']:.0f} s",
        f"- machine: {m['nproc']} cores, {m['memory_gib']} GiB, Python {m['python']}; load "
        f"average {', '.join(f'{x:.1f}' for x in m['loadavg_at_start'])} at the start, "
        f"{', '.join(f'{x:.1f}' for x in run['loadavg_at_end'])} at the end",
        f"- Kafka {run['kafka']} (1 node), MinIO {run['minio']}; per parallelism a topic of "
        f"{args.bytes / GB:.2f} GB of {args.record_size} B records, {args.partitions} "
        "partitions, all below the cutover; the job on "
        + ("a Spark standalone cluster of N one-core workers" if args.cluster else "local[N]"),
        "",
        "| | raw copy MB/s | migrate MB/s | migrate / raw copy | objects | batches |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for n, r in sorted(by.items()):
        lines.append(
            f"| {label(n, args)} | {r.copy_mb_s:.1f} | {r.migrate_mb_s:.1f} | "
            f"{r.migrate_mb_s / r.copy_mb_s:.2f} | {r.objects} | {r.batches:,} |"
        )
    if 1 in by and 2 in by:
        one, two = by[1], by[2]
        share = two.migrate_mb_s / two.copy_mb_s
        lines += [
            "",
            f"- scaling {label(1, args)} -> {label(2, args)}: migrate "
            f"{two.migrate_mb_s / one.migrate_mb_s:.2f}x, "
            f"raw copy {two.copy_mb_s / one.copy_mb_s:.2f}x",
            f"- target: migrate at {label(2, args)} >= {TARGET_SHARE:.0%} of the raw copy: "
            f"{share:.0%}: " + ("met" if share >= TARGET_SHARE else "NOT met"),
        ]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
