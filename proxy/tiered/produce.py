"""A Produce request on a connection of a proxy that tiers some topics.

`plan_produce` reads the request (per partition, never per record) and splits it: the
passthrough partitions go upstream as a smaller request, the tiered ones to
`TieringService.produce`, started at once and in request order, so a connection's
requests reach each partition's sequencer in the order they came. The connection then
answers with `merge_responses`: upstream's answer (if any part went there) and the local
results, in the request's order.

It also counts the passthrough Produce requests in flight per topic: a topic being cut
over is reported drained only when none is left (docs/tiering.md, "Cutover").
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from kio.schema.errors import ErrorCode

from proxy.apis.api00_produce import (
    PartitionResult,
    ProduceRequestView,
    TieredPartition,
    TopicKey,
    merge_responses,
    read_produce_request,
    split,
)
from proxy.clock import now_ms
from proxy.kafka.frames import framed
from proxy.objects.ratelimit import Priority
from proxy.partition.produce_rules import ProduceRules, check_records
from proxy.partition.rules import ProduceResult
from proxy.tiered.ports import ProduceHost


@dataclass(slots=True, eq=False)
class ProducePlan:
    view: ProduceRequestView
    upstream_frame: tuple[bytes | memoryview, ...] | None  # framed, header included
    local: asyncio.Future[list[PartitionResult]] | None  # None: nothing tiered
    passthrough_topics: tuple[TopicKey, ...]  # counted in flight until answered
    tiered: tuple[tuple[TopicKey, int], ...] = ()  # (topic, partition) handled here

    def merge(self, api_version: int, upstream: memoryview | None, local: list) -> bytes:
        return merge_responses(api_version, upstream, local, request=self.view)

    def failed(self, error: BaseException) -> list[PartitionResult]:
        """Every tiered partition of the request answered KAFKA_STORAGE_ERROR (retriable)."""
        return [
            PartitionResult(t, p, ErrorCode.kafka_storage_error, error_message=repr(error))
            for t, p in self.tiered
        ]


def plan_produce(
    tiering: ProduceHost, header_bytes: memoryview, body: memoryview, api_version: int
):
    """The plan for one Produce request; FrameError if it cannot be read."""
    started = time.perf_counter()
    view = read_produce_request(api_version, body)
    if not tiering.topics.any():
        topics = tuple(topic.topic for topic in view.topics)
        return ProducePlan(view, None, None, topics)
    upstream_body, tiered = split(view, tiering.is_tiered)
    if not tiered:
        topics = tuple(topic.topic for topic in view.topics)
        return ProducePlan(view, None, None, topics)
    frame = None
    kept: tuple[TopicKey, ...] = ()
    tiered_keys = tuple((p.topic, p.partition) for p in tiered)
    if upstream_body is not None:
        frame = framed(header_bytes, upstream_body)
        kept = tuple(
            t.topic
            for t in view.topics
            if any((t.topic, p.index) not in tiered_keys for p in t.partitions)
        )
    tiering.stages.since("decode", started)  # read, split by partition, per batch header
    return ProducePlan(view, frame, _produce_local(tiering, view, tiered), kept, tiered_keys)


def _produce_local(
    tiering: ProduceHost, view: ProduceRequestView, tiered: list[TieredPartition]
) -> asyncio.Future[list[PartitionResult]]:
    """Each tiered partition's produce, started now, in request order, and gathered.

    One task per partition, created here, in the connection's own step: a task's first
    step runs in creation order, so every partition of this request is queued at its
    sequencer before any partition of the connection's next request, whatever their
    counts. The partitions do not wait for one another. One partition (a paced producer's
    usual request) is one task and no gather."""
    started = time.perf_counter()
    if len(tiered) == 1:
        return asyncio.ensure_future(_alone(tiering, view, tiered[0], started))
    calls = [asyncio.ensure_future(_one(tiering, view, part)) for part in tiered]
    gathered: asyncio.Future[list[PartitionResult]] = asyncio.gather(*calls)
    gathered.add_done_callback(lambda _: tiering.stages.since("local", started))
    return gathered


async def _alone(
    tiering: ProduceHost, view: ProduceRequestView, part: TieredPartition, started: float
) -> list[PartitionResult]:
    result = await _one(tiering, view, part)
    tiering.stages.since("local", started)  # every tiered partition of the request done
    return [result]


async def _one(
    tiering: ProduceHost, view: ProduceRequestView, part: TieredPartition
) -> PartitionResult:
    if part.records is not None and len(part.records) > tiering.max_batch_bytes:
        result = ProduceResult(
            ErrorCode.message_too_large,
            error_message=f"{len(part.records)} bytes exceed {tiering.max_batch_bytes}",
        )
    else:
        rules = await tiering.produce_rules(part.topic)  # cached: waits only the first time
        refused = _refusal(tiering, view, part, rules)
        if refused is not None:
            return refused
        if part.records is not None and tiering.bandwidth is not None:  # never waits
            await tiering.bandwidth.limiter.acquire(Priority.PRODUCE, len(part.records))
        answer = await tiering.produce(
            part.topic,
            part.partition,
            part.records,
            view.acks,
            view.timeout_ms,
            rules,
            view.transactional_id,
            view.api_version,
        )
        result = answer if answer is not None else ProduceResult(0)
    return PartitionResult(
        part.topic,
        part.partition,
        result.error_code,
        result.base_offset,
        result.log_append_time_ms,
        result.log_start_offset,
        result.error_message,
    )


def _refusal(
    tiering: ProduceHost,
    view: ProduceRequestView,
    part: TieredPartition,
    rules: ProduceRules | None,
) -> PartitionResult | None:
    """Kafka's refusal of the partition's records by the topic's configs (produce_rules.py),
    decided here, before the batch is written or handed to its owner."""
    if part.records is None:
        return None  # answered by TieringService.produce
    topic = tiering.topics.topic(part.topic)
    if topic is None:
        return None  # untiered meanwhile: answered by TieringService.produce
    if rules is None:
        message = f"the configs of topic {topic.name} could not be read from Kafka"
        return PartitionResult(
            part.topic, part.partition, ErrorCode.kafka_storage_error, error_message=message
        )
    name = f"{topic.name}-{part.partition}"
    refusal = check_records(part.records, rules, now_ms(), view.api_version, name)
    if refusal is None:
        return None
    return PartitionResult(
        part.topic,
        part.partition,
        refusal.error_code,
        error_message=refusal.error_message,
        record_errors=refusal.record_errors,
    )


def count_in_flight(in_flight: dict, topics: tuple[TopicKey, ...], delta: int) -> None:
    for topic in topics:
        left = in_flight.get(topic, 0) + delta
        if left > 0:
            in_flight[topic] = left
        else:
            in_flight.pop(topic, None)
