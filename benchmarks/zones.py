"""Cross-zone bytes: one workload direct to Kafka, then through the zone-aware fleet.

    .venv/bin/python benchmarks/zones.py [--bytes 1000000000] [--partitions 18] [--json out.json]

The baseline the tiered write path will be measured against. One 3-broker Kafka with
broker.rack zone-a/b/c and, per scenario, a fresh topic with replication factor 3 whose
partition p is led by broker p mod 3 + 1. In each zone one producer writes a third of
`--bytes` of record values (1 KiB values, acks=all, idempotence on, partitions in turn);
then one consumer group with one consumer per zone reads the topic once: every record is
read by exactly one consumer. Scenario "direct": the clients connect to the brokers.
Scenario "fleet": they connect to the two proxies of their zone (six `tierproxy run`
processes on 127.0.1.x / 127.0.2.x / 127.0.3.x, membership through a Kafka topic, as in
tests/integration/zones/zonefleet.py), each naming its zone in its client.id.

Bytes are counted per connection by librdkafka (`statistics.interval.ms`: txbytes and
rxbytes of every broker handle, from an emission after the work is done) and put on the
hops they travel. A client in zone Z reaching broker N crosses zones if rack(N) != Z.
Through the fleet, client -> proxy crosses if the proxy (by its 127.0.x address) is not
in Z, and proxy -> broker if rack(N) is not the proxy's zone: a proxy's broker-N listener
is served by broker N, its bootstrap listener by a broker of its zone, which probe
connections check (unchecked, it counts as crossing). Replication is read from the disk:
the follower replicas' .log files, each follower being in another zone than its leader.
The fleet's figures are checked against `tierproxy fleet status --json`. The report is
Markdown on stdout (docs/benchmarks.md holds a run); `--json` writes every figure.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter, defaultdict
from contextlib import ExitStack
from dataclasses import asdict, dataclass
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_clients import Handle, Traffic  # noqa: E402
from bench_procs import in_threads, machine_description, tierproxy_argv  # noqa: E402
from confluent_kafka import (  # noqa: E402
    Consumer,
    ElectionType,
    KafkaError,
    Producer,
    TopicPartition,
    libversion,
)
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402
from kio.schema.metadata.v12.request import MetadataRequest  # noqa: E402
from passthrough import _command_line, _git_state, _interrupt  # noqa: E402

from proxy.devstack import KafkaCluster, ManagedProcess, versions  # noqa: E402
from proxy.devstack.paths import free_port_block  # noqa: E402
from proxy.kafka.messages import encode_request  # noqa: E402

ZONES = ("zone-a", "zone-b", "zone-c")
RECORD_SIZE = 1024
GB, TB = 10**9, 10**12
USD_PER_GB_CROSSED = 0.02  # $0.01 out of one zone plus $0.01 into the other
PROBE_ZONE = "bootstrap-probe"  # a client zone of its own, so the probes' bytes stand apart
DEADLINE_S = 1800.0


def client_id(role: str, zone: str) -> str:
    return f"zones-bench-{role},tierproxy_az={zone}"


# -- the clients -------------------------------------------------------------------------


def produce(zone: str, bootstrap: str, topic: str, partitions: int, records: int) -> list[Handle]:
    """Records go to the partitions in turn: what the sticky partitioner does on average,
    without its luck (in a short trial it sent 40 % of a run to one partition, and where
    that partition's leader was decided a large share of the crossings)."""
    traffic, reports = Traffic(), Counter()
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "client.id": client_id("producer", zone),
            "acks": "all",
            "enable.idempotence": True,
            "statistics.interval.ms": Traffic.INTERVAL_MS,
            "stats_cb": traffic.on_stats,
            "on_delivery": lambda error, _: reports.update([str(error) if error else "ok"]),
        }
    )
    value = os.urandom(RECORD_SIZE)
    for i in range(records):
        while True:
            try:
                producer.produce(topic, value, partition=i % partitions)
                break
            except BufferError:  # the queue is full: wait for delivery reports
                producer.poll(0.05)
        if i % 1000 == 0:
            producer.poll(0)
    left = producer.flush(DEADLINE_S)
    if left or reports != {"ok": records}:
        raise RuntimeError(f"producer {zone}: {records} records, {left} left, reports {reports}")
    return traffic.settle(producer.poll, "produce", zone)


