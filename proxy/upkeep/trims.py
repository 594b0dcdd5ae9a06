"""Moving a tiered stream's log start up: by retention (retention.py) and by DeleteRecords
(tiered_deletes.py). Only the owner of the stream's metadata shard writes the StreamTrim;
another proxy hands a DeleteRecords trim to it over the peer protocol (TrimRequest).

A StreamTrim may not pass the stream's committed end (docs/metadata.md), while Kafka lets
DeleteRecords reach the high watermark. So the owner first uploads what the WAL holds,
within the request's timeout, then trims: the log start never covers records that only
the WAL has, and a restart cannot bring deleted records back.

The answer waits until every live member has read the trim (tiered/shard_reads.py), as
Kafka's waits for every replica in sync: a consumer asking any proxy afterwards finds the
new log start. Also when the stream was trimmed that far already (a retry of a delete
that timed out there). A proxy that handed the trim to the owner reads the shard to its
end before it answers (the owner may not know it yet, or run an older release). The
request's timeout bounds it all, the upload before the trim included.
"""

from __future__ import annotations

import asyncio
import logging
import time

from aiokafka.errors import KafkaError
from kio.schema.errors import ErrorCode

from proxy.clock import now_ms
from proxy.metadata.records import ProducerSnapshot, StreamTrim
from proxy.metadata.rules import Outcome, Verdict
from proxy.metadata.store import ShardFenced, ShardOwner
from proxy.metadata.streams import StreamInfo, shard_of
from proxy.peer.codec import TRIM_SNAPSHOT_PROTOCOL
from proxy.peer.messages import TrimRequest
from proxy.upkeep.ports import TrimHost, TrimWriter, owner_or_peer
from proxy.upload.uploader import UploadError

log = logging.getLogger("tierproxy.trims")

HIGH_WATERMARK = -1


async def write_trim(
    service: TrimWriter,
    owner: ShardOwner,
    info: StreamInfo,
    log_start: int,
    now_ms: int,
    batch_base: int | None = None,
) -> Verdict:
    """Write the StreamTrim and, once accepted, move the owned partition's log start;
    `batch_base`: where the batch holding `log_start` begins, if it began below it.

    With the trim goes a producer snapshot at the new log start when the partition is
    served here and the log start is past the cutover (docs/sequencer.md, "Producer state
    below the log start"): the producers whose batches the trim passes stay known to a
    rebuild, as Kafka keeps them (KIP-360), and the marker follower's place with them.
    The trim drops the snapshot before it; this one, after it in the same write, stays.
    Only while every live member reads it (`TRIM_SNAPSHOT_PROTOCOL`): a release before it
    taking the shard over would fail to rebuild the partition from it."""
    partition = service.partitions.get(info.stream_id) if service.partitions else None
    records: list[StreamTrim | ProducerSnapshot] = [
        StreamTrim(
            owner.state.generation, info.stream_id, info.incarnation, log_start, owner.epoch, now_ms
        )
    ]
    state = None
    current = owner.state.stream(info.stream_id)  # the snapshot names no incarnation
    same = current is not None and current.incarnation == info.incarnation
    readable = service.fleet_at(TRIM_SNAPSHOT_PROTOCOL)
    if partition is not None and same and readable and log_start > info.cutover_offset:
        end = owner.state.stream_end(info.stream_id)
        state = None if end is None else partition.snapshot_at(log_start, end)
    if state is not None:
        records.append(
            ProducerSnapshot(
                owner.state.generation, info.stream_id, owner.epoch, log_start, now_ms, state
            )
        )
    verdict, *snapshot = await owner.write(records)
    if snapshot and not snapshot[0].accepted:
        log.warning(
            "stream %d: producer snapshot at %d not written: %s",
            info.stream_id,
            log_start,
            snapshot[0].reason,
        )
    if verdict.accepted:
        if partition is not None and log_start > partition.log_start_offset:
            partition.log_start_offset = log_start
            if batch_base is not None:
                partition.note_start_batch(log_start, batch_base)
    return verdict


