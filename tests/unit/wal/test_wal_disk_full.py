"""A full disk under the local WAL (issue 18): appends wait, in order, and go on once the
disk has room; nothing half written stays, nothing is answered before it is durable.

The disk is `MemoryFilesystem.set_space`: a write past it puts what fits and fails with
ENOSPC, as a full filesystem does (tests/integration/faults/test_disk_full.py fills a real
tmpfs under a running proxy).
"""

from __future__ import annotations

import asyncio

import pytest

from proxy.wal import WalClosedError, WalConfig, WriteAheadLog
from proxy.wal.entry import entry_size
from proxy.wal.memfs import MemoryFilesystem
from proxy.wal.segments import segment_name
from tests.support.waiting import eventually

DIR = "/wal"


def batch(i: int, size: int = 100) -> bytes:
    return bytes([i % 251]) * size


async def open_wal(fs, **settings) -> WriteAheadLog:
    return await WriteAheadLog.open(WalConfig(DIR, **settings), fs=fs)


async def replayed(wal: WriteAheadLog) -> list[int]:
    return [e.base_offset async for e in wal.replay()]


def segment_bytes(fs: MemoryFilesystem, base: int = 0) -> bytes:
    return fs.file_bytes(f"{DIR}/{segment_name(base)}")


@pytest.fixture
def fs():
    return MemoryFilesystem()


async def test_appends_wait_while_the_disk_is_full_and_go_on_in_order_when_it_has_room(fs):
    size = entry_size(100)
    async with await open_wal(fs, no_space_retry_s=0.01) as wal:
        acked = [await wal.append(1, i, batch(i)) for i in range(3)]
        on_disk = segment_bytes(fs)
        fs.set_space(len(on_disk) + size // 2)  # the next entry fits only half
        waiting = [asyncio.create_task(wal.append(1, i, batch(i))) for i in range(3, 8)]
        await eventually(lambda: wal.stats.waiting_for_space)
        await asyncio.sleep(0.05)  # several retries, still no room
        assert not any(task.done() for task in waiting)
        assert wal.broken is None
        assert segment_bytes(fs) == on_disk  # the half written entry was cut back
        assert wal.durable_end == acked[-1].end
        fs.set_space(None)  # room again
        positions = await asyncio.gather(*waiting)
        assert positions[0].start == acked[-1].end
        assert [p.start for p in positions[1:]] == [p.end for p in positions[:-1]]
        stats = wal.stats
        assert stats.no_space_waits == 1
        assert not stats.waiting_for_space
        assert stats.no_space_seconds > 0
        assert await replayed(wal) == list(range(8))


async def test_a_trim_that_frees_a_segment_lets_the_waiting_appends_in(fs):
    size = entry_size(100)
    # a retry only every minute: the trim itself must wake the writer
    async with await open_wal(fs, segment_bytes=2 * size, no_space_retry_s=60.0) as wal:
        acked = [await wal.append(1, i, batch(i)) for i in range(4)]  # two full segments
        fs.set_space(4 * size)
        waiting = asyncio.create_task(wal.append(1, 4, batch(4)))
        await eventually(lambda: wal.stats.waiting_for_space)
        await wal.trim_to(acked[1].end)  # the first segment goes: room for two entries
        position = await asyncio.wait_for(waiting, 5)
        assert position.start == acked[-1].end
        assert await replayed(wal) == [2, 3, 4]


async def test_close_fails_appends_waiting_for_space_and_keeps_what_was_acknowledged(fs):
    async with await open_wal(fs, no_space_retry_s=0.01) as wal:
        await wal.append(1, 0, batch(0))
        fs.set_space(len(segment_bytes(fs)))
        waiting = asyncio.create_task(wal.append(1, 1, batch(1)))
        await eventually(lambda: wal.stats.waiting_for_space)
    with pytest.raises(WalClosedError):
        await waiting
    fs.set_space(None)
    async with await open_wal(fs) as again:
        assert again.recovery.truncated_bytes == 0  # no torn tail: it was cut at once
        assert await replayed(again) == [0]