class Group:
    """What the members of the consumer group share: when to start reading, who has
    read its share, whether the run was abandoned."""

    def __init__(self, members: int) -> None:
        self.members = members
        self.start, self.abandoned = threading.Event(), threading.Event()
        self.finished: set[str] = set()  # the zones of the members at the end of their share
        self.counted = threading.Barrier(members, timeout=120)

    def done(self) -> bool:
        return len(self.finished) == self.members


class GroupMember:
    """One consumer of the group. Its partitions stay paused until every member holds its
    share (the first to join gets every partition, then gives most back), so no record is
    fetched twice; it closes only once every member has counted its bytes, as a member
    leaving makes the others rebalance and fetch again."""

    def __init__(self, zone: str, bootstrap: str, topic: str, group_id: str, group: Group):
        self.zone, self.topic, self.group = zone, topic, group
        self.traffic = Traffic()
        self.assignment: frozenset[int] = frozenset()
        self.share: frozenset[int] = frozenset()  # the partitions it read
        self.ends: dict[int, int] = {}  # partition -> high watermark
        self.records: Counter[int] = Counter()  # partition -> records read
        self.closing = False
        self._at_end: set[int] = set()
        self.consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "client.id": client_id("consumer", zone),
                "group.id": group_id,
                "auto.offset.reset": "earliest",
                "enable.partition.eof": True,
                # members are sorted by member id, which starts with the client.id: zone-a,
                # zone-b, zone-c take a block of partitions each, in that order
                "partition.assignment.strategy": "range",
                "statistics.interval.ms": Traffic.INTERVAL_MS,
                "stats_cb": self.traffic.on_stats,
            }
        )

    def _assigned(self, consumer, partitions) -> None:
        consumer.assign(partitions)
        if self.closing or not self.group.start.is_set():
            consumer.pause(partitions)  # a rebalance while reading shows in the counts
        self.assignment = frozenset(p.partition for p in partitions)

    def _revoked(self, consumer, partitions) -> None:
        self.assignment = frozenset()

    def _serve(self, timeout: float) -> None:
        if self.group.abandoned.is_set():
            raise RuntimeError(f"consumer {self.zone}: the run was abandoned")
        for message in self.consumer.consume(num_messages=10000, timeout=timeout):
            error = message.error()
            if error is None:
                self.records[message.partition()] += 1
            elif error.code() == KafkaError._PARTITION_EOF:
                self._at_end.add(message.partition())
            else:
                raise RuntimeError(f"consumer {self.zone}: {error}")

    def _serve_until(self, done, what: str) -> None:
        deadline = time.monotonic() + DEADLINE_S
        while not done():
            self._serve(0.2)
            if time.monotonic() > deadline:
                raise RuntimeError(f"consumer {self.zone}: {what} not in {DEADLINE_S:.0f} s")

    def read(self) -> list[Handle]:
        consumer = self.consumer
        consumer.subscribe([self.topic], on_assign=self._assigned, on_revoke=self._revoked)
        try:
            self._serve_until(self.group.start.is_set, "the group settled")
            self.share = self.assignment
            consumer.resume([TopicPartition(self.topic, p) for p in self.share])
            self._serve_until(lambda: self._at_end >= self.share, "its share read")
            for p in self.share:
                self.ends[p] = consumer.get_watermark_offsets(
                    TopicPartition(self.topic, p), timeout=30, cached=False
                )[1]
            self.group.finished.add(self.zone)
            self._serve_until(self.group.done, "every share read")
            handles = self.traffic.settle(self._serve, "consume", self.zone)
            self.group.counted.wait()
        except BaseException:
            self.group.abandoned.set()
            self.group.counted.abort()
            raise
        finally:
            self.closing = True
            consumer.close()
        return handles


