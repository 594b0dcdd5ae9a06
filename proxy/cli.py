"""The `tierproxy` command."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path

OFFLOAD_COMMANDS = ("migrate", "verify", "export", "clean")  # the Spark jobs: the offload extra


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tierproxy", description="Kafka-protocol proxy fleet")
    commands = parser.add_subparsers(dest="command", required=True)

    run = commands.add_parser(
        "run",
        help="run a proxy in front of an existing Kafka cluster",
        description="Runs one proxy with the settings of a YAML file (see configs/).",
    )
    run.add_argument("--config", type=Path, required=True, help="the YAML configuration")
    # with `workers: N`, the parent starts each worker as `run --worker i`
    run.add_argument("--worker", type=int, default=None, help=argparse.SUPPRESS)
    run.set_defaults(func=_run)

    dev = commands.add_parser(
        "dev",
        help="start a local single-node Kafka and a proxy in front of it, for a first try",
        description="Starts Apache Kafka from the project's cache, then a proxy in front of "
        "it with its admin API on loopback, and keeps both running until Ctrl-C. Kafka's "
        "data, the WAL, the objects and the proxy's config (proxy.yaml) live in --data-dir "
        "and are found again by the next start (`make run` uses .data/ of the checkout); "
        "without --data-dir, in a temporary folder deleted on exit.",
    )
    dev.add_argument("--data-dir", type=Path, default=None, help="keep all the data here")
    dev.add_argument(
        "--fresh", action="store_true", help="empty --data-dir first: start with no topics"
    )
    dev.add_argument("--port", type=int, default=19092, help="the proxy's bootstrap port")
    dev.add_argument(
        "--broker-port-base", type=int, default=19100, help="broker N listens on base + N"
    )
    dev.add_argument(
        "--admin-port", type=int, default=19644, help="the admin API's port (on 127.0.0.1)"
    )
    dev.set_defaults(func=_dev)

    fleet = commands.add_parser("fleet", help="look at a proxy fleet")
    fleet_commands = fleet.add_subparsers(dest="fleet_command", required=True)
    status = fleet_commands.add_parser(
        "status",
        help="the fleet's members and its cross-zone bytes",
        description="Reads the fleet's membership topic in the upstream Kafka and prints "
        "each proxy, whether it is alive, and the client bytes the fleet carried by "
        "(client zone, proxy zone, upstream broker zone), with the cross-zone total.",
    )
    where = status.add_mutually_exclusive_group(required=True)
    where.add_argument("--config", type=Path, help="a proxy's YAML configuration")
    where.add_argument("--bootstrap", help="the upstream Kafka's bootstrap servers")
    where.add_argument(
        "--admin",
        help="a proxy's admin API (http://host:port): members, shards and its uploader lag",
    )
    status.add_argument("--token", help="the admin API's token (or env TIERPROXY_ADMIN_TOKEN)")
    status.add_argument("--topic", default=None, help="the membership topic (fleet.topic)")
    status.add_argument(
        "--member-timeout", type=float, default=None, help="seconds before a member is dead"
    )
    status.add_argument("--json", action="store_true", help="print JSON")
    status.set_defaults(func=_fleet_status)

    topics = commands.add_parser("topics", help="move topics between passthrough and tiered")
    topic_commands = topics.add_subparsers(dest="topics_command", required=True)
    for op, text in (
        ("tier", "tier a topic: new writes go to the proxy's WAL and S3, partition by partition"),
        ("untier", "send a tiered topic back to Kafka (refused once S3 holds data Kafka lacks)"),
    ):
        command = topic_commands.add_parser(op, help=text, description=text)
        command.add_argument("topic")
        command.add_argument(
            "--peer",
            required=True,
            help="host:port of any proxy's peer listener (tiering.peer_port)",
        )
        command.add_argument("--timeout", type=float, default=30.0, help="seconds to wait")
        command.set_defaults(func=_topics, op=op)
    _add_topic_views(topic_commands)

    from offload_jobs.migrate_cli import add_parser as add_migrate

    add_migrate(commands)  # offload_jobs/migrate_cli.py: the migration job (PySpark)
    from offload_jobs.report_cli import add_parsers as add_verify_and_export

    add_verify_and_export(commands)  # offload_jobs/report_cli.py: verify, Parquet export
    from offload_jobs.clean_cli import add_parser as add_clean

    add_clean(commands)  # offload_jobs/clean_cli.py: the log cleaner for a large backlog

    args = parser.parse_args(argv)
    from proxy.devstack.spark import MissingExtra, require_offload_packages

    try:
        if args.command in OFFLOAD_COMMANDS:
            require_offload_packages()
        return args.func(args)
    except MissingExtra as exc:  # an offload job without the offload extra
        print(f"tierproxy {args.command}: {exc}", file=sys.stderr)
        return 2


def _run(args: argparse.Namespace) -> int:
    from proxy.config import ConfigError, load_config
    from proxy.server.main import run
    from proxy.server.supervisor import check_wal_directories, run_worker, supervise

    try:
        config = load_config(args.config)
        if args.worker is None:
            check_wal_directories(config)
            if config.workers > 1:  # a parent; each worker comes back here with --worker
                return supervise(args.config, config)
    except ConfigError as exc:
        print(f"tierproxy: {exc}", file=sys.stderr)
        return 2
    # A worker says "worker i ready at"; its parent says "proxy ready at" once all are.
    worker = "" if args.worker is None else f" (worker {args.worker})"
    said = "proxy" if args.worker is None else f"worker {args.worker}"

    def serve(config, tell_parent: Callable[[], None] = lambda: None) -> None:
        def ready(proxy) -> None:
            print(f"{said} ready at {proxy.bootstrap}", flush=True)
            tell_parent()

        run(config, on_ready=ready)

    try:
        if args.worker is not None:
            return run_worker(config, args.worker, serve)
        serve(config)
    except ConfigError as exc:  # --worker i out of range
        print(f"tierproxy: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # upstream unreachable, credentials refused, port taken
        print(f"tierproxy: cannot start{worker}: {exc}", file=sys.stderr)
        return 1
    return 0


def _add_topic_views(topic_commands) -> None:
    """`topics list` and `topics status <topic>`: read from a proxy's admin API."""
    from proxy.admin.client import ADMIN_ENV, TOKEN_ENV

    for op, text, description in (
        ("list", "every topic and its mode (passthrough or tiered)",
         "Lists Kafka's topics and the tiered ones, with their mode, partitions, the "
         "partitions cut over, objects, and offsets still only in Kafka (to migrate)."),
        ("status", "one topic: per partition its cutover, log start, ends, objects",
         "Shows one topic's mode and, when tiered, per partition: shard, owner, log "
         "start, cutover, committed end, high watermark (on the owner) and objects."),
    ):  # fmt: skip
        command = topic_commands.add_parser(op, help=text, description=description)
        if op == "status":
            command.add_argument("topic")
        command.add_argument(
            "--admin",
            default=os.environ.get(ADMIN_ENV),
            required=ADMIN_ENV not in os.environ,
            help=f"a proxy's admin API, http://host:port (or env {ADMIN_ENV})",
        )
        command.add_argument("--token", help=f"the admin API's token (or env {TOKEN_ENV})")
        command.add_argument("--json", action="store_true", help="print JSON")
        command.set_defaults(func=_topic_view, op=op)


