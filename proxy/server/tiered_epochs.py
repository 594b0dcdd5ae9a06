"""OffsetForLeaderEpoch on tiered partitions (docs/tiering.md, "Reading a tiered topic").

The request goes to Kafka as it came. Kafka knows the partition's epochs up to the
cutover: where it answers an end offset at or past the cutover (the epoch asked is the
latest, and Kafka's log ends at the cutover), the log really ends at the stream's high
watermark, which the proxy answers instead (asked of the owner when it is elsewhere, so
a consumer never sees an end below its position and takes it for a truncation). Earlier
epochs end below the cutover, as Kafka says.
"""

from __future__ import annotations

import asyncio
import struct
from dataclasses import dataclass

from proxy.apis.api23_offset_for_leader_epoch import read_requested, rewrite_end_offsets
from proxy.tiering.topic_index import stream_of

_SIZE = struct.Struct(">i")

Key = tuple[str, int]


@dataclass(slots=True, eq=False)
class EpochsPlan:
    upstream_frame: tuple[bytes | memoryview, ...]  # the request as it came, framed
    local: asyncio.Future[dict]  # (topic, partition) -> (cutover, high watermark)
    passthrough_topics: tuple[str, ...] = ()  # not counted in flight

    def merge(self, api_version: int, upstream: memoryview | None, local: dict) -> bytes:
        assert upstream is not None  # the whole request went upstream

        def new_end(topic: str, partition: int, epoch: int, end: int) -> int | None:
            tiered = local.get((topic, partition))
            if tiered is None or end < tiered[0]:
                return None
            return max(end, tiered[1])

        return bytes(rewrite_end_offsets(api_version, upstream, new_end))

    def failed(self, error: BaseException) -> dict:
        return {}  # Kafka's answers as they came: ends at the cutover, never past the log


def plan_offset_for_leader_epoch(
    tiering, header_bytes: memoryview, body: memoryview, api_version: int
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
    frame = (_SIZE.pack(len(header_bytes) + len(body)), header_bytes, body)
    return EpochsPlan(frame, local)


async def _high_watermarks(tiering, streams: dict[Key, tuple[int, int]]) -> dict:
    keys = list(streams)
    ends = await asyncio.gather(*(tiering.reads.high_watermark(streams[k][0]) for k in keys))
    return {key: (streams[key][1], end) for key, end in zip(keys, ends, strict=True)}
