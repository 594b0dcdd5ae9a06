"""The `tierproxy` command."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tierproxy", description="Kafka-protocol proxy fleet")
    commands = parser.add_subparsers(dest="command", required=True)

    run = commands.add_parser(
        "run",
        help="run a proxy in front of an existing Kafka cluster",
        description="Runs one proxy with the settings of a YAML file (see configs/).",
    )
    run.add_argument("--config", type=Path, required=True, help="the YAML configuration")
    run.set_defaults(func=_run)

    dev = commands.add_parser(
        "dev",
        help="start a local single-node Kafka and a proxy in front of it, for a first try",
        description="Starts Apache Kafka from the project's cache on a free loopback port, "
        "then a proxy in front of it, and keeps both running until Ctrl-C. Kafka's data "
        "lives in a temporary folder unless --data-dir is given.",
    )
    dev.add_argument("--data-dir", type=Path, default=None, help="keep Kafka's data here")
    dev.add_argument("--port", type=int, default=19092, help="the proxy's bootstrap port")
    dev.add_argument(
        "--broker-port-base", type=int, default=19100, help="broker N listens on base + N"
    )
    dev.set_defaults(func=_dev)

    args = parser.parse_args(argv)
    return args.func(args)


def _run(args: argparse.Namespace) -> int:
    from proxy.config import ConfigError, load_config
    from proxy.server.main import run

    try:
        config = load_config(args.config)
    except ConfigError as exc:
        print(f"tierproxy: {exc}", file=sys.stderr)
        return 2
    try:
        run(config, on_ready=lambda proxy: print(f"proxy ready at {proxy.bootstrap}", flush=True))
    except OSError as exc:  # upstream unreachable, credentials refused, port taken
        print(f"tierproxy: cannot start: {exc}", file=sys.stderr)
        return 1
    return 0


def _dev(args: argparse.Namespace) -> int:
    from proxy.config import parse_config
    from proxy.devstack import DevstackError, KafkaCluster
    from proxy.server.main import run

    cluster = KafkaCluster(size=1, base_dir=args.data_dir, name="kafka-dev")
    print("starting Apache Kafka (single node, KRaft)...", flush=True)
    try:
        cluster.start()
    except DevstackError as exc:
        print(f"tierproxy dev: {exc}", file=sys.stderr)
        return 1
    config = parse_config(
        {
            "upstream": {"bootstrap": cluster.bootstrap},
            "listeners": {"bootstrap_port": args.port, "broker_port_base": args.broker_port_base},
        }
    )

    def ready(proxy) -> None:
        print(
            f"Kafka is up at {cluster.bootstrap} (log: {cluster.log_files()[0]}).\n"
            f"tierproxy is up: point your clients at bootstrap.servers={proxy.bootstrap}\n"
            "Object store: tiering is not built yet, so no data is written outside Kafka.\n"
            "Press Ctrl-C to stop both.",
            flush=True,
        )

    try:
        run(config, on_ready=ready)
    finally:
        print("stopping Kafka...", flush=True)
        cluster.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
