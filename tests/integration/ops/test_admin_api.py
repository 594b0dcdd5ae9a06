"""The admin API, the metrics and the CLI views of a live tiered proxy, as an operator
meets them: the shared 3-broker Kafka, objects on the shared MinIO (its secret key from
the environment, `${...}` in the config), fleet membership through Kafka, the admin API
on a loopback port with a token.

One proxy for the module: it comes up ready; probes need no token, every other path
does (401 without it or with a wrong one); a topic produced to, tiered with
`tierproxy topics tier`, produced to and read through the proxy shows up tiered in
/v1/topics and in `tierproxy topics list|status`, with its cutover where Kafka's log
ended; /v1/fleet names this proxy with every shard and its uploader lag; the metrics
move (requests and latency per API key, WAL appends and fsyncs, uploads, log cache
reads); the Grafana dashboard's every metric is on /metrics; and neither the S3 secret
nor the token appears in anything served or logged.
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import re
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kio.schema.fetch.v12.request import FetchPartition, FetchRequest, FetchTopic
from kio.static.primitive import i32, i64
from prometheus_client.parser import text_string_to_metric_families

from proxy.config import parse_config
from proxy.devstack.minio import SECRET_KEY
from proxy.devstack.paths import free_port, free_port_block
from proxy.devstack.proxy_thread import ProxyThread
from proxy.kafka.messages import encode_request

pytestmark = [pytest.mark.kafka, pytest.mark.minio]

TOKEN = "admin-token-" + uuid.uuid4().hex  # what the operator would keep in a secret store
SECRET_ENV = "TIERPROXY_TEST_S3_SECRET"
PARTITIONS = 2
BEFORE = 40  # records per partition through Kafka, before the topic is tiered
AFTER = 60  # records per partition through the proxy once it is tiered
DASHBOARD = Path(__file__).parents[3] / "docs" / "grafana-dashboard.json"
TIERPROXY = [sys.executable, "-m", "proxy.cli"]


class _Lines(logging.Handler):
    """Every log line of the process while the module runs, formatted as written."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []
        self.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def text(self) -> str:
        return "\n".join(self.format(r) for r in self.records)


def _config(kafka_cluster, s3_server, tmp_path: Path, suffix: str) -> dict:
    endpoint = s3_server.client_kwargs()["endpoint_url"]
    return {
        "upstream": {"bootstrap": kafka_cluster.bootstrap},
        "listeners": {"bootstrap_port": free_port(), "broker_port_base": free_port_block(8)},
        "fleet": {"name": f"ops-{suffix}", "zone": "zone-a", "topic": f"fleet-ops-{suffix}"},
        "tiering": {
            "metadata_topic": f"meta-ops-{suffix}",
            "shard_count": 2,
            "session_timeout_ms": 6000,
            "upload_interval_s": 0.2,
            "wal": {"directory": str(tmp_path / "wal")},
            "object_store": {
                "kind": "s3",
                "bucket": s3_server.bucket,
                "endpoint_url": endpoint,
                "access_key_id": s3_server.client_kwargs()["aws_access_key_id"],
                "secret_access_key": "${" + SECRET_ENV + "}",
                "path_style": True,
            },
        },
        "admin": {"port": 0, "token": TOKEN},
    }


@pytest.fixture(scope="module")
def ops(kafka_cluster, s3_server, tmp_path_factory):
    """(proxy thread, admin URL, captured log lines)."""
    suffix = uuid.uuid4().hex[:8]
    os.environ[SECRET_ENV] = SECRET_KEY
    lines = _Lines()
    root = logging.getLogger()
    level = root.level
    root.addHandler(lines)
    root.setLevel(logging.DEBUG)  # the most a misconfigured proxy could write
    try:
        tmp = tmp_path_factory.mktemp("ops")
        config = parse_config(_config(kafka_cluster, s3_server, tmp, suffix))
        with ProxyThread(config) as proxy:
            yield proxy, f"http://127.0.0.1:{proxy.proxy.admin.port}", lines
    finally:
        root.removeHandler(lines)
        root.setLevel(level)
        del os.environ[SECRET_ENV]


