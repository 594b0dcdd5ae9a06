"""A Fetch request on a connection of a proxy that tiers some topics.

`plan_fetch` reads the request (per partition, never per record) and splits it: the
partitions the proxy answers (`TieredReads.fetch_here`) are read here, the rest go
upstream as a smaller request, and the connection answers with the merge, in request
order. Once any topic is tiered, no Fetch keeps a fetch session: upstream gets sessionless
full fetches and the client an answer with session id 0, so it sends full fetches too. A
session the broker kept would leave out the tiered partitions a client stops listing in
its incremental fetches.

A tiered partition read below its cutover goes to Kafka, and Kafka's answer for it is cut
at the cutover (fetch_clamp.py): what Kafka's log holds past it (a transaction marker,
records written to a broker directly) is not the partition's data, and a consumer must not
move past a tiered offset because of it. A cut of a data batch is noted
(`beyond_cutover`); markers past the cutover are expected (transactions on the tiered
partition): Kafka's LSO and aborted transactions below the cutover are kept.

A request only for tiered partitions waits here (max_wait_ms, min_bytes). A mixed one is
read here at once first: with data, upstream is asked not to wait; without, upstream
waits as the client asked, and what is appended here meanwhile goes out in the next
Fetch.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from kio.schema.errors import ErrorCode

from proxy.apis.fetch_clamp import clamp_partition_answer
from proxy.apis.fetch_merge import merge_responses
from proxy.apis.fetch_split import (
    FINAL_EPOCH,
    NO_SESSION,
    FetchRequestView,
    TieredFetchResult,
    TopicKey,
    answer_layout,
    read_fetch_request,
    split,
)
from proxy.kafka.frames import framed
from proxy.metadata.topic_index import stream_of
from proxy.tiered.beyond_cutover import BeyondCutover
from proxy.tiered.ports import ReadHandlers


@dataclass(slots=True, eq=False)
class FetchPlan:
    view: FetchRequestView
    upstream_frame: tuple[bytes | memoryview, ...] | None  # framed, header included
    local: asyncio.Future[dict]  # (topic, partition) -> TieredFetchResult
    tiered: tuple[tuple[TopicKey, int], ...] = ()
    passthrough_topics: tuple[TopicKey, ...] = ()  # fetches are not counted in flight
    # tiered partitions read from Kafka, below their cutover: key -> (topic name, cutover)
    cutovers: dict[tuple[TopicKey, int], tuple[str, int]] = field(default_factory=dict)
    beyond: BeyondCutover | None = None

    def merge(self, api_version: int, upstream: memoryview | None, local: dict) -> bytes:
        clamp = self._clamp if self.cutovers else None
        return merge_responses(api_version, self.view, upstream, local, clamp=clamp)

    def _clamp(self, key: tuple[TopicKey, int], entry: memoryview):
        """Kafka's entry for a tiered partition, cut at its cutover (None: as it came)."""
        found = self.cutovers.get(key)
        if found is None:
            return None
        name, cutover = found
        clamped = clamp_partition_answer(answer_layout(self.view.api_version), entry, cutover)
        if clamped is None:
            return None
        if self.beyond is not None and clamped.data_cut:  # markers past it are expected
            self.beyond.note("fetch", name, key[1], cutover, clamped.seen)
        return clamped.pieces

    def failed(self, error: BaseException) -> dict:
        """Every partition read here answered KAFKA_STORAGE_ERROR (retriable)."""
        return {key: TieredFetchResult(ErrorCode.kafka_storage_error) for key in self.tiered}


async def plan_fetch(
    tiering: ReadHandlers,
    header_bytes: memoryview,
    body: memoryview,
    api_version: int,
    reader: object,
) -> FetchPlan | None:
    """The plan for one Fetch; None to forward it as it came (nothing tiered, or a
    sessionless fetch of passthrough partitions only). FrameError if it cannot be read."""
    if not tiering.topics.any():
        return None
    started = time.perf_counter()
    view = read_fetch_request(api_version, body)
    if view.replica_id >= 0:
        return None  # a broker's follower fetch: not a client's
    reads = tiering.reads
    upstream_body, tiered = split(view, reads.fetch_here)
    if tiered:
        tiering.fetch_stages.since("plan", started)  # read and split, per partition
    keys = tuple((p.topic, p.partition) for p in tiered)
    cutovers = _below_cutover(tiering, view, frozenset(keys)) if upstream_body else {}
    loop = asyncio.get_running_loop()
    local: asyncio.Future[dict]
    if upstream_body is None:
        local = asyncio.ensure_future(
            reads.fetch(
                tiered,
                max_wait_ms=view.max_wait_ms,
                min_bytes=view.min_bytes,
                max_bytes=view.max_bytes,
                reader=reader,
                isolation_level=view.isolation_level,
            )
        )
        return FetchPlan(view, None, local, keys)
    sessionless = view.session_id == NO_SESSION and view.session_epoch == FINAL_EPOCH
    if not tiered and not cutovers and sessionless:
        return None
    results: dict = {}
    if tiered:
        results = await reads.fetch(
            tiered,
            max_wait_ms=0,
            min_bytes=0,
            max_bytes=view.max_bytes,
            reader=reader,
            isolation_level=view.isolation_level,
        )
        got = sum(len(piece) for r in results.values() for piece in r.records)
        if got:  # answer now: upstream must not wait
            room = max(view.max_bytes - got, 1)
            again, _ = split(view, reads.fetch_here, max_wait_ms=0, max_bytes=room)
            upstream_body = again or upstream_body
    local = loop.create_future()
    local.set_result(results)
    frame = framed(header_bytes, upstream_body)
    return FetchPlan(view, frame, local, keys, cutovers=cutovers, beyond=tiering.beyond_cutover)


def _below_cutover(tiering: ReadHandlers, view: FetchRequestView, tiered: frozenset) -> dict:
    """The partitions of tiered topics that go to Kafka (read below their cutover):
    (topic, partition) -> (topic name, cutover)."""
    found_cutovers = {}
    for topic in view.topics:
        found = tiering.topics.topic(topic.topic)
        if found is None:
            continue
        for p in topic.partitions:
            key = (topic.topic, p.partition)
            if key in tiered:
                continue
            stream = stream_of(found, p.partition)
            info = tiering.state(stream).stream(stream)
            if info is not None:
                found_cutovers[key] = (found.name, info.cutover_offset)
    return found_cutovers
