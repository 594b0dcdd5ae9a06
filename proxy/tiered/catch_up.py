"""The catch-up of tiered partitions' transaction markers, wherever they are owned
(docs/tiering.md, "Transactions"; the plans that ask for it are txn.py and fencing.py).

`catch_up(keys)` asks each partition's owner: this proxy's marker follower for the
partitions owned here, the owner's (a `CatchUpRequest` over the peer protocol) for the
others, all at once and within `CATCH_UP_TIMEOUT_S`; it returns the partitions whose
catch-up failed. `catch_up_producer(producer_id)` does the same for every tiered
partition where a producer has a transaction open, which no one but their owners knows:
this proxy's, and every live member's of the fleet (a `ProducerCatchUpRequest`); it
returns what failed. `catch_up_here` is the owner's side of both peer requests.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Protocol

from kio.schema.errors import ErrorCode

from proxy.apis.api24_add_partitions_to_txn import Key
from proxy.markers.follower import CatchUpFailed, MarkerFollower
from proxy.metadata.state import MetadataState
from proxy.metadata.topic_index import TopicIndex, stream_of
from proxy.partition.owner import TieredPartition
from proxy.partition.partition_set import PartitionSet
from proxy.peer.clients import PeerClients, PeerUnavailable
from proxy.peer.codec import CATCH_UP_PROTOCOL, PRODUCER_CATCH_UP_PROTOCOL
from proxy.peer.messages import CatchUpRequest, ProducerCatchUpRequest

log = logging.getLogger("tierproxy.transactions")

CATCH_UP_TIMEOUT_S = 5.0  # well inside a client's request timeout (30 s by default)
WARN_INTERVAL_S = 10.0  # a stream's failed catch-ups are logged at most this often


class _Warnings:
    """One WARNING per stream per WARN_INTERVAL_S: while an owner is away every client's
    retried AddPartitionsToTxn fails its catch-up (10+ a second), and the first line of
    each interval, with the count of those left out, says all there is to say."""

    def __init__(self, interval_s: float = WARN_INTERVAL_S) -> None:
        self._interval_s = interval_s
        self._last: dict[int, tuple[float, int]] = {}  # stream -> (last logged, left out)

    def warn(self, streams: list[int], reason: str) -> None:
        now = time.monotonic()
        due = []
        for stream in streams:
            last, left_out = self._last.get(stream, (-self._interval_s, 0))
            if now - last < self._interval_s:
                self._last[stream] = (last, left_out + 1)
            else:
                self._last[stream] = (now, 0)
                due.append((stream, left_out))
        if len(self._last) > 10_000:  # streams that failed once long ago
            self._last = {k: v for k, v in self._last.items() if now - v[0] < self._interval_s}
        if due:
            left_out = sum(n for _, n in due)
            log.warning(
                "catch-up of streams %s failed: %s%s",
                [stream for stream, _ in due],
                reason,
                f" ({left_out} more failures not logged in the last {self._interval_s:g} s)"
                if left_out
                else "",
            )


_warnings = _Warnings()


class CatchUpHost(Protocol):
    """What a catch-up needs of the tiered service."""

    @property
    def topics(self) -> TopicIndex: ...

    @property
    def partitions(self) -> PartitionSet | None: ...

    @property
    def peers(self) -> PeerClients: ...

    @property
    def markers(self) -> MarkerFollower | None: ...

    def state(self, stream: int) -> MetadataState: ...

    def owned_here(self, stream: int) -> bool: ...

    def owner_address(self, stream: int) -> tuple[str, int] | None: ...

    def peer_protocol(self, member: str) -> int: ...

    def live_peers(self) -> list[str]: ...

    def peer_address(self, member: str) -> tuple[str, int] | None: ...

    async def partition_here(self, stream: int) -> TieredPartition | None: ...


async def catch_up(
    host: CatchUpHost, keys: list[Key], timeout_s: float = CATCH_UP_TIMEOUT_S
) -> frozenset[Key]:
    """Catch these tiered partitions up at their owners; the partitions that failed."""
    by_stream: dict[int, Key] = {}
    for key in keys:
        topic = host.topics.topic(key[0])
        if topic is None:  # untiered since: Kafka's log is the partition's again
            continue
        stream = stream_of(topic, key[1])
        if host.state(stream).stream(stream) is not None:  # else not cut over yet: all
            by_stream[stream] = key  # of it is Kafka's, markers included
    local = [s for s in by_stream if host.owned_here(s)]
    remote = [s for s in by_stream if s not in local]
    calls = []
    if local:
        calls.append(_here(host, local, timeout_s))
    calls.extend(_at_owner(host, stream, timeout_s) for stream in remote)
    results = await asyncio.gather(*calls)
    failed = [stream for streams in results for stream in streams]
    return frozenset(by_stream[s] for s in failed)


async def _here(host: CatchUpHost, streams: list[int], timeout_s: float) -> list[int]:
    """The streams of `streams` (owned here) that could not be caught up."""
    try:
        async with asyncio.timeout(timeout_s):
            await _wait_for_partitions(host, streams)
            markers = host.markers
            if markers is None:
                raise CatchUpFailed("the marker follower is not running")
            await markers.catch_up(streams)
    except (CatchUpFailed, TimeoutError) as exc:
        _warnings.warn(streams, str(exc) or f"not done within {timeout_s} s")
        return streams
    return []


async def _wait_for_partitions(host: CatchUpHost, streams: list[int]) -> None:
    partitions = host.partitions
    if partitions is None:
        raise CatchUpFailed("the tiered service is not started")
    for stream in streams:
        await host.partition_here(stream)  # cut over or taken over just now: started


async def _at_owner(host: CatchUpHost, stream: int, timeout_s: float) -> list[int]:
    """[] once the owner of `stream` caught it up; [stream] if it did not."""
    owner = host.state(stream).owner
    address = host.owner_address(stream)
    if address is None:
        reason = "no live owner"
    elif host.peer_protocol(owner) < CATCH_UP_PROTOCOL:
        reason = f"its owner {owner} predates the catch-up (peer protocol)"
    else:
        try:
            code, message = await host.peers.catch_up(address, stream, int(timeout_s * 1000))
        except (PeerUnavailable, TimeoutError, OSError) as exc:
            code, message = -1, str(exc)
        if code == 0:
            return []
        reason = f"owner {owner} answered {code}: {message}"
    _warnings.warn([stream], reason)
    return [stream]


async def catch_up_producer(
    host: CatchUpHost, producer_id: int, timeout_s: float = CATCH_UP_TIMEOUT_S
) -> list[str]:
    """Catch up every tiered partition where `producer_id` has a transaction open (or a
    batch waiting for its verification), here and at every live member of the fleet;
    what failed (one line each, for the log)."""
    calls = [_producer_here(host, producer_id, timeout_s)]
    calls.extend(_producer_at(host, member, producer_id, timeout_s) for member in host.live_peers())
    return [failure for failures in await asyncio.gather(*calls) for failure in failures]


def producer_streams(host: CatchUpHost, producer_id: int) -> list[int]:
    """The streams owned here where `producer_id` has a transaction open or a batch
    waiting for its verification."""
    partitions = host.partitions
    if partitions is None:
        return []
    return [
        stream
        for stream in partitions.streams()
        if (partition := partitions.get(stream)) is not None
        and partition.has_transaction_of(producer_id)
    ]


async def _producer_here(host: CatchUpHost, producer_id: int, timeout_s: float) -> list[str]:
    streams = producer_streams(host, producer_id)
    if not streams:
        return []
    failed = await _here(host, streams, timeout_s)
    return [f"streams {failed} here"] if failed else []


async def _producer_at(
    host: CatchUpHost, member: str, producer_id: int, timeout_s: float
) -> list[str]:
    if host.peer_protocol(member) < PRODUCER_CATCH_UP_PROTOCOL:
        return []  # an older member is not asked: its partitions wait for its follow
    address = host.peer_address(member)
    if address is None:
        return []  # not live any more, or without tiering: it owns nothing
    try:
        code, message = await host.peers.catch_up_producer(
            address, producer_id, int(timeout_s * 1000)
        )
    except (PeerUnavailable, TimeoutError, OSError) as exc:
        code, message = -1, str(exc) or type(exc).__name__
    return [] if code == 0 else [f"member {member} answered {code}: {message}"]


async def catch_up_here(
    host: CatchUpHost, request: CatchUpRequest | ProducerCatchUpRequest
) -> tuple[int, str]:
    """A peer's `CatchUpRequest` for a stream owned here, or `ProducerCatchUpRequest`
    for the streams owned here where a producer has a transaction open: (error code,
    message)."""
    if isinstance(request, ProducerCatchUpRequest):
        failures = await _producer_here(host, request.producer_id, request.timeout_ms / 1000)
        if failures:
            return ErrorCode.request_timed_out.value, f"not caught up: {failures[0]}"
        return 0, ""
    stream = request.stream_id
    if not host.owned_here(stream):
        return ErrorCode.not_leader_or_follower.value, f"stream {stream} is not owned here"
    failed = await _here(host, [stream], request.timeout_ms / 1000)
    if failed:
        return ErrorCode.request_timed_out.value, f"stream {stream}: not caught up"
    return 0, ""
