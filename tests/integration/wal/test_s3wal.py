"""S3-WAL mode against both stores: a LocalDirectoryStore and S3 (the session's MinIO).

Group commit across partitions (few PUTs, byte-exact read back), the size and time
triggers, bounded PUTs in flight with backpressure, a failed PUT failing exactly the
appends of its object, and a damaged range refused by the reader with a clear error.
"""

from __future__ import annotations

import asyncio
import random
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiobotocore.session import AioSession, get_session

from proxy.handoff.objects import (
    parse_wal_object,
    parse_wal_object_key,
    wal_object_key,
    writer_id_for,
)
from proxy.handoff.writer import (
    S3WalClosedError,
    S3WalCorruptError,
    S3WalPutError,
    S3WalReader,
    S3WalWriter,
)
from proxy.objects.keys import parse_object_key
from proxy.objects.local import LocalDirectoryStore
from proxy.objects.s3 import S3Store
from proxy.objects.s3config import S3Config
from proxy.objects.store import ObjectStore, ObjectStoreError
from proxy.records.batches import CorruptBatchError
from tests.support.batches import batch_of_size, opaque_batch

KiB = 1024


class FaultyStore:
    """Passes everything to a real store; counts PUTs and can fail or hold the next ones."""

    def __init__(self, inner: ObjectStore) -> None:
        self.inner = inner
        self.puts: list[str] = []  # keys PUT successfully, in order
        self.attempted: list[str] = []
        self.fail_next = 0
        self.gate: asyncio.Event | None = None  # while set to an unset event, PUTs wait
        self.concurrent = self.max_concurrent = 0

    async def put(self, key: str, data: Any) -> None:
        self.attempted.append(key)
        self.concurrent += 1
        self.max_concurrent = max(self.max_concurrent, self.concurrent)
        try:
            if self.gate is not None:
                await self.gate.wait()
            if self.fail_next:
                self.fail_next -= 1
                raise ObjectStoreError(key, "put", "injected outage", attempts=3, retryable=True)
            await self.inner.put(key, data)
            self.puts.append(key)
        finally:
            self.concurrent -= 1

    async def get(self, key: str, start: int | None = None, end: int | None = None) -> bytes:
        return await self.inner.get(key, start, end)

    async def get_tail(self, key: str, length: int) -> bytes:
        return await self.inner.get_tail(key, length)

    async def size(self, key: str) -> int:
        return await self.inner.size(key)

    async def delete(self, keys: Any) -> None:
        await self.inner.delete(keys)

    def list(self, prefix: str = "") -> Any:
        return self.inner.list(prefix)

    async def close(self) -> None:
        await self.inner.close()


@pytest.fixture(scope="module")
def aio_session() -> AioSession:
    return get_session()


def s3_config(server: Any) -> S3Config:
    kwargs = server.client_kwargs()
    return S3Config(
        bucket=server.bucket,
        endpoint_url=kwargs["endpoint_url"],
        region=kwargs["region_name"],
        access_key_id=kwargs["aws_access_key_id"],
        secret_access_key=kwargs["aws_secret_access_key"],
        path_style=True,
        connect_timeout=2.0,
        read_timeout=5.0,
        request_timeout=10.0,
        max_attempts=3,
        backoff_base=0.05,
        backoff_cap=0.5,
    )


@pytest.fixture(params=["local", pytest.param("minio", marks=pytest.mark.minio)])
async def store(request, tmp_path, aio_session) -> AsyncIterator[FaultyStore]:
    if request.param == "local":
        async with LocalDirectoryStore(tmp_path / "objects") as local:
            yield FaultyStore(local)
        return
    server = request.getfixturevalue("s3_server")
    async with S3Store(s3_config(server), session=aio_session) as s3:
        faulty = FaultyStore(s3)
        try:
            yield faulty
        finally:  # the bucket is the session's: leave it as found
            await s3.delete(sorted(set(faulty.attempted)))


