"""The owner's WAL in S3 (proxy/wal/s3log.py, s3logobject.py): keys, the recovery plan
(the listing's last contiguous run is the log), group commit, trim, capacity, a failed
PUT, damage named by key and byte; on a LocalDirectoryStore in tmp_path. The store that
fails a PUT is a thin fault-injecting twin around the real local store."""

from __future__ import annotations

import asyncio

import pytest

from proxy.config.section import ConfigError, Section
from proxy.config.tiering import parse_tiering
from proxy.objects.local import LocalDirectoryStore
from proxy.objects.store import ObjectInfo, ObjectStoreError
from proxy.upkeep.orphan_plan import SweepLimits, plan_sweep
from proxy.wal.entry import encode_entry
from proxy.wal.s3log import S3WalConfig, S3WriteAheadLog
from proxy.wal.s3log_objects import (
    decode_object,
    log_prefix,
    object_key,
    parse_object_start,
    plan_recovery,
)
from proxy.wal.segments import Segment
from proxy.wal.types import WalBrokenError, WalCorruptError
from tests.support.clock import ManualClock

PREFIX = log_prefix("proxy-a")


def batch(fill: int, size: int = 100) -> bytes:
    return bytes([fill]) * size  # the WAL never looks inside a batch


async def keys(store: LocalDirectoryStore) -> list[str]:
    return [info.key async for info in store.list(PREFIX)]


def info(start: int, size: int) -> ObjectInfo:
    return ObjectInfo(object_key(PREFIX, start), size, 0.0)


# -- keys and the recovery plan (pure) ---------------------------------------------------


def test_keys_sort_by_start_and_parse_back():
    assert PREFIX == "walog/proxy-a/"
    assert log_prefix(".odd name:1") == "walog/_.odd_name_1/"
    assert object_key(PREFIX, 9) < object_key(PREFIX, 10)
    assert parse_object_start(PREFIX, object_key(PREFIX, 12345)) == 12345
    assert parse_object_start(PREFIX, PREFIX + "12345") is None
    assert parse_object_start(PREFIX, "walog/proxy-b/" + "0" * 20) is None
    with pytest.raises(ValueError, match="fleet.name"):
        log_prefix("")


def test_the_log_is_the_last_contiguous_run():
    listed = [info(0, 10), info(30, 5), info(35, 7), info(42, 1)]  # [10, 30) trimmed away
    plan = plan_recovery(PREFIX, [*listed, ObjectInfo(PREFIX + "notes.txt", 3)])
    assert [o.base for o in plan.objects] == [30, 35, 42]
    assert [o.base for o in plan.leftovers] == [0]
    assert plan.foreign == (PREFIX + "notes.txt",)
    assert (plan.start, plan.end) == (30, 43)
    contiguous = plan_recovery(PREFIX, reversed([info(0, 10), info(10, 5)]))
    assert [o.base for o in contiguous.objects] == [0, 10] and not contiguous.leftovers
    assert plan_recovery(PREFIX, []).end == 0


def test_a_late_put_below_the_log_is_a_leftover_whether_it_overlaps_or_leaves_a_gap():
    # [0, 10) and [10, 20) were trimmed; a killed process's PUT to key 10 landed since
    log = [info(20, 5), info(25, 5)]
    for late in (info(10, 14), info(10, 4)):  # overlaps [20, 25) / leaves a gap before it
        plan = plan_recovery(PREFIX, [late, *log])
        assert [o.base for o in plan.objects] == [20, 25] and plan.leftovers[0].base == 10


def test_empty_objects_are_damage_named_by_key():
    with pytest.raises(WalCorruptError, match=f"{object_key(PREFIX, 0)} is empty"):
        plan_recovery(PREFIX, [info(0, 0)])


def test_decode_names_the_key_and_byte_of_a_bad_entry():
    data = bytearray(encode_entry(1, 0, batch(1)) + encode_entry(1, 1, batch(2)))
    obj = Segment(object_key(PREFIX, 1000), 1000, len(data))
    entries = decode_object(obj, bytes(data))
    assert [(e.position.start, e.base_offset) for e in entries] == [(1000, 0), (1125, 1)]
    data[-1] ^= 0xFF
    with pytest.raises(WalCorruptError, match=r"corrupt entry at byte 125 \(WAL offset 1125\)"):
        decode_object(obj, bytes(data))


def test_the_orphan_sweep_leaves_the_s3_wal_log_alone():
    listed = [ObjectInfo(object_key(PREFIX, 0), 10, 0.0), ObjectInfo(PREFIX + "x", 1, 0.0)]
    plan = plan_sweep(listed, lambda _id: False, 1e12, SweepLimits(1.0, 1.0, 1.0))
    assert plan.count == 0 and plan.foreign == 2


def test_wal_mode_is_validated_by_key():
    def parse(wal: dict):
        return parse_tiering(Section({"enabled": True, "wal": wal}, "tiering"), "p")

    assert parse({}).wal_mode == "local"
    assert parse({"mode": "s3"}).wal_mode == "s3"
    with pytest.raises(ConfigError, match="tiering.wal.mode"):
        parse({"mode": "ebs"})