def _get(url: str, token: str | None = TOKEN) -> tuple[int, dict[str, str], bytes]:
    request = urllib.request.Request(url)
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, dict(answer.headers), answer.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


def _wait(condition, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"{what}: not after {timeout_s} s"
        time.sleep(0.2)


def _metrics(admin: str) -> dict[tuple[str, tuple], float]:
    """(sample name, sorted labels) -> value, as /metrics serves them."""
    status, _, body = _get(admin + "/metrics")
    assert status == 200
    samples = {}
    for family in text_string_to_metric_families(body.decode()):
        for s in family.samples:
            samples[s.name, tuple(sorted(s.labels.items()))] = s.value
    return samples


def _value(samples, name: str, **labels) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def _produce(bootstrap: str, topic: str, count: int, prefix: str) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    for p in range(PARTITIONS):
        for n in range(count):
            producer.produce(topic, f"{prefix}-{n}".encode(), partition=p)
    assert producer.flush(60) == 0


def _read(bootstrap: str, topic: str, per_partition: int) -> dict[int, int]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"ops-{uuid.uuid4().hex}"})
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(PARTITIONS)])
    got = dict.fromkeys(range(PARTITIONS), 0)
    deadline = time.monotonic() + 60
    try:
        while any(n < per_partition for n in got.values()) and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None and msg.error() is None:
                got[msg.partition()] += 1
    finally:
        consumer.close()
    return got


def _cli(*args: str, token: str | None = TOKEN) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "TIERPROXY_ADMIN_TOKEN"}
    if token is not None:
        env["TIERPROXY_ADMIN_TOKEN"] = token
    return subprocess.run([*TIERPROXY, *args], capture_output=True, text=True, timeout=120, env=env)


def test_probes_need_no_token_and_everything_else_does(ops):
    proxy, admin, _ = ops
    _wait(lambda: _get(admin + "/readyz", None)[0] == 200, 60, "ready")
    status, _, body = _get(admin + "/readyz", None)
    checks = json.loads(body)["checks"]
    assert checks["upstream"]["ok"] and checks["fleet"]["ok"]
    assert sorted(checks["tiering"]["owned_shards"]) == [0, 1]  # the fleet's only member
    status, _, body = _get(admin + "/healthz", None)
    assert status == 200 and json.loads(body)["name"] == proxy.config.fleet.name
    for path in ("/v1/topics", "/v1/fleet", "/metrics"):
        status, headers, _ = _get(admin + path, None)
        assert status == 401, path
        assert headers["WWW-Authenticate"].startswith("Bearer")
        assert _get(admin + path, TOKEN[:-1] + "x")[0] == 401, path
        assert _get(admin + path)[0] == 200, path
    assert _get(admin + "/v1/nothing")[0] == 404
    port = proxy.proxy.admin.port
    for raw, status in (
        (b"POST /v1/topics HTTP/1.1\r\n\r\n", b"405"),
        (b"\x16\x03\x01\x00\x05hello\r\n\r\n", b"400"),  # TLS spoken to plain HTTP
        (b"GET /healthz HTTP/1.1\r\nX: " + b"y" * 20000 + b"\r\n\r\n", b"431"),
        (b"HEAD /healthz HTTP/1.1\r\n\r\n", b"200"),
    ):
        with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
            conn.sendall(raw)
            answer = b""
            while chunk := conn.recv(65536):
                answer += chunk
        assert answer.split(b" ", 2)[1] == status, answer[:200]
        if raw.startswith(b"HEAD"):
            assert answer.endswith(b"\r\n\r\n")  # the head alone
    assert _get(admin + "/healthz", None)[0] == 200  # and it goes on serving
    assert _get(admin + "/v1/topics/no-such-topic-" + uuid.uuid4().hex)[0] == 404


