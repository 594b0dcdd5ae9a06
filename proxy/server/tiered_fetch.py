"""A Fetch request on a connection of a proxy that tiers some topics.

`plan_fetch` reads the request (per partition, never per record) and splits it: the
partitions the proxy answers (`TieredReads.fetch_here`) are read here, the rest go
upstream as a smaller request, and the connection answers with the merge, in request
order. Once any topic is tiered, no Fetch keeps a fetch session: upstream gets sessionless
full fetches and the client an answer with session id 0, so it sends full fetches too. A
session the broker kept would leave out the tiered partitions a client stops listing in
its incremental fetches.

A request only for tiered partitions waits here (max_wait_ms, min_bytes). A mixed one is
read here at once first: with data, upstream is asked not to wait; without, upstream
waits as the client asked, and what is appended here meanwhile goes out in the next
Fetch.
"""

from __future__ import annotations

import asyncio
import struct
from dataclasses import dataclass

from proxy.apis.fetch_split import (
    FINAL_EPOCH,
    NO_SESSION,
    FetchRequestView,
    TieredFetchResult,
    TopicKey,
    merge_responses,
    read_fetch_request,
    split,
)

KAFKA_STORAGE_ERROR = 56
_SIZE = struct.Struct(">i")


@dataclass(slots=True, eq=False)
class FetchPlan:
    view: FetchRequestView
    upstream_frame: tuple[bytes | memoryview, ...] | None  # framed, header included
    local: asyncio.Future[dict]  # (topic, partition) -> TieredFetchResult
    tiered: tuple[tuple[TopicKey, int], ...] = ()
    passthrough_topics: tuple[TopicKey, ...] = ()  # fetches are not counted in flight

    def merge(self, api_version: int, upstream: memoryview | None, local: dict) -> bytes:
        return merge_responses(api_version, self.view, upstream, local)

    def failed(self, error: BaseException) -> dict:
        """Every partition read here answered KAFKA_STORAGE_ERROR (retriable)."""
        return {key: TieredFetchResult(KAFKA_STORAGE_ERROR) for key in self.tiered}


async def plan_fetch(
    tiering, header_bytes: memoryview, body: memoryview, api_version: int, reader: object
) -> FetchPlan | None:
    """The plan for one Fetch; None to forward it as it came (nothing tiered, or a
    sessionless fetch of passthrough partitions only). FrameError if it cannot be read."""
    if not tiering.topics.any():
        return None
    view = read_fetch_request(api_version, body)
    if view.replica_id >= 0:
        return None  # a broker's follower fetch: not a client's
    reads = tiering.reads
    upstream_body, tiered = split(view, reads.fetch_here)
    keys = tuple((p.topic, p.partition) for p in tiered)
    loop = asyncio.get_running_loop()
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
    if not tiered and view.session_id == NO_SESSION and view.session_epoch == FINAL_EPOCH:
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
    frame = (_SIZE.pack(len(header_bytes) + len(upstream_body)), header_bytes, upstream_body)
    return FetchPlan(view, frame, local, keys)