@pytest.fixture
def writer_id() -> str:
    return writer_id_for("test-proxy", 1_700_000_000.0) + uuid.uuid4().hex[:6]


async def test_concurrent_appends_share_few_puts_and_read_back_exactly(store, writer_id):
    rng = random.Random(7)
    batches = [
        (i % 20, opaque_batch(rng.randbytes(rng.randrange(50, 4000)), records=1 + i % 5))
        for i in range(200)
    ]

    async def produce(writer: S3WalWriter, stream: int, batch: bytes):
        await asyncio.sleep(rng.random() * 0.05)  # arrivals spread over the window
        return await writer.append(stream, batch)

    async with S3WalWriter(store, writer_id) as writer:  # defaults: 250 ms, 8 MiB
        locations = await asyncio.gather(*(produce(writer, s, b) for s, b in batches))
    assert 1 <= len(store.puts) <= 3, store.puts  # one, unless the machine stalls
    assert writer.metrics.value("tierproxy_s3wal_puts_total", outcome="ok") == len(store.puts)
    assert writer.metrics.value("tierproxy_s3wal_appends_total", outcome="ok") == 200
    assert writer.metrics.value("tierproxy_s3wal_object_batches_sum") == 200
    assert writer.pending_bytes == 0

    reader = S3WalReader(store)
    read = await asyncio.gather(*(reader.read(location) for location in locations))
    for (stream, batch), location, data in zip(batches, locations, read, strict=True):
        assert location.stream_id == stream and location.object_key in store.puts
        assert bytes(data) == batch

    # the object itself: one block per stream, sorted, holding its appends in order
    key = store.puts[0]
    footer, blocks = parse_wal_object(await store.get(key), key)
    assert parse_wal_object_key(key) == (writer_id, footer.sequence)
    in_object = [
        (s, b) for (s, b), loc in zip(batches, locations, strict=True) if loc.object_key == key
    ]
    assert [block.stream_id for block in blocks] == sorted({s for s, _ in in_object})
    for block in blocks:
        mine = [b for s, b in in_object if s == block.stream_id]
        assert block.batch_count == len(mine) and block.size == sum(map(len, mine))


async def test_an_object_is_put_when_its_batches_reach_max_bytes(store, writer_id):
    writer = S3WalWriter(store, writer_id, max_bytes=64 * KiB, max_delay_s=60)
    # 16 KiB batches: four fill an object exactly; 20 KiB ones: a fourth would overflow
    exact = [batch_of_size(16 * KiB, i) for i in range(8)]
    over = [batch_of_size(20 * KiB, i) for i in range(4)]
    huge = batch_of_size(100 * KiB)
    async with asyncio.timeout(10):  # far below max_delay_s: only size can have sealed
        located = await asyncio.gather(*(writer.append(1, b) for b in exact))
        # the huge one closes the 60 KiB object of the three before it, then fills its own
        located += await asyncio.gather(
            *(writer.append(2, b) for b in over[:3]), writer.append(3, huge)
        )
    keys = [loc.object_key for loc in located]
    assert keys == [keys[0]] * 4 + [keys[4]] * 4 + [keys[8]] * 3 + [keys[11]]
    assert len(set(keys)) == 4 and sorted(store.puts) == sorted(set(keys))  # PUTs overlap
    assert writer.metrics.value("tierproxy_s3wal_objects_sealed_total", trigger="size") == 4
    pending = asyncio.ensure_future(writer.append(4, over[3]))
    await asyncio.sleep(0)  # let it join the open object
    await writer.close()  # flushes the open object
    assert (await pending).object_key not in keys
    assert writer.metrics.value("tierproxy_s3wal_objects_sealed_total", trigger="flush") == 1
    with pytest.raises(S3WalClosedError):
        await writer.append(4, over[3])