def consume(bootstraps: dict[str, str], topic: str, group_id: str, partitions: int):
    """One member per zone reads the topic, together; starts them once their shares are
    disjoint and cover every partition."""
    group = Group(len(ZONES))
    members = [GroupMember(z, bootstraps[z], topic, group_id, group) for z in ZONES]

    def start(threads: list[threading.Thread]) -> None:
        deadline = time.monotonic() + 120
        while not group.start.is_set():
            shares = [member.assignment for member in members]
            if all(shares) and sum(map(len, shares)) == partitions == len(
                frozenset().union(*shares)
            ):
                group.start.set()
            elif time.monotonic() > deadline or not all(t.is_alive() for t in threads):
                group.abandoned.set()
                raise RuntimeError(f"the group never settled: assignments {shares}")
            time.sleep(0.1)

    handles = in_threads([member.read for member in members], start)
    return members, [handle for member_handles in handles for handle in member_handles]


# -- the fleet ------------------------------------------------------------------------------


@dataclass
class FleetProxy:
    name: str
    zone: str
    host: str
    process: ManagedProcess


class Fleet:
    """Six `tierproxy run` processes, two per zone, configured as in the zone tests but
    with the default heartbeat interval, member timeout and metadata refresh."""

    def __init__(self, kafka_bootstrap: str, work_dir: Path, run_id: str) -> None:
        self.kafka_bootstrap = kafka_bootstrap
        self.topic = f"__tierproxy_fleet_bench_{run_id}"
        base = free_port_block(8)
        self.broker_port_base, self.port, self.metrics_port = base, base + 5, base + 6
        self.proxies: list[FleetProxy] = []
        for number, zone in enumerate(ZONES, start=1):
            for index in (1, 2):
                name, host = f"{zone[-1]}{index}", f"127.0.{number}.{index}"
                config = {
                    "upstream": {"bootstrap": kafka_bootstrap},
                    "listeners": {
                        "bind_host": host,
                        "bootstrap_port": self.port,
                        "broker_port_base": self.broker_port_base,
                    },
                    "fleet": {"name": name, "zone": zone, "topic": self.topic},
                    "metrics": {"bind_host": host, "port": self.metrics_port},
                    "logging": {"format": "text"},  # its report greps " WARNING " lines
                }
                path = work_dir / f"{name}.yaml"
                path.write_text(yaml.safe_dump(config))
                argv = [*tierproxy_argv(), "run", "--config", str(path)]
                process = ManagedProcess(f"zones-proxy-{name}", argv, work_dir / f"{name}.log")
                self.proxies.append(FleetProxy(name, zone, host, process))

    @staticmethod
    def zone_of(host: str) -> str | None:
        parts = host.split(".")
        if len(parts) == 4 and parts[:2] == ["127", "0"] and parts[2] in ("1", "2", "3"):
            return ZONES[int(parts[2]) - 1]
        return None

    def bootstrap(self, zone: str) -> str:
        return ",".join(f"{p.host}:{self.port}" for p in self.proxies if p.zone == zone)

    def start(self, timeout: float = 90.0) -> None:
        for proxy in self.proxies:
            proxy.process.start()
        deadline = time.monotonic() + timeout
        while True:  # until every proxy is ready and sees all six
            for proxy in self.proxies:
                if not proxy.process.running():
                    raise RuntimeError(f"proxy {proxy.name} exited:\n{proxy.process.tail(30)}")
            ready = all(b"proxy ready at" in p.process.log_path.read_bytes() for p in self.proxies)
            live = ready and all(
                sum(self.metric(p, "tierproxy_fleet_live_members").values()) == len(self.proxies)
                for p in self.proxies
            )
            if live:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"the fleet was not up after {timeout} s")
            time.sleep(0.5)

    def stop(self) -> None:
        for proxy in self.proxies:  # all at once, then wait for each
            proxy.process.terminate()
        for proxy in self.proxies:
            proxy.process.stop(timeout=15)

    def metric(self, proxy: FleetProxy, name: str) -> dict[tuple, float]:
        """{sorted (label, value) pairs: sample} of one metric from a proxy's /metrics."""
        url = f"http://{proxy.host}:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as answer:
            text = answer.read().decode()
        pattern = rf"^{name}(?:{{([^}}]*)}})? (\S+)$"
        return {
            tuple(sorted(re.findall(r'(\w+)="([^"]*)"', m[1] or ""))): float(m[2])
            for m in re.finditer(pattern, text, re.MULTILINE)
        }

    def status(self) -> dict:
        """`tierproxy fleet status --json`: the zone byte counts of every heartbeat."""
        argv = [*tierproxy_argv(), "fleet", "status", "--json"]
        argv += ["--bootstrap", self.kafka_bootstrap, "--topic", self.topic]
        return json.loads(subprocess.run(argv, capture_output=True, check=True, timeout=120).stdout)

    def probe_bootstrap(self, connections: int = 3) -> dict[str, dict[str, int]]:
        """Which zone's broker serves each proxy's bootstrap listener: Metadata requests on
        fresh bootstrap connections under a client zone of their own, then that zone's
        tierproxy_zone_bytes on the proxy: {proxy: {broker zone: bytes}}."""
        request = MetadataRequest(
            topics=(), allow_auto_topic_creation=False, include_topic_authorized_operations=False
        )
        frame = encode_request(request, 1, client_id("probe", PROBE_ZONE))
        found = {}
        for proxy in self.proxies:
            for _ in range(connections):
                with socket.create_connection((proxy.host, self.port), timeout=10) as sock:
                    sock.sendall(frame)
                    answer = sock.makefile("rb")
                    answer.read(struct.unpack(">i", answer.read(4))[0])
            time.sleep(0.1)  # the proxy counts an answer once it is written
            by_zone: Counter[str] = Counter()
            for labels, value in self.metric(proxy, "tierproxy_zone_bytes_total").items():
                labels = dict(labels)
                if labels["client_zone"] == PROBE_ZONE and value:
                    by_zone[labels["broker_zone"]] += int(value)
            found[proxy.name] = dict(by_zone)
        return found


