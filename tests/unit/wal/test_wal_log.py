"""The WAL writer on the in-memory filesystem: group commit, rolling, trimming, capacity
backpressure, and what a failed write or fsync does."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from proxy.wal import (
    WalBrokenError,
    WalClosedError,
    WalConfig,
    WalCorruptError,
    WalOffsetOutOfRange,
    WriteAheadLog,
)
from proxy.wal.entry import entry_size
from proxy.wal.fs import OsFilesystem
from proxy.wal.memfs import MemoryFilesystem
from proxy.wal.segments import segment_name
from tests.support.clock import ManualClock
from tests.support.waiting import eventually

DIR = "/wal"


def batch(i: int, size: int = 100) -> bytes:
    return bytes([i % 251]) * size


async def open_wal(fs, clock=None, **settings) -> WriteAheadLog:
    config = WalConfig(DIR, **settings)
    if clock is None:
        return await WriteAheadLog.open(config, fs=fs)
    return await WriteAheadLog.open(config, fs=fs, clock=clock)


async def replayed(wal: WriteAheadLog) -> list[tuple[int, int, bytes]]:
    return [(e.stream_id, e.base_offset, bytes(e.batch)) async for e in wal.replay()]


@contextlib.asynccontextmanager
async def held_fsyncs(fs: MemoryFilesystem):
    fs.hold_fsyncs()
    try:
        yield
    finally:
        fs.release_fsyncs()


@pytest.fixture
def fs():
    return MemoryFilesystem()


async def test_appends_get_contiguous_positions_and_read_back(fs):
    async with await open_wal(fs) as wal:
        positions = [await wal.append(1, i, batch(i, 10 + i)) for i in range(5)]
        assert positions[0].start == 0
        for before, after in zip(positions, positions[1:], strict=False):
            assert after.start == before.end
        assert [p.size for p in positions] == [entry_size(10 + i) for i in range(5)]
        assert wal.durable_end == positions[-1].end
        got = await wal.read(0)
        assert [(e.position, e.base_offset, bytes(e.batch)) for e in got] == [
            (p, i, batch(i, 10 + i)) for i, p in enumerate(positions)
        ]
        assert wal.stats.appends == wal.stats.fsyncs == 5


async def test_concurrent_appends_share_fsyncs(fs):
    async with await open_wal(fs) as wal:
        positions = await asyncio.gather(*(wal.append(i % 4, i, batch(i)) for i in range(500)))
        stats = wal.stats
        assert stats.appends == 500
        assert stats.fsyncs <= 10, stats
        assert len({p.start for p in positions}) == 500
        assert sorted(positions) == sorted(positions, key=lambda p: p.start)


async def test_every_append_waiting_when_an_fsync_starts_is_covered_by_the_next_one(fs):
    async with await open_wal(fs) as wal:
        async with held_fsyncs(fs):
            first = asyncio.create_task(wal.append(0, 0, batch(0)))
            await eventually(
                lambda: fs.fsync_calls == 0 and fs.file_bytes(f"{DIR}/{segment_name(0)}"),
                interval_s=0.001,
            )
            # the first fsync is running (held): these gather behind it
            rest = [asyncio.create_task(wal.append(0, i, batch(i))) for i in range(1, 101)]
            await asyncio.sleep(0.01)  # the loop is not blocked by the held fsync
            assert not first.done()
        await asyncio.gather(first, *rest)
        stats = wal.stats
        assert (stats.appends, stats.fsyncs, stats.largest_group) == (101, 2, 100)
        assert [r.result().start for r in rest] == sorted(r.result().start for r in rest)


async def test_segments_roll_at_the_configured_size(fs):
    size = entry_size(100)
    async with await open_wal(fs, segment_bytes=3 * size) as wal:
        positions = await asyncio.gather(*(wal.append(1, i, batch(i)) for i in range(10)))
        assert [s.base for s in wal.segments] == [0, 3 * size, 6 * size, 9 * size]
        assert all(s.size <= 3 * size for s in wal.segments)
        assert fs.list_dir(DIR) == [segment_name(s.base) for s in wal.segments]
        assert wal.stats.segments_rolled == 3
        # a read crosses segment boundaries
        got = await wal.read(positions[2].start, max_bytes=4 * size)
        assert [e.base_offset for e in got] == [2, 3, 4, 5]


async def test_an_entry_larger_than_a_segment_gets_one_of_its_own(fs):
    async with await open_wal(fs, segment_bytes=1000) as wal:
        await wal.append(1, 0, batch(0, 10))
        big = await wal.append(1, 1, batch(1, 5000))
        await wal.append(1, 2, batch(2, 10))
        assert [(s.base, s.size) for s in wal.segments] == [
            (0, big.start),
            (big.start, big.size),
            (big.end, entry_size(10)),
        ]


async def test_trim_removes_whole_segments_below_and_keeps_the_active_one(fs):
    size = entry_size(100)
    async with await open_wal(fs, segment_bytes=2 * size) as wal:
        positions = [await wal.append(1, i, batch(i)) for i in range(7)]
        assert len(wal.segments) == 4
        await wal.trim_to(positions[2].end)  # segment 0 whole, segment 1 half
        assert [s.base for s in wal.segments] == [2 * size, 4 * size, 6 * size]
        assert wal.trimmed_to == positions[2].end and wal.log_start == 2 * size
        assert [b for _, b, _ in await replayed(wal)] == [3, 4, 5, 6]
        await wal.trim_to(positions[0].end)  # going back: nothing
        assert wal.trimmed_to == positions[2].end
        await wal.trim_to(wal.durable_end)  # everything: the active segment stays
        assert [s.base for s in wal.segments] == [6 * size]
        assert await replayed(wal) == []
        assert any(name.endswith(".deleted") for name in fs.list_dir(DIR)) is False
        assert wal.stats.segments_deleted == 3
        with pytest.raises(WalOffsetOutOfRange):
            await wal.read(0)
        with pytest.raises(ValueError, match="past the durable end"):
            await wal.trim_to(wal.durable_end + 1)


async def test_reopening_replays_what_was_not_trimmed(fs):
    size = entry_size(100)
    async with await open_wal(fs, segment_bytes=2 * size) as wal:
        positions = [await wal.append(i % 2, i, batch(i)) for i in range(6)]
        await wal.trim_to(positions[2].end)
    async with await open_wal(fs, segment_bytes=2 * size) as wal:
        assert wal.recovery.entries == 3
        assert wal.recovery.trimmed_to == positions[2].end
        assert await replayed(wal) == [(i % 2, i, batch(i)) for i in range(3, 6)]
        after = await wal.append(0, 6, batch(6))
        assert after.start == positions[-1].end


async def test_a_full_wal_makes_appends_wait_until_a_trim(fs):
    clock = ManualClock(100.0)
    size = entry_size(100)
    async with await open_wal(fs, clock, capacity_bytes=3 * size) as wal:
        positions = [await wal.append(1, i, batch(i)) for i in range(3)]
        waiting = asyncio.create_task(wal.append(1, 3, batch(3)))
        behind = asyncio.create_task(wal.append(1, 4, batch(4)))
        await asyncio.sleep(0.02)
        assert not waiting.done() and not behind.done()
        assert wal.stats.retained_bytes == 3 * size
        clock.now += 2.5
        assert wal.stats.throttled_seconds == pytest.approx(2.5)  # blocked now, counted
        await wal.trim_to(positions[0].end)  # room for one
        assert (await waiting).start == positions[-1].end
        await asyncio.sleep(0.02)
        assert not behind.done()
        clock.now += 1.0
        await wal.trim_to(positions[1].end)
        await behind
        stats = wal.stats
        assert stats.throttled_appends == 2
        assert stats.throttled_seconds == pytest.approx(3.5)
        assert stats.appends == 5


async def test_an_append_larger_than_the_capacity_is_refused(fs):
    async with await open_wal(fs, capacity_bytes=1000) as wal:
        with pytest.raises(ValueError, match="capacity"):
            await wal.append(1, 0, bytes(1000))
        await wal.append(1, 0, bytes(1000 - entry_size(0)))  # exactly full is fine


async def test_a_cancelled_append_waiting_for_room_is_not_written(fs):
    size = entry_size(100)
    async with await open_wal(fs, capacity_bytes=size) as wal:
        first = await wal.append(1, 0, batch(0))
        gone = asyncio.create_task(wal.append(1, 1, batch(1)))
        await asyncio.sleep(0.01)
        gone.cancel()
        kept = asyncio.create_task(wal.append(1, 2, batch(2)))
        await asyncio.sleep(0.01)
        await wal.trim_to(first.end)
        await kept
        assert [b for _, b, _ in await replayed(wal)] == [2]


async def test_a_withdrawn_append_is_never_written_and_the_one_behind_it_goes_on(fs):
    size = entry_size(100)
    clock = ManualClock(100.0)
    async with await open_wal(fs, clock, capacity_bytes=2 * size) as wal:
        first = await wal.append(1, 0, batch(0))
        full = wal.next_full()  # done when the log starts to wait for room
        assert not full.done()
        large = wal.submit(1, 1, batch(1, 100 + size))  # 3 entries' worth: waits for room
        behind = wal.submit(2, 0, batch(2))  # would fit, but never overtakes
        await asyncio.wait_for(full, 5)
        clock.now += 1.0
        assert wal.stats.throttled_seconds > 0  # the writer took both and waits for room
        again = wal.next_full()  # the next time, not this one
        assert wal.withdraw(large) and large.cancelled()
        # no trim: the append behind it is written once the withdrawn one is dropped
        assert (await asyncio.wait_for(behind, 5)).start == first.end
        assert not wal.withdraw(behind)  # written
        assert not again.done()
        again.cancel()
        # an append the writer has begun to write (written, its fsync held) stays
        await wal.trim_to(behind.result().end)
        # and so does one queued while the log has room: written within a group commit
        async with held_fsyncs(fs):
            writing = wal.submit(1, 2, batch(3))
            path = f"{DIR}/{segment_name(0)}"
            await eventually(lambda: len(fs.file_bytes(path)) == 3 * size, interval_s=0.002)
            assert not wal.withdraw(writing)
            queued = wal.submit(1, 3, batch(4))
            assert not wal.withdraw(queued)
        assert (await writing).start == behind.result().end
        assert (await queued).start == writing.result().end
    async with await open_wal(fs) as wal:
        # on disk: the first, the one behind the withdrawn one, the last two; no other
        assert [s.size for s in wal.segments] == [4 * size]
        assert [(s, o) for s, o, _ in await replayed(wal)] == [(1, 2), (1, 3)]  # not trimmed


async def test_a_failed_fsync_fails_every_waiting_append_and_breaks_the_wal(fs):
    wal = await open_wal(fs)
    acked = await wal.append(1, 0, batch(0))
    fs.fail_next_fsync()
    results = await asyncio.gather(
        *(wal.append(1, i, batch(i)) for i in range(1, 20)), return_exceptions=True
    )
    assert all(isinstance(r, WalBrokenError) for r in results), results
    assert isinstance(results[0].__cause__, OSError)
    assert isinstance(wal.broken, OSError)
    with pytest.raises(WalBrokenError):
        await wal.append(1, 99, batch(99))
    with pytest.raises(WalBrokenError):
        await wal.trim_to(acked.end)
    # what was acknowledged before stays readable, for the uploader
    assert [e.position for e in await wal.read(0)] == [acked]
    assert wal.durable_end == acked.end
    await wal.close()
    # reopening recovers; the failed appends may or may not be there (they were written,
    # their fsync failed): acknowledged ones are
    async with await open_wal(fs) as again:
        entries = await replayed(again)
        assert entries[0] == (1, 0, batch(0))
        assert [b for _, b, _ in entries] == list(range(len(entries)))
        assert (await again.append(1, 100, batch(100))).start >= acked.end


async def test_a_torn_write_is_cut_by_recovery(fs):
    wal = await open_wal(fs)
    acked = [await wal.append(1, i, batch(i)) for i in range(3)]
    fs.tear_next_write(37)
    with pytest.raises(WalBrokenError):
        await wal.append(1, 3, batch(3))
    await wal.close()
    async with await open_wal(fs) as again:
        assert again.recovery.truncated_bytes == 37
        assert [b for _, b, _ in await replayed(again)] == [0, 1, 2]
        assert again.durable_end == acked[-1].end


async def test_a_failed_write_fails_the_group(fs):
    async with await open_wal(fs) as wal:
        fs.fail_next_write()
        with pytest.raises(WalBrokenError):
            await wal.append(1, 0, batch(0))


async def test_acknowledged_entries_survive_a_power_loss(fs):
    size = entry_size(100)
    wal = await open_wal(fs, segment_bytes=2 * size)
    for i in range(7):
        await wal.append(1, i, batch(i))
    async with held_fsyncs(fs):
        unacked = asyncio.create_task(wal.append(1, 7, batch(7)))
        active = wal.segments[-1]
        await eventually(lambda: len(fs.file_bytes(active.path)) > active.size, interval_s=0.001)
        # power lost while that write waits for its fsync: 11 of its bytes made it
        after = fs.crash(keep_unsynced=11)
    await unacked
    await wal.close()
    async with await open_wal(after, segment_bytes=2 * size) as again:
        assert again.recovery.truncated_bytes == 11
        # segments created by rolls survived too: their names were fsynced
        assert len(again.segments) == 4
        assert [b for _, b, _ in await replayed(again)] == list(range(7))


async def test_close_fails_appends_still_waiting_for_room(fs):
    wal = await open_wal(fs, capacity_bytes=entry_size(100))
    await wal.append(1, 0, batch(0))
    waiting = asyncio.create_task(wal.append(1, 1, batch(1)))
    await asyncio.sleep(0.01)
    await wal.close()
    with pytest.raises(WalClosedError):
        await waiting
    with pytest.raises(WalClosedError):
        await wal.append(1, 2, batch(2))
    await wal.close()  # again: nothing


async def test_close_writes_what_was_already_handed_over(fs):
    wal = await open_wal(fs)
    tasks = [asyncio.create_task(wal.append(1, i, batch(i))) for i in range(10)]
    await asyncio.sleep(0)
    await wal.close()
    assert len(await asyncio.gather(*tasks)) == 10


async def test_reads_page_and_check_their_offsets(fs):
    size = entry_size(100)
    async with await open_wal(fs) as wal:
        positions = [await wal.append(1, i, batch(i)) for i in range(10)]
        got = await wal.read(positions[3].start, max_bytes=3 * size)
        assert [e.base_offset for e in got] == [3, 4, 5]
        assert [e.base_offset for e in await wal.read(0, max_bytes=1)] == [0]  # at least one
        assert await wal.read(wal.durable_end) == []
        with pytest.raises(WalOffsetOutOfRange):
            await wal.read(wal.durable_end + 1)
        with pytest.raises(WalCorruptError, match="not the start of an entry"):
            await wal.read(positions[3].start + 1)
        with pytest.raises(ValueError):
            await wal.read(0, max_bytes=0)


async def test_misuse_is_a_value_error(fs):
    async with await open_wal(fs) as wal:
        with pytest.raises(ValueError, match="int64"):
            await wal.append(1 << 64, 0, b"")
    with pytest.raises(ValueError, match="segment_bytes"):
        WalConfig(DIR, segment_bytes=0)


async def test_on_the_real_filesystem(tmp_path):
    config = WalConfig(str(tmp_path / "wal"), segment_bytes=4096)
    async with await WriteAheadLog.open(config, fs=OsFilesystem()) as wal:
        positions = await asyncio.gather(*(wal.append(i % 3, i, batch(i, 500)) for i in range(50)))
        await wal.trim_to(positions[20].end)
    # a torn tail, as a crash mid-write leaves it
    last = sorted((tmp_path / "wal").glob("*.wal"))[-1]
    with last.open("ab") as f:
        f.write(b"\x00\x00\x01\x00garbage")
    async with await WriteAheadLog.open(config) as wal:
        assert wal.recovery.truncated_bytes == 11
        entries = [e async for e in wal.replay()]
        assert [e.base_offset for e in entries] == sorted(
            i for i in range(50) if positions[i].end > positions[20].end
        )
        assert all(bytes(e.batch) == batch(e.base_offset, 500) for e in entries)


async def test_an_uploader_reading_and_trimming_beside_the_writers_sees_each_entry_once(fs):
    size = entry_size(100)
    async with await open_wal(fs, segment_bytes=5 * size, capacity_bytes=8 * size) as wal:
        done = asyncio.Event()
        uploaded = []

        async def writer(stream_id: int) -> None:
            for offset in range(60):
                await wal.append(stream_id, offset, batch(offset))

        async def uploader() -> None:
            offset = wal.log_start
            while not (done.is_set() and offset == wal.durable_end):
                entries = await wal.read(offset, max_bytes=7 * size)
                if not entries:
                    await asyncio.sleep(0.001)
                    continue
                uploaded.extend((e.stream_id, e.base_offset, bytes(e.batch)) for e in entries)
                offset = entries[-1].position.end
                await asyncio.sleep(0.005)  # uploading: slower than the writers
                await wal.trim_to(offset)

        upload = asyncio.create_task(uploader())
        await asyncio.gather(*(writer(w) for w in range(4)))
        done.set()
        await upload
        for w in range(4):
            assert [(o, b) for s, o, b in uploaded if s == w] == [(o, batch(o)) for o in range(60)]
        assert len(uploaded) == 240
        assert wal.stats.throttled_appends > 0  # the capacity bound was met, and survived
        assert len(wal.segments) == 1


async def test_a_failed_segment_removal_fails_that_trim_only(fs, monkeypatch):
    size = entry_size(100)
    async with await open_wal(fs, segment_bytes=size) as wal:
        positions = [await wal.append(1, i, batch(i)) for i in range(3)]
        real_rename = fs.rename

        def failing_rename(src, dst):
            monkeypatch.setattr(fs, "rename", real_rename)
            raise OSError(5, "injected")

        monkeypatch.setattr(fs, "rename", failing_rename)
        with pytest.raises(OSError, match="injected"):
            await wal.trim_to(positions[1].end)
        assert wal.broken is None and len(wal.segments) == 3
        assert wal.trimmed_to == positions[1].end  # the room is released all the same
        await wal.trim_to(positions[1].end)  # the next trim removes them
        assert [s.base for s in wal.segments] == [positions[2].start]
        await wal.append(1, 3, batch(3))