def _topic_view(args: argparse.Namespace) -> int:
    from proxy.admin import client as admin_client

    path = "/v1/topics" if args.op == "list" else admin_client.topic_path(args.topic)
    try:
        report = admin_client.get(args.admin, path, args.token)
    except admin_client.AdminError as exc:
        print(f"tierproxy topics {args.op}: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(report, indent=2))
    elif args.op == "list":
        print(admin_client.render_topics(report))
    else:
        print(admin_client.render_topic(report))
    return 0


def _fleet_status(args: argparse.Namespace) -> int:
    if args.admin is not None:
        from proxy.admin import client as admin_client

        try:
            report = admin_client.get(args.admin, "/v1/fleet", args.token)
        except admin_client.AdminError as exc:
            print(f"tierproxy fleet status: {exc}", file=sys.stderr)
            return 1
        print(json.dumps(report, indent=2) if args.json else admin_client.render_fleet(report))
        return 0
    from proxy.admin.fleet_status import fleet_status
    from proxy.config import ConfigError, FleetConfig, load_config

    fleet = FleetConfig()
    kafka = {"bootstrap_servers": args.bootstrap}
    if args.config is not None:
        try:
            config = load_config(args.config)
        except ConfigError as exc:
            print(f"tierproxy: {exc}", file=sys.stderr)
            return 2
        from proxy.server.membership import kafka_settings
        from proxy.server.tls import client_context

        fleet = config.fleet
        kafka = kafka_settings(config, client_context(config.upstream.tls))
    try:
        print(
            fleet_status(
                kafka,
                args.topic or fleet.topic,
                args.member_timeout or fleet.member_timeout_s,
                args.json,
            )
        )
    except (LookupError, OSError, TimeoutError) as exc:
        print(f"tierproxy fleet status: {exc}", file=sys.stderr)
        return 1
    return 0


def _topics(args: argparse.Namespace) -> int:
    import asyncio
    import time
    import uuid

    from kio.schema.errors import ErrorCode

    from proxy.peer.clients import PeerClients

    RETRIABLE_ADMIN_CODES = {  # noqa: N806 - a constant, local to keep the CLI's import light
        ErrorCode.not_coordinator,
        ErrorCode.coordinator_not_available,
        ErrorCode.coordinator_load_in_progress,
    }

    host, _, port = args.peer.rpartition(":")
    if not host or not port.isdigit():
        print(f"tierproxy topics: --peer {args.peer!r} is not host:port", file=sys.stderr)
        return 2

    async def ask() -> tuple[int, str]:
        """Like Kafka's admin client, retries until --timeout while the answer is
        retriable: the proxy not listening yet (a restart), or the topic's metadata shard
        without an owner (a shard-group rebalance). Tier and untier are idempotent."""
        clients = PeerClients()
        deadline = time.monotonic() + args.timeout
        backoff = 0.1
        told: set[str] = set()
        try:
            while True:
                try:
                    code, message = await clients.admin(
                        (host, int(port)),
                        args.op,
                        args.topic,
                        uuid.UUID(int=0),
                        timeout_s=max(0.1, deadline - time.monotonic()),
                    )
                except ConnectionError as exc:  # refused, or dropped before its answer
                    if time.monotonic() + backoff >= deadline:
                        raise
                    reason = str(exc)
                else:
                    if code not in RETRIABLE_ADMIN_CODES or time.monotonic() + backoff >= deadline:
                        return code, message
                    reason = f"error {code}: {message}"
                if reason not in told:  # each reason once, as Kafka's tools log retries
                    told.add(reason)
                    print(f"tierproxy topics {args.op}: {reason}; retrying", file=sys.stderr)
                await asyncio.sleep(backoff)
                backoff = min(1.0, backoff * 2)
        finally:
            await clients.close()

    try:
        code, message = asyncio.run(ask())
    except (OSError, TimeoutError) as exc:
        print(f"tierproxy topics {args.op}: {exc}", file=sys.stderr)
        return 1
    print(message if code == 0 else f"tierproxy topics {args.op}: error {code}: {message}")
    return 0 if code == 0 else 1


def _dev(args: argparse.Namespace) -> int:
    from proxy.devstack.dev import DevPorts, run_dev

    ports = DevPorts(args.port, args.broker_port_base, args.admin_port)
    return run_dev(args.data_dir, args.fresh, ports)


if __name__ == "__main__":
    sys.exit(main())
