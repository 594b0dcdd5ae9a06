"""`tierproxy verify` and `tierproxy export` from a proxy's YAML, on the shared Kafka,
MinIO and Spark session (the commands' own code; only the Spark session is the test's):
export writes the files and prints a progress line and the summary; verify of a topic the
fleet's metadata does not know as tiered reports every partition as an error, exit 1;
bad settings exit 2 naming the setting."""

from __future__ import annotations

import argparse

import pytest
import yaml
from confluent_kafka.admin import AdminClient, NewTopic

from offload_jobs.report_cli import add_parsers

pytestmark = [pytest.mark.kafka, pytest.mark.minio, pytest.mark.spark]


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="tierproxy")
    add_parsers(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(argv)


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
    metadata_topic = f"{mixed_topic.name}-metadata"
    admin = AdminClient({"bootstrap.servers": kafka_cluster.bootstrap})
    admin.create_topics([NewTopic(metadata_topic, 1, 3)])[metadata_topic].result(30)
    config = write_config(tmp_path, kafka_cluster, s3_server, metadata_topic)

    out = tmp_path / "parquet"
    args = parse(["export", mixed_topic.name, "--config", str(config), "--to", str(out)])
    assert args.func(args, spark) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed[0] == f"{mixed_topic.name}: exporting 2 partitions from kafka"
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
