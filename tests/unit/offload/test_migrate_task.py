"""One migration task, as an executor runs it, on a local-directory store: the objects it
writes are the planned stream objects holding the segments' batches; a corrupt batch or
a store that fails makes a failed range (reported, nothing to commit), never an
exception that would stop the job. And the command's settings from a proxy's YAML."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
from test_segments import LAYOUT, write_partition

from offload_jobs import migrate_cli
from offload_jobs.fleet import PartitionGaps, TopicGaps
from offload_jobs.migrate import MigrateJob, StoreSpec, plan, run_task
from offload_jobs.writer import OffloadTask
from proxy.metadata.streams import offload_object_id
from proxy.objects.format import find_entries, read_block, read_object
from proxy.objects.keys import ObjectKind, object_key
from proxy.records.batches import iter_batches

STREAM = 777


def job(tmp_path: Path, **overrides) -> MigrateJob:
    settings = dict(
        topic="t",
        bootstrap="127.0.0.1:1",
        metadata_topic="meta",
        shard_count=2,
        store=StoreSpec("local", str(tmp_path / "objects")),
        peer=("127.0.0.1", 1),
        segment_dirs=(str(tmp_path / "empty"), str(tmp_path / "logs")),
    )
    settings.update(overrides)
    return MigrateJob(**settings)


def test_a_task_writes_its_objects_with_the_segments_batches(tmp_path: Path) -> None:
    written = write_partition(tmp_path / "logs" / "t-0", LAYOUT)
    result = run_task(job(tmp_path, target_object_bytes=1), OffloadTask(0, STREAM, 0, 10))
    assert result.error is None and result.torn_tail is None
    assert [(a, b) for _, _, a, b in result.objects] == [(0, 3), (3, 8), (8, 10)]
    assert (result.batches, result.records) == (3, 10)
    assert result.record_bytes == sum(len(b) for b in written[:3])
    stored = []
    for object_id, size, start, end in result.objects:
        assert object_id == offload_object_id(STREAM, start, end)
        key = object_key(object_id, ObjectKind.STREAM)
        data = (tmp_path / "objects" / key).read_bytes()
        assert len(data) == size
        _, index = read_object(data, key)
        for entry in find_entries(index, STREAM, start):
            stored += [bytes(b) for _, b in iter_batches(read_block(data, entry, key))]
    assert stored == written[:3]


def test_a_corrupt_batch_fails_the_range_with_file_and_byte(tmp_path: Path) -> None:
    write_partition(tmp_path / "logs" / "t-0", LAYOUT)
    segment = tmp_path / "logs" / "t-0" / f"{10:020d}.log"
    data = bytearray(segment.read_bytes())
    data[-20] ^= 0xFF  # the segment's last batch
    segment.write_bytes(data)
    result = run_task(job(tmp_path), OffloadTask(0, STREAM, 10, 15))
    assert result.objects == [] and result.error is not None
    assert result.error.startswith(f"t-0 [10, 15): {segment}: byte ")
    assert "CRC-32C mismatch" in result.error
    assert [p for p in (tmp_path / "objects").rglob("*") if p.is_file()] == []  # nothing PUT


def test_missing_segments_and_a_failing_store_fail_the_range(tmp_path: Path) -> None:
    result = run_task(job(tmp_path), OffloadTask(3, STREAM, 0, 5))
    assert result.error is not None and "no t-3 directory under" in result.error
    write_partition(tmp_path / "logs" / "t-0", LAYOUT)
    # a file where the object's key prefix (a directory of the store) should be: the PUT fails
    key = object_key(offload_object_id(STREAM, 0, 10), ObjectKind.STREAM)
    (tmp_path / "objects").mkdir()
    (tmp_path / "objects" / key.split("/")[0]).write_text("in the way")
    result = run_task(job(tmp_path), OffloadTask(0, STREAM, 0, 10))
    assert result.objects == [] and result.error is not None
    assert result.error.startswith("t-0 [0, 10): ") and key in result.error


def test_plan_cuts_gaps_at_segment_boundaries(tmp_path: Path) -> None:
    write_partition(tmp_path / "logs" / "t-0", LAYOUT)
    gaps = TopicGaps("t", None, (PartitionGaps(0, STREAM, 0, 24, ((2, 12), (20, 24))),))
    assert plan(job(tmp_path), gaps) == [
        OffloadTask(0, STREAM, 2, 10),
        OffloadTask(0, STREAM, 10, 12),
        OffloadTask(0, STREAM, 20, 24),
    ]


def test_settings_come_from_a_proxys_config(tmp_path: Path) -> None:
    config = tmp_path / "proxy.yaml"
    config.write_text(
        "upstream: {bootstrap: '10.0.0.1:9092,10.0.0.2:9092'}\n"
        "fleet: {name: a, zone: z}\n"
        "tiering:\n  metadata_topic: meta-x\n  shard_count: 4\n"
        "  object_store: {kind: local, directory: /srv/objects}\n"
    )
    parser = argparse.ArgumentParser()
    migrate_cli.add_arguments(parser)
    args = parser.parse_args(
        ["orders", "--config", str(config), "--peer", "10.0.0.5:19090", "--from-segments",
         "/a", "--from-segments", "/b", "--object-mib", "8"]
    )  # fmt: skip
    made = migrate_cli.job_from_args(args)
    assert (made.bootstrap, made.metadata_topic, made.shard_count) == (
        "10.0.0.1:9092,10.0.0.2:9092",
        "meta-x",
        4,
    )
    assert made.store == StoreSpec("local", "/srv/objects")
    assert (made.peer, made.segment_dirs) == (("10.0.0.5", 19090), ("/a", "/b"))
    assert made.target_object_bytes == 8 << 20 and not made.from_cluster
    for bad, reason in ((["--peer", "nowhere"], "not host:port"),
                        (["--object-mib", "0"], "must be at least 1")):  # fmt: skip
        args = parser.parse_args(["orders", "--config", str(config), "--peer", "h:1",
                                  "--from-cluster", *bad])  # fmt: skip
        with pytest.raises(ValueError, match=reason):
            migrate_cli.job_from_args(args)
    args = parser.parse_args(["orders", "--config", str(config), "--peer", "x", "--from-cluster"])
    assert migrate_cli.run(args) == 2


def test_a_range_below_the_first_segment_or_past_the_copy_is_missing(tmp_path: Path) -> None:
    write_partition(tmp_path / "logs" / "t-0", LAYOUT[1:])  # segments from offset 10 on
    result = run_task(job(tmp_path), OffloadTask(0, STREAM, 4, 12))
    assert result.error is not None
    assert "offset 4 is in no segment (the first starts at 10)" in result.error
    result = run_task(job(tmp_path), OffloadTask(0, STREAM, 15, 30))  # the copy ends at 24
    assert result.error is not None and "offsets [24, 30) of stream 777" in result.error
    result = run_task(job(tmp_path), OffloadTask(0, STREAM, 10, 15))  # a segment's range
    assert result.error is None and [(a, b) for _, _, a, b in result.objects] == [(10, 15)]


def test_objects_before_a_corrupt_batch_are_kept_with_the_error(tmp_path: Path) -> None:
    write_partition(tmp_path / "logs" / "t-0", LAYOUT)
    segment = tmp_path / "logs" / "t-0" / f"{0:020d}.log"
    data = bytearray(segment.read_bytes())
    data[-20] ^= 0xFF  # the batch of offsets 8..9
    segment.write_bytes(data)
    result = run_task(job(tmp_path, target_object_bytes=1), OffloadTask(0, STREAM, 0, 10))
    assert result.error is not None and "CRC-32C mismatch" in result.error
    # an object is cut when the batch after it is read: [3, 8) waited for the bad one
    assert [(a, b) for _, _, a, b in result.objects] == [(0, 3)]
