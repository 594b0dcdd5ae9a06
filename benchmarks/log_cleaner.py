"""Log cleaner benchmark: the proxy's cleaner of a compacted tiered topic against Kafka's
own cleaner on the same records, in one run (issue 20; docs/tiering.md "Compacted topics").

    .venv/bin/python -m benchmarks.log_cleaner [--mib 64] [--keys 8192] [--record-size 1024]
        [--spark local[1]|local[2]] [--json out.json]

One Kafka broker of its own (Kafka's cleaner reports its work in the broker's log, at
INFO; `log.cleaner.backoff.ms=1000`) and one proxy in this process, with a local object
store (the bytes are counted at the store's port: what S3 would be asked for). Two
compacted one-partition topics (`segment.bytes` 1 MiB, `segment.ms` 2 s,
`min.cleanable.dirty.ratio` 0.01), a passthrough one and a tiered one, get the same
records: `--mib` MiB of values of `--record-size` bytes, keys drawn (seeded) among
`--keys`, uncompressed, librdkafka idempotent. Then:

- **Kafka**: a record written after `segment.ms` rolls the active segment; the run waits
  until Kafka's cleaner has cleaned up to it and sums its report lines for the topic
  ("N MB of log processed in S seconds"): one cleaner thread, one core at most.
- **proxy**: the tiered topic uploaded whole, one pass of its cleaner
  (`LogCleaner.run_once`) on the proxy's event loop, timed: wall time and the loop
  thread's CPU time (the clean runs there: decoding, offset map, re-encoding, store
  calls); the bytes the store was asked for (GETs) and given (PUTs); the metadata
  records its commit wrote and the committed ranges before and after (the shard's state
  machine load). "Per GB cleaned" is per GB of the stream's objects before the clean.
- **proxy, `--spark MASTER`** instead: the clean job (`tierproxy clean`,
  offload_jobs/clean.py) on a local Spark session of that master, its objects of
  `--object-mib` MiB of input, committed through the proxy: wall time, MB of input per
  second and per core (the master's thread count), the bytes the tasks read from the
  store (a Spark accumulator: every pass) and the bytes of the objects they wrote.

MB = 2^20 bytes (Kafka's cleaner counts so). Markdown on stdout; `--json` has it all.
"""

from __future__ import annotations

import argparse
import random
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from benchmarks.common.procs import machine_description
from benchmarks.common.run import git_state, run_facts, write_json
from proxy.config import parse_config
from proxy.devstack import KafkaCluster
from proxy.devstack.paths import free_port, free_port_block
from proxy.devstack.proxy_thread import ProxyThread
from proxy.metadata.streams import stream_id

MIB = 1 << 20
TOPIC_CONFIG = {
    "cleanup.policy": "compact",
    "segment.bytes": str(MIB),
    "segment.ms": "2000",
    "min.cleanable.dirty.ratio": "0.01",
}
_PROCESSED = re.compile(r"([\d,.]+) MB of log processed in ([\d,.]+) seconds")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for flag, default in (("--mib", 64), ("--keys", 8192), ("--record-size", 1024)):
        parser.add_argument(flag, type=int, default=default)
    parser.add_argument("--spark", metavar="MASTER", help="local[1] or local[2]: the clean job")
    parser.add_argument("--object-mib", type=int, default=64, help="--spark: object input, MiB")
    parser.add_argument("--json", type=Path)
    return parser.parse_args(argv)


def _produce(bootstrap: str, topic: str, args: argparse.Namespace, last: bool = False) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True,
                         "linger.ms": 20, "compression.type": "none"})  # fmt: skip
    draw = random.Random(20)
    count = 1 if last else args.mib * MIB // args.record_size
    for n in range(count):
        key = b"roll" if last else b"k%d" % draw.randrange(args.keys)
        value = (b"%d:" % n).ljust(args.record_size, b"v")
        while True:
            try:
                producer.produce(topic, value, key, partition=0)
                break
            except BufferError:
                producer.poll(0.05)
        producer.poll(0)
    assert producer.flush(120) == 0