def test_a_tiered_topic_in_the_admin_api_the_cli_and_the_metrics(ops, kafka_cluster):
    proxy, admin, lines = ops
    _wait(lambda: _get(admin + "/readyz", None)[0] == 200, 60, "ready")
    topic = f"ops-{uuid.uuid4().hex[:8]}"
    kafka_admin = AdminClient({"bootstrap.servers": kafka_cluster.bootstrap})
    kafka_admin.create_topics([NewTopic(topic, PARTITIONS, 3)])[topic].result(30)
    _produce(proxy.bootstrap, topic, BEFORE, "kafka")
    assert _get(admin + f"/v1/topics/{topic}")[2] and json.loads(
        _get(admin + f"/v1/topics/{topic}")[2]
    ) == {"topic": topic, "mode": "passthrough", "partitions": PARTITIONS}
    before = _metrics(admin)

    peer = f"127.0.0.1:{proxy.proxy.tiering.peer_port}"
    tier = _cli("topics", "tier", topic, "--peer", peer)
    assert tier.returncode == 0, tier.stderr
    _wait(lambda: _status(admin, topic)["mode"] == "tiered", 30, "tiered")
    _wait(lambda: len(_status(admin, topic)["tiered_partitions"]) == PARTITIONS, 30, "cut over")
    connection_lines = len([r for r in lines.records if r.name == "tierproxy.connection"])
    _produce(proxy.bootstrap, topic, AFTER, "tiered")
    assert _read(proxy.bootstrap, topic, BEFORE + AFTER) == dict.fromkeys(
        range(PARTITIONS), BEFORE + AFTER
    )
    # a healthy produce and consume writes no connection line (nothing per request)
    assert len([r for r in lines.records if r.name == "tierproxy.connection"]) == connection_lines
    proxy.run(lambda: proxy.proxy.tiering.uploader.flush())

    status = _status(admin, topic)
    assert status["partitions"] == PARTITIONS
    for p in status["tiered_partitions"]:
        assert p["cutover_offset"] == BEFORE
        assert p["log_start_offset"] == 0
        assert p["high_watermark"] == BEFORE + AFTER  # owned here: the WAL's end
        assert p["committed_end_offset"] == BEFORE + AFTER  # flushed: all in objects
        assert p["objects"] >= 1 and p["object_bytes"] > 0
        assert p["offsets_only_in_kafka"] == BEFORE  # not migrated
        assert p["owner"] == proxy.config.fleet.name

    listed = _cli("topics", "list", "--admin", admin)
    assert listed.returncode == 0, listed.stderr
    row = next(line for line in listed.stdout.splitlines() if line.startswith(topic + " "))
    assert row.split()[:3] == [topic, "tiered", str(PARTITIONS)]
    shown = _cli("topics", "status", topic, "--admin", admin, "--json")
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["tiered_partitions"] == status["tiered_partitions"]
    table = _cli("topics", "status", topic, "--admin", admin)
    assert "CUTOVER" in table.stdout and f"{BEFORE + AFTER}" in table.stdout
    refused = _cli("topics", "list", "--admin", admin, token=None)
    assert refused.returncode == 1 and "HTTP 401" in refused.stderr

    fleet = json.loads(_get(admin + "/v1/fleet")[2])
    me = next(m for m in fleet["members"] if m["self"])
    assert me["live"] and me["zone"] == "zone-a" and me["shards"] == [0, 1]
    assert me["uploader"]["lag_bytes"] == 0  # flushed just now
    assert all(s["owner"] == me["name"] and s["owner_live"] for s in fleet["shards"])
    shown = _cli("fleet", "status", "--admin", admin)
    assert shown.returncode == 0 and me["name"] in shown.stdout, shown.stderr

    after = _metrics(admin)

    def moved(name: str, **labels) -> float:
        return _value(after, name, **labels) - _value(before, name, **labels)

    assert moved("tierproxy_request_seconds_count", api_key="0") >= PARTITIONS  # Produce
    assert moved("tierproxy_request_seconds_count", api_key="1") >= 1  # Fetch
    assert moved("tierproxy_wal_appends_total") >= PARTITIONS
    assert moved("tierproxy_wal_fsync_seconds_count") >= 1
    assert moved("tierproxy_wal_fsync_seconds_sum") > 0
    assert moved("tierproxy_uploader_uploads_total") >= 1
    assert moved("tierproxy_uploader_object_bytes_total") > 0
    # the tiered reads went to the caches (committed within 0.2 s: mostly the block cache)
    lookups = [
        f"tierproxy_{c}_cache_{r}_total" for c in ("log", "block") for r in ("hits", "misses")
    ]
    assert sum(moved(name) for name in lookups) > 0
    assert _value(after, "tierproxy_client_connections") >= 0
    assert _value(after, "tierproxy_wal_capacity_bytes") > 0
    assert _value(after, "tierproxy_uploader_lag_bytes") == 0


