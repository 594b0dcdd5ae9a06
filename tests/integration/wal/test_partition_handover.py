"""A tiered partition handed over on the same proxy: closed with requests in flight and
queued (a shard released), uploaded and trimmed, rebuilt from the committed objects (the
shard claimed again). Real WAL in tmp_path, real uploader and object store (a local
directory), the rebuild's real object reader (`committed.committed_blocks`).

What the fault-injection suite's duplicates came from (docs/reliability.md, "Duplicates"):
not the rebuild, which answers every retry as a duplicate (first test), but the answer to
a producer whose pipelined requests straddle the partition's start: the first refused
NOT_LEADER_OR_FOLLOWER, a later one sequenced with a gap. OUT_OF_ORDER_SEQUENCE_NUMBER
there makes librdkafka bump its epoch and write again the batches of other partitions it
only knows as possibly persisted. A gap that a batch the proxy refused explains is
answered NOT_LEADER_OR_FOLLOWER, which makes it resend in order (second test); any other
gap gets Kafka's answer (third).
"""

from __future__ import annotations

import asyncio
import logging
from types import SimpleNamespace

from kio.schema.errors import ErrorCode
from test_tiered_partition import (
    CUTOVER,
    NOW_MS,
    RECORDS,
    S0,
    Shard,
    config_for,
    held_upstream,
    nth,
    ok,
)

from proxy.metadata.records import ObjectCommit, ShardClaim
from proxy.metadata.state import MetadataState
from proxy.objects.local import LocalDirectoryStore
from proxy.partition.committed import committed_blocks
from proxy.partition.owner import PartitionConfig, TieredPartition
from proxy.partition.partition_set import PartitionSet
from proxy.partition.sequence_holes import SequenceHoles
from proxy.tiered import shards
from proxy.upload.uploader import ObjectIdAllocator, Uploader, UploaderConfig
from proxy.wal import WriteAheadLog

QUIET = UploaderConfig(upload_bytes=1 << 30, upload_interval_s=600)  # flush() only
PID = 7


async def test_retry_after_release_and_claim_is_answered_as_duplicate(tmp_path):
    shard = Shard()
    config = PartitionConfig(max_in_flight=4)
    async with LocalDirectoryStore(tmp_path / "objects") as store:
        async with await WriteAheadLog.open(config_for(tmp_path / "wal")) as wal:
            async with Uploader(wal, store, shard.commit, ObjectIdAllocator(1), config=QUIET) as up:
                old = await TieredPartition.recover(S0, wal, shard.state, config=config)
                old.start()
                sends = [asyncio.create_task(old.produce(nth(PID, n), -1)) for n in range(10)]
                # the release: close while the first writes are in flight, the rest queued
                # (one loop step at a time: the task takes max_in_flight, then waits)
                for _ in range(100):
                    if old.log_end_offset > CUTOVER:
                        break
                    await asyncio.sleep(0)
                await old.close()
                first = await asyncio.gather(*sends)
                taken = sum(1 for r in first if r.error_code == 0)
                assert 1 <= taken <= 4, first
                for n, result in enumerate(first[:taken]):  # answered once durable
                    ok(result, CUTOVER + RECORDS * n)
                assert all(
                    r.error_code == ErrorCode.not_leader_or_follower for r in first[taken:]
                ), first
                await up.flush()  # what the release does before its ShardRelease
                end = CUTOVER + RECORDS * taken
                assert shard.state.stream_end(S0) == end
                assert [e async for e in wal.replay() if e.stream_id == S0] == []

                # the claim: the WAL holds nothing of the stream, the objects hold it all
                def read_committed(stream: int, start: int, stop: int):
                    return committed_blocks(store, shard.state, stream, start, stop)

                new = await TieredPartition.recover(
                    S0, wal, shard.state, read_committed=read_committed, config=config
                )
                async with new:
                    assert new.log_end_offset == new.high_watermark == end
                    appends = wal.stats.appends
                    for n in range(taken):  # the client's retries, in order
                        ok(await new.produce(nth(PID, n), -1), CUTOVER + RECORDS * n)
                    assert wal.stats.appends == appends  # nothing written twice
                    for n in range(taken, 10):  # the refused ones are new
                        ok(await new.produce(nth(PID, n), -1), CUTOVER + RECORDS * n)
                    assert new.log_end_offset == CUTOVER + RECORDS * 10