# -- topics, and their replicas on disk -------------------------------------------------------


class Cluster:
    def __init__(self, kafka: KafkaCluster) -> None:
        self.kafka = kafka
        self.admin = AdminClient({"bootstrap.servers": kafka.bootstrap})
        self.racks = {node.node_id: node.rack for node in kafka.nodes}
        self.ports = {node.port: node.node_id for node in kafka.nodes}

    def close(self) -> None:
        del self.admin  # librdkafka's handle goes with the last reference

    def partitions(self, topic: str) -> dict[int, tuple[int, list[int], list[int]]]:
        """{partition: (leader, replicas, in-sync replicas)}."""
        meta = self.admin.list_topics(topic, timeout=30).topics[topic]
        return {p: (m.leader, list(m.replicas), list(m.isrs)) for p, m in meta.partitions.items()}

    def create_topic(self, topic: str, partitions: int) -> dict[int, int]:
        """Partition p led by broker p mod 3 + 1, the two others following: the same
        layout in every scenario and run. {partition: leader} once every replica is in
        sync and every preferred replica leads (one elected while its broker was still
        fenced would not)."""
        nodes = sorted(self.racks)
        layout = [
            [nodes[(p + i) % len(nodes)] for i in range(len(nodes))] for p in range(partitions)
        ]
        new = NewTopic(topic, num_partitions=partitions, replica_assignment=layout)
        self.admin.create_topics([new])[topic].result(60)
        deadline, elected = time.monotonic() + 90, False
        while True:
            state = self.partitions(topic)
            full = len(state) == partitions and all(len(isr) == 3 for _, _, isr in state.values())
            if full and all(leader == replicas[0] for leader, replicas, _ in state.values()):
                return {p: leader for p, (leader, _, _) in sorted(state.items())}
            if full and not elected:
                parts = [TopicPartition(topic, p) for p in state]
                self.admin.elect_leaders(ElectionType.PREFERRED, parts).result(60)
                elected = True
            if time.monotonic() > deadline:
                raise RuntimeError(f"topic {topic}: replicas or leaders not in place: {state}")
            time.sleep(0.5)

    def delete_topic(self, topic: str) -> None:
        self.admin.delete_topics([topic], operation_timeout=30)[topic].result(60)

    def replica_logs(self, topic: str, timeout: float = 60.0) -> dict:
        """Bytes of the topic's .log files per partition and replica, once the followers
        hold as much as their leader: the leaders' are what one replica stores, the
        followers' what replication carried."""
        deadline = time.monotonic() + timeout
        while True:
            state = self.partitions(topic)
            sizes = {
                p: {node: self._log_bytes(node, topic, p) for node in replicas}
                for p, (_, replicas, _) in state.items()
            }
            caught_up = all(len(set(s.values())) == 1 for s in sizes.values())
            if caught_up or time.monotonic() > deadline:
                break
            time.sleep(1)
        for p, (_, replicas, _) in state.items():
            if len({self.racks[node] for node in replicas}) != len(replicas):
                raise RuntimeError(f"{topic}-{p}: two replicas in one rack: {replicas}")
        return {
            "leader_bytes": sum(sizes[p][leader] for p, (leader, _, _) in state.items()),
            "follower_bytes": sum(
                size
                for p, (leader, _, _) in state.items()
                for node, size in sizes[p].items()
                if node != leader
            ),
            "followers_caught_up": caught_up,
            "by_partition": {p: {"leader": state[p][0], "bytes": sizes[p]} for p in sorted(state)},
        }

    def _log_bytes(self, node: int, topic: str, partition: int) -> int:
        folder = self.kafka.node(node).data_dir / "logs" / f"{topic}-{partition}"
        return sum(path.stat().st_size for path in folder.glob("*.log"))


