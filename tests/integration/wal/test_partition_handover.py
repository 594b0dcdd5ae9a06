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

from kio.schema.errors import ErrorCode
from test_tiered_partition import CUTOVER, RECORDS, S0, Shard, config_for, nth, ok

from proxy.objects.local import LocalDirectoryStore
from proxy.partition.committed import committed_blocks
from proxy.partition.owner import PartitionConfig, TieredPartition
from proxy.partition.sequence_holes import SequenceHoles
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