def _kafka_cleaned(kafka: KafkaCluster, topic: str, end: int) -> list[tuple[float, float]] | None:
    """Kafka's cleaner reports for `topic` (MB, seconds), once one reached `end`."""
    text = "".join(path.read_text(errors="replace") for path in kafka.log_files())
    reports, reached = [], False
    marker = f"cleaned log {topic}-0 (dirty section = ["
    for at in (m.start() for m in re.finditer(re.escape(marker), text)):
        section = text[at + len(marker) : text.index("]", at)]
        reached = reached or int(section.split(",")[1]) >= end
        found = _PROCESSED.search(text, at)
        if found:
            reports.append(tuple(float(g.replace(",", "")) for g in found.groups()))
    return reports if reached else None


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="tierproxy-bench-cleaner-"))
    suffix = str(int(time.time()) % 100000)
    plain, tiered = f"clean-kafka-{suffix}", f"clean-tiered-{suffix}"
    out = run_facts(args, git_state(), machine_description(), minio=False)
    print("starting Kafka (1 node) and a proxy...", flush=True)
    extra = {"log.cleaner.backoff.ms": "1000"}
    with KafkaCluster(size=1, name="bench-cleaner", extra_config=extra) as kafka:
        admin = AdminClient({"bootstrap.servers": kafka.bootstrap})
        for topic in (plain, tiered):
            admin.create_topics([NewTopic(topic, 1, 1, config=TOPIC_CONFIG)])[topic].result(60)
        config = {
            "upstream": {"bootstrap": kafka.bootstrap},
            "listeners": {"bootstrap_port": free_port(), "broker_port_base": free_port_block(8)},
            "fleet": {"name": "bench", "zone": "zone-a", "topic": f"fleet-{suffix}"},
            "tiering": {
                "metadata_topic": f"meta-{suffix}", "shard_count": 1,
                "wal": {"directory": str(work / "wal")},
                "object_store": {"directory": str(work / "objects")},
                "upload_interval_s": 0.2, "log_cleaner_interval_s": 3600,
            },
        }  # fmt: skip
        with ProxyThread(parse_config(config)) as proxy:
            tiering = proxy.proxy.tiering
            peer = f"127.0.0.1:{tiering.peer_port}"
            tier = [sys.executable, "-m", "proxy.cli", "topics", "tier", tiered, "--peer", peer]
            while tiering.assignment.owner(0) is None:
                time.sleep(0.1)
            subprocess.run(tier, check=True, capture_output=True, timeout=120)
            while (found := tiering.topics.topic(tiered)) is None:
                time.sleep(0.1)
            stream = stream_id(found.topic_id, 0)
            while tiering.partitions.get(stream) is None:
                time.sleep(0.1)
            began = time.monotonic()
            _produce(kafka.bootstrap, plain, args)
            _produce(proxy.bootstrap, tiered, args)
            print(f"  wrote {args.mib} MiB to each in {time.monotonic() - began:.0f} s", flush=True)
            time.sleep(2.5)  # Kafka rolls its active segment on an append after segment.ms
            _produce(kafka.bootstrap, plain, args, last=True)
            _produce(proxy.bootstrap, tiered, args, last=True)
            end = args.mib * MIB // args.record_size
            proxy.run(lambda: tiering.uploader.flush())
            state = tiering.state(stream)
            while state.stream_end(stream) < end + 1:
                time.sleep(0.1)
            if args.spark:
                out["proxy"] = _spark_clean(args, kafka.bootstrap, tiering, tiered, stream)
            else:
                out["proxy"] = _proxy_clean(proxy, tiering, stream)
            print(f"  proxy: {out['proxy']}", flush=True)
            deadline = time.monotonic() + 600
            while (reports := _kafka_cleaned(kafka, plain, end)) is None:
                assert time.monotonic() < deadline, "Kafka's cleaner did not reach the end"
                time.sleep(1)
            mb, seconds = sum(r[0] for r in reports), sum(r[1] for r in reports)
            out["kafka"] = {"cleans": len(reports), "mb_processed": mb, "seconds": seconds,
                            "mb_per_s": mb / seconds if seconds else None}  # fmt: skip
    _report(out)
    write_json(args.json, out)
    return 0