async def test_an_object_is_put_max_delay_after_its_first_append(store, writer_id):
    loop = asyncio.get_running_loop()
    async with S3WalWriter(store, writer_id, max_delay_s=0.3) as writer:
        began = loop.time()
        first = asyncio.ensure_future(writer.append(5, batch_of_size(200)))
        await asyncio.sleep(0.1)
        assert not first.done() and store.puts == []
        second = await writer.append(6, batch_of_size(300))  # joins the open object
        elapsed = loop.time() - began
        assert (await first).object_key == second.object_key
    assert 0.3 <= elapsed < 0.3 + 2.0  # slack for a shared machine
    assert len(store.puts) == 1
    assert writer.metrics.value("tierproxy_s3wal_objects_sealed_total", trigger="time") == 1


async def test_an_object_is_put_once_no_append_came_for_idle_s(store, writer_id):
    # Clients waiting for their answers send nothing more: a window far longer than the
    # quiet only delays them (librdkafka: one request per partition in flight).
    loop = asyncio.get_running_loop()
    async with S3WalWriter(store, writer_id, max_delay_s=30, idle_s=0.05) as writer:
        began = loop.time()
        first = asyncio.ensure_future(writer.append(5, batch_of_size(200)))
        await asyncio.sleep(0)  # joins the open object first
        second = await writer.append(6, batch_of_size(300))  # the same object
        elapsed = loop.time() - began
        assert (await first).object_key == second.object_key
        third = await writer.append(7, batch_of_size(100))  # after the seal: the next one
        assert third.object_key != second.object_key
    assert 0.05 <= elapsed < 0.05 + 5.0  # slack for a shared machine; far below max_delay_s
    assert writer.metrics.value("tierproxy_s3wal_objects_sealed_total", trigger="idle") == 2
    assert writer.metrics.value("tierproxy_s3wal_objects_sealed_total", trigger="time") == 0
    with pytest.raises(ValueError, match="idle_s"):
        S3WalWriter(store, writer_id, idle_s=-1)


async def test_a_failed_put_fails_every_append_of_that_object_and_later_ones_succeed(
    store, writer_id
):
    writer = S3WalWriter(store, writer_id, max_bytes=32 * KiB, max_delay_s=60)
    store.fail_next = 1  # the first object's PUT: the store gave up after its retries
    results = await asyncio.gather(
        *(writer.append(i, batch_of_size(8 * KiB, i)) for i in range(8)), return_exceptions=True
    )
    failed, stored = results[:4], results[4:]  # objects of four appends each
    assert all(isinstance(error, S3WalPutError) for error in failed), failed
    error = failed[0]
    assert error.retryable and error.appends == 4 and isinstance(error.__cause__, ObjectStoreError)
    assert error.key in str(error) and "injected outage" in str(error)
    assert error.key not in store.puts
    reader = S3WalReader(store)
    for i, location in enumerate(stored, start=4):
        assert bytes(await reader.read(location)) == batch_of_size(8 * KiB, i)
    # the store is back: new appends are made durable as usual
    later = await asyncio.gather(*(writer.append(9, batch_of_size(8 * KiB, 9)) for _ in range(4)))
    assert len({loc.object_key for loc in later}) == 1
    await writer.close()
    assert writer.metrics.value("tierproxy_s3wal_puts_total", outcome="failed") == 1
    assert writer.metrics.value("tierproxy_s3wal_appends_total", outcome="failed") == 4
    assert writer.metrics.value("tierproxy_s3wal_appends_total", outcome="ok") == 8


async def test_puts_in_flight_are_bounded_and_appends_wait_for_room(tmp_path, writer_id):
    async with LocalDirectoryStore(tmp_path) as local:
        store = FaultyStore(local)
        store.gate = asyncio.Event()
        writer = S3WalWriter(
            store, writer_id, max_bytes=4 * KiB, max_puts_in_flight=2, max_pending_bytes=20 * KiB
        )
        appends = [
            asyncio.ensure_future(writer.append(i, batch_of_size(4 * KiB))) for i in range(5)
        ]
        await asyncio.sleep(0.05)
        assert store.concurrent == 2 and writer.pending_bytes == 20 * KiB
        sixth = asyncio.ensure_future(writer.append(6, batch_of_size(4 * KiB)))
        await asyncio.sleep(0.05)
        assert not sixth.done() and writer.pending_bytes == 20 * KiB  # it waits for room
        store.gate.set()
        async with asyncio.timeout(10):
            await asyncio.gather(*appends, sixth)
        await writer.close()
        assert store.max_concurrent == 2 and len(store.puts) == 6


