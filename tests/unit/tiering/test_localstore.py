"""LocalDirectoryStore: objects as files, atomic puts, keys that cannot leave the root.

What both stores share is also run against S3 in
tests/integration/tiering/test_objectstore_contract.py; this file covers the local store's
own promises: the file layout, durability (fsync of file and directories) and faults.
"""

from __future__ import annotations

import asyncio
import errno
import os
import time

import pytest

from proxy.objects import local as localstore
from proxy.objects.local import LocalDirectoryStore
from proxy.objects.store import ObjectInfo, ObjectNotFound, ObjectStoreError


@pytest.fixture
async def store(tmp_path):
    async with LocalDirectoryStore(tmp_path / "objects") as store:
        yield store


def files_under(root) -> list[str]:
    return sorted(str(path.relative_to(root)) for path in root.rglob("*") if path.is_file())


async def test_round_trip_of_bytes_and_of_pieces(store):
    await store.put("4321/stream-set/0000000000001234", b"one buffer")
    await store.put("k/pieces", [b"ab", memoryview(b"xcdx")[1:3], bytearray(b"ef")])
    assert await store.get("4321/stream-set/0000000000001234") == b"one buffer"
    assert await store.get("k/pieces") == b"abcdef"
    assert (store.root / "4321" / "stream-set" / "0000000000001234").read_bytes() == b"one buffer"


async def test_ranged_and_tail_reads(store):
    data = bytes(range(256)) * 40
    await store.put("obj", data)
    assert await store.get("obj", 100, 300) == data[100:300]
    assert await store.get("obj", 10_000) == data[10_000:]
    assert await store.get("obj", 10_200, 99_999) == data[10_200:]
    assert await store.get("obj", 20_000, 20_010) == b""
    assert await store.get_tail("obj", 48) == data[-48:]
    assert await store.get_tail("obj", 1_000_000) == data
    assert await store.size("obj") == len(data)


async def test_missing_keys(store):
    await store.put("dir/obj", b"x")
    for key in ("nothing", "dir", "dir/obj/below"):  # a directory or a path through a file
        with pytest.raises(ObjectNotFound) as caught:
            await store.get(key)
        assert caught.value.key == key
        with pytest.raises(ObjectNotFound):
            await store.get_tail(key, 4)
        with pytest.raises(ObjectNotFound):
            await store.size(key)


async def test_list_and_delete(store):
    for key in ("a/1", "a/2", "a/sub/3", "b/1"):
        await store.put(key, key.encode())
    assert [info async for info in store.list("a/")] == [
        ObjectInfo("a/1", 3),
        ObjectInfo("a/2", 3),
        ObjectInfo("a/sub/3", 7),
    ]
    await store.delete(["a/1", "a/sub/3", "a/never"])
    assert [info.key async for info in store.list()] == ["a/2", "b/1"]
    assert files_under(store.root) == ["a/2", "b/1"]


@pytest.mark.parametrize(
    "key", ["../escape", "a/../../escape", "/etc/passwd", "a/../b", "..", "./a", "a\x00b"]
)
async def test_path_traversal_is_refused(store, key):
    with pytest.raises(ValueError, match="invalid object key"):
        await store.put(key, b"owned")
    with pytest.raises(ValueError, match="invalid object key"):
        await store.get(key)
    with pytest.raises(ValueError, match="invalid object key"):
        await store.delete([key])
    assert files_under(store.root.parent) == []


async def test_list_refuses_a_prefix_that_climbs_out(store):
    with pytest.raises(ValueError, match="invalid object key"):
        [info async for info in store.list("../")]


async def test_a_key_cannot_be_both_an_object_and_a_directory(store):
    await store.put("a/b", b"1")
    with pytest.raises(ObjectStoreError, match="cannot hold both"):
        await store.put("a", b"2")
    with pytest.raises(ObjectStoreError, match="cannot hold both"):
        await store.put("a/b/c", b"3")
    assert await store.get("a/b") == b"1"


def disk_full_midway(fd, view):
    """A write that stores half of the buffer and then finds the disk full."""
    os.write(fd, view[: len(view) // 2])
    raise OSError(errno.ENOSPC, "No space left on device")


def raising(error):
    def fail(*args):
        raise error

    return fail


@pytest.mark.parametrize(
    ("target", "make_fault"),
    [
        ("_write_all", lambda: disk_full_midway),
        ("_fsync_file", lambda: raising(OSError(errno.EIO, "Input/output error"))),
        ("_rename", lambda: raising(OSError(errno.EIO, "Input/output error"))),
    ],
    ids=["write-fails-midway", "fsync-fails", "rename-fails"],
)
async def test_a_failed_put_leaves_no_partial_object(store, monkeypatch, target, make_fault):
    await store.put("kept/obj", b"old version")
    monkeypatch.setattr(localstore, target, make_fault())

    with pytest.raises(ObjectStoreError) as caught:
        await store.put("kept/obj", [b"new version " * 1000, b"second piece"])
    assert (caught.value.key, caught.value.operation) == ("kept/obj", "put")
    with pytest.raises(ObjectStoreError):
        await store.put("fresh/obj", b"x" * 10_000)

    assert await store.get("kept/obj") == b"old version"
    with pytest.raises(ObjectNotFound):
        await store.get("fresh/obj")
    assert [info.key async for info in store.list()] == ["kept/obj"]
    assert files_under(store.root) == ["kept/obj"]  # no temporary file left either


async def test_temporary_files_are_hidden_and_swept(store):
    await store.put("d/obj", b"x")
    # what a crash between the temporary write and the rename leaves behind
    (store.root / "d" / ".obj.0123456789abcdef.tmp").write_bytes(b"torn")
    (store.root / ".top.fedcba9876543210.tmp").write_bytes(b"torn")
    assert [info.key async for info in store.list()] == ["d/obj"]
    assert await store.remove_temp_files() == 2
    assert files_under(store.root) == ["d/obj"]


async def test_a_put_fsyncs_the_file_and_every_directory_it_changed(store, monkeypatch):
    synced_dirs = []
    real_fsync_dir = localstore._fsync_dir
    synced_files = 0

    def record_dir(path):
        synced_dirs.append(str(path.relative_to(store.root.parent)))
        real_fsync_dir(path)

    def record_file(fd):
        nonlocal synced_files
        synced_files += 1
        os.fsync(fd)

    monkeypatch.setattr(localstore, "_fsync_dir", record_dir)
    monkeypatch.setattr(localstore, "_fsync_file", record_file)
    await store.put("new/nested/obj", b"data")
    # each new directory's parent (its entry), then the object's directory (the rename)
    assert synced_dirs == ["objects", "objects/new", "objects/new/nested"]
    assert synced_files == 1

    synced_dirs.clear()
    await store.put("new/nested/other", b"data")
    assert synced_dirs == ["objects/new/nested"]


async def test_slow_disk_does_not_block_the_event_loop(store, monkeypatch):
    def slow_fsync(fd):
        time.sleep(0.3)
        os.fsync(fd)

    monkeypatch.setattr(localstore, "_fsync_file", slow_fsync)
    ticks = 0

    async def ticker():
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1

    ticking = asyncio.create_task(ticker())
    try:
        await store.put("slow", b"x")
    finally:
        ticking.cancel()
    assert ticks >= 5  # the loop kept running while a thread waited on the disk


async def test_a_closed_store_refuses_work(tmp_path):
    store = LocalDirectoryStore(tmp_path)
    await store.close()
    await store.close()  # twice is fine
    with pytest.raises(RuntimeError, match="closed"):
        await store.put("k", b"x")
