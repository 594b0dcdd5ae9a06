"""Export benchmark: a topic exported to Parquet files and appended to an Iceberg table,
both in MinIO, on the same Spark (local[N]), in one run.

    .venv/bin/python -m benchmarks.offload_export [--bytes 500000000] [--partitions 4]
        [--master local[2]] [--json out.json]

One Kafka broker, one MinIO. A topic of `--bytes` of 1 KiB records (`--partitions`,
librdkafka, idempotent, acks=all, uncompressed: the benchmark's values repeat, so a
codec would shrink the bytes read to nothing), then, each on a Spark session of its own:

- `parquet`: `offload_jobs.export.export` from Kafka to s3://BUCKET/parquet/;
- `iceberg`: `offload_jobs.export_iceberg.export_iceberg` from Kafka to a new table
  (SQLite catalog in the run's folder, warehouse s3://BUCKET/iceberg/): Spark tasks write
  the data files, the driver commits one snapshot; timed to the commit's end.

Both read the same batches with the same reader and decode them with the same decoder;
what differs is the writer (pyarrow's Parquet file per day vs pyiceberg's, with field
ids and column statistics) and the Iceberg commit. MB = 2^20 bytes of record batches
read (about the records' size, uncompressed); also thousands of records a second.
Markdown on stdout; `--json` has it all.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from confluent_kafka.admin import AdminClient, NewTopic

from benchmarks.common.clients import MIB, librdkafka_produce
from benchmarks.common.procs import machine_description
from benchmarks.common.run import git_state, run_facts, write_json
from benchmarks.offload import s3_fields
from offload_jobs.export import ExportJob, export
from offload_jobs.export_iceberg import export_iceberg
from offload_jobs.iceberg_table import CatalogSpec, s3_io
from proxy.devstack import KafkaCluster, MinioServer
from proxy.devstack.spark import spark_session

GB = 10**9


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    settings = (
        ("--bytes", int, GB // 2), ("--record-size", int, 1024), ("--partitions", int, 4),
        ("--master", str, "local[2]"),
    )  # fmt: skip
    for flag, kind, default in settings:
        parser.add_argument(flag, type=kind, default=default)
    parser.add_argument("--json", type=Path)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="tierproxy-bench-export-"))
    topic = f"export-{int(time.time()) % 100000}"
    results: dict[str, dict] = {}
    print("starting Kafka (1 node), MinIO...", flush=True)
    with KafkaCluster(size=1, name="bench-export") as kafka, MinioServer(name="bench-export") as m:
        fields = s3_fields(m)
        admin = AdminClient({"bootstrap.servers": kafka.bootstrap})
        admin.create_topics([NewTopic(topic, args.partitions, 1)])[topic].result(60)
        records = args.bytes // args.record_size
        produced = librdkafka_produce(
            kafka.bootstrap, topic, records, args.record_size, settings={"compression.type": "none"}
        )
        print(f"  wrote {topic}: {records:,} records at {produced.mb_per_s:.1f} MB/s", flush=True)
        for kind in ("parquet", "iceberg"):
            spark = spark_session(f"bench-export-{kind}", master=args.master)
            try:
                if kind == "parquet":
                    job = ExportJob(topic, kafka.bootstrap, f"s3://{m.bucket}/parquet", s3=fields)
                    summary = export(spark, job, progress=lambda _: None)
                else:
                    job = ExportJob(topic, kafka.bootstrap, "")
                    spec = CatalogSpec(str(work / "catalog.db"), f"bench.{topic}",
                                       f"s3://{m.bucket}/iceberg", s3_io(fields))  # fmt: skip
                    summary = export_iceberg(spark, job, spec, progress=lambda _: None)
            finally:
                spark.stop()
            if not summary.ok:
                raise RuntimeError(f"{kind} export failed: {summary.line()}")
            results[kind] = {
                "bytes": summary.bytes, "seconds": summary.seconds, "records": summary.records,
                "files": summary.files, "mb_s": summary.bytes / MIB / summary.seconds,
                "krecords_s": summary.records / 1000 / summary.seconds,
            }  # fmt: skip
            print(f"  {kind}: {results[kind]['mb_s']:.1f} MB/s", flush=True)
    run = run_facts(args, git_state(), machine_description(), minio=True)
    run["runtime_s"] = time.monotonic() - started
    print()
    print(render(run, results, args))
    write_json(args.json, {"run": run, "results": results})
    return 0


def render(run: dict, results: dict[str, dict], args) -> str:
    m = run["machine"]
    lines = [
        "### Run",
        "",
        f"- command: `{run['command']}`",
        f"- code at {run['proxy_code']}; {run['date']}; total runtime {run['runtime_s']:.0f} s",
        f"- machine: {m['nproc']} cores, {m['memory_gib']} GiB, Python {m['python']}",
        f"- Kafka {run['kafka']} (1 node), MinIO {run['minio']}; a topic of "
        f"{args.bytes / GB:.2f} GB of {args.record_size} B records (uncompressed), "
        f"{args.partitions} partitions; Spark {args.master}",
        "",
        "| to | MB/s | k records/s | records | files | seconds |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for kind, r in results.items():
        lines.append(
            f"| {kind} | {r['mb_s']:.1f} | {r['krecords_s']:.1f} | {r['records']:,} | "
            f"{r['files']} | {r['seconds']:.1f} |"
        )
    if len(results) == 2:
        share = results["iceberg"]["mb_s"] / results["parquet"]["mb_s"]
        lines += ["", f"- Iceberg / Parquet: {share:.2f}"]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