async def test_a_gap_after_a_batch_the_proxy_refused_is_answered_not_leader(tmp_path, caplog):
    shard = Shard()
    holes = SequenceHoles()  # the proxy's, shared by its partitions (TieringService.holes)
    async with await WriteAheadLog.open(config_for(tmp_path / "wal")) as wal:
        old = await TieredPartition.recover(S0, wal, shard.state)
        old.holes = holes
        async with old:
            for n in range(3):
                ok(await old.produce(nth(PID, n), -1), CUTOVER + RECORDS * n)
        # batch 3 reaches the closed partition (the shard is being handed over): refused
        # NOT_LEADER_OR_FOLLOWER, and recorded; batch 4, pipelined behind it, reaches the
        # new partition first
        assert (await old.produce(nth(PID, 3), -1)).error_code == ErrorCode.not_leader_or_follower
        new = await TieredPartition.recover(S0, wal, shard.state)
        new.holes = holes
        async with new:
            appends = wal.stats.appends
            with caplog.at_level(logging.WARNING, logger="proxy.partition.owner"):
                result = await new.produce(nth(PID, 4), -1)
            assert result.error_code == ErrorCode.not_leader_or_follower, result
            assert "a batch before this one was not appended" in result.error_message
            assert "out of order sequence number for producer 7: 12" in result.error_message
            assert "OUT_OF_ORDER_SEQUENCE_NUMBER refused" in caplog.text
            assert wal.stats.appends == appends and new.log_end_offset == CUTOVER + 9
            # the client drains and resends from its oldest batch not answered, in order
            ok(await new.produce(nth(PID, 3), -1), CUTOVER + 9)
            ok(await new.produce(nth(PID, 4), -1), CUTOVER + 12)
            # a gap the proxy did not make (batch 5 never came): Kafka's answer, at once
            result = await new.produce(nth(PID, 6), -1)
            assert result.error_code == ErrorCode.out_of_order_sequence_number, result
            assert "not appended" not in result.error_message
            assert new.log_end_offset == CUTOVER + 15


async def test_a_gap_the_proxy_did_not_make_gets_kafkas_answer_even_after_a_takeover(tmp_path):
    shard = Shard()
    holes = SequenceHoles()
    async with await WriteAheadLog.open(config_for(tmp_path / "wal")) as wal:
        async with await TieredPartition.recover(S0, wal, shard.state) as old:
            old.holes = holes
            ok(await old.produce(nth(PID, 0), -1), CUTOVER)
        new = await TieredPartition.recover(S0, wal, shard.state)
        new.holes = holes
        async with new:
            result = await new.produce(nth(PID, 2), -1)
            assert result.error_code == ErrorCode.out_of_order_sequence_number, result


def commits_at(shard: Shard, epoch: int):
    """The uploader's commit callback of the owner of `epoch`."""

    async def commit(objects) -> None:
        for o in objects:
            shard.write(ObjectCommit(0, o.object_id, o.kind, o.size, epoch, NOW_MS, o.ranges))

    return commit


async def test_a_member_taken_over_uncleanly_does_not_bring_back_its_stale_wal_entries(tmp_path):
    """proxy-a acknowledged five batches of S0 (its WAL only) and was killed; proxy-b took
    the shard over uncleanly (`unclean_takeover_after_s`) at the committed end, the
    cutover, and committed two batches of its own producer there. proxy-a restarts with
    its old WAL and is given the shard again: its partition goes on from proxy-b's log
    (its stale batches neither replayed nor served: before, they came back as the log past
    proxy-b's end), and its uploader trims them without uploading them."""
    shard = Shard()  # claimed by proxy-a at epoch 1
    await five_acknowledged_then_killed(tmp_path / "a", shard)
    shard.write(ShardClaim(0, 2, "proxy-b", NOW_MS))  # the unclean takeover
    async with LocalDirectoryStore(tmp_path / "objects") as store:
        async with await WriteAheadLog.open(config_for(tmp_path / "b")) as wal:
            taker = PartitionSet(wal)
            await taker.recover([S0], shard.state)
            for n in range(2):
                ok(await taker.produce(S0, nth(8, n), -1), CUTOVER + RECORDS * n)
            async with Uploader(wal, store, commits_at(shard, 2), ObjectIdAllocator(2)) as up:
                await up.flush()
            await taker.close()
        assert shard.state.stream_end(S0) == CUTOVER + 6

        shard.write(ShardClaim(0, 3, "proxy-a", NOW_MS))  # given back to proxy-a
        async with await WriteAheadLog.open(config_for(tmp_path / "a")) as wal:
            assert len([e async for e in wal.replay()]) == 5  # the stale entries
            partitions = PartitionSet(wal)
            service = service_of(partitions, shard, store)
            owner = SimpleNamespace(state=shard.state, previous_owner="proxy-b", shard=0, epoch=3)
            await shards.owned(service, owner)
            partition = partitions.get(S0)
            assert partition.log_end_offset == partition.high_watermark == CUTOVER + 6
            ok(await partitions.produce(S0, nth(8, 2), -1), CUTOVER + 6)  # proxy-b's producer
            ok(await partitions.produce(S0, nth(8, 1), -1), CUTOVER + 3)  # a retry: duplicate
            uploader = await flush_uploads(wal, store, shard, partitions, epoch=3, first_id=3)
            assert uploader.stats.skipped_entries == 5
            assert wal.trimmed_to == wal.durable_end
            await partitions.close()
        assert shard.state.stream_end(S0) == CUTOVER + 9
        blocks = [b async for b in committed_blocks(store, shard.state, S0, CUTOVER, CUTOVER + 9)]
        assert [h.producer_id for b in blocks for h in b.headers] == [8, 8, 8]


