"""The marker follower: the asyncio runner of follow.py (docs/tiering.md, "Transactions").

For every tiered partition this proxy owns (its `PartitionSet`), `MarkerFollower` reads
Kafka's own log of that topic-partition from `marker_resume()` on (the stream's cutover
when the committed state names no position), one raw Fetch per leader broker for all of
them (read_uncommitted, long polling), and appends each control batch it finds to the
stream with `append_marker`, applying TXN.md's resume rule. Partitions gained and lost
are picked up at each round (at most `RECONCILE_S` late; `catch_up` looks at once).

`catch_up(streams)` is the ordering rule's half: for partitions followed here, read
Kafka's log up to the high watermark it answers now (a Fetch that does not wait, on a
connection of its own so it never queues behind a long poll) and append every marker
found, then return. The follow and a catch-up share each partition's position under a
lock, so a marker is appended once whichever reads it first.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from aiokafka import AIOKafkaClient, TopicPartition
from aiokafka.client import ConnectionGroup
from aiokafka.errors import KafkaError
from aiokafka.protocol.offset import OffsetRequest
from kio.schema.errors import ErrorCode
from prometheus_client import CollectorRegistry, Counter, Histogram

from proxy.clock import now_ms
from proxy.markers.follow import (
    Identity,
    Resume,
    Step,
    control_batches,
    group_by_leader,
    reset_position,
    step_for,
)
from proxy.markers.upstream_log import Bootstrap, LeaderFetchRequest, list_offset
from proxy.metadata.client_start import start_client
from proxy.metadata.state import MetadataState
from proxy.metadata.topic_index import TopicIndex
from proxy.partition.owner import TieredPartition
from proxy.partition.partition_set import PartitionSet
from proxy.records.batches import CorruptBatchError
from proxy.records.markers import read_marker

log = logging.getLogger("tierproxy.transactions")

MAX_WAIT_MS = 500  # the follow's long poll
RECONCILE_S = 0.5  # how often the partitions owned are compared with those followed
RETRY_S = 1.0  # after a broker or leader error, the partition waits this long
PARTITION_MAX_BYTES = 1 << 20  # markers are ~80 bytes each: a MiB is thousands of them
MAX_BYTES = 16 << 20
READ_UNCOMMITTED = 0
EARLIEST, LATEST = -2, -1
# the appends that failed because the partition is no longer here (or broken): not retried
_GONE = frozenset({ErrorCode.not_leader_or_follower.value, ErrorCode.kafka_storage_error.value})
LAG_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class CatchUpFailed(Exception):
    """A catch-up that could not read Kafka's log, or append what it found, in time."""


class FollowHost(Protocol):
    """What the follower needs of the tiered service."""

    @property
    def kafka_settings(self) -> dict: ...

    @property
    def topics(self) -> TopicIndex: ...

    @property
    def partitions(self) -> PartitionSet | None: ...

    def state(self, stream: int) -> MetadataState: ...


@dataclass(eq=False, slots=True)
class _Followed:
    stream: int
    topic: str
    partition: int
    target: TieredPartition
    position: int  # the next offset of Kafka's log to consider
    resume: Resume
    leader: int | None = None
    retry_at: float = 0.0  # time.monotonic() before which the follow does not read it
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    @property
    def key(self) -> tuple[str, int]:
        return self.topic, self.partition


class _PartitionGone(Exception):
    """The partition stopped taking appends (given up, or its WAL broke)."""


class FollowerMetrics:
    def __init__(self, registry: CollectorRegistry | None) -> None:
        self._registry = registry
        self.appended = Counter(
            "tierproxy_txn_markers_appended",
            "Transaction markers read from Kafka's log and appended to tiered streams",
            registry=registry,
        )
        self.lag = Histogram(
            "tierproxy_txn_marker_lag_seconds",
            "From a marker's timestamp (Kafka's coordinator wrote it) to its append",
            buckets=LAG_BUCKETS,
            registry=registry,
        )
        self.catch_ups = Counter(
            "tierproxy_txn_catch_ups",
            "Catch-ups of tiered partitions owned here (AddPartitionsToTxn), by result",
            ["result"],
            registry=registry,
        )

    def close(self) -> None:
        if self._registry is not None:
            for metric in (self.appended, self.lag, self.catch_ups):
                self._registry.unregister(metric)


