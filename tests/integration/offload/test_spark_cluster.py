"""The offload jobs on a real Spark standalone cluster (a master and two 1-core workers,
the session's `spark_cluster`), submitted as docs/offload.md tells users ("On a Spark
cluster"): `spark-submit --master spark://... --py-files <make offload-zip's zip> --conf
spark.pyspark.python=<the workers' Python> --conf spark.pyspark.driver.python=<the
driver's> offload_jobs/<script>.py ...`. The workers' Python holds the dependencies but
not tierproxy (`deps_only_python`), and no PYTHONPATH reaches the jobs: the code they run
is the zip's. The only additions to the documented command are the test's windows on
the job: an event log and the driver's UI port.

1. migrate from segments and export (to S3), with the end checks of the local tests: the
   objects hold Kafka's batches byte for byte, the export reads back field by field, and
   once Kafka's copy is dropped a consumer reads the whole topic through the proxy.
2. a worker is lost mid-migration from the cluster (kill -9 of its JVM and its executor,
   whose Python workers follow, while a task runs there): the event log shows that task
   lost with its executor and run again on the other worker, and the result is exact: one
   object per range, each Kafka's batches, every range committed once and no gap left
   (a re-run plans nothing); verify, on the cluster whole again, says OK; once Kafka's
   copy is dropped a consumer reads the whole topic through the proxy.

Each spark-submit is an application of its own (a driver, an executor per worker): the
tests keep to four of them, the cluster is the session's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest
from offloadcopies import s3_spec
from offloaddata import CODECS, Topic, create_topic, produce
from pyarrow import fs
from test_export import expected, read_back
from test_migrate_segments import (
    _config,
    _drop_kafkas_copy_and_read_all,
    _objects_hold_kafkas_batches,
    _offload_keys,
    _produce_through_proxy,
    _tier,
)

from proxy.devstack.paths import free_port, repo_root
from proxy.devstack.sparkcluster import deps_only_python, spark_bin
from proxy.metadata.streams import shard_of, stream_id
from tests.integration.tiering.tieredfleet import TieredFleet
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.kafka, pytest.mark.minio, pytest.mark.spark]


@pytest.fixture(scope="module")
def submit(spark_cluster, tmp_path_factory):
    """Runs `spark-submit` of one job script on the cluster; returns its Popen (stdout
    and stderr to files beside its event log)."""
    base = tmp_path_factory.mktemp("spark-submit")
    code = base / "tierproxy-offload.zip"
    script = repo_root() / "scripts" / "offload_zip.py"  # what `make offload-zip` runs
    subprocess.run([sys.executable, str(script), "--out", str(code)], check=True)
    worker_python = deps_only_python(base / "worker-env")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {
        "SPARK_LOCAL_IP": "127.0.0.1"
    }

    def start(script: str, *args: str) -> Job:
        run = base / f"run-{uuid.uuid4().hex[:6]}"
        (run / "events").mkdir(parents=True)
        ui_port = free_port()
        argv = [
            str(spark_bin("spark-submit")), "--master", spark_cluster.master_url,
            "--py-files", str(code),
            "--conf", f"spark.pyspark.python={worker_python}",
            "--conf", f"spark.pyspark.driver.python={sys.executable}",
            # the test's windows on the job
            "--conf", "spark.eventLog.enabled=true", "--conf", "spark.eventLog.compress=false",
            "--conf", f"spark.eventLog.dir=file://{run / 'events'}",
            "--conf", f"spark.ui.port={ui_port}",
            str(repo_root() / "offload_jobs" / script), *args,
        ]  # fmt: skip
        with open(run / "stdout", "wb") as out, open(run / "stderr", "wb") as err:
            proc = subprocess.Popen(argv, stdout=out, stderr=err, env=env, cwd=run)
        return Job(proc, run, ui_port)

    return start


class Job:
    """A spark-submit run: its process, folder (stdout, stderr, events/) and UI port."""

    def __init__(self, proc: subprocess.Popen, folder: Path, ui_port: int) -> None:
        self.proc, self.folder, self.ui_port = proc, folder, ui_port

    def wait(self, timeout: float = 300) -> tuple[int, str]:
        """(exit code, stdout); the driver's log tail is in the failure message."""
        try:
            code = self.proc.wait(timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
        out = (self.folder / "stdout").read_text()
        if code != 0:
            out += "\n--- driver log (tail)\n" + (self.folder / "stderr").read_text()[-4000:]
        return code, out

    def api(self, path: str):
        """The driver's REST API (its UI, up while the job runs); None before it answers."""
        url = f"http://127.0.0.1:{self.ui_port}/api/v1/applications{path}"
        try:
            with urllib.request.urlopen(url, timeout=5) as answer:
                return json.load(answer)
        except (urllib.error.URLError, OSError, ValueError):
            return None

    def task_ends(self) -> list[dict]:
        """SparkListenerTaskEnd events of the job's event log (Spark 4 rolls it: a folder)."""
        files = sorted((self.folder / "events").rglob("events_*"))  # not its .crc files
        events = (json.loads(line) for f in files for line in f.read_text().splitlines())
        return [e for e in events if e["Event"] == "SparkListenerTaskEnd"]


def _peer(fleet: TieredFleet) -> str:
    return f"127.0.0.1:{fleet['zone-a'].peer_port}"


def test_migrate_from_segments_and_export_through_spark_submit(
    fleet, kafka_cluster, s3_server, spark_cluster, submit, mixed_topic, tmp_path
):
    bootstrap = kafka_cluster.bootstrap
    topic = Topic(f"cluster-{uuid.uuid4().hex[:8]}", 2)
    create_topic(bootstrap, topic.name, topic.partitions, {"min.insync.replicas": "2"})
    for codec in CODECS:
        produce(bootstrap, topic, codec, 100)
    produce(bootstrap, topic, "lz4", 100, transactional=True)
    topic_id, cutovers = _tier(fleet, topic)
    _produce_through_proxy(fleet.bootstrap(), topic)
    log_dirs = [str(Path(node.data_dir) / "logs") for node in kafka_cluster.nodes]

    segments = [arg for d in log_dirs for arg in ("--from-segments", d)]
    job = submit("migrate_cli.py", topic.name, "--config", _config(fleet),
                 "--peer", _peer(fleet), *segments)  # fmt: skip
    code, out = job.wait()
    assert code == 0, out
    assert "2 tiered partitions, 2 ranges to move" in out and "(2 committed, 0 " in out, out
    for p in range(topic.partitions):
        _objects_hold_kafkas_batches(fleet, topic_id, p, Path(log_dirs[0]) / f"{topic.name}-{p}")

    # the export of a topic that is not tiered, to S3 as a cluster's executors write it
    prefix = f"exports/{mixed_topic.name}-cluster"
    job = submit("report_cli.py", "export", mixed_topic.name, "--config", _config(fleet),
                 "--to", f"s3://{s3_server.bucket}/{prefix}")  # fmt: skip
    code, out = job.wait()
    assert code == 0, out
    assert f"exported {mixed_topic.name} to s3://{s3_server.bucket}/{prefix}: " in out, out
    s3 = s3_spec(s3_server).s3
    endpoint = s3["endpoint_url"].split("://")
    minio = fs.S3FileSystem(
        access_key=s3["access_key_id"], secret_key=s3["secret_access_key"],
        region=s3["region"], endpoint_override=endpoint[1], scheme=endpoint[0],
    )  # fmt: skip
    assert read_back(f"{s3_server.bucket}/{prefix}", minio) == expected(mixed_topic)

    _drop_kafkas_copy_and_read_all(fleet, bootstrap, topic, cutovers)


def test_a_worker_lost_mid_migration_changes_nothing(
    fleet, kafka_cluster, spark_cluster, submit, tmp_path
):
    bootstrap = kafka_cluster.bootstrap
    topic = Topic(f"cluster-kill-{uuid.uuid4().hex[:8]}", 4)
    create_topic(bootstrap, topic.name, topic.partitions, {"min.insync.replicas": "2"})
    produce(bootstrap, topic, "zstd", 400)
    produce(bootstrap, topic, "none", 400)
    produce(bootstrap, topic, "lz4", 200, transactional=True)
    topic_id, cutovers = _tier(fleet, topic)
    before = _offload_keys(fleet)

    job = submit("migrate_cli.py", topic.name, "--config", _config(fleet),
                 "--peer", _peer(fleet), "--from-cluster")  # fmt: skip
    worker = None
    try:
        found = wait_for(
            lambda: _busy_worker(spark_cluster, job),
            lambda found: found is not None or job.proc.poll() is not None,
            "a task running on a worker's executor", timeout=240, interval=0.05,
        )  # fmt: skip
        assert found is not None, job.wait()  # the job ended before any task ran
        worker, executor = found
        spark_cluster.kill_worker(worker)
        code, out = job.wait()
    finally:
        if job.proc.poll() is None:  # the wait for a busy executor failed
            job.proc.kill()
            job.proc.wait()
        if worker is not None:  # the session's cluster is whole again for the next test
            spark_cluster.restart_worker(worker)
    assert code == 0, out
    assert "4 tiered partitions, 4 ranges to move" in out and "(4 committed, 0 " in out, out

    # the task that ran on the lost executor failed with it, and ran again elsewhere
    ends = job.task_ends()
    lost = [e for e in ends if e["Task End Reason"]["Reason"] == "ExecutorLostFailure"]
    assert lost and all(e["Task Info"]["Executor ID"] == executor for e in lost), ends
    succeeded = {e["Task Info"]["Index"]: e["Task Info"]["Executor ID"] for e in ends
                 if e["Task End Reason"]["Reason"] == "Success"}  # fmt: skip
    assert sorted(succeeded) == [0, 1, 2, 3]
    for e in lost:
        assert succeeded[e["Task Info"]["Index"]] != executor

    # exact: one object per range (the retried task wrote its range's own key), each
    # holding Kafka's batches; no gap left, so a re-run would plan nothing
    assert len(_offload_keys(fleet) - before) == topic.partitions
    states = fleet.states()
    for p in range(topic.partitions):
        log_dir = Path(kafka_cluster.nodes[0].data_dir) / "logs" / f"{topic.name}-{p}"
        _objects_hold_kafkas_batches(fleet, topic_id, p, log_dir)
        stream = stream_id(topic_id, p)
        assert states[shard_of(stream, fleet.shard_count)].backfill_gaps(stream) == []

    # and verify, on the cluster whole again: Kafka's batches against the objects'
    report = tmp_path / "verify.json"
    job = submit("report_cli.py", "verify", topic.name, "--config", _config(fleet),
                 "--json", str(report))  # fmt: skip
    code, out = job.wait()
    assert code == 0 and f"verification of {topic.name}: OK" in out, out
    assert json.loads(report.read_text())["ok"] is True
    _drop_kafkas_copy_and_read_all(fleet, bootstrap, topic, cutovers)


def _busy_worker(cluster, job: Job) -> tuple[int, str] | None:
    """(worker number, executor id) of an executor running a task now, else None."""
    apps = job.api("")
    if not apps:
        return None
    app = apps[0]["id"]
    busy = {e["id"] for e in job.api(f"/{app}/executors") or () if e["activeTasks"] > 0}
    for n in range(len(cluster.workers)):
        for e in cluster.worker_state(n)["executors"]:
            if e["appid"] == app and str(e["id"]) in busy - {"driver"}:
                return n, str(e["id"])
    return None