# -- hops and figures -------------------------------------------------------------------------


def direct_hops(handle: Handle, cluster: Cluster) -> list[tuple[str, bool | None]]:
    """[(hop, crossed)]: client -> broker; None where the broker is not known."""
    node = cluster.ports.get(int(handle.address.rpartition(":")[2] or 0))
    return [("broker", None if node is None else cluster.racks[node] != handle.zone)]


def fleet_hops(handle: Handle, cluster: Cluster, fleet: Fleet, bootstrap_in_zone: bool):
    """[(hop, crossed)]: client -> proxy, proxy -> broker; None where not known."""
    host, _, port = handle.address.rpartition(":")
    proxy_zone = Fleet.zone_of(host)
    if proxy_zone is None:
        return [("proxy", None), ("broker", None)]
    if int(port) == fleet.port:
        to_broker = not bootstrap_in_zone
    else:
        rack = cluster.racks.get(int(port) - fleet.broker_port_base)
        to_broker = None if rack is None else rack != proxy_zone
    return [("proxy", proxy_zone != handle.zone), ("broker", to_broker)]


def summarize(scenario: dict, hops) -> dict:
    """Bytes per role and hop, those that crossed a zone, and what they cost. A hop whose
    ends are not known counts as crossing, and is reported as unattributed."""
    wire: dict[str, int] = defaultdict(int)
    crossed: dict[str, int] = defaultdict(int)
    unattributed = 0
    for handle in scenario["handles"]:
        moved = handle.sent + handle.received
        wire[handle.role] += moved
        for hop, crosses in hops(handle):
            crossed["client-proxy" if hop == "proxy" else handle.role] += moved * (
                crosses is not False
            )
            unattributed += moved * (crosses is None)
    values = scenario["value_bytes"]
    without = sum(crossed.values())
    total = without + scenario["logs"]["follower_bytes"]
    per_byte = total / values
    return {
        "records": scenario["records"],
        "value_bytes": values,
        "wire_produce": wire["produce"],
        "wire_consume": wire["consume"],
        "stored": scenario["logs"]["leader_bytes"],
        "x_client_proxy": crossed["client-proxy"] if "client-proxy" in crossed else None,
        "x_produce": crossed["produce"],
        "x_consume": crossed["consume"],
        "x_replication": scenario["logs"]["follower_bytes"],
        "x_total": total,
        "per_byte": per_byte,
        "usd_per_tb": per_byte * TB / GB * USD_PER_GB_CROSSED,
        "x_without": without,
        "per_byte_without": without / values,
        "usd_per_tb_without": without / values * TB / GB * USD_PER_GB_CROSSED,
        "times": f"{scenario['produce_s']:.0f} s / {scenario['consume_s']:.0f} s",
        "unattributed": unattributed,
    }


