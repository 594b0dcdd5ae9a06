"""The issue's scenario with the Java client, through Kafka's own command-line tools.

The tools come from the same 4.1.2 jars the devstack runs Kafka from:
TopicCommand creates, describes, deletes and lists the topic; VerifiableProducer sends
20,000 keyed records with an idempotent producer and prints each acknowledgement;
two VerifiableConsumers form one group, print every record and every commit; after
they stop, ProducerPerformance adds 20,000 more records and ConsumerPerformance, in
the same group, must resume at the committed offsets: ConsumerGroupCommand then shows
every partition committed up to its end, with no lag.
"""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import threading
import uuid
from collections import Counter
from pathlib import Path

import pytest

from proxy.devstack.paths import kafka_libs
from tests.support import waiting

pytestmark = pytest.mark.kafka

PARTITIONS = 6
RECORDS = 20_000
JVM_OPTIONS = ["-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1"]
TOOLS = "org.apache.kafka.tools."

_TOOLS_LOG4J2 = """\
status = error
appender.err.type = Console
appender.err.name = ERR
appender.err.target = SYSTEM_ERR
appender.err.layout.type = PatternLayout
appender.err.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = WARN
rootLogger.appenderRef.err.ref = ERR
"""


class KafkaTools:
    """Runs Kafka's tools on small heaps; their logs go to stderr, their data to stdout."""

    def __init__(self, bootstrap: str, workdir: Path) -> None:
        self.bootstrap = bootstrap
        self.workdir = workdir
        log_config = workdir / "tools-log4j2.properties"
        log_config.write_text(_TOOLS_LOG4J2)
        self._argv = [
            shutil.which("java") or "java",
            *JVM_OPTIONS,
            "-Djava.net.preferIPv4Stack=true",
            f"-Dlog4j2.configurationFile={log_config}",
            "-cp",
            f"{kafka_libs()}/*",
        ]

        self.started: list[JsonEvents] = []

    def start(self, stderr: Path, main_class: str, *args: str) -> JsonEvents:
        tool = JsonEvents(self.argv(main_class, *args), stderr)
        self.started.append(tool)
        return tool

    def kill_leftovers(self) -> None:
        for tool in self.started:
            if tool.process.poll() is None:
                tool.process.kill()
                tool.process.wait(10)

    def argv(self, main_class: str, *args: str) -> list[str]:
        return [*self._argv, TOOLS + main_class, *args]

    def run(self, main_class: str, *args: str, timeout: float = 90.0) -> str:
        done = subprocess.run(
            self.argv(main_class, *args),
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )
        assert done.returncode == 0, (
            f"{main_class} exited with {done.returncode}\nstdout:\n{done.stdout[-3000:]}\n"
            f"stderr:\n{done.stderr[-3000:]}"
        )
        return done.stdout

    def properties(self, name: str, **props: str) -> Path:
        path = self.workdir / name
        path.write_text(
            "".join(f"{key.replace('_', '.')}={value}\n" for key, value in props.items())
        )
        return path


