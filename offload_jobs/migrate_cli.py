"""`tierproxy migrate`, and the same job under spark-submit:

    spark-submit --master spark://... --py-files dist/tierproxy-offload.zip \\
        --conf spark.pyspark.python=... --conf spark.pyspark.driver.python=... \\
        offload_jobs/migrate_cli.py TOPIC --config ... --peer HOST:PORT --from-cluster

(`make offload-zip` builds the zip; docs/offload.md, "On a Spark cluster", says what
each side needs.)

Settings come from a proxy's YAML (`--config`): the upstream bootstrap, the metadata
topic, the shard count and the object store, so the job writes exactly where the fleet
reads. The exit code is 0 when every range moved and was committed, 1 otherwise.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def add_parser(commands) -> None:
    """The `migrate` subcommand of `tierproxy` (commands: argparse subparsers)."""
    text = "move a tiered topic's offsets below its cutover from Kafka to the object store"
    migrate = commands.add_parser("migrate", help=text, description=text)
    add_arguments(migrate)
    migrate.set_defaults(func=run)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("topic")
    add_fleet_arguments(parser)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--from-segments",
        action="append",
        metavar="PATH",
        help="a Kafka log directory (or a copy) holding <topic>-<partition>/ folders; "
        "repeat for several (each partition is read from the first that has it)",
    )
    source.add_argument(
        "--from-cluster", action="store_true", help="read the upstream cluster with Fetch"
    )
    parser.add_argument(
        "--object-mib", type=int, default=64, help="target size of a stream object, MiB"
    )


def add_fleet_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments of a job that writes the fleet's objects and commits them."""
    parser.add_argument("--config", type=Path, required=True, help="a proxy's YAML config")
    parser.add_argument(
        "--peer", required=True, help="host:port of any proxy's peer listener (tiering.peer_port)"
    )
    parser.add_argument("--master", default="local[*]", help="Spark master (local runs)")


def fleet_settings(args: argparse.Namespace) -> dict:
    """A job's fields from the proxy's YAML and --peer (and --object-mib): the upstream,
    the metadata topic, the shard count and the object store the fleet reads."""
    from offload_jobs.migrate import StoreSpec
    from proxy.config import load_config

    config = load_config(args.config)
    tiering = config.tiering
    host, _, port = args.peer.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"--peer {args.peer!r}: not host:port")
    if args.object_mib < 1:
        raise ValueError(f"--object-mib {args.object_mib}: must be at least 1")
    return {
        "topic": args.topic,
        "bootstrap": ",".join(f"{h}:{p}" for h, p in config.upstream.bootstrap),
        "metadata_topic": tiering.metadata_topic,
        "shard_count": tiering.shard_count,
        "store": StoreSpec.from_settings(tiering.object_store),
        "peer": (host, int(port)),
        "target_object_bytes": args.object_mib << 20,
        "object_format_version": tiering.object_format_version,
    }


def job_from_args(args: argparse.Namespace):
    from offload_jobs.migrate import MigrateJob

    return MigrateJob(
        **fleet_settings(args),
        segment_dirs=tuple(args.from_segments or ()),
        from_cluster=args.from_cluster,
    )


def run(args: argparse.Namespace, spark=None) -> int:
    return run_job("migrate", args, spark, job_from_args, _migrate)


def run_job(name: str, args: argparse.Namespace, spark, make_job, body) -> int:
    """`tierproxy NAME`: the job from the arguments (2 if they are wrong), the checks
    before Spark starts (1 if one fails: a wrong --peer is found even with nothing to
    do), then `body(session, job)` on `spark` or a local session of --master, whose
    summary is printed (0 if it is ok, else 1)."""
    from aiokafka.errors import KafkaError

    from offload_jobs import preflight
    from offload_jobs.fleet import NotTiered
    from proxy.config import ConfigError
    from proxy.devstack.spark import local_spark

    try:
        job = make_job(args)
    except (ConfigError, ValueError) as exc:
        print(f"tierproxy {name}: {exc}", file=sys.stderr)
        return 2
    try:
        preflight.check(
            job.bootstrap,
            job.topic,
            peer_address=job.peer,
            store_spec=job.store,
            say=lambda line: print(line, flush=True),
        )
    except preflight.PreflightError as exc:
        print(f"tierproxy {name}: {exc}", file=sys.stderr)
        return 1
    with local_spark(spark, f"tierproxy-{name}", args.master) as session:
        try:
            summary = body(session, job)
        except NotTiered as exc:
            print(f"tierproxy {name}: {exc}", file=sys.stderr)
            return 1
        except (OSError, TimeoutError, KafkaError, LookupError) as exc:  # Kafka, the peer
            print(
                f"tierproxy {name}: cannot reach Kafka or the proxy: {exc!r} (what is not "
                "committed is not visible; run it again)",
                file=sys.stderr,
            )
            return 1
    print(summary.line(), flush=True)
    return 0 if summary.ok else 1


def _migrate(spark, job):
    from offload_jobs.migrate import migrate
    from offload_jobs.progress import Console

    console = Console()  # a bar on a terminal, plain lines otherwise
    return migrate(spark, job, progress=console.line, redraw=console.redraw)


def submit_main(name: str, argv: list[str] | None, add, run, description: str | None) -> int:
    """A job's spark-submit entry point: the session spark-submit configured."""
    from pyspark.sql import SparkSession

    parser = argparse.ArgumentParser(prog=f"{name}_cli.py", description=description)
    add(parser)
    args = parser.parse_args(argv)
    return run(args, SparkSession.builder.appName(f"tierproxy-{name}").getOrCreate())


def main(argv: list[str] | None = None) -> int:
    return submit_main("migrate", argv, add_arguments, run, __doc__)


if __name__ == "__main__":
    sys.exit(main())