async def five_acknowledged_then_killed(wal_dir, shard: Shard) -> None:
    """A proxy with its WAL in `wal_dir` acknowledges five batches of S0 (one producer),
    none uploaded, and stops as if killed."""
    async with await WriteAheadLog.open(config_for(wal_dir)) as wal:
        partitions = PartitionSet(wal)
        await partitions.recover([S0], shard.state)
        for n in range(5):
            ok(await partitions.produce(S0, nth(PID, n), -1), CUTOVER + RECORDS * n)
        await partitions.close()  # killed: nothing uploaded


def service_of(partitions: PartitionSet, shard: Shard, store=None, **epochs: int):
    """proxy-a's tiered service as the shard callbacks (tiered/shards.py) see it."""
    return SimpleNamespace(
        name="proxy-a",
        partitions=partitions,
        store=store,
        kafka_settings={},
        topics=None,
        readers=[SimpleNamespace(state=shard.state)],
        claimed_epochs={0: epochs.get("claimed", 0)} if "claimed" in epochs else {},
        is_sealed=lambda stream: False,
        notify=lambda: None,
        losing=set(),
    )


async def serve_five_batches(tmp_path, shard: Shard):
    """proxy-a's WAL and partitions, S0 served with five batches acknowledged and not
    uploaded (the shard claimed at epoch 1)."""
    wal = await WriteAheadLog.open(config_for(tmp_path / "a"))
    partitions = PartitionSet(wal)
    await partitions.recover([S0], shard.state)
    for n in range(5):
        ok(await partitions.produce(S0, nth(PID, n), -1), CUTOVER + RECORDS * n)
    return wal, partitions


async def flush_uploads(
    wal, store, shard: Shard, partitions: PartitionSet, *, epoch: int = 1, first_id: int = 9
) -> Uploader:
    """An upload of everything the WAL holds, committed as the owner of `epoch`, stale
    entries trimmed (the uploader proxy-a runs)."""
    uploader = Uploader(
        wal,
        store,
        commits_at(shard, epoch),
        ObjectIdAllocator(first_id),
        committed_end=shard.state.stream_end,
        stale=partitions.stale,
        config=QUIET,
    )
    async with uploader:
        await uploader.flush()
    return uploader


async def test_a_member_paused_past_the_takeover_disowns_its_entries_when_it_resumes(tmp_path):
    """proxy-a serves S0, five batches acknowledged and not uploaded, and is paused past
    the takeover bound: proxy-b claims the shard (epoch 2). On resuming, proxy-a loses the
    shard and its reader reads proxy-b's claim, in either order: the entries are disowned
    then, and its uploader trims them without uploading them. (Before, nothing disowned
    them until proxy-a claimed the shard again: its uploader tried to commit them again
    and again, and the WAL kept them.)"""
    for reader_first in (False, True):
        shard = Shard()
        wal, partitions = await serve_five_batches(tmp_path / str(reader_first), shard)
        service = service_of(partitions, shard, claimed=1)
        shard.write(ShardClaim(0, 2, "proxy-b", NOW_MS))  # the takeover, while paused
        if reader_first:  # the reader reads the claim while S0 is still served: kept
            shards.claimed_elsewhere(service, 0)
            assert [partitions.stale(e) async for e in wal.replay()] == [False] * 5
        await shards.lost(service, 0)  # stops S0's partition, then disowns
        if not reader_first:
            shards.claimed_elsewhere(service, 0)  # the reader's turn: nothing more to do
        assert partitions.get(S0) is None
        async with LocalDirectoryStore(tmp_path / f"objects-{reader_first}") as store:
            uploader = await flush_uploads(wal, store, shard, partitions)
        assert uploader.stats.skipped_entries == 5
        assert wal.trimmed_to == wal.durable_end
        await partitions.close()
        await wal.close()


async def test_a_claim_older_than_this_members_own_disowns_nothing(tmp_path):
    """The service's reader may read another member's claim after this member claimed
    the shard again at a later epoch (it lags the owner's own reader): the entries
    written under the later claim are the log, not to be disowned."""
    shard = Shard()
    shard.write(ShardClaim(0, 2, "proxy-b", NOW_MS))
    wal, partitions = await serve_five_batches(tmp_path, shard)
    service = service_of(partitions, shard, claimed=3)  # the reader has not read epoch 3
    await shards.lost(service, 0)
    shards.claimed_elsewhere(service, 0)
    assert [partitions.stale(e) async for e in wal.replay()] == [False] * 5
    # without this member's own claim, the same entries are stale
    shards.claimed_elsewhere(service_of(partitions, shard), 0)
    assert [partitions.stale(e) async for e in wal.replay()] == [True] * 5
    await partitions.close()
    await wal.close()


