"""Both write-ahead logs with entries that carry a reference (version 2) beside ordinary
ones: replayed and read back with their references, in order, after a reopen; counted
whole in positions, stats, capacity and trims. The local log on a real directory and on
the in-memory filesystem; the S3 log on a LocalDirectoryStore in tmp_path."""

from __future__ import annotations

import asyncio

import pytest

from proxy.objects.local import LocalDirectoryStore
from proxy.wal import WalConfig, WalEntry, WalPosition, WriteAheadLog
from proxy.wal.entry import encode_entry, entry_size
from proxy.wal.memfs import MemoryFilesystem
from proxy.wal.s3log import S3WalConfig, S3WriteAheadLog
from proxy.wal.s3log_objects import log_prefix
from proxy.wal.types import WalBrokenError

PREFIX = log_prefix("proxy-ref")
Written = tuple[int, int, bytes, bytes | None]


def batch(i: int, size: int = 100) -> bytes:
    return bytes([i % 251]) * size


def reference(i: int) -> bytes:
    return f"wal/writer-{i}/00000000000000000042?range={i * 100}-{i * 100 + 99}".encode()


def written(count: int) -> list[Written]:
    """Every third entry an ordinary one, the others with a reference (an empty one too)."""
    out: list[Written] = []
    for i in range(count):
        ref = None if i % 3 == 0 else (b"" if i == 4 else reference(i))
        out.append((i % 2, 1000 + i, batch(i, 61 if ref is not None else 100), ref))
    return out


def size_of(w: Written) -> int:
    return entry_size(len(w[2]), None if w[3] is None else len(w[3]))


def seen(entries: list[WalEntry]) -> list[Written]:
    return [
        (
            e.stream_id,
            e.base_offset,
            bytes(e.batch),
            None if e.reference is None else bytes(e.reference),
        )
        for e in entries
    ]


async def replay(wal: WriteAheadLog | S3WriteAheadLog) -> list[WalEntry]:
    return [e async for e in wal.replay()]


# -- the local log -------------------------------------------------------------------------


async def test_mixed_entries_replay_read_and_trim_on_a_real_directory(tmp_path):
    entries = written(12)
    sizes = [size_of(w) for w in entries]
    config = WalConfig(str(tmp_path / "wal"), segment_bytes=3 * max(sizes))
    async with await WriteAheadLog.open(config) as wal:
        positions = [await wal.append(*w[:3], reference=w[3]) for w in entries[:6]]
        # the hot path: queued without a coroutine, a group commit of several
        futures = [wal.submit(*w[:3], w[3]) for w in entries[6:]]
        positions += await asyncio.gather(*futures)
        assert [p.size for p in positions] == sizes
        assert [p.start for p in positions] == [sum(sizes[:i]) for i in range(12)]
        stats = wal.stats
        assert stats.appends == 12 and stats.bytes_appended == sum(sizes)
        assert stats.retained_bytes == sum(sizes)
        assert len(wal.segments) > 2

    async with await WriteAheadLog.open(config) as wal:
        assert wal.recovery.entries == 12 and wal.recovery.truncated_bytes == 0
        replayed = await replay(wal)
        assert seen(replayed) == entries
        assert [e.position for e in replayed] == positions
        got = await wal.read(positions[4].start, max_bytes=sizes[4] + sizes[5])
        assert seen(got) == entries[4:6]
        assert seen(await wal.read(positions[1].start, max_bytes=1)) == entries[1:2]
        assert seen(await wal.read(positions[0].start, max_bytes=1 << 20)) == entries

        await wal.trim_to(positions[6].end)  # across segments holding both kinds
        assert wal.log_start > 0 and wal.stats.segments_deleted > 0
        assert seen(await replay(wal)) == entries[7:]
        assert wal.stats.retained_bytes == sum(sizes[7:])
        last: Written = (5, 2000, batch(1, 61), reference(99))
        after = await wal.append(*last[:3], reference=last[3])
        assert after == WalPosition(positions[-1].end, positions[-1].end + size_of(last))
        with pytest.raises(ValueError, match="reference of 65536 bytes"):
            wal.submit(1, 2, b"", b"r" * 0x10000)

    async with await WriteAheadLog.open(config) as wal:
        assert seen(await replay(wal)) == [*entries[7:], last]