def _proxy_clean(proxy: ProxyThread, tiering, stream: int) -> dict:
    store, cleaner = tiering.store, tiering.log_cleaner
    state = tiering.state(stream)
    before = state.committed_ranges(stream)
    # the input: the stream's objects as committed (one stream tiered: all theirs)
    cleaned_gb = sum({r.object_id: r.object_size for r in before}.values()) / 1e9
    gets: list[int] = []
    plain_get = store.get

    async def counted_get(key, start=None, end=None):
        data = await plain_get(key, start, end)
        gets.append(len(data))
        return data

    store.get = counted_get  # the benchmark counts what the clean asks of the store

    async def timed():
        cpu, wall = time.thread_time(), time.perf_counter()
        report = await cleaner.run_once(refresh_configs=True)
        return report, time.thread_time() - cpu, time.perf_counter() - wall

    try:
        report, cpu, wall = proxy.run(timed, timeout=1800)
    finally:
        store.get = plain_get
    assert stream in report.cleaned, report
    read, written = sum(gets), cleaner.stats.bytes_written
    return {
        "records_read": report.records_read, "records_kept": report.records_kept,
        "bytes_read": read, "bytes_written": written, "wall_s": wall, "cpu_s": cpu,
        "mb_per_cpu_s": read / MIB / cpu, "mb_per_s": read / MIB / wall,
        "input_bytes": cleaned_gb * 1e9, "read_per_gb": read / cleaned_gb,
        "written_per_gb": written / cleaned_gb,
        "commits": report.objects_written, "ranges_before": len(before),
        "ranges_after": len(state.committed_ranges(stream)),
    }  # fmt: skip


def _spark_clean(args: argparse.Namespace, bootstrap: str, tiering, topic: str, stream: int):
    from offload_jobs.clean import CleanJob, clean
    from offload_jobs.migrate import StoreSpec
    from proxy.devstack.spark import local_spark

    config, state = tiering.config, tiering.state(stream)
    before = state.committed_ranges(stream)
    cleaned_gb = sum({r.object_id: r.object_size for r in before}.values()) / 1e9
    job = CleanJob(
        topic=topic,
        bootstrap=bootstrap,
        metadata_topic=config.metadata_topic,
        shard_count=config.shard_count,
        store=StoreSpec.from_settings(config.object_store),
        peer=("127.0.0.1", tiering.peer_port),
        target_object_bytes=args.object_mib * MIB,
        object_format_version=config.object_format_version,
    )
    cores = int(args.spark.removeprefix("local[").removesuffix("]") or 1)
    with local_spark(None, "bench-cleaner", args.spark) as spark:
        spark.sparkContext.parallelize([0], 1).count()  # the workers up before the clock
        wall = time.perf_counter()
        summary = clean(spark, job, progress=lambda line: print(f"  {line}", flush=True))
        wall = time.perf_counter() - wall
    assert summary.ok and summary.committed_streams == 1, summary.line()
    read = summary.store_read
    return {
        "master": args.spark, "cores": cores,
        "records_read": summary.records_read, "records_kept": summary.records_kept,
        "bytes_read": read, "bytes_written": summary.store_written, "wall_s": wall,
        "cpu_s": None, "mb_per_s": summary.input_bytes / MIB / wall,
        "mb_per_core_s": summary.input_bytes / MIB / wall / cores,
        "mb_per_cpu_s": summary.input_bytes / MIB / wall / cores,
        "input_bytes": cleaned_gb * 1e9, "read_per_gb": read / cleaned_gb,
        "written_per_gb": summary.store_written / cleaned_gb,
        "commits": summary.objects, "ranges_before": len(before),
        "ranges_after": len(state.committed_ranges(stream)),
    }  # fmt: skip


def _report(out: dict) -> None:
    p, k = out["proxy"], out["kafka"]
    print(f"\n## Log cleaner: proxy vs Kafka ({out['date']}, code {out['proxy_code']})\n")
    print("| | MB read | s | MB/s | MB per CPU s |")
    print("|---|---|---|---|---|")
    print(f"| Kafka's cleaner ({k['cleans']} cleans) | {k['mb_processed']:.1f} | "
          f"{k['seconds']:.1f} | {k['mb_per_s'] or 0:.1f} | (one thread) |")  # fmt: skip
    what = f"clean job, Spark {p['master']}" if "master" in p else "proxy, one pass"
    per_cpu = "MB per core s" if "master" in p else "MB per CPU s"
    print(f"| {what} | {p['bytes_read'] / MIB:.1f} | {p['wall_s']:.1f} | "
          f"{p['mb_per_s']:.1f} | {p['mb_per_cpu_s']:.1f} ({per_cpu}) |")  # fmt: skip
    print(
        f"\nproxy: {p['records_read']:,} records read, {p['records_kept']:,} kept; store "
        f"bytes per GB cleaned: {p['read_per_gb'] / 1e9:.2f} GB read, "
        f"{p['written_per_gb'] / 1e9:.3f} GB written; metadata: {p['commits']} object "
        f"commits, committed ranges {p['ranges_before']} -> {p['ranges_after']}"
    )


if __name__ == "__main__":
    sys.exit(main())