def fleet_check(fleet: dict, status: dict) -> dict:
    """{figure: (the clients' count, the proxies' own from `tierproxy fleet status`)}; a
    broker zone the proxies did not know counts as crossing, as fleet status counts it."""
    rows = status["zone_bytes"]
    in_zone = sum(r["bytes"] for r in rows if r["broker_zone"] == r["proxy_zone"])
    return {
        "client ↔ proxy, across zones": (
            fleet["x_client_proxy"],
            status["client_proxy_cross_zone_bytes"],
        ),
        "proxy ↔ brokers, across zones": (
            fleet["x_produce"] + fleet["x_consume"],
            status["total_bytes"] - in_zone,
        ),
        "all client traffic through the proxies": (
            fleet["wire_produce"] + fleet["wire_consume"],
            status["total_bytes"],
        ),
    }


def membership_estimate(cluster: Cluster, fleet: Fleet, seconds: float) -> dict:
    """The fleet's own traffic, estimated from its heartbeat topic: each record is written
    once to the leader (from another zone for 4 proxies of 6), read by every proxy (4 of
    them in other zones) and copied by two followers; request overhead left out."""
    logs = cluster.replica_logs(fleet.topic, timeout=5)
    (partition,) = logs["by_partition"].values()
    written = logs["leader_bytes"]
    outside = sum(p.zone != cluster.racks[partition["leader"]] for p in fleet.proxies)
    crossed = written * outside / len(fleet.proxies) + written * outside + logs["follower_bytes"]
    return {"seconds": seconds, "written": written, "crossed": int(crossed)}


# -- the report --------------------------------------------------------------------------------


def _gb(n: float | None) -> str:
    return "–" if n is None else f"{n / GB:.3f} GB"


TABLE = (  # label, summary key, format; a bold label makes a bold figure
    ("records produced (1,024 B values)", "records", "{:,}".format),
    ("record values produced", "value_bytes", _gb),
    ("produce traffic, client side (sent + received)", "wire_produce", _gb),
    ("consume traffic, client side (sent + received)", "wire_consume", _gb),
    ("stored per replica (the leaders' .log files)", "stored", _gb),
    ("cross-zone: client ↔ proxy", "x_client_proxy", _gb),
    ("cross-zone: client/proxy ↔ brokers, produce", "x_produce", _gb),
    ("cross-zone: client/proxy ↔ brokers, consume", "x_consume", _gb),
    ("cross-zone: replication (the followers' .log files)", "x_replication", _gb),
    ("**cross-zone total**", "x_total", _gb),
    ("**cross-zone bytes per produced byte**", "per_byte", "{:.2f}".format),
    ("**$ per TB produced**", "usd_per_tb", "${:.2f}".format),
    ("cross-zone without replication", "x_without", _gb),
    ("per produced byte, without replication", "per_byte_without", "{:.2f}".format),
    ("$ per TB produced, without replication", "usd_per_tb_without", "${:.2f}".format),
    ("time to produce / consume", "times", str),
)


