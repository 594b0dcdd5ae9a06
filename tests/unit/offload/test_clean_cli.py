"""`tierproxy clean`'s arguments (offload_jobs/clean_cli.py): the job's settings come from
a proxy's config, as the migration's do; wrong ones exit 2 before Spark starts."""

from __future__ import annotations

import argparse
from pathlib import Path

from offload_jobs import clean_cli
from offload_jobs.migrate import StoreSpec
from proxy.cli import main


def test_settings_come_from_a_proxys_config(tmp_path: Path) -> None:
    config = tmp_path / "proxy.yaml"
    config.write_text(
        "upstream: {bootstrap: '10.0.0.1:9092'}\n"
        "fleet: {name: a, zone: z}\n"
        "tiering:\n  metadata_topic: meta-x\n  shard_count: 4\n"
        "  object_store: {kind: local, directory: /srv/objects}\n"
    )
    parser = argparse.ArgumentParser()
    clean_cli.add_arguments(parser)
    args = parser.parse_args(
        ["--topic", "orders", "--config", str(config), "--peer", "10.0.0.5:19090",
         "--partitions", "0", "3", "--object-mib", "8"]
    )  # fmt: skip
    job = clean_cli.job_from_args(args)
    assert (job.topic, job.bootstrap, job.metadata_topic, job.shard_count) == (
        "orders",
        "10.0.0.1:9092",
        "meta-x",
        4,
    )
    assert job.store == StoreSpec("local", "/srv/objects")
    assert (job.peer, job.partitions, job.target_object_bytes) == (
        ("10.0.0.5", 19090),
        (0, 3),
        8 << 20,
    )
    argv = ["clean", "--topic", "orders", "--config", str(config), "--peer", "nowhere"]
    assert main(argv) == 2
