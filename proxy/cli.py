"""The `tierproxy` command."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tierproxy", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    dev = commands.add_parser(
        "dev",
        help="start a local single-node Kafka (and the proxy in front of it) for a first try",
        description="Starts Apache Kafka from the project's cache on a free loopback port "
        "and keeps it running until Ctrl-C. Data lives in a temporary folder unless "
        "--data-dir is given.",
    )
    dev.add_argument("--data-dir", type=Path, default=None, help="keep Kafka's data here")
    dev.set_defaults(func=_dev)

    args = parser.parse_args(argv)
    return args.func(args)


def _dev(args: argparse.Namespace) -> int:
    from proxy.devstack import DevstackError, KafkaCluster

    cluster = KafkaCluster(size=1, base_dir=args.data_dir, name="kafka-dev")
    print("starting Apache Kafka (single node, KRaft)...", flush=True)
    try:
        cluster.start()
    except DevstackError as exc:
        print(f"tierproxy dev: {exc}", file=sys.stderr)
        return 1
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    print(
        f"Kafka is up at {cluster.bootstrap} (log: {cluster.log_files()[0]}).\n"
        "The proxy itself is not built yet: clients connect to Kafka directly for now.\n"
        "Press Ctrl-C to stop.",
        flush=True,
    )
    try:
        stop.wait()
    finally:
        print("stopping...", flush=True)
        cluster.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
