"""ListOffsets for tiered partitions (docs/tiering.md, "Reading a tiered topic").

Kafka still answers the earliest offset (its log start; the tiered stream continues its
log) and the spec values this module does not know (max timestamp, KIP-405's local and
tiered ends): `answer_here` sends those upstream. The proxy answers:

- EARLIEST, once retention moved the tiered log start past the cutover (Kafka's log
  end), or once the offload job has moved all of [log start, cutover) into objects
  (Kafka's copy may then be deleted, its log start is no longer the log's): the tiered
  log start. Kafka's records below it are trimmed as far as clients go;
- LATEST: the partition's high watermark (on a proxy that does not own it, the committed
  end, or the owner's high watermark when the owner answers over the peer protocol);
- a timestamp: Kafka's answer when Kafka's part of the log has a record at or after it
  (and is not trimmed, as above), else the first tiered record at or after it. The
  tiered search reads the stream's batch headers from its cutover (or log start) on
  (through the block cache; no time index yet); inside the batch found, records are
  read one by one when the batch is not compressed (exact, as Kafka), else the batch's
  base offset is answered (at most one batch early).
"""

from __future__ import annotations

import asyncio
import logging
import struct
from dataclasses import dataclass

from aiokafka import TopicPartition

from proxy.apis.offsets_split import (
    ListOffsetsRequestView,
    OffsetsResult,
    merge_responses,
    read_list_offsets_request,
    split,
)
from proxy.tiering.batches import Compression, iter_batches
from proxy.tiering.objectformat import ObjectFormatError
from proxy.tiering.objectstore import ObjectStoreError
from proxy.tiering.topic_index import stream_of

log = logging.getLogger("tierproxy.reads")

LATEST, EARLIEST = -1, -2
NONE = 0
NOT_LEADER_OR_FOLLOWER = 6
KAFKA_STORAGE_ERROR = 56
SEARCH_READ_BYTES = 1 << 20
_SIZE = struct.Struct(">i")


def answer_here(tiering, topic: str, partition: int, timestamp: int) -> bool:
    """Whether the proxy answers this ListOffsets partition (a cut-over tiered one, for
    LATEST or a timestamp; for EARLIEST too once retention trimmed it past its cutover or
    the offload job filled it below its cutover)."""
    found = tiering.topics.topic(topic)
    if found is None or (timestamp < 0 and timestamp not in (LATEST, EARLIEST)):
        return False
    stream = stream_of(found, partition)
    state = tiering.state(stream)
    info = state.stream(stream)
    if info is None:
        return False
    return timestamp != EARLIEST or _trimmed_past_cutover(info) or not state.backfill_gaps(stream)


def _trimmed_past_cutover(info) -> bool:
    """The tiered log start is above Kafka's log end (the cutover): Kafka's part of the
    log is gone as far as clients are concerned, and Kafka's log start is not the answer."""
    return info.log_start_offset > info.cutover_offset


async def list_offset(tiering, topic: str, partition: int, timestamp: int) -> tuple[int, int, int]:
    """(error code, timestamp, offset) for one partition `answer_here` took."""
    found = tiering.topics.topic(topic)
    stream = None if found is None else stream_of(found, partition)
    state = None if stream is None else tiering.state(stream)
    info = None if state is None else state.stream(stream)
    if info is None:
        return NOT_LEADER_OR_FOLLOWER, -1, -1
    if timestamp == EARLIEST:  # answer_here took it: trimmed past the cutover, or backfilled
        return NONE, -1, info.log_start_offset
    if timestamp == LATEST:
        end = await tiering.reads.owner_high_watermark(stream)
        if end is None:  # the owner is away: the committed end may be below its acks
            return NOT_LEADER_OR_FOLLOWER, -1, -1
        return NONE, -1, end
    if not _trimmed_past_cutover(info):  # else Kafka's records are below the log start
        upstream = await tiering.cutover.offset_for_time(
            TopicPartition(found.name, partition), timestamp
        )
        if upstream is not None and upstream[1] < info.cutover_offset:
            return NONE, upstream[0], upstream[1]
    try:
        hit = await _search(
            tiering, state, stream, max(info.cutover_offset, info.log_start_offset), timestamp
        )
    except (ObjectFormatError, ObjectStoreError) as exc:
        log.error("%s-%d: timestamp %d: %s", found.name, partition, timestamp, exc)
        return KAFKA_STORAGE_ERROR, -1, -1
    if hit is None:
        return NONE, -1, -1  # no record at or after it: Kafka answers -1 too
    return NONE, hit[0], hit[1]