class JsonEvents(threading.Thread):
    """A tool printing one JSON event per line (the Verifiable* tools), read live."""

    def __init__(self, argv: list[str], stderr: Path) -> None:
        super().__init__(daemon=True)
        self.stderr = stderr
        with open(stderr, "wb") as errors:
            self.process = subprocess.Popen(
                argv, stdout=subprocess.PIPE, stderr=errors, stdin=subprocess.DEVNULL, text=True
            )
        self.events: list[dict] = []
        self.start()

    def run(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            if line.startswith("{"):
                self.events.append(json.loads(line))

    def named(self, name: str) -> list[dict]:
        return [event for event in list(self.events) if event["name"] == name]

    def assignment(self) -> list[int]:
        """The partitions of the latest assignment (empty after a revocation)."""
        for event in reversed(list(self.events)):
            if event["name"] == "partitions_assigned":
                return [p["partition"] for p in event["partitions"]]
            if event["name"] == "partitions_revoked":
                return []
        return []

    def errors(self) -> str:
        return self.stderr.read_text(errors="replace")[-3000:]

    def wait_exit(self, timeout: float, ok: tuple[int, ...] = (0,)) -> None:
        self.process.wait(timeout)
        self.join(timeout)
        assert self.process.stdout is not None
        self.process.stdout.close()
        assert self.process.returncode in ok, self.errors()

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM: the tools shut down cleanly on it, say so (shutdown_complete), and
        the JVM exits with 128 + 15."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        self.wait_exit(timeout, ok=(0, 128 + signal.SIGTERM))


def args(line: str) -> list[str]:
    return line.split()


@pytest.fixture
def tools(bootstrap, tmp_path):
    tools = KafkaTools(bootstrap, tmp_path)
    yield tools
    tools.kill_leftovers()


def test_java_client_full_scenario(bootstrap, tools, tmp_path):
    tag = uuid.uuid4().hex[:8]
    topic, group = f"compat-java-{tag}", f"compat-java-group-{tag}"
    server = f"--bootstrap-server {bootstrap}"

    create = f"{server} --create --topic {topic} --partitions {PARTITIONS} --replication-factor 3"
    assert f"Created topic {topic}." in tools.run("TopicCommand", *args(create))
    described = wait_for(
        lambda: tools.run("TopicCommand", *args(f"{server} --describe --topic {topic}")),
        lambda out: len(re.findall(r"Partition: \d+\s+Leader: \d+", out)) == PARTITIONS,
        f"{topic} described with {PARTITIONS} led partitions",
    )
    assert f"PartitionCount: {PARTITIONS}" in described

    # A group of two, formed before any record exists so that both get a share; each
    # commits synchronously after every batch (the tool's default).
    consume = f"{server} --topic {topic} --group-id {group} --verbose"
    members = [
        tools.start(tmp_path / f"vc{i}.err", "VerifiableConsumer", *args(consume)) for i in range(2)
    ]
    try:
        wait_for(
            lambda: [m.assignment() for m in members],
            lambda shares: (
                all(shares) and sorted(p for s in shares for p in s) == [*range(PARTITIONS)]
            ),
            "both members assigned a share of the partitions",
        )

        # 20,000 keyed records, idempotent; every acknowledgement printed with its offset.
        config = tools.properties(
            "producer.properties", enable_idempotence="true", acks="all", retries="2147483647"
        )
        produce = (
            f"{server} --topic {topic} --max-messages {RECORDS} --repeating-keys {RECORDS} "
            f"--value-prefix 7 --producer.config {config}"
        )
        producer = tools.start(tmp_path / "vp.err", "VerifiableProducer", *args(produce))
        producer.wait_exit(timeout=120)

        wait_for(
            lambda: sum(len(m.named("record_data")) for m in members),
            lambda n: n >= RECORDS or any(m.process.poll() is not None for m in members),
            f"the group read {RECORDS} records",
        )
    finally:
        for member in members:
            member.stop()  # a failure here leaves the other to the fixture's kill

    assert producer.named("producer_send_error") == []
    acked = producer.named("producer_send_success")
    assert len(acked) == RECORDS
    produced = [(e["key"], e["value"]) for e in acked]
    assert len(set(produced)) == RECORDS
    ends = Counter(e["partition"] for e in acked)
    assert sorted(ends) == list(range(PARTITIONS))
    assert {(e["partition"], e["offset"]) for e in acked} == {
        (p, o) for p, n in ends.items() for o in range(n)
    }

    assert all(m.named("shutdown_complete") for m in members)
    per_member = [[(e["key"], e["value"]) for e in m.named("record_data")] for m in members]
    assert all(per_member), f"a member read nothing: {[len(r) for r in per_member]}"
    got = [record for records in per_member for record in records]
    duplicated = [record for record, n in Counter(got).items() if n > 1]
    assert not duplicated, f"{len(duplicated)} records read twice, e.g. {duplicated[:3]}"
    assert sorted(got) == sorted(produced)
    committed: dict[int, int] = {}
    for member in members:
        for event in member.named("offsets_committed"):
            assert event["success"], event
            for entry in event["offsets"]:
                partition = entry["partition"]
                committed[partition] = max(committed.get(partition, 0), entry["offset"])
    assert committed == dict(ends)

    # More records, then a restarted consumer of the group: it must start at the
    # committed offsets, so it reads exactly the new ones and commits every end.
    perf = (
        f"--topic {topic} --num-records {RECORDS} --record-size 100 --throughput -1 "
        f"--producer-props bootstrap.servers={bootstrap} acks=all enable.idempotence=true"
    )
    out = tools.run("ProducerPerformance", *args(perf))
    assert re.search(rf"^{RECORDS} records sent", out, re.M), out
    perf = f"{server} --topic {topic} --group {group} --messages {RECORDS} --timeout 30000"
    out = tools.run("ConsumerPerformance", *args(perf))
    header, row = [line.split(",") for line in out.splitlines() if line.strip()][-2:]
    stats = dict(zip(map(str.strip, header), map(str.strip, row), strict=True))
    assert int(stats["data.consumed.in.nMsg"]) == RECORDS, out
    out = tools.run(
        "consumer.group.ConsumerGroupCommand", *args(f"{server} --describe --group {group}")
    )
    offsets = {
        int(m["partition"]): (int(m["current"]), int(m["end"]), m["lag"])
        for m in re.finditer(
            rf"^{re.escape(group)}\s+{re.escape(topic)}\s+(?P<partition>\d+)\s+"
            r"(?P<current>\d+)\s+(?P<end>\d+)\s+(?P<lag>\S+)",
            out,
            re.M,
        )
    }
    assert sorted(offsets) == list(range(PARTITIONS)), out
    assert all(current == end and lag == "0" for current, end, lag in offsets.values()), out
    assert sum(end for _, end, _ in offsets.values()) == 2 * RECORDS, out

    tools.run("TopicCommand", *args(f"{server} --delete --topic {topic}"))
    wait_for(
        lambda: tools.run("TopicCommand", *args(f"{server} --list")).split(),
        lambda topics: topic not in topics,
        f"{topic} gone from the topic list",
    )


def wait_for(get, done, what: str):
    """The Java tools start a JVM a call: a longer bound, a slower poll."""
    return waiting.wait_for(get, done, what, timeout=90.0, interval=0.3)
