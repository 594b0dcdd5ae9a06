"""`tierproxy verify` and `tierproxy export` from a proxy's YAML, on the shared Kafka,
MinIO and Spark session (the commands' own code; only the Spark session is the test's):
export writes the files and prints progress lines (a bar on a terminal) and the summary;
verify of a topic the fleet's metadata does not know as tiered reports every partition
as an error, exit 1; bad settings exit 2 naming the setting."""

from __future__ import annotations

import argparse
import os
import pty
import subprocess
import sys
import time
import uuid

import pytest
import yaml
from confluent_kafka.admin import AdminClient, NewTopic
from offloadcopies import offload, state_of

from offload_jobs import migrate_cli
from offload_jobs.export import tiered_partitions, whole_topic_note
from offload_jobs.report_cli import add_parsers
from proxy.devstack.paths import free_port

pytestmark = [pytest.mark.kafka, pytest.mark.minio, pytest.mark.spark]


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="tierproxy")
    add_parsers(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(argv)


def parse_migrate(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="tierproxy")
    migrate_cli.add_parser(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(["migrate", *argv])


def write_config(tmp_path, kafka_cluster, s3_server, metadata_topic: str):
    kwargs = s3_server.client_kwargs()
    config = {
        "upstream": {"bootstrap": kafka_cluster.bootstrap},
        "listeners": {"bind_host": "127.0.0.1", "bootstrap_port": 1, "broker_port_base": 2},
        "fleet": {"name": "offload-cli-test", "zone": "zone-a"},
        "tiering": {
            "metadata_topic": metadata_topic,
            "shard_count": 1,
            "object_store": {
                "kind": "s3", "bucket": s3_server.bucket, "region": kwargs["region_name"],
                "endpoint_url": kwargs["endpoint_url"], "path_style": True,
                "access_key_id": kwargs["aws_access_key_id"],
                "secret_access_key": kwargs["aws_secret_access_key"],
            },
        },
    }  # fmt: skip
    path = tmp_path / "proxy.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def test_export_and_verify_commands(kafka_cluster, s3_server, spark, mixed_topic, tmp_path, capsys):
    metadata_topic = _metadata_topic(kafka_cluster, f"{mixed_topic.name}-metadata")
    config = write_config(tmp_path, kafka_cluster, s3_server, metadata_topic)

    out = tmp_path / "parquet"
    args = parse(["export", mixed_topic.name, "--config", str(config), "--to", str(out)])
    assert args.func(args, spark) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed[0] == f"{mixed_topic.name}: exporting 2 partitions from kafka"
    # not a terminal: plain progress lines (no bar), the last with the bytes and rate
    assert printed[-2].startswith("  2/2 partitions exported, ") and "\r" not in "".join(printed)
    assert printed[-2].endswith(" MiB/s)") and " 0.0 MiB in " not in printed[-2], printed
    visible = len(mixed_topic.visible())
    assert printed[-1].startswith(f"exported {mixed_topic.name} to {out}: ")
    assert f" {visible} records (" in printed[-1] and " files in " in printed[-1]
    assert len(list(out.glob(f"topic={mixed_topic.name}/partition=*/date=*/*.parquet"))) >= 2

    report = tmp_path / "report.json"
    args = parse(["verify", mixed_topic.name, "--config", str(config), "--json", str(report)])
    assert args.func(args, spark) == 1
    printed = capsys.readouterr().out
    assert f"verification of {mixed_topic.name}: FAILED" in printed
    assert f"{mixed_topic.name}-0: not tiered" in printed
    assert '"ok": false' in report.read_text()


def test_bad_settings_exit_2_naming_them(kafka_cluster, s3_server, tmp_path, capsys):
    config = tmp_path / "local.yaml"
    config.write_text(yaml.safe_dump({"upstream": {"bootstrap": kafka_cluster.bootstrap}}))
    args = parse(["export", "t", "--config", str(config), "--to", "s3://bucket/x"])
    assert args.func(args) == 2
    assert "tiering.object_store.s3 is not set" in capsys.readouterr().err
    args = parse(["verify", "t", "--config", str(tmp_path / "missing.yaml")])
    assert args.func(args) == 2
    assert "missing.yaml" in capsys.readouterr().err


def _metadata_topic(kafka_cluster, name: str) -> str:
    admin = AdminClient({"bootstrap.servers": kafka_cluster.bootstrap})
    admin.create_topics([NewTopic(name, 1, 3)])[name].result(30)
    return name


def test_a_wrong_peer_and_a_missing_topic_are_named_before_spark_starts(
    kafka_cluster, s3_server, mixed_topic, tmp_path, capsys
):
    """No Spark session is given: each command must fail before it would start one."""
    config = str(write_config(tmp_path, kafka_cluster, s3_server, "no-metadata-needed"))
    dead = f"127.0.0.1:{free_port()}"  # nothing listens there
    started = time.monotonic()
    # a topic with nothing to move (not tiered): the wrong peer is still found
    args = parse_migrate([mixed_topic.name, "--config", config, "--peer", dead, "--from-cluster"])
    assert args.func(args) == 1
    err = capsys.readouterr().err
    assert f"--peer {dead}: no proxy's peer listener answers there" in err, err
    broker = kafka_cluster.bootstrap.split(",")[0]  # a listener, but Kafka's, not a proxy's
    args = parse_migrate([mixed_topic.name, "--config", config, "--peer", broker, "--from-cluster"])
    assert args.func(args) == 1
    err = capsys.readouterr().err
    assert f"--peer {broker}: what answers there is not a proxy's peer listener" in err, err
    missing = f"no-such-topic-{uuid.uuid4().hex[:8]}"
    args = parse_migrate([missing, "--config", config, "--peer", dead, "--from-cluster"])
    assert args.func(args) == 1
    assert f"topic {missing} does not exist in Kafka" in capsys.readouterr().err
    for command in (["verify"], ["export", "--to", str(tmp_path / "out")]):
        args = parse([command[0], missing, "--config", config, *command[1:]])
        assert args.func(args) == 1
        err = capsys.readouterr().err
        assert f"tierproxy {command[0]}: topic {missing} does not exist in Kafka" in err, err
        assert "error code" not in err
    assert time.monotonic() - started < 60


def test_what_a_whole_topic_export_of_a_tiered_topic_reads_and_leaves_out(
    kafka_cluster, s3_server, mixed_topic
):
    topic_id, copies = offload(kafka_cluster, s3_server, mixed_topic)
    states = state_of(topic_id, copies)
    tiered = tiered_partitions(topic_id, mixed_topic.partitions, states, 1)
    assert [(p, first) for p, _, first, _ in tiered] == [(0, 0), (1, 0)]
    text = whole_topic_note(mixed_topic.name, tiered)
    assert text.startswith(f"{mixed_topic.name} is tiered (partition 0: cutover ")
    assert "the objects are read where they hold offsets, Kafka's log for the rest" in text
    assert "records not uploaded yet (past each partition's objects) are left out" in text


def test_a_cli_run_is_quiet_and_leaves_no_spark_folder(
    kafka_cluster, s3_server, mixed_topic, tmp_path
):
    """The real command in a process of its own, with its own Spark session and its
    stdout on a terminal (a pty): a progress bar drawn in place, no Spark notice on
    stderr and no `tierproxy-spark-*` folder left in the temporary directory."""
    metadata = _metadata_topic(kafka_cluster, f"{mixed_topic.name}-meta-{uuid.uuid4().hex[:6]}")
    config = write_config(tmp_path, kafka_cluster, s3_server, metadata)
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    screen, terminal = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "proxy.cli", "export", mixed_topic.name, "--config",
         str(config), "--to", str(tmp_path / "out"), "--master", "local[2]"],
        stdout=terminal, stderr=subprocess.PIPE, text=True,
        env=os.environ | {"TMPDIR": str(scratch)},
    )  # fmt: skip
    os.close(terminal)
    shown = b""
    while True:  # until the process closes the terminal (EIO once it is gone)
        try:
            chunk = os.read(screen, 65536)
        except OSError:
            break
        if not chunk:
            break
        shown += chunk
    os.close(screen)
    stderr = proc.stderr.read()
    proc.stderr.close()
    assert proc.wait(400) == 0, shown.decode() + stderr
    stdout = shown.decode().replace("\r\n", "\n")  # the pty's newline
    assert "\r[########################] 2/2 partitions exported  " in stdout, repr(stdout)
    assert "\n  2/2 partitions exported, " in stdout and " MiB in " in stdout, repr(stdout)
    assert stdout.rstrip("\n").splitlines()[-1].endswith(" MiB/s)"), repr(stdout)
    noise = ("log4j", "WARN", "incubator", "NativeCodeLoader", "Setting default log level")
    assert [line for line in stderr.splitlines() if any(n in line for n in noise)] == []
    assert list(scratch.glob("tierproxy-spark-*")) == []