async def _search(tiering, state, stream: int, offset: int, timestamp: int):
    """(timestamp, offset) of the first tiered record at or after `timestamp`: the
    committed objects first, then (on the owner) the log cache."""
    reads = tiering.reads
    while True:
        result = await reads.reader.read(
            state, stream, offset, SEARCH_READ_BYTES, reader_id=("timestamp search", stream)
        )
        pieces = list(result.batches)
        if not pieces and tiering.partitions.get(stream) is not None:
            pieces, _ = reads.log_cache.read(stream, offset, SEARCH_READ_BYTES)
        start = offset
        for piece in pieces:
            for header, batch in iter_batches(piece):
                if header.next_offset <= offset or header.max_timestamp < timestamp:
                    offset = max(offset, header.next_offset)
                    continue
                return _in_batch(header, batch, timestamp)
        if offset == start:  # nothing further here
            return None


def _in_batch(header, batch: memoryview, timestamp: int) -> tuple[int, int]:
    """The first record of the batch at or after `timestamp` (the batch's max timestamp
    is): exact for an uncompressed batch, the base offset for a compressed one."""
    if header.compression != Compression.NONE or header.is_log_append_time:
        ts = header.max_timestamp if header.is_log_append_time else header.base_timestamp
        return max(ts, header.base_timestamp), header.base_offset
    for delta_offset, delta_ts in _record_deltas(batch, header.record_count):
        if header.base_timestamp + delta_ts >= timestamp:
            return header.base_timestamp + delta_ts, header.base_offset + delta_offset
    return header.max_timestamp, header.last_offset


def _record_deltas(batch: memoryview, count: int):
    """(offset delta, timestamp delta) of each record of an uncompressed batch."""
    pos = 61  # the records follow the 61-byte batch header
    for _ in range(count):
        length, pos = _varint(batch, pos)
        end = pos + length
        pos += 1  # attributes
        ts_delta, pos = _varint(batch, pos)
        offset_delta, pos = _varint(batch, pos)
        yield offset_delta, ts_delta
        pos = end


def _varint(buf: memoryview, pos: int) -> tuple[int, int]:
    """A zigzag varint (Kafka's record fields)."""
    shift = value = 0
    while True:
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return (value >> 1) ^ -(value & 1), pos
        shift += 7


@dataclass(slots=True, eq=False)
class OffsetsPlan:
    view: ListOffsetsRequestView
    upstream_frame: tuple[bytes | memoryview, ...] | None  # framed, header included
    local: asyncio.Future[dict]  # (topic, partition) -> OffsetsResult
    tiered: tuple[tuple[str, int], ...] = ()
    passthrough_topics: tuple[str, ...] = ()  # not counted in flight

    def merge(self, api_version: int, upstream: memoryview | None, local: dict) -> bytes:
        return merge_responses(api_version, self.view, upstream, local)

    def failed(self, error: BaseException) -> dict:
        return {key: OffsetsResult(KAFKA_STORAGE_ERROR) for key in self.tiered}


def plan_list_offsets(
    tiering, header_bytes: memoryview, body: memoryview, api_version: int
) -> OffsetsPlan | None:
    """The plan for one ListOffsets; None to forward it as it came. FrameError if it
    cannot be read."""
    if not tiering.topics.any():
        return None
    view = read_list_offsets_request(api_version, body)
    upstream_body, tiered = split(
        view, lambda topic, p: answer_here(tiering, topic, p.partition, p.timestamp)
    )
    if not tiered:
        return None
    local = asyncio.ensure_future(_answer_all(tiering, tiered))
    frame = None
    if upstream_body is not None:
        size = len(header_bytes) + len(upstream_body)
        frame = (_SIZE.pack(size), header_bytes, upstream_body)
    return OffsetsPlan(view, frame, local, tuple((p.topic, p.partition) for p in tiered))


async def _answer_all(tiering, tiered) -> dict:
    answers = await asyncio.gather(
        *(list_offset(tiering, p.topic, p.partition, p.timestamp) for p in tiered)
    )
    return {
        (p.topic, p.partition): OffsetsResult(code, timestamp, offset)
        for p, (code, timestamp, offset) in zip(tiered, answers, strict=True)
    }
