"""One contract, two stores: every case runs against LocalDirectoryStore and S3Store (MinIO),
so the embedded default behaves as production's S3 does."""

from __future__ import annotations

import asyncio
import os

import pytest

from proxy.objects.local import LocalDirectoryStore
from proxy.objects.store import (
    ObjectExists,
    ObjectInfo,
    ObjectNotFound,
    ObjectStore,
    ObjectStoreError,
)


@pytest.fixture(params=["local", pytest.param("s3", marks=pytest.mark.minio)])
def s3_or_none(request):
    """The S3 server for the "s3" case (started on first use), None for the local one."""
    return request.getfixturevalue("s3_server") if request.param == "s3" else None


@pytest.fixture
async def store(s3_or_none, make_s3_store, tmp_path):
    if s3_or_none is None:
        async with LocalDirectoryStore(tmp_path / "objects") as local:
            yield local
    else:
        yield await make_s3_store(s3_or_none)


@pytest.fixture
def prefix(key_prefix):
    """The S3 bucket is shared by the session: each test writes under a prefix of its own."""
    return key_prefix


def test_both_stores_are_object_stores(tmp_path):
    from proxy.objects.s3 import S3Config, S3Store

    assert isinstance(LocalDirectoryStore(tmp_path), ObjectStore)
    assert isinstance(S3Store(S3Config(bucket="b")), ObjectStore)


@pytest.mark.parametrize(
    "data",
    [
        b"hello, object",
        b"",
        bytearray(b"\x00\x01\x02" * 1000),
        memoryview(b"0123456789abcdef")[3:11],
        [b"abc", memoryview(b"defg"), bytearray(b""), b"h" * 5000],
        [],
    ],
    ids=["bytes", "empty", "bytearray", "memoryview-slice", "pieces", "no-pieces"],
)
async def test_put_then_get_round_trips(store, prefix, data):
    expected = b"".join(bytes(piece) for piece in data) if isinstance(data, list) else bytes(data)
    await store.put(prefix + "obj", data)
    assert await store.get(prefix + "obj") == expected
    assert await store.size(prefix + "obj") == len(expected)


async def test_put_replaces_the_object(store, prefix):
    await store.put(prefix + "obj", b"first version, longer")
    await store.put(prefix + "obj", b"second")
    assert await store.get(prefix + "obj") == b"second"
    assert await store.size(prefix + "obj") == 6


async def test_ranged_gets_are_byte_exact_and_clip_like_slices(store, prefix):
    data = os.urandom(10_000)
    await store.put(prefix + "obj", data)
    ranges = [
        (0, 1),
        (0, 10_000),
        (1, 9_999),
        (4_096, 8_192),
        (9_999, 10_000),
        (5_000, None),
        (None, 100),
        (None, None),
        (9_000, 20_000),  # end past the end: read to the end
        (10_000, None),  # start at the end: nothing
        (12_000, 13_000),  # wholly past the end: nothing
        (500, 500),  # empty range
        (600, 500),  # end before start: empty
    ]
    for start, end in ranges:
        got = await store.get(prefix + "obj", start, end)
        assert got == data[start:end], (start, end)


async def test_tail_reads_the_last_bytes_in_one_request(store, prefix):
    data = os.urandom(3_000)
    await store.put(prefix + "obj", data)
    for length in (1, 48, 2_999, 3_000, 3_001, 1_000_000):
        assert await store.get_tail(prefix + "obj", length) == data[-length:], length
    await store.put(prefix + "empty", b"")
    assert await store.get_tail(prefix + "empty", 16) == b""
    assert await store.get(prefix + "empty", 0, 16) == b""


async def test_missing_key_raises_object_not_found(store, prefix):
    key = prefix + "missing"
    reads = [
        ("get", store.get(key)),
        ("get", store.get(key, 10, 20)),
        ("get", store.get_tail(key, 8)),
        ("head", store.size(key)),
    ]
    for operation, read in reads:
        with pytest.raises(ObjectNotFound) as caught:
            await read
        assert caught.value.key == key
        assert caught.value.operation == operation
        assert isinstance(caught.value, ObjectStoreError)