# -- the log on a real local store --------------------------------------------------------


async def test_appends_group_into_objects_and_replay_after_reopen(tmp_path):
    async with LocalDirectoryStore(tmp_path) as store:
        async with await S3WriteAheadLog.open(S3WalConfig(PREFIX), store) as wal:
            first = await wal.append(7, 0, batch(0))
            positions = await asyncio.gather(
                *(wal.append(7 + i % 2, i + 1, batch(i + 1)) for i in range(20))
            )
            stats = wal.stats
        assert first.start == 0
        assert [p.start for p in positions] == [first.end + 125 * i for i in range(20)]
        # the first append went alone (nothing in flight), the 20 gathered meanwhile
        assert stats.appends == 21 and stats.fsyncs == 2 and stats.largest_group == 20
        assert await keys(store) == [object_key(PREFIX, 0), object_key(PREFIX, 125)]

        async with await S3WriteAheadLog.open(S3WalConfig(PREFIX), store) as wal:
            replayed = [e async for e in wal.replay()]
            assert wal.recovery.objects == 2 and wal.recovery.entries == 21
            assert [(e.stream_id, e.base_offset, bytes(e.batch)) for e in replayed] == [
                (7, 0, batch(0)),
                *((7 + i % 2, i + 1, batch(i + 1)) for i in range(20)),
            ]
            assert (wal.trimmed_to, wal.durable_end) == (0, positions[-1].end)
            after = await wal.append(9, 99, batch(9))  # goes on where the log ended
            assert after.start == positions[-1].end


async def test_recovery_reads_many_objects_back_in_offset_order(tmp_path):
    async with LocalDirectoryStore(tmp_path) as store:
        async with await S3WriteAheadLog.open(S3WalConfig(PREFIX), store) as wal:
            for i in range(20):  # one object each: more than one round of GETs
                await wal.append(i % 3, i, batch(i, 50 + i))
        async with await S3WriteAheadLog.open(S3WalConfig(PREFIX), store) as wal:
            replayed = [e async for e in wal.replay()]
            assert wal.recovery.objects == 20 and len(wal.segments) == 20
        assert [(e.stream_id, e.base_offset, len(e.batch)) for e in replayed] == [
            (i % 3, i, 50 + i) for i in range(20)
        ]
        assert all(
            a.position.end == b.position.start for a, b in zip(replayed, replayed[1:], strict=False)
        )


async def test_a_group_stops_at_max_object_bytes(tmp_path):
    async with LocalDirectoryStore(tmp_path) as store:
        config = S3WalConfig(PREFIX, max_object_bytes=300)
        async with await S3WriteAheadLog.open(config, store) as wal:
            await asyncio.gather(*(wal.append(1, i, batch(i)) for i in range(5)))
        sizes = [info.size async for info in store.list(PREFIX)]
        assert sizes == [250, 250, 125]  # two entries of 125 per object at most


async def test_trim_deletes_objects_wholly_below_and_a_restart_replays_the_straddler(tmp_path):
    async with LocalDirectoryStore(tmp_path) as store:
        async with await S3WriteAheadLog.open(S3WalConfig(PREFIX), store) as wal:
            a = await wal.append(1, 0, batch(0))
            b = await wal.append(1, 1, batch(1))
            c = await wal.append(1, 2, batch(2))  # three objects, one entry each
            await wal.trim_to(b.end - 1)  # inside b: a goes, b stays
            assert await keys(store) == [object_key(PREFIX, b.start), object_key(PREFIX, c.start)]
            assert wal.log_start == b.start and wal.stats.segments_deleted == 1
            assert [e.base_offset for e in await wal.read(b.start)] == [1, 2]
            with pytest.raises(WalCorruptError, match="not the start of an entry"):
                await wal.read(b.start + 1)
            assert a.end == b.start
        async with await S3WriteAheadLog.open(S3WalConfig(PREFIX), store) as wal:
            assert [e.base_offset async for e in wal.replay()] == [1, 2]
            await wal.trim_to(wal.durable_end)
            # the newest object stays, so the log never starts over at a key an earlier
            # process may still write (docs/wal.md, "Late PUTs")
            assert await keys(store) == [object_key(PREFIX, c.start)]
            assert wal.stats.retained_bytes == 0 and await wal.read(wal.durable_end) == []
            d = await wal.append(1, 3, batch(3))
            await wal.trim_to(wal.durable_end)
            assert await keys(store) == [object_key(PREFIX, d.start)] and d.start == c.end
        async with await S3WriteAheadLog.open(S3WalConfig(PREFIX), store) as wal:
            assert (wal.log_start, wal.durable_end) == (d.start, d.end)  # not back to 0