def _status(admin: str, topic: str) -> dict:
    status, _, body = _get(admin + f"/v1/topics/{topic}")
    assert status == 200, body
    return json.loads(body)


def test_every_dashboard_metric_is_served(ops):
    _, admin, _ = ops
    status, _, body = _get(admin + "/metrics")
    served = {family.name for family in text_string_to_metric_families(body.decode())}
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [target["expr"] for panel in dashboard["panels"] for target in panel.get("targets", ())]
    used = {
        re.sub(r"_(bucket|count|sum|total)$", "", name)
        for expr in exprs
        for name in re.findall(r"\b(tierproxy_[a-z0-9_]+)", expr)
    }
    assert len(exprs) >= 10 and len(used) >= 15
    missing = sorted(used - served)
    assert not missing, f"the dashboard uses metrics no proxy serves: {missing}"


def test_no_secret_is_served_or_logged(ops):
    _, admin, lines = ops
    served = b"".join(
        _get(admin + path)[2]
        for path in ("/healthz", "/readyz", "/v1/topics", "/v1/fleet", "/metrics")
    )
    assert b'"members"' in served and b'"topics"' in served  # answers, not error pages
    for secret in (SECRET_KEY, TOKEN):
        assert secret.encode() not in served
        assert secret not in lines.text()
    assert len(lines.records) > 10  # the check read real log output


def test_a_request_whose_connection_closes_unanswered_is_counted(ops, kafka_cluster):
    """A Fetch the broker holds (no data, max wait 30 s) on a connection the client then
    closes: one unanswered Fetch."""
    proxy, admin, _ = ops
    topic = f"ops-unanswered-{uuid.uuid4().hex[:8]}"
    kafka_admin = AdminClient({"bootstrap.servers": kafka_cluster.bootstrap})
    kafka_admin.create_topics([NewTopic(topic, 1, 3)])[topic].result(30)

    def leader() -> int:
        partitions = kafka_admin.list_topics(topic, timeout=10).topics[topic].partitions
        return partitions[0].leader if 0 in partitions else -1

    _wait(lambda: leader() >= 0, 30, "a leader")
    port = proxy.config.listeners.broker_port_base + leader()
    fetch = FetchRequest(
        max_wait=datetime.timedelta(seconds=30),
        min_bytes=i32(1),
        max_bytes=i32(1 << 20),
        topics=(
            FetchTopic(
                topic=topic,
                partitions=(
                    FetchPartition(
                        partition=i32(0), fetch_offset=i64(0), partition_max_bytes=i32(1 << 20)
                    ),
                ),
            ),
        ),
        forgotten_topics_data=(),
        rack_id="",
    )
    before = _value(_metrics(admin), "tierproxy_unanswered_requests_total", api_key="1")
    # a partition just created may be answered at once (its leader not settled yet):
    # again until the broker holds the Fetch
    for _ in range(40):
        with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
            conn.sendall(encode_request(fetch, correlation_id=7))
            conn.settimeout(1.0)
            try:
                conn.recv(1)
            except TimeoutError:
                break  # held by the broker: closed now, unanswered
        time.sleep(0.25)
    else:
        raise AssertionError("the broker never held the Fetch")
    _wait(
        lambda: (
            _value(_metrics(admin), "tierproxy_unanswered_requests_total", api_key="1")
            == before + 1
        ),
        30,
        "the unanswered Fetch counted",
    )