async def test_list_returns_keys_under_a_prefix_in_order_with_sizes(store, prefix):
    objects = {
        "b/2": b"22",
        "a": b"1",
        "b/10": b"1010101010",
        "bz": b"",
        "c/d/e": b"deep",
        "b/1/x": b"x",
    }
    for key, data in objects.items():
        await store.put(prefix + key, data)

    listed = [info async for info in store.list(prefix)]
    assert listed == [
        ObjectInfo(prefix + key, len(objects[key]))
        for key in sorted(objects, key=lambda k: k.encode())
    ]
    assert [info.key async for info in store.list(prefix + "b/")] == [
        prefix + "b/1/x",
        prefix + "b/10",
        prefix + "b/2",
    ]
    # a prefix is a string prefix, not a directory: "b" matches "b/..." and "bz"
    assert len([info async for info in store.list(prefix + "b")]) == 4
    assert [info async for info in store.list(prefix + "b/1")] == [
        ObjectInfo(prefix + "b/1/x", 1),
        ObjectInfo(prefix + "b/10", 10),
    ]
    assert [info async for info in store.list(prefix + "nothing/")] == []


async def test_delete_removes_objects_and_ignores_missing_keys(store, prefix):
    keys = [f"{prefix}k/{n:03d}" for n in range(12)]
    for key in keys:
        await store.put(key, key.encode())
    await store.delete(keys[:5] + [prefix + "k/never-written"])
    await store.delete([])
    assert [info.key async for info in store.list(prefix)] == keys[5:]
    with pytest.raises(ObjectNotFound):
        await store.get(keys[0])
    await store.delete(keys)  # again, with some already gone
    assert [info async for info in store.list(prefix)] == []


async def test_concurrent_puts_of_one_key_leave_one_whole_object(store, prefix):
    versions = [bytes([n]) * (100_000 + n) for n in range(8)]
    await asyncio.gather(*(store.put(prefix + "contended", v) for v in versions))
    assert await store.get(prefix + "contended") in versions


# -- exclusive creates (docs/object-store.md, "Exclusive creates") ------------------------


async def test_a_second_create_of_a_key_fails_and_leaves_the_first_object(store, prefix):
    key = prefix + "walog/p/00000000000000000000"
    await store.create(key, [b"first ", b"writer"])
    with pytest.raises(ObjectExists) as caught:
        await store.create(key, b"a late PUT of a dead writer")
    assert caught.value.key == key and caught.value.operation == "create"
    assert isinstance(caught.value, ObjectStoreError) and not caught.value.retryable
    assert await store.get(key) == b"first writer"
    assert [info.key async for info in store.list(prefix)] == [key]  # nothing else left


async def test_create_after_a_delete_succeeds_and_put_still_replaces(store, prefix):
    key = prefix + "k"
    await store.create(key, b"one")
    await store.delete([key])
    await store.create(key, b"two")
    assert await store.get(key) == b"two"
    await store.put(key, b"three")  # a plain put is not conditional
    assert await store.get(key) == b"three"
    with pytest.raises(ObjectExists):
        await store.create(key, b"four")


async def test_concurrent_creates_of_one_key_leave_exactly_one_winner(store, prefix):
    versions = [bytes([n]) * (100_000 + n) for n in range(8)]
    results = await asyncio.gather(
        *(store.create(prefix + "contended", v) for v in versions), return_exceptions=True
    )
    winners = [v for v, r in zip(versions, results, strict=True) if r is None]
    assert len(winners) == 1, results
    assert all(isinstance(r, ObjectExists) for r in results if r is not None)
    assert await store.get(prefix + "contended") == winners[0]


@pytest.mark.parametrize(
    "key",
    ["", "/absolute", "a/../b", "..", "a//b", "a/./b", "trailing/", ".hidden", "a/.tmp", "nul\x00"],
)
async def test_bad_keys_are_refused_before_any_io(store, key):
    for call in (
        lambda: store.put(key, b"x"),
        lambda: store.get(key),
        lambda: store.get_tail(key, 1),
        lambda: store.size(key),
        lambda: store.delete([key]),
    ):
        with pytest.raises(ValueError, match="invalid object key"):
            await call()


async def test_bad_arguments_are_refused(store, prefix):
    with pytest.raises(ValueError, match="negative"):
        await store.get(prefix + "k", -5, 10)
    with pytest.raises(ValueError, match="must be positive"):
        await store.get_tail(prefix + "k", 0)
    with pytest.raises(TypeError, match="list of keys"):
        await store.delete(prefix + "k")
    with pytest.raises(TypeError, match="bytes-like"):
        await store.put(prefix + "k", "text")


@pytest.mark.minio
async def test_a_multipart_create_is_conditional_too(s3_server, make_s3_store, prefix):
    mib = 1 << 20
    store = await make_s3_store(s3_server, part_size=5 * mib, multipart_threshold=5 * mib)
    big = os.urandom(11 * mib)  # three parts
    await store.create(prefix + "big", big)
    with pytest.raises(ObjectExists):
        await store.create(prefix + "big", big[::-1])
    assert await store.get(prefix + "big") == big