async def test_open_deletes_what_an_interrupted_trim_left_below_a_gap(tmp_path):
    async with LocalDirectoryStore(tmp_path) as store:
        async with await S3WriteAheadLog.open(S3WalConfig(PREFIX), store) as wal:
            for i in range(4):
                await wal.append(1, i, batch(i))
        await store.delete([object_key(PREFIX, 125)])  # the trim deleted b, not a
        async with await S3WriteAheadLog.open(S3WalConfig(PREFIX), store) as wal:
            assert wal.recovery.leftovers_deleted == 1
            assert [e.base_offset async for e in wal.replay()] == [2, 3]
        assert await keys(store) == [object_key(PREFIX, 250), object_key(PREFIX, 375)]


async def test_a_damaged_object_stops_the_open_naming_its_key_and_byte(tmp_path):
    async with LocalDirectoryStore(tmp_path) as store:
        async with await S3WriteAheadLog.open(S3WalConfig(PREFIX), store) as wal:
            await wal.append(1, 0, batch(0))
            await asyncio.gather(wal.append(1, 1, batch(1)), wal.append(1, 2, batch(2)))
        key = object_key(PREFIX, 125)
        data = bytearray(await store.get(key))
        data[125 + 30] ^= 0x01  # inside the second entry's batch
        await store.put(key, bytes(data))
        with pytest.raises(WalCorruptError, match=rf"{key}: corrupt entry at byte 125"):
            await S3WriteAheadLog.open(S3WalConfig(PREFIX), store)


async def test_appends_wait_for_room_and_never_fail(tmp_path):
    async with LocalDirectoryStore(tmp_path) as store:
        config = S3WalConfig(PREFIX, capacity_bytes=300)
        async with await S3WriteAheadLog.open(config, store) as wal:
            first = await wal.append(1, 0, batch(0))
            await wal.append(1, 1, batch(1))
            third = asyncio.ensure_future(wal.append(1, 2, batch(2)))
            await asyncio.sleep(0.2)
            assert not third.done() and wal.stats.retained_bytes == 250
            await wal.trim_to(first.end)
            position = await asyncio.wait_for(third, 5)
            assert position.start == 250
            assert wal.stats.throttled_appends == 1 and wal.stats.throttled_seconds > 0.1
        with pytest.raises(ValueError, match="capacity_bytes"):
            async with await S3WriteAheadLog.open(config, store) as wal:
                await wal.append(1, 3, batch(3, 400))


async def test_a_withdrawn_append_is_never_put_and_the_one_behind_it_goes_on(tmp_path):
    clock = ManualClock(100.0)
    async with LocalDirectoryStore(tmp_path) as store:
        config = S3WalConfig(PREFIX, capacity_bytes=300)
        async with await S3WriteAheadLog.open(config, store, clock=clock) as wal:
            first = await wal.append(1, 0, batch(0))  # 125 bytes
            full = wal.next_full()  # done when the log starts to wait for room
            large = wal.submit(1, 1, batch(1, 200))  # 225 more: waits for room
            behind = wal.submit(2, 0, batch(2))  # would fit, but never overtakes
            await asyncio.wait_for(full, 5)
            clock.now += 1.0
            assert wal.stats.throttled_seconds > 0
            assert not behind.done()
            assert wal.withdraw(large) and large.cancelled()
            assert (await asyncio.wait_for(behind, 5)).start == first.end  # no trim needed
            assert not wal.withdraw(behind)  # PUT
        async with await S3WriteAheadLog.open(config, store) as wal:
            assert [(e.stream_id, e.base_offset) async for e in wal.replay()] == [(1, 0), (2, 0)]


class FailingPuts:
    """The real local store, with the next PUT failing as S3 would after its retries."""

    def __init__(self, store: LocalDirectoryStore) -> None:
        self._store = store
        self.fail_next = False

    async def create(self, key, data):
        if self.fail_next:
            self.fail_next = False
            raise ObjectStoreError(key, "create", "503 Slow Down", attempts=3, retryable=True)
        await self._store.create(key, data)

    def __getattr__(self, name):
        return getattr(self._store, name)


async def test_a_failed_put_breaks_the_wal_and_reopening_recovers_what_was_acknowledged(
    tmp_path,
):
    async with LocalDirectoryStore(tmp_path) as real:
        store = FailingPuts(real)
        async with await S3WriteAheadLog.open(S3WalConfig(PREFIX), store) as wal:
            acked = await wal.append(1, 0, batch(0))
            store.fail_next = True
            with pytest.raises(WalBrokenError, match="503 Slow Down"):
                await wal.append(1, 1, batch(1))
            assert wal.broken is not None
            with pytest.raises(WalBrokenError):
                await wal.append(1, 2, batch(2))
            assert [e.base_offset for e in await wal.read(0)] == [0]  # still readable
        async with await S3WriteAheadLog.open(S3WalConfig(PREFIX), real) as wal:
            assert [e.base_offset async for e in wal.replay()] == [0]
            assert (await wal.append(1, 1, batch(1))).start == acked.end
