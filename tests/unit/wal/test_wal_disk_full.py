"""A full disk under the local WAL (issue 18): appends wait, in order, and go on once the
disk has room; nothing half written stays, nothing is answered before it is durable.

The disk is `MemoryFilesystem.set_space`: a write past it puts what fits and fails with
ENOSPC, as a full filesystem does (tests/integration/faults/test_disk_full.py fills a real
tmpfs under a running proxy).
"""

from __future__ import annotations

import asyncio
import errno

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
        full = wal.next_full()  # done when the log starts to wait for room: a full disk too
        fs.set_space(len(on_disk) + size // 2)  # the next entry fits only half
        waiting = [asyncio.create_task(wal.append(1, i, batch(i))) for i in range(3, 8)]
        await asyncio.wait_for(full, 5)
        assert wal.stats.waiting_for_space
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


async def test_an_fsync_that_finds_the_disk_full_waits_and_writes_the_group_again(fs):
    """A filesystem that allocates at writeback (NFS, thin provisioning) says ENOSPC at the
    fsync. Its pages are then marked clean though not on the disk (the model's
    `fail_next_fsync`, as Linux does): fsyncing again would acknowledge zeros. The group
    is cut off and written again whole; a power loss after keeps every acknowledged
    entry."""
    async with await open_wal(fs, no_space_retry_s=0.01) as wal:
        acked = [await wal.append(1, i, batch(i)) for i in range(3)]
        fs.fail_next_fsync(errno.ENOSPC)
        positions = await asyncio.gather(*(wal.append(1, i, batch(i)) for i in range(3, 8)))
        assert wal.broken is None
        assert positions[0].start == acked[-1].end
        assert [p.start for p in positions[1:]] == [p.end for p in positions[:-1]]
        assert wal.stats.no_space_waits == 1 and not wal.stats.waiting_for_space
        assert await replayed(wal) == list(range(8))
    async with await open_wal(fs.crash()) as after_power_loss:
        assert after_power_loss.recovery.truncated_bytes == 0
        assert await replayed(after_power_loss) == list(range(8))


async def test_the_model_loses_a_failed_fsyncs_bytes_that_are_not_written_again(fs):
    """The model the test above relies on: after a failed fsync, a later one that succeeds
    does not make the bytes it failed on durable."""
    fs.make_dirs(DIR)
    file = fs.open(f"{DIR}/f", "create")
    file.write([b"durable"])
    file.fsync()
    file.write([b"lost"])
    fs.fail_next_fsync(errno.ENOSPC)
    with pytest.raises(OSError) as failed:
        file.fsync()
    assert failed.value.errno == errno.ENOSPC
    file.write([b"!"])
    file.fsync()  # succeeds, as Linux's does
    fs.fsync_dir(DIR)
    assert fs.crash().file_bytes(f"{DIR}/f") == b"durable" + bytes(4) + b"!"
    file.truncate(len(b"durable"))  # cut off and written again: durable at the next fsync
    file.write([b"again"])
    file.fsync()
    assert fs.crash().file_bytes(f"{DIR}/f") == b"durableagain"