async def test_the_claim_watch_disowns_when_the_shards_reader_reads_another_members_claim(
    tmp_path, caplog
):
    """The service's reader of the shard calls the watch at each record: proxy-b's claim
    read after the shard's partitions were stopped here disowns their entries; proxy-a's
    own claim does nothing; before the partitions exist, nothing."""
    shard = Shard()
    wal, partitions = await serve_five_batches(tmp_path, shard)
    service = service_of(partitions, shard, claimed=1)
    watch = shards.ClaimWatch(service)
    watch.record(0)  # proxy-a's own claim: nothing
    await partitions.remove(S0)  # lost (fenced) before its reader read the claim
    assert [partitions.stale(e) async for e in wal.replay()] == [False] * 5
    shard.write(ShardClaim(0, 2, "proxy-b", NOW_MS))
    watch.record(0)
    assert [partitions.stale(e) async for e in wal.replay()] == [True] * 5
    await partitions.close()
    await wal.close()
    # before the service's partitions exist (its start disowns then): no disown tried,
    # so no error logged
    with caplog.at_level(logging.ERROR, logger="tierproxy.tiering"):
        shards.ClaimWatch(service_of(None, shard)).record(0)
    assert caplog.records == []


async def test_each_rebuilt_partition_logs_where_its_log_and_state_came_from(tmp_path, caplog):
    """A restart after five acknowledged batches (none uploaded): the rebuild logs, as
    Kafka logs each log it loads, the log it serves and where it came from, so a failure
    can be read from the proxy's log after the fact. The log starts at 0: Kafka's log below
    the cutover is the stream's too."""
    shard = Shard()
    await five_acknowledged_then_killed(tmp_path / "a", shard)
    end = CUTOVER + 5 * RECORDS
    caplog.set_level(logging.INFO, logger="tierproxy.tiering")
    async with await WriteAheadLog.open(config_for(tmp_path / "a")) as wal:
        partitions = PartitionSet(wal)
        await partitions.recover([S0], shard.state)
        assert partitions.get(S0).high_watermark == end
        await partitions.close()
    rebuilt = [r.getMessage() for r in caplog.records if "rebuilt" in r.getMessage()]
    assert rebuilt == [
        f"stream {S0} rebuilt at shard 0 epoch 1: log [0, {end}), committed end "
        f"{CUTOVER}, producer state from no snapshot, 5 WAL batches [{CUTOVER}, {end})"
    ]


async def test_a_shard_lost_during_a_rebuild_its_reader_has_not_read_starts_nothing(tmp_path):
    """The cutover loop rebuilds a stream it has just cut over (its reader of the shard
    has not read the cutover yet) when the shard is lost: `lost` gives up the streams the
    partition set knows of too, so that rebuild starts nothing. A rebuild begun once the
    shard is being given up (its owner still commits what it holds) starts nothing
    either (`losing`, asked through `may_start`); a claim again clears that."""
    slow, read_upstream = held_upstream()
    async with await WriteAheadLog.open(config_for(tmp_path / "wal")) as wal:
        partitions = PartitionSet(wal, clock_ms=lambda: NOW_MS + 1000)
        behind = Shard.__new__(Shard)  # its reader has read the claim, not the cutover
        behind.state = MetadataState(0, 1)
        behind.write(ShardClaim(0, 1, "proxy-a", NOW_MS))
        service = service_of(partitions, behind)
        state = Shard().state

        def may_start(stream: int) -> bool:  # as shards.recover_streams asks
            return 0 not in service.losing

        rebuilding = asyncio.create_task(
            partitions.recover([S0], state, read_upstream=read_upstream)
        )
        await asyncio.sleep(0.05)
        await shards.lost(service, 0)
        slow.set()
        await asyncio.wait_for(rebuilding, 10)
        assert partitions.get(S0) is None and not partitions.not_rebuilt
        assert service.losing == {0}

        slow.clear()  # a rebuild begun while the shard is being given up
        rebuilding = asyncio.create_task(
            partitions.recover([S0], state, read_upstream=read_upstream, may_start=may_start)
        )
        await asyncio.sleep(0.05)
        slow.set()
        await asyncio.wait_for(rebuilding, 10)
        assert partitions.get(S0) is None and not partitions.not_rebuilt
        service.losing.discard(0)  # claimed again (shards.owned)
        await partitions.recover([S0], state, read_upstream=read_upstream, may_start=may_start)
        assert partitions.get(S0) is not None
        await partitions.close()
