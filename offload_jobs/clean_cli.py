"""`tierproxy clean`, and the same job under spark-submit:

    spark-submit --master spark://... --py-files dist/tierproxy-offload.zip \\
        --conf spark.pyspark.python=... --conf spark.pyspark.driver.python=... \\
        offload_jobs/clean_cli.py --topic TOPIC --config ... --peer HOST:PORT

Settings come from a proxy's YAML (`--config`): the upstream bootstrap, the metadata
topic, the shard count, the object store and its format version. The exit code is 0 when
every partition cleaned is committed or was refused by a race (a trim, a compaction, the
proxy's own cleaner: listed, their objects deleted, run the job again), 1 when a range
could not be read or a commit's outcome is unknown, 2 for wrong arguments.
"""

from __future__ import annotations

import argparse
import sys

from offload_jobs.migrate_cli import add_fleet_arguments, fleet_settings, run_job, submit_main


def add_parser(commands) -> None:
    """The `clean` subcommand of `tierproxy` (commands: argparse subparsers)."""
    text = "clean a compacted tiered topic's committed log, as Kafka's log cleaner (Spark)"
    command = commands.add_parser("clean", help=text, description=text)
    add_arguments(command)
    command.set_defaults(func=run)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--topic", required=True)
    parser.add_argument(
        "--partitions", type=int, nargs="+", metavar="N", help="only these partitions"
    )
    add_fleet_arguments(parser)
    parser.add_argument(
        "--object-mib", type=int, default=64, help="input of one new stream object, MiB"
    )


def job_from_args(args: argparse.Namespace):
    from offload_jobs.clean import CleanJob

    return CleanJob(**fleet_settings(args), partitions=tuple(args.partitions or ()))


def run(args: argparse.Namespace, spark=None) -> int:
    return run_job("clean", args, spark, job_from_args, _clean)


def _clean(spark, job):
    from offload_jobs.clean import clean

    return clean(spark, job, progress=lambda line: print(line, flush=True))


def main(argv: list[str] | None = None) -> int:
    return submit_main("clean", argv, add_arguments, run, __doc__)


if __name__ == "__main__":
    sys.exit(main())