async def test_a_torn_reference_entry_is_cut_by_recovery():
    fs = MemoryFilesystem()
    config = WalConfig("/wal")
    async with await WriteAheadLog.open(config, fs=fs) as wal:
        acked = [await wal.append(1, i, batch(i), reference(i)) for i in range(3)]
        fs.tear_next_write(29)  # inside the reference of the next one
        with pytest.raises(WalBrokenError):
            await wal.append(1, 3, batch(3), reference(3))
    async with await WriteAheadLog.open(config, fs=fs) as again:
        assert again.recovery.truncated_bytes == 29
        assert [bytes(e.reference or b"") for e in await replay(again)] == [
            reference(i) for i in range(3)
        ]
        assert again.durable_end == acked[-1].end


async def test_the_reference_counts_against_capacity():
    fs = MemoryFilesystem()
    ref = reference(1)
    full = entry_size(100, len(ref))
    async with await WriteAheadLog.open(WalConfig("/wal", capacity_bytes=full), fs=fs) as wal:
        with pytest.raises(ValueError, match="can never fit"):
            wal.submit(1, 0, batch(0), ref + b"!")
        first = await wal.append(1, 0, batch(0), ref)
        assert first.size == full
        # the WAL is full now: the next one waits for a trim, even a plain one
        waiting = wal.submit(1, 1, batch(1))
        await asyncio.sleep(0.01)
        assert not waiting.done()
        await wal.trim_to(first.end)
        assert (await asyncio.wait_for(waiting, 5)).start == full


async def test_old_wals_without_references_still_replay():
    fs = MemoryFilesystem()
    fs.make_dirs("/wal")
    path = "/wal/00000000000000000000.wal"
    fs.open(path, "create").close()
    fs.append_bytes(path, encode_entry(1, 0, batch(0)) + encode_entry(1, 1, batch(1)))
    fs.fsync_dir("/wal")
    async with await WriteAheadLog.open(WalConfig("/wal"), fs=fs) as wal:
        replayed = await replay(wal)
        assert seen(replayed) == [(1, 0, batch(0), None), (1, 1, batch(1), None)]


# -- the S3 log ------------------------------------------------------------------------


async def test_the_s3_log_keeps_references_in_memory_and_across_a_reopen(tmp_path):
    entries = written(9)
    sizes = [size_of(w) for w in entries]
    async with LocalDirectoryStore(tmp_path) as store:
        async with await S3WriteAheadLog.open(S3WalConfig(PREFIX), store) as wal:
            mutable = bytearray(reference(0))
            first = await wal.append(9, 0, batch(0, 61), mutable)
            mutable[:] = b"changed after the answer"  # the log kept its own copy
            positions = list(
                await asyncio.gather(*(wal.append(*w[:3], reference=w[3]) for w in entries))
            )
            assert seen(await wal.read(first.start, max_bytes=first.size)) == [
                (9, 0, batch(0, 61), reference(0))
            ]
            assert seen(await wal.read(positions[0].start, max_bytes=1 << 20)) == entries
            stats = wal.stats
            assert stats.bytes_appended == first.size + sum(sizes)
            assert [p.size for p in positions] == sizes

        async with await S3WriteAheadLog.open(S3WalConfig(PREFIX), store) as wal:
            replayed = await replay(wal)
            assert seen(replayed) == [(9, 0, batch(0, 61), reference(0)), *entries]
            got = await wal.read(positions[2].start, max_bytes=sizes[2] + sizes[3])
            assert seen(got) == entries[2:4]
            await wal.trim_to(positions[-1].end)  # the first object goes, the last stays
            assert wal.stats.segments_deleted == 1
            assert seen(await replay(wal)) == []
            after = await wal.append(1, 50, batch(50, 61), reference(50))
            assert after.start == positions[-1].end

        async with await S3WriteAheadLog.open(S3WalConfig(PREFIX), store) as wal:
            assert seen(await replay(wal))[-1] == (1, 50, batch(50, 61), reference(50))
            assert wal.log_start == positions[0].start  # the object kept by the trim


async def test_the_s3_log_counts_the_reference_against_capacity(tmp_path):
    ref = reference(1)
    full = entry_size(100, len(ref))
    async with LocalDirectoryStore(tmp_path) as store:
        config = S3WalConfig(PREFIX, capacity_bytes=full)
        async with await S3WriteAheadLog.open(config, store) as wal:
            with pytest.raises(ValueError, match="can never fit"):
                wal.submit(1, 0, batch(0), ref + b"!")
            first = await wal.append(1, 0, batch(0), ref)
            waiting = wal.submit(1, 1, batch(1))
            await asyncio.sleep(0.01)
            assert not waiting.done()
            await wal.trim_to(first.end)
            assert (await asyncio.wait_for(waiting, 5)).start == full