class MarkerFollower:
    def __init__(
        self,
        host: FollowHost,
        registry: CollectorRegistry | None = None,
        *,
        max_wait_ms: int = MAX_WAIT_MS,
    ) -> None:
        self._host = host
        self._max_wait_ms = max_wait_ms
        self.metrics = FollowerMetrics(registry)
        self._followed: dict[int, _Followed] = {}
        self._client: AIOKafkaClient | None = None
        self._task: asyncio.Task[None] | None = None
        self._brokers: dict[int, asyncio.Task[None]] = {}
        self._wake = asyncio.Event()

    # -- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        """Connect to Kafka and start following; `close()` undoes any part of it."""
        settings = dict(self._host.kafka_settings)
        settings["client_id"] = f"{settings.get('client_id', 'tierproxy')},markers"
        self._client = AIOKafkaClient(**settings)
        await start_client(Bootstrap(self._client))
        self._task = asyncio.create_task(self._run(), name="marker-follower")

    async def close(self) -> None:
        await self.stop_following()
        if self._client is not None:
            await self._client.close()
        self.metrics.close()

    async def stop_following(self) -> None:
        """Stop the background follow; catch-ups still read Kafka's log (a test of the
        ordering rule: only catch-ups then put markers in the streams)."""
        tasks = [t for t in (self._task, *self._brokers.values()) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._task = None
        self._brokers.clear()

    def followed(self) -> dict[int, int]:
        """stream -> the next offset of Kafka's log the follow considers (tests, status)."""
        return {stream: f.position for stream, f in self._followed.items()}

    # -- the follow ------------------------------------------------------------------------

    async def _run(self) -> None:
        while True:
            self._reconcile()
            lost = [f for f in self._followed.values() if f.leader is None]
            # a partition that failed before: its leader moved, ask Kafka again
            await self._locate(lost, refresh=any(f.retry_at for f in lost))
            now = time.monotonic()
            ready = [f for f in self._followed.values() if f.retry_at <= now]
            groups, _ = group_by_leader(ready, lambda f: f.leader)
            for node in groups:
                task = self._brokers.get(node)
                if task is None or task.done():
                    name = f"marker-follower-{node}"
                    self._brokers[node] = asyncio.create_task(self._follow_broker(node), name=name)
            self._wake.clear()
            try:
                async with asyncio.timeout(RECONCILE_S):
                    await self._wake.wait()
            except TimeoutError:
                pass

    def _reconcile(self) -> None:
        """Follow the partitions started here since the last round; forget those given up."""
        host = self._host
        partitions = host.partitions
        streams = set(partitions.streams()) if partitions is not None else set()
        for stream, f in list(self._followed.items()):
            if (
                stream not in streams
                or partitions is None
                or partitions.get(stream) is not f.target
            ):
                del self._followed[stream]
        for stream in streams - self._followed.keys():
            assert partitions is not None
            target = partitions.get(stream)
            info = host.state(stream).stream(stream)
            topic = None if info is None else host.topics.topic(info.topic_id)
            if target is None or info is None or topic is None:
                continue
            position, expected = target.marker_resume()
            start = info.cutover_offset if position is None else position
            resume = Resume(expected)
            self._followed[stream] = _Followed(
                stream, topic.name, info.partition, target, start, resume
            )
            log.debug("following markers of %s-%d from %d", topic.name, info.partition, start)

    async def _locate(self, followed: list[_Followed], refresh: bool = False) -> None:
        """Each partition's leader from the client's metadata (asked for again if
        `refresh`, or if a topic is new to it)."""
        client = self._client
        if not followed or client is None:
            return
        try:
            topics = {f.topic for f in self._followed.values()} | {f.topic for f in followed}
            update = client.set_topics(sorted(topics))
            if refresh:
                update = client.force_metadata_update()
            async with asyncio.timeout(RETRY_S * 5):
                await update
        except (TimeoutError, KafkaError) as exc:
            log.info("marker follower: metadata not refreshed: %r", exc)
        for f in followed:
            f.leader = client.cluster.leader_for_partition(TopicPartition(f.topic, f.partition))

    async def _follow_broker(self, node: int) -> None:
        """Long-poll one broker for the followed partitions it leads, until none is left
        (the main loop starts it again when one is)."""
        while True:
            now = time.monotonic()
            group = [f for f in self._followed.values() if f.leader == node and f.retry_at <= now]
            if not group:
                return
            try:
                answers = await self._fetch(node, group, self._max_wait_ms, ConnectionGroup.DEFAULT)
            except (KafkaError, OSError, TimeoutError) as exc:
                log.info("marker follower: fetch from broker %d failed: %r", node, exc)
                self._retry_later(group)
                return
            for f in group:
                answer = answers.get(f.key)
                if answer is None or self._followed.get(f.stream) is not f:
                    continue
                try:
                    await self._handle(f, *answer)
                except _PartitionGone:
                    self._followed.pop(f.stream, None)
                except KafkaError as exc:
                    log.info("marker follower: %s-%d: %r", f.topic, f.partition, exc)
                    self._retry_later([f])

    def _retry_later(self, followed: Iterable[_Followed]) -> None:
        at = time.monotonic() + RETRY_S
        for f in followed:
            f.leader, f.retry_at = None, at
        self._wake.set()

    async def _fetch(
        self,
        node: int,
        group: list[_Followed],
        max_wait_ms: int,
        connection: Any,
        at: int | None = None,
    ) -> dict[tuple[str, int], tuple[int, int, bytes]]:
        """One raw Fetch to `node` for `group` at their positions: (topic, partition) ->
        (error code, high watermark, records). Answered by the leader only (a follower
        answers NOT_LEADER_OR_FOLLOWER: `LeaderFetchRequest`), so the high watermark is
        the leader's and a catch-up up to it sees every marker written before it asked.
        `at`: read there instead of at the position (one partition's scan: `_surviving`)."""
        client = self._client
        assert client is not None
        by_topic: dict[str, list[tuple[int, int, int]]] = {}
        for f in group:
            position = f.position if at is None else at
            by_topic.setdefault(f.topic, []).append((f.partition, position, PARTITION_MAX_BYTES))
        request = LeaderFetchRequest(
            max_wait_ms, 1, MAX_BYTES, READ_UNCOMMITTED, list(by_topic.items())
        )
        response = await client.send(node, request, group=connection)
        answers = {}
        for topic, partitions in response.topics:
            for partition, error_code, high_watermark, *rest in partitions:
                answers[(topic, partition)] = (error_code, high_watermark, rest[-1] or b"")
        return answers

    async def _handle(
        self, f: _Followed, error_code: int, high_watermark: int, records: bytes
    ) -> Step:
        """Act on one partition's part of a Fetch answer; what it meant."""
        step = step_for(error_code)
        if step is Step.READ:
            await self._apply(f, records)
        elif step is Step.RESET:
            await self._reset(f)
        else:
            if step is Step.WAIT:
                log.warning(
                    "marker follower: %s-%d: fetch error %d", f.topic, f.partition, error_code
                )
            self._retry_later([f])
        return step

    async def _apply(self, f: _Followed, records: bytes) -> None:
        """Append the new markers among `records` and move the position past them."""
        async with f.lock:
            try:
                found, end = control_batches(records, f.position)
            except CorruptBatchError as exc:
                log.error("marker follower: %s-%d: %s", f.topic, f.partition, exc)
                raise KafkaError(f"corrupt batches from Kafka: {exc}") from None
            for header, batch in found:
                try:
                    marker = read_marker(batch)
                except ValueError as exc:
                    log.error(
                        "marker follower: %s-%d: control batch at %d skipped: %s",
                        f.topic, f.partition, header.base_offset, exc,
                    )  # fmt: skip
                    f.position = header.next_offset
                    continue
                if f.resume.is_new(marker.identity):
                    result = await f.target.append_marker(marker)
                    if result.error_code in _GONE:
                        raise _PartitionGone(result.error_message)
                    if result.error_code == 0:
                        self.metrics.appended.inc()
                        self.metrics.lag.observe(max(now_ms() - marker.timestamp, 0) / 1000)
                f.position = header.next_offset
            f.position = max(f.position, end)

    async def _reset(self, f: _Followed) -> None:
        """OFFSET_OUT_OF_RANGE: move to Kafka's log (follow.reset_position)."""
        async with f.lock:
            leader = f.leader  # one broker throughout: a catch-up may forget it meanwhile
            if leader is None:
                raise KafkaError(f"{f.topic}-{f.partition}: its leader is not known")
            log_start = await self._list_offset(f, leader, EARLIEST)
            log_end = await self._list_offset(f, leader, LATEST)
            position = reset_position(f.position, log_start, log_end)
            log.warning(
                "marker follower: %s-%d: offset %d is out of Kafka's log [%d, %d): reading from"
                " %d (markers between not in the stream yet are lost to it)",
                f.topic, f.partition, f.position, log_start, log_end, position,
            )  # fmt: skip
            if f.resume.expected and position != f.position:
                # a log cut below the position holds none of them (they lie past it)
                surviving = None
                if position > f.position:
                    surviving = await self._surviving(f, leader, position, log_end)
                dropped = f.resume.resync(surviving)
                if dropped:
                    log.warning(
                        "marker follower: %s-%d: %d markers the stream holds are no longer in"
                        " Kafka's log: not waited for",
                        f.topic, f.partition, dropped,
                    )  # fmt: skip
            f.position = position

    async def _surviving(self, f: _Followed, leader: int, start: int, end: int) -> Identity | None:
        """The first marker of Kafka's log in [start, end) that the resume rule expects
        (`Resume.resync`), None if there is none: read there without moving the position
        (the follow then reads it all again, in order). `end` is the log end ListOffsets
        answered, not a Fetch's high watermark, which a leader just elected may answer
        short (its markers above it would be missed, and appended a second time): a
        read that cannot reach `end` is a KafkaError, the reset tried again later."""
        wanted = set(f.resume.expected)
        at = start
        while at < end:
            answers = await self._fetch(leader, [f], 0, ConnectionGroup.COORDINATION, at=at)
            error_code, high_watermark, records = answers.get(f.key, (-1, -1, b""))
            if error_code != 0:
                raise KafkaError(f"reading Kafka's log from {at}: error {error_code}")
            try:
                found, after = control_batches(records, at)
            except CorruptBatchError as exc:
                raise KafkaError(f"corrupt batches from Kafka: {exc}") from None
            for _, batch in found:
                try:
                    identity = read_marker(batch).identity
                except ValueError:
                    continue  # passed over by the follow too
                if identity in wanted:
                    return identity
            if after <= at:
                raise KafkaError(
                    f"reading Kafka's log from {at}: nothing below {end} (high watermark "
                    f"{high_watermark})"
                )
            at = after
        return None

    async def _list_offset(self, f: _Followed, leader: int, timestamp: int) -> int:
        assert self._client is not None
        return await list_offset(self._client, leader, f.topic, f.partition, timestamp)

    # -- catch-up --------------------------------------------------------------------------

    def follows(self, stream: int) -> bool:
        """Whether the stream's partition is followed here (started here)."""
        self._reconcile()
        return stream in self._followed

    async def catch_up(self, streams: Iterable[int]) -> None:
        """Read Kafka's log of these streams' partitions up to the high watermark it
        answers now and append every marker found. CatchUpFailed if a stream is not
        followed here or Kafka could not be read; the caller bounds the time."""
        self._reconcile()
        pending: dict[int, _Followed] = {}
        for stream in streams:
            f = self._followed.get(stream)
            if f is None:
                raise CatchUpFailed(f"stream {stream} is not owned here")
            pending[stream] = f
        targets: dict[int, int] = {}
        try:
            await self._catch_up(pending, targets)
        except (KafkaError, OSError, _PartitionGone) as exc:
            self.metrics.catch_ups.labels("failed").inc()
            raise CatchUpFailed(f"{type(exc).__name__}: {exc}") from None
        except BaseException:
            self.metrics.catch_ups.labels("failed").inc()
            raise
        self.metrics.catch_ups.labels("done").inc()

    async def _catch_up(self, pending: dict[int, _Followed], targets: dict[int, int]) -> None:
        while pending:
            await self._locate([f for f in pending.values() if f.leader is None])
            groups, unknown = group_by_leader(pending.values(), lambda f: f.leader)
            if unknown and not groups:
                await asyncio.sleep(RETRY_S / 10)  # the leader is being elected
                await self._locate(unknown, refresh=True)
                continue
            for node, group in groups.items():
                # the target and the read in one round trip (pipelined on one connection)
                latest, answers = await asyncio.gather(
                    self._latest(node, [f for f in group if f.stream not in targets]),
                    self._fetch(node, group, 0, ConnectionGroup.COORDINATION),
                )
                for f in group:
                    answer = answers.get(f.key)
                    if answer is None:
                        continue
                    step = await self._handle(f, *answer)
                    if step is Step.READ and f.stream not in targets:
                        error_code, offset = latest.get(f.key, (-1, -1))
                        if error_code == 0:
                            targets[f.stream] = offset
                        else:
                            step = step_for(error_code)
                    if step is Step.READ:
                        if f.stream in targets and f.position >= targets[f.stream]:
                            del pending[f.stream]
                    elif step is not Step.RESET:
                        await asyncio.sleep(RETRY_S / 10)
                        await self._locate([f], refresh=True)

    async def _latest(self, node: int, group: list[_Followed]) -> dict[tuple[str, int], tuple]:
        """Kafka's high watermark of each partition of `group` as its leader `node` answers
        ListOffsets LATEST (read_uncommitted) now: (topic, partition) -> (error code,
        offset). The catch-up's target, rather than a Fetch's high watermark: a leader just
        elected may still hold a high watermark below its predecessor's (it learns the
        real one from its followers' next fetches), below markers the coordinator had
        written and been answered for; ListOffsets answers it OFFSET_NOT_AVAILABLE until
        the high watermark reaches the start of its leader epoch (KIP-207), a Fetch
        answers the lower high watermark."""
        if not group:
            return {}
        client = self._client
        assert client is not None
        by_topic: dict[str, list[tuple[int, int]]] = {}
        for f in group:
            by_topic.setdefault(f.topic, []).append((f.partition, LATEST))
        request = OffsetRequest(-1, READ_UNCOMMITTED, list(by_topic.items()))
        response = await client.send(node, request, group=ConnectionGroup.COORDINATION)
        return {
            (topic, partition): (error_code, offset)
            for topic, partitions in response.topics
            for partition, error_code, _timestamp, offset, *_ in partitions
        }
