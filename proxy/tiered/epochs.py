"""OffsetForLeaderEpoch on tiered partitions (docs/tiering.md, "Reading a tiered topic").

The request goes to Kafka as it came. Kafka knows the partition's epochs up to the
cutover: where it answers an end offset below the cutover (an earlier epoch), that is the
partition's answer. Where it answers the cutover (the epoch asked is the latest, and
Kafka's log ends at the cutover), the log really ends at the stream's high watermark,
which the proxy answers instead (asked of the owner when it is elsewhere, so a consumer
never sees an end below its position and takes it for a truncation). Kafka's answer past
the cutover is cut there first: Kafka's log may hold a transaction marker or records
written to a broker directly past the cutover, which are not the partition's, so such an
answer is the stream's high watermark too (not noted in `beyond_cutover`: markers of
transactions on the tiered partition put it there, as expected). When no owner
answers (it is away, or restarting and not serving the stream yet), the proxy does not
know that end: it answers NOT_LEADER_OR_FOLLOWER and the client asks again, as it would a
broker that is not the leader; the committed end may be below what the owner acknowledged
and consumers have read.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from kio.schema.errors import ErrorCode

from proxy.apis.api23_offset_for_leader_epoch import (
    EpochError,
    read_requested,
    rewrite_end_offsets,
)
from proxy.kafka.frames import framed
from proxy.metadata.topic_index import stream_of
from proxy.tiered.ports import ReadHandlers

Key = tuple[str, int]


@dataclass(slots=True, eq=False)
class EpochsPlan:
    upstream_frame: tuple[bytes | memoryview, ...]  # the request as it came, framed
    local: asyncio.Future[dict]  # (topic, partition) -> (cutover, high watermark or None)
    cutovers: dict[Key, int]  # (topic, partition) -> cutover, of the tiered ones asked
    passthrough_topics: tuple[str, ...] = ()  # not counted in flight

    def merge(self, api_version: int, upstream: memoryview | None, local: dict) -> bytes:
        assert upstream is not None  # the whole request went upstream

        def new_end(topic: str, partition: int, epoch: int, end: int) -> int | EpochError | None:
            tiered = local.get((topic, partition))
            if tiered is None or end < tiered[0]:
                return None
            cutover, high_watermark = tiered
            if high_watermark is None:  # the stream's end is not known: not the cutover either
                return EpochError(ErrorCode.not_leader_or_follower)
            return max(high_watermark, cutover)

        return bytes(rewrite_end_offsets(api_version, upstream, new_end))

    def failed(self, error: BaseException) -> dict:
        # not Kafka's answers as they came: the cutover is below what consumers have read
        return {key: (cutover, None) for key, cutover in self.cutovers.items()}


def plan_offset_for_leader_epoch(
    tiering: ReadHandlers, header_bytes: memoryview, body: memoryview, api_version: int
) -> EpochsPlan | None:
    """The plan for one OffsetForLeaderEpoch; None when it names no tiered partition.
    FrameError if it cannot be read."""
    if not tiering.topics.any():
        return None
    streams: dict[Key, tuple[int, int]] = {}  # -> stream, cutover
    for topic, partition in read_requested(api_version, body):
        found = tiering.topics.topic(topic)
        if found is None:
            continue
        stream = stream_of(found, partition)
        info = tiering.state(stream).stream(stream)
        if info is not None:
            streams[topic, partition] = (stream, info.cutover_offset)
    if not streams:
        return None
    local = asyncio.ensure_future(_high_watermarks(tiering, streams))
    frame = framed(header_bytes, body)
    cutovers = {key: cutover for key, (_, cutover) in streams.items()}
    return EpochsPlan(frame, local, cutovers)


async def _high_watermarks(tiering: ReadHandlers, streams: dict[Key, tuple[int, int]]) -> dict:
    keys = list(streams)
    reads = tiering.reads
    ends = await asyncio.gather(*(reads.owner_high_watermark(streams[k][0]) for k in keys))
    return {key: (streams[key][1], end) for key, end in zip(keys, ends, strict=True)}
