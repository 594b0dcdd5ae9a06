"""`tierproxy verify` and `tierproxy export`, and the same jobs under spark-submit:

    spark-submit ... offload_jobs/report_cli.py verify TOPIC --config ...
    spark-submit ... offload_jobs/report_cli.py export TOPIC --config ... --to s3://bucket/prefix

with the options of docs/offload.md ("On a Spark cluster": the zip of `make offload-zip`
and the Pythons of the workers and of the driver).

Settings come from a proxy's YAML (`--config`): the upstream bootstrap, the metadata
topic, the shard count and the object store (whose S3 endpoint and credentials an
s3:// export destination uses). Exit codes: 0 verified / exported, 1 a mismatch or a
partition that failed, 2 bad settings.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def add_parsers(commands) -> None:
    """The `verify` and `export` subcommands of `tierproxy` (argparse subparsers)."""
    text = "compare a tiered topic's objects with Kafka's log, batch by batch"
    verify = commands.add_parser("verify", help=text, description=text)
    _common(verify)
    verify.add_argument("--json", type=Path, default=None, help="also write the report here")
    verify.set_defaults(func=run_verify)
    text = (
        "write a topic's records as Parquet (topic/partition/date directories), or append "
        "what is new to an Iceberg table"
    )
    export = commands.add_parser("export", help=text, description=text)
    _common(export)
    target = export.add_mutually_exclusive_group(required=True)
    target.add_argument("--to", help="Parquet: a local directory or s3://bucket/prefix")
    target.add_argument(
        "--iceberg", metavar="NAMESPACE.TABLE",
        help="append to this Iceberg table (created on the first run; a name alone is in "
        "namespace 'kafka'): what is new since its last snapshot, exactly once",
    )  # fmt: skip
    export.add_argument(
        "--catalog", default="iceberg-catalog.db",
        help="--iceberg: the SQL catalog, a SQLite file (default ./iceberg-catalog.db, "
        "created if missing) or a SQLAlchemy URI (sqlite:///..., postgresql+psycopg2://...)",
    )  # fmt: skip
    export.add_argument(
        "--value-schema", type=Path, default=None, metavar="FILE",
        help='--iceberg: JSON values into columns, a file of {"field": "type"} (string, '
        "long, int, double, boolean, timestamp, json); a value that does not fit is kept "
        "with its reason in column value_error, never stops the run",
    )  # fmt: skip
    export.add_argument(
        "--warehouse", default=None,
        help="--iceberg: where a new table's files go, file:///dir or s3://bucket/prefix "
        "(default: iceberg/ in the config's object store)",
    )  # fmt: skip
    export.add_argument(
        "--from", dest="source", choices=("kafka", "objects"), default=None,
        help="read only Kafka's log, or only the objects the fleet's metadata commits "
        "(default: the whole topic, the objects where they hold offsets and Kafka's log "
        "for the rest)",
    )  # fmt: skip
    export.set_defaults(func=run_export)


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("topic")
    parser.add_argument("--config", type=Path, required=True, help="a proxy's YAML config")
    parser.add_argument("--master", default="local[*]", help="Spark master")


def _settings(args: argparse.Namespace):
    """(bootstrap, tiering config, store spec) from --config."""
    from offload_jobs.migrate import StoreSpec
    from proxy.config import load_config

    config = load_config(args.config)
    bootstrap = ",".join(f"{h}:{p}" for h, p in config.upstream.bootstrap)
    tiering = config.tiering
    return bootstrap, tiering, StoreSpec.from_settings(tiering.object_store)


def run_verify(args: argparse.Namespace, spark=None) -> int:
    from offload_jobs import preflight
    from offload_jobs.progress import Console
    from offload_jobs.verify import VerifyJob, verify
    from proxy.config import ConfigError
    from proxy.devstack.spark import local_spark

    try:
        bootstrap, tiering, store = _settings(args)
    except (ConfigError, ValueError) as exc:
        print(f"tierproxy verify: {exc}", file=sys.stderr)
        return 2
    job = VerifyJob(args.topic, bootstrap, store, tiering.metadata_topic, tiering.shard_count)
    try:
        preflight.check(bootstrap, args.topic, store_spec=store)
        with local_spark(spark, "tierproxy-verify", args.master) as session:
            console = Console()  # a bar on a terminal, plain lines otherwise
            report = verify(session, job, progress=console.line, redraw=console.redraw)
    except (preflight.PreflightError, LookupError) as exc:
        print(f"tierproxy verify: {exc}", file=sys.stderr)
        return 1
    print(report.table())
    if args.json is not None:
        args.json.write_text(report.to_json() + "\n")
    print(report.line(), flush=True)
    return 0 if report.ok else 1


def run_export(args: argparse.Namespace, spark=None) -> int:
    import asyncio
    import dataclasses

    from offload_jobs import preflight
    from offload_jobs.export import ExportJob, export, tiered_partitions
    from offload_jobs.progress import Console
    from offload_jobs.verify import read_states
    from proxy.config import ConfigError
    from proxy.devstack.spark import local_spark

    try:
        bootstrap, tiering, store = _settings(args)
        s3 = tiering.object_store.s3
        if args.to is not None and args.to.startswith("s3://") and s3 is None:
            raise ValueError(
                f"--to {args.to}: tiering.object_store.s3 is not set; the export uses its "
                "endpoint and credentials"
            )
        if args.to is not None and args.value_schema is not None:
            raise ValueError("--value-schema is for --iceberg (Parquet keeps the value as bytes)")
    except (ConfigError, ValueError) as exc:
        print(f"tierproxy export: {exc}", file=sys.stderr)
        return 2
    try:
        topic_id, partitions = preflight.check(bootstrap, args.topic, store_spec=store)
    except preflight.PreflightError as exc:
        print(f"tierproxy export: {exc}", file=sys.stderr)
        return 1
    states, source = None, args.source
    if source != "kafka":
        states = asyncio.run(read_states(bootstrap, tiering.metadata_topic, tiering.shard_count))
    if source is None:  # the whole topic: Kafka's log alone when none of it is tiered
        tiered = tiered_partitions(topic_id, partitions, states, tiering.shard_count)
        source = "whole" if tiered else "kafka"
    try:
        job = ExportJob(
            args.topic, bootstrap, args.to or "", source=source, store=store,
            s3=None if s3 is None else dataclasses.asdict(s3),
            metadata_topic=tiering.metadata_topic, shard_count=tiering.shard_count,
        )  # fmt: skip
    except ValueError as exc:
        print(f"tierproxy export: {exc}", file=sys.stderr)
        return 2
    if args.iceberg is not None:
        return _run_iceberg(args, spark, job, states, tiering)
    try:
        with local_spark(spark, "tierproxy-export", args.master) as session:
            console = Console()  # a bar on a terminal, plain lines otherwise
            summary = export(session, job, states, console.line, console.redraw)
    except LookupError as exc:
        print(f"tierproxy export: {exc}", file=sys.stderr)
        return 1
    print(summary.line(), flush=True)
    return 0 if summary.ok else 1


def _run_iceberg(args: argparse.Namespace, spark, job, states, tiering) -> int:
    import dataclasses
    import importlib.util

    if importlib.util.find_spec("pyiceberg") is None:
        print(
            "tierproxy export: --iceberg needs pyiceberg, which this installation lacks: "
            "install the offload extra (pip install 'tierproxy[offload]')",
            file=sys.stderr,
        )
        return 2

    from offload_jobs.export_iceberg import export_iceberg
    from offload_jobs.iceberg_offsets import OffsetsError
    from offload_jobs.iceberg_table import CatalogSpec, IcebergSetupError, default_warehouse, s3_io
    from offload_jobs.progress import Console
    from offload_jobs.value_columns import ValueSchema, ValueSchemaError
    from proxy.devstack.spark import local_spark

    settings = tiering.object_store
    s3 = None if settings.s3 is None else dataclasses.asdict(settings.s3)
    warehouse = args.warehouse or default_warehouse(settings.kind, str(settings.directory), s3)
    io = s3_io(s3) if s3 is not None else {}
    spec = CatalogSpec(args.catalog, args.iceberg, warehouse, io)
    try:
        spec.identifier  # noqa: B018 - checks the name before Spark starts
        values = None
        if args.value_schema is not None:
            values = ValueSchema.from_file(args.value_schema)
        with local_spark(spark, "tierproxy-export", args.master) as session:
            console = Console()
            summary = export_iceberg(
                session, job, spec, states, console.line, console.redraw, values
            )
    except (IcebergSetupError, OffsetsError, ValueSchemaError) as exc:
        print(f"tierproxy export: {exc}", file=sys.stderr)
        return 2
    except LookupError as exc:
        print(f"tierproxy export: {exc}", file=sys.stderr)
        return 1
    print(summary.line(), flush=True)
    return 0 if summary.ok else 1


def main(argv: list[str] | None = None) -> int:
    """spark-submit's entry point: the session spark-submit configured."""
    from pyspark.sql import SparkSession

    parser = argparse.ArgumentParser(prog="report_cli.py", description=__doc__)
    add_parsers(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    spark = SparkSession.builder.appName(f"tierproxy-{args.command}").getOrCreate()
    return args.func(args, spark)


if __name__ == "__main__":
    sys.exit(main())