async def trim_stream(service: TrimHost, request: TrimRequest) -> tuple[int, int, str]:
    """DeleteRecords' part for one tiered stream: (Kafka error code, the log start after
    it, a message), on the shard's owner, here or through the peer protocol."""
    stream, offset = request.stream_id, request.offset
    deadline = time.monotonic() + request.timeout_ms / 1000
    shard = shard_of(stream, service.config.shard_count)
    owner = owner_or_peer(service, shard)
    if owner is None:
        return ErrorCode.not_leader_or_follower, -1, f"metadata shard {shard} has no live owner now"
    if isinstance(owner, tuple):  # owned by another proxy: its peer address
        code, start, message = await service.peers.trim(owner, stream, offset, request.timeout_ms)
        if code == ErrorCode.none and not await _read_here(service, shard, deadline):
            return ErrorCode.request_timed_out, -1, f"shard {shard}: the trim not read here in time"
        return code, start, message
    info = owner.state.stream(stream)
    # cut over or taken over just now: its partition may be being started (a rebuild,
    # which may read Kafka's tail), as a produce waits for it (tiered/hold.py)
    partition = None if info is None else await service.partition_here(stream, deadline)
    if info is None or partition is None:  # untiered, or not started: the client retries
        return ErrorCode.not_leader_or_follower, -1, f"stream {stream} is not served here now"
    high_watermark = partition.high_watermark
    target = high_watermark if offset == HIGH_WATERMARK else offset
    if not 0 <= target <= high_watermark:
        return (
            ErrorCode.offset_out_of_range,
            -1,
            f"stream {stream}: offset {target} is past the high watermark {high_watermark}",
        )
    start = max(info.log_start_offset, partition.log_start_offset)
    if target <= start:
        late = await _read_everywhere(service, owner, deadline)
        if late:
            return ErrorCode.request_timed_out, -1, f"{late} did not read the trim in time"
        return ErrorCode.none, start, f"stream {stream} starts at {start} already"
    try:
        async with asyncio.timeout(deadline - time.monotonic()):
            if (owner.state.stream_end(stream) or 0) < target:
                assert service.uploader is not None  # started with the partitions
                await service.uploader.flush()
    except TimeoutError:
        return (
            ErrorCode.request_timed_out,
            -1,
            f"stream {stream}: offset {target} not uploaded in time",
        )
    except UploadError as exc:
        return ErrorCode.request_timed_out, -1, f"stream {stream}: upload failed: {exc}"
    info = owner.state.stream(stream)
    if info is None:
        return ErrorCode.not_leader_or_follower, -1, f"stream {stream} is not served here now"
    # a transaction open below the new log start: Kafka's LSO becomes the base offset of
    # the batch holding it (TieredPartition.last_stable_offset)
    base = await service.batch_base(stream, target) if partition.opened_below(target) else None
    try:
        verdict = await write_trim(service, owner, info, target, now_ms(), base)
    except ShardFenced as exc:
        return ErrorCode.not_leader_or_follower, -1, str(exc)
    if verdict.outcome is Outcome.REFUSE:
        return ErrorCode.not_leader_or_follower, -1, verdict.reason
    log.info("DeleteRecords: stream %d log start %d -> %d", stream, start, target)
    late = await _read_everywhere(service, owner, deadline)
    if late:
        return ErrorCode.request_timed_out, -1, f"{late} did not read the trim in time"
    return ErrorCode.none, target, f"stream {stream}: log start {target}"


async def _read_everywhere(service: TrimHost, owner: ShardOwner, deadline: float) -> list[str]:
    """Every live member reads the owner's shard as far as the owner has (its trim
    included) by `deadline`: the members that did not."""
    left = deadline - time.monotonic()
    return await service.read_everywhere(owner.shard, owner.state.next_offset, left)


async def _read_here(service: TrimHost, shard: int, deadline: float) -> bool:
    """This proxy's reader of `shard` reads to the shard's end by `deadline` (the owner
    asks this proxy to read its trim too, unless it does not know it yet, or runs an
    older release): whether it did."""
    try:
        async with asyncio.timeout(deadline - time.monotonic()):
            await service.readers[shard].read_to_end()
    except TimeoutError:
        return False
    except (KafkaError, RuntimeError) as exc:  # the end not asked, or the reader stopped
        log.warning("shard %d not read to its end here: %r", shard, exc)
    return True