async def test_a_corrupted_range_is_refused_naming_object_and_range(tmp_path, writer_id):
    async with LocalDirectoryStore(tmp_path) as local:
        async with S3WalWriter(local, writer_id, max_delay_s=0.01) as writer:
            a, b = await asyncio.gather(
                writer.append(1, batch_of_size(500, 1)), writer.append(2, batch_of_size(700, 2))
            )
        path = tmp_path.joinpath(*a.object_key.split("/"))
        original = path.read_bytes()
        reader = S3WalReader(local, cache_max_age_s=0)  # the test rewrites the object
        # a byte of the batch's payload (Kafka's CRC catches it), then of its base
        # offset (outside Kafka's CRC: the location's CRC catches it)
        for flip in (a.start + 300, a.start + 3):
            damaged = bytearray(original)
            damaged[flip] ^= 0x10
            path.write_bytes(damaged)
            with pytest.raises(S3WalCorruptError) as caught:
                await reader.read(a)
            message = str(caught.value)
            assert a.object_key in message and f"bytes [{a.start}, {a.end})" in message
            assert "CRC-32C mismatch" in message
            assert bytes(await reader.read(b)) == batch_of_size(700, 2)  # the rest is intact
            with pytest.raises(S3WalCorruptError, match="CRC mismatch"):
                parse_wal_object(bytes(damaged), a.object_key)
        path.write_bytes(original[: a.end - 10])  # cut inside the first append
        with pytest.raises(S3WalCorruptError, match="truncated") as caught:
            await reader.read(a)
        assert caught.value.key == a.object_key and (caught.value.start, caught.value.end) == (
            a.start,
            a.end,
        )


async def test_bad_batches_are_refused_before_anything_is_written(tmp_path, writer_id):
    async with LocalDirectoryStore(tmp_path) as local:
        async with S3WalWriter(local, writer_id) as writer:
            damaged = bytearray(batch_of_size(200))
            damaged[100] ^= 1
            with pytest.raises(CorruptBatchError):
                await writer.append(1, damaged)
            with pytest.raises(ValueError, match="at least one record batch"):
                await writer.append(1, b"")
            with pytest.raises(ValueError, match="stream id"):
                await writer.append(-1, batch_of_size(200))
        small = S3WalWriter(local, writer_id, max_bytes=4 * KiB, max_pending_bytes=8 * KiB)
        with pytest.raises(ValueError, match="max_pending_bytes"):
            await small.append(1, batch_of_size(10 * KiB))
        await small.close()
        assert [info async for info in local.list()] == []


def test_keys_spread_over_prefixes_and_never_look_like_stream_objects():
    keys = [wal_object_key("proxy-a-1700000000000-0badcafe", n) for n in range(256)]
    assert len({key.split("/")[1] for key in keys}) == 256
    assert all(key.startswith("wal/") for key in keys)
    same_sequence = {wal_object_key(f"proxy-{i}", 0).split("/")[1] for i in range(50)}
    assert len(same_sequence) > 40  # writers starting together do not share a prefix
    for n, key in enumerate(keys):
        assert parse_wal_object_key(key) == ("proxy-a-1700000000000-0badcafe", n)
        with pytest.raises(ValueError):
            parse_object_key(key)
    with pytest.raises(ValueError):
        parse_wal_object_key(keys[0].replace("wal/", "wal/0", 1))
    for bad in ("", ".hidden", "a/b", "x" * 129):
        with pytest.raises(ValueError, match="writer id"):
            S3WalWriter(None, bad)  # type: ignore[arg-type]
    assert writer_id_for("proxy a/zone-b", 1.5).startswith("proxy-a-zone-b-1500-")
