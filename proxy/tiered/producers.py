"""DescribeProducers on tiered partitions (docs/tiering.md, "Transactions": describing
producers).

Kafka keeps a tiered partition's producer state only up to the cutover: the batches and
transactions written since are the stream's, sequenced by its owner. So a tiered
partition's producers are the owner's (`TieredPartition.producers`), asked over the peer
protocol when the owner is another proxy; the partitions of other topics go upstream, and
the answer is merged in the request's order. When no owner answers, the partition is
answered NOT_LEADER_OR_FOLLOWER and the admin client asks again, as it would a broker
that is not the leader. A partition index the tiered topic does not have goes upstream,
which answers it as Kafka does (UNKNOWN_TOPIC_OR_PARTITION).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from kio.schema.errors import ErrorCode

from proxy.apis.api61_describe_producers import (
    DescribeProducersView,
    PartitionProducers,
    merge_response,
    read_request,
    upstream_request,
)
from proxy.kafka.frames import framed
from proxy.metadata.topic_index import stream_of
from proxy.tiered.ports import ReadHandlers

Key = tuple[str, int]


@dataclass(slots=True, eq=False)
class ProducersPlan:
    view: DescribeProducersView
    upstream_frame: tuple[bytes | memoryview, ...] | None  # framed, header included
    local: asyncio.Future[dict]  # (topic, partition) -> PartitionProducers
    tiered: tuple[Key, ...] = ()
    passthrough_topics: tuple[str, ...] = ()  # not counted in flight

    def merge(self, api_version: int, upstream: memoryview | None, local: dict) -> bytes:
        return merge_response(self.view, upstream, local)

    def failed(self, error: BaseException) -> dict:
        unanswered = PartitionProducers(ErrorCode.not_leader_or_follower.value)
        return dict.fromkeys(self.tiered, unanswered)


def plan_describe_producers(
    tiering: ReadHandlers, header_bytes: memoryview, body: memoryview, api_version: int
) -> ProducersPlan | None:
    """The plan for one DescribeProducers; None when it names no tiered partition.
    FrameError if it cannot be read."""
    if not tiering.topics.any():
        return None
    view = read_request(api_version, body)
    streams: dict[Key, int] = {}
    upstream: list[Key] = []
    for topic in view.topics:
        found = tiering.topics.topic(topic.topic)
        for p in topic.partitions:
            key = (topic.topic, p.partition)
            stream = None if found is None or p.partition < 0 else stream_of(found, p.partition)
            if stream is not None and tiering.state(stream).stream(stream) is not None:
                streams[key] = stream
            else:
                upstream.append(key)
    if not streams:
        return None
    local = asyncio.ensure_future(_describe_all(tiering, streams))
    upstream_body = upstream_request(view, upstream)
    frame = None if upstream_body is None else framed(header_bytes, upstream_body)
    return ProducersPlan(view, frame, local, tuple(streams))


async def _describe_all(tiering: ReadHandlers, streams: dict[Key, int]) -> dict:
    keys = list(streams)
    answers = await asyncio.gather(*(tiering.reads.owner_producers(streams[k]) for k in keys))
    return {
        key: PartitionProducers(code, producers)
        for key, (code, producers) in zip(keys, answers, strict=True)
    }