def render(run: dict) -> str:
    summary, scenarios, m = run["summary"], run["scenarios"], run["machine"]
    shares = " / ".join(
        f"{name}: "
        + ", ".join(
            f"{zone[-1]} {share['own_zone']} of {len(share['partitions'])}"
            for zone, share in sorted(s["consumer_shares"].items())
        )
        for name, s in scenarios.items()
    )
    out = [
        "### Run",
        "",
        f"- command: `{run['command']}`",
        f"- proxy code at {run['proxy_code']}; {run['date']}",
        f"- machine: {m['nproc']} cores ({m['cpu_model']}), {m['memory_gib']} GiB, Linux "
        f"{m['kernel']}, Python {m['python']}, librdkafka {run['librdkafka']}; load average "
        f"at start {', '.join(f'{x:.2f}' for x in m['loadavg_at_start'])}",
        f"- Kafka {run['kafka']}, 3 nodes (KRaft), broker.rack zone-a/b/c; per scenario a "
        f"topic of {run['settings']['partitions']} partitions, replication factor 3, "
        "partition p led by broker p mod 3 + 1; producers write to the partitions in "
        f"turn; the consumers' shares (range assignor) hold partitions led from their own "
        f"zone: {shares}",
        f"- total runtime {run['runtime_s']:.0f} s",
        "",
        "GB = 10^9 bytes. Per produced byte = cross-zone bytes / record value bytes produced; "
        f"$ per TB = per produced byte × 1,000 GB × ${USD_PER_GB_CROSSED:.2f}.",
        "",
        "| | direct | fleet (passthrough) |",
        "| --- | ---: | ---: |",
    ]
    for label, key, fmt in TABLE:
        cells = [
            fmt(summary[name][key]) if summary[name][key] is not None else "–" for name in summary
        ]
        if label.startswith("**"):
            cells = [f"**{cell}**" for cell in cells]
        out.append(f"| {label} | {' | '.join(cells)} |")
    out += [
        "",
        "Fleet scenario: the clients' count against the proxies' own "
        "(`tierproxy fleet status --json`, summed from every proxy's heartbeat):",
        "",
        "| fleet, bytes | clients' statistics | `tierproxy fleet status` | difference |",
        "| --- | ---: | ---: | ---: |",
    ]
    for label, (mine, theirs) in run["fleet_check"].items():
        out.append(f"| {label} | {mine:,} | {theirs:,} | {theirs - mine:+,} |")
    probes = "; ".join(f"{name} {zones}" for name, zones in run["bootstrap_probe"].items())
    verdict = "in its own zone" if run["bootstrap_in_zone"] else "NOT shown to be in its zone"
    member = run["membership"]
    out += [
        "",
        f"- each proxy's bootstrap listener is served by a broker {verdict} (probe bytes "
        f"by broker zone: {probes})",
        f"- not in the table: the fleet's own heartbeats, {member['written']:,} B written to "
        f"the membership topic in {member['seconds']:.0f} s, about "
        f"{member['crossed'] / 1e6:.1f} MB "
        f"across zones ({member['crossed'] / member['seconds'] / 1000:.0f} kB/s, whatever "
        "the traffic)",
    ]
    for name, s in summary.items():
        if s["unattributed"]:
            out.append(f"- {name}: {s['unattributed']:,} B on hops not known, counted as crossing")
    if run["proxy_log_problems"]:
        out += ["", "Proxy warnings and errors:", "", "```", *run["proxy_log_problems"][:20], "```"]
    return "\n".join(out)


# -- the run ----------------------------------------------------------------------------------


