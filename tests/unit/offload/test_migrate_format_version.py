"""The migrate job writes the object format version the proxy's config names
(tiering.object_format_version), so a fleet mid-upgrade reads what the job writes."""

from __future__ import annotations

import argparse
from pathlib import Path

from test_migrate_task import LAYOUT, STREAM, job, write_partition

from offload_jobs import migrate_cli
from offload_jobs.migrate import run_task
from offload_jobs.writer import OffloadTask
from proxy.objects.format import read_object
from proxy.objects.keys import ObjectKind, object_key


def test_the_offload_job_takes_the_version_from_the_proxys_config(tmp_path: Path):
    config = tmp_path / "proxy.yaml"
    config.write_text(
        "upstream: {bootstrap: '10.0.0.1:9092'}\nfleet: {name: a, zone: z}\n"
        "tiering:\n  object_format_version: 1\n"
        f"  object_store: {{kind: local, directory: {tmp_path / 'objects'}}}\n"
    )
    parser = argparse.ArgumentParser()
    migrate_cli.add_arguments(parser)
    args = parser.parse_args(["t", "--config", str(config), "--peer", "h:1", "--from-cluster"])
    assert migrate_cli.job_from_args(args).object_format_version == 1
    write_partition(tmp_path / "logs" / "t-0", LAYOUT)
    result = run_task(job(tmp_path, object_format_version=1), OffloadTask(0, STREAM, 0, 10))
    assert result.error is None and result.objects
    for object_id, _, _, _ in result.objects:
        key = object_key(object_id, ObjectKind.STREAM)
        footer, _ = read_object((tmp_path / "objects" / key).read_bytes(), key)
        assert footer.version == 1
