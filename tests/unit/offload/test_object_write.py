"""An offload task run again never replaces an object under its deterministic key
(offload_jobs/object_write.py), on a local-directory store: the same task again is a
no-op; a run with another object format version keeps the earlier run's object and
reports its size (what the commit names); any other object under the key fails the
range, named, and stays as it was."""

from __future__ import annotations

from pathlib import Path

from test_migrate_task import STREAM, job
from test_segments import LAYOUT, write_partition

from offload_jobs.migrate import run_task
from offload_jobs.writer import OffloadTask
from proxy.objects.format import ObjectWriter, read_object
from proxy.objects.keys import ObjectKind, object_key

TASK = OffloadTask(0, STREAM, 0, 10)


def stored(tmp_path: Path, result) -> dict[str, bytes]:
    keys = [object_key(object_id, ObjectKind.STREAM) for object_id, *_ in result.objects]
    return {key: (tmp_path / "objects" / key).read_bytes() for key in keys}


def test_the_same_task_again_is_a_no_op(tmp_path: Path) -> None:
    write_partition(tmp_path / "logs" / "t-0", LAYOUT)
    first = run_task(job(tmp_path, target_object_bytes=1), TASK)
    before = stored(tmp_path, first)
    again = run_task(job(tmp_path, target_object_bytes=1), TASK)
    assert first.error is None and again.error is None
    assert again.objects == first.objects and len(first.objects) == 3
    assert stored(tmp_path, again) == before


def test_a_run_with_another_format_version_keeps_the_committed_bytes(tmp_path: Path) -> None:
    write_partition(tmp_path / "logs" / "t-0", LAYOUT)
    first = run_task(job(tmp_path, object_format_version=1), TASK)
    before = stored(tmp_path, first)
    again = run_task(job(tmp_path, object_format_version=2), TASK)
    assert again.error is None
    assert again.objects == first.objects  # the sizes the earlier run committed
    assert again.object_bytes == first.object_bytes
    after = stored(tmp_path, again)
    assert after == before
    assert {read_object(data, key)[0].version for key, data in after.items()} == {1}


def test_another_object_under_the_key_fails_the_range_and_stays(tmp_path: Path) -> None:
    written = write_partition(tmp_path / "logs" / "t-0", LAYOUT)
    [(object_id, *_)] = run_task(job(tmp_path), TASK).objects
    key = object_key(object_id, ObjectKind.STREAM)
    path = tmp_path / "objects" / key
    # an object of this id holding other offsets (not this range's)
    writer = ObjectWriter(object_id, ObjectKind.STREAM)
    writer.add_block(STREAM, written[0], 0, 3, 3)
    other = writer.build().to_bytes()
    for foreign in (other, b"not an object"):
        path.write_bytes(foreign)
        result = run_task(job(tmp_path), TASK)
        assert result.objects == []
        assert result.error is not None and key in result.error
        assert "not replaced" in result.error
        assert path.read_bytes() == foreign