def run_scenario(name: str, cluster: Cluster, bootstraps: dict, args, run_id: str) -> dict:
    topic = f"zones-{run_id}-{name}"
    leaders = cluster.create_topic(topic, args.partitions)
    total = args.bytes // RECORD_SIZE
    per_zone = [total // len(ZONES) + (i < total % len(ZONES)) for i in range(len(ZONES))]
    print(f"{name}: producing {total:,} records of {RECORD_SIZE} B into {topic}...", flush=True)
    started = time.monotonic()
    calls = [
        lambda z=z, n=n: produce(z, bootstraps[z], topic, args.partitions, n)
        for z, n in zip(ZONES, per_zone, strict=True)
    ]
    produced = [handle for handles in in_threads(calls) for handle in handles]
    produce_s = time.monotonic() - started
    print(f"{name}: produced in {produce_s:.0f} s; one group of three consumers reads it...")
    started = time.monotonic()
    members, consumed = consume(bootstraps, topic, f"zones-{run_id}-{name}", args.partitions)
    consume_s = time.monotonic() - started
    by_partition = sum((member.records for member in members), Counter())
    ends = {p: end for member in members for p, end in member.ends.items() if end}
    print(f"{name}: read {by_partition.total():,} records in {consume_s:.0f} s", flush=True)
    if by_partition.total() != total or dict(by_partition) != ends:
        raise RuntimeError(f"{name}: {total} produced, read {dict(by_partition)}, ends {ends}")
    return {
        "topic": topic,
        "records": total,
        "value_bytes": total * RECORD_SIZE,
        "leaders": leaders,
        "consumer_shares": {
            m.zone: {
                "partitions": sorted(m.share),
                "own_zone": sum(cluster.racks[leaders[p]] == m.zone for p in m.share),
            }
            for m in members
        },
        "produce_s": produce_s,
        "consume_s": consume_s,
        "handles": produced + consumed,
        "logs": cluster.replica_logs(topic),
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--bytes",
        type=int,
        default=GB,
        help="record value bytes produced per scenario, a third per zone (default 10^9)",
    )
    parser.add_argument(
        "--partitions",
        type=int,
        default=18,
        help="per topic (default 18; with a multiple of 9, each consumer's share holds as "
        "many partitions led from each zone, as a consumer blind to zones would on average)",
    )
    parser.add_argument("--json", type=Path, help="also write every figure and connection here")
    args = parser.parse_args(argv)
    if args.bytes < RECORD_SIZE * len(ZONES) or args.partitions < len(ZONES):
        parser.error(f"at least {RECORD_SIZE * len(ZONES)} bytes and {len(ZONES)} partitions")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.monotonic()
    for signum in (signal.SIGINT, signal.SIGTERM):  # SIGINT too: a background job ignores it
        signal.signal(signum, _interrupt)
    machine = machine_description()
    run_id = os.urandom(3).hex()
    with tempfile.TemporaryDirectory(prefix="tierproxy-zones-") as tmp, ExitStack() as stack:
        print("starting Kafka (3 nodes, racks zone-a/b/c)...", flush=True)
        # a deleted topic leaves the disk at once
        extra = {"file.delete.delay.ms": "1000"}
        kafka = KafkaCluster(size=3, racks=list(ZONES), name="kafka-zones", extra_config=extra)
        stack.callback(kafka.stop)
        kafka.start()
        cluster = Cluster(kafka)
        stack.callback(cluster.close)  # before Kafka stops, or librdkafka logs the stop
        direct = run_scenario("direct", cluster, {z: kafka.bootstrap for z in ZONES}, args, run_id)
        cluster.delete_topic(direct["topic"])

        print("starting the fleet (6 proxies, two per zone)...", flush=True)
        fleet = Fleet(kafka.bootstrap, Path(tmp), run_id)
        stack.callback(fleet.stop)
        fleet_started = time.monotonic()
        fleet.start()
        proxy_code = _git_state()  # what the proxies have just loaded
        bootstraps = {zone: fleet.bootstrap(zone) for zone in ZONES}
        in_fleet = run_scenario("fleet", cluster, bootstraps, args, run_id)
        time.sleep(3)  # the last counts travel with the next heartbeats (one a second)
        status = fleet.status()
        probe = fleet.probe_bootstrap()
        membership = membership_estimate(cluster, fleet, time.monotonic() - fleet_started)
        problems = [
            f"{proxy.name}: {line}"
            for proxy in fleet.proxies
            for line in proxy.process.log_path.read_text(errors="replace").splitlines()
            if " WARNING " in line or " ERROR " in line or "Traceback" in line
        ]

    bootstrap_in_zone = all(set(probe[p.name]) == {p.zone} for p in fleet.proxies)
    summary = {
        "direct": summarize(direct, lambda h: direct_hops(h, cluster)),
        "fleet": summarize(in_fleet, lambda h: fleet_hops(h, cluster, fleet, bootstrap_in_zone)),
    }
    run = {
        "command": _command_line(),
        "date": time.strftime("%Y-%m-%d %H:%M %Z"),
        "proxy_code": proxy_code,
        "machine": machine,
        "kafka": versions()["KAFKA_VERSION"],
        "librdkafka": libversion()[0],
        "settings": {k: str(v) for k, v in vars(args).items()},
        "summary": summary,
        "fleet_check": fleet_check(summary["fleet"], status),
        "fleet_status": status,
        "bootstrap_probe": probe,
        "bootstrap_in_zone": bootstrap_in_zone,
        "membership": membership,
        "proxy_log_problems": problems[:50],
        "scenarios": {"direct": direct, "fleet": in_fleet},
        "runtime_s": time.monotonic() - started,
    }
    print()
    print(render(run))
    if args.json:
        args.json.write_text(json.dumps(run, indent=2, default=asdict))
        print(f"\n(JSON written to {args.json})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
