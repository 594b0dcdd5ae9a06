"""The filesystem interface: the real one writes everything it is given, and the twin
keeps exactly what a power loss would keep."""

from __future__ import annotations

import pytest

from proxy.wal.fs import OsFilesystem
from proxy.wal.memfs import MemoryFilesystem


def test_os_file_writes_more_buffers_than_one_writev_takes(tmp_path):
    fs = OsFilesystem()
    path = str(tmp_path / "f")
    buffers = [bytes([i % 256]) * (i % 7) for i in range(5000)]  # > IOV_MAX, some empty
    file = fs.open(path, "create")
    try:
        file.write(buffers)
        file.write([memoryview(b"tail")])
        file.fsync()
        expected = b"".join(buffers) + b"tail"
        assert file.size() == len(expected)
        assert file.read(0, len(expected) + 10) == expected
        assert file.read(3, 5) == expected[3:8]
        file.truncate(10)
        assert file.size() == 10
    finally:
        file.close()
    with pytest.raises(FileExistsError):
        fs.open(path, "create")
    with pytest.raises(FileNotFoundError):
        fs.open(str(tmp_path / "missing"), "read")
    fs.rename(path, path + ".deleted")
    assert fs.list_dir(str(tmp_path)) == ["f.deleted"]
    fs.fsync_dir(str(tmp_path))
    fs.unlink(path + ".deleted")
    assert fs.list_dir(str(tmp_path)) == []


def test_twin_power_loss_keeps_only_what_was_synced():
    fs = MemoryFilesystem()
    fs.make_dirs("/d")
    synced = fs.open("/d/synced", "create")
    fs.fsync_dir("/d")
    synced.write([b"durable"])
    synced.fsync()
    synced.write([b" lost"])
    fs.open("/d/unnamed", "create").write([b"x"])  # its name was never fsynced
    after = fs.crash()
    assert after.list_dir("/d") == ["synced"]
    assert after.file_bytes("/d/synced") == b"durable"
    assert fs.crash(keep_unsynced=3).file_bytes("/d/synced") == b"durable lo"


def test_twin_removals_come_back_unless_the_directory_was_synced():
    fs = MemoryFilesystem()
    fs.make_dirs("/d")
    fs.open("/d/a", "create").close()
    fs.fsync_dir("/d")
    fs.rename("/d/a", "/d/a.deleted")
    assert fs.crash().list_dir("/d") == ["a"]
    fs.unlink("/d/a.deleted")
    fs.fsync_dir("/d")
    assert fs.crash().list_dir("/d") == []


def test_twin_open_files_outlive_their_names_and_faults_fire_once():
    fs = MemoryFilesystem()
    fs.make_dirs("/d")
    file = fs.open("/d/a", "create")
    file.write([b"abc"])
    reader = fs.open("/d/a", "read")
    fs.unlink("/d/a")
    assert reader.read(0, 10) == b"abc"
    with pytest.raises(OSError):
        reader.write([b"no"])
    fs.fail_next_fsync()
    with pytest.raises(OSError):
        file.fsync()
    file.fsync()
    fs.tear_next_write(2)
    with pytest.raises(OSError):
        file.write([b"defg"])
    assert reader.read(0, 10) == b"abcde"
    file.write([b"!"])
    assert reader.read(0, 10) == b"abcde!"
