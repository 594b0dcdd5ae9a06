"""Cutover: a topic moves from passthrough to tiered, partition by partition
(docs/tiering.md, "Cutover").

1. `tierproxy topics tier T` reaches any proxy's admin API; the owner of T's topic shard
   writes `TopicModeSet(TIERED)`.
2. Every proxy reads it. From then on it forwards no new Produce for T to Kafka: those
   partitions wait in `TieringService.produce` for their cutover. Once its passthrough
   Produce requests for T in flight are answered, its heartbeat lists T as drained.
3. The owner of each stream's shard (this loop), once every live proxy reports T drained,
   reads the partition's upstream log end until it is stable (the high watermark reaches
   the log end once nothing is in flight), writes `StreamCutover` at that offset with
   Kafka's last stable offset (below it when a transaction is open: the transaction is
   carried across, partition/carried.py), and starts the stream's partition there:
   offsets continue with no gap and no duplicate.

`untier` is refused while a partition holds offsets past its cutover: committed ones from
the metadata, and those only in an owner's WAL too (upkeep/seals.py closes every partition
of the topic where it is owned first, and starts them again if it refuses).

A tiered topic deleted in Kafka (docs/tiering.md, "Deleting a tiered topic"): the owner
of its topic shard writes `TopicModeSet(DELETED)` once Kafka no longer knows its topic id
under its name: at once when a DeleteTopics Kafka answered with success came through a
proxy of the fleet (`topic_deleted`, forwarded to that owner), else when a check every
`TOPICS_CHECK_S` finds the name gone twice in a row or given to another topic id. Then
each stream's owner drops the stream whatever it holds (its WAL entries too), as Kafka
drops a deleted topic's log, with a `StreamUntier` that says so; the garbage collector
deletes its objects. The name is free: a topic created again under it is passthrough.

The same look at Kafka every `TOPICS_CHECK_S` (one Metadata request for every tiered
topic) finds partitions added to a tiered topic (CreatePartitions): the count this loop
keeps grows, and the new partitions are cut over like the first ones (docs/tiering.md,
"Partitions added to a tiered topic").
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from dataclasses import dataclass, replace
from typing import Protocol

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import KafkaError
from kio.schema.errors import ErrorCode

from proxy.apis.api03_metadata import TopicsAnswer
from proxy.clock import now_ms
from proxy.metadata.client_start import start_client
from proxy.metadata.records import StreamCutover, StreamUntier, TopicMode, TopicModeSet
from proxy.metadata.state import topic_untier_refusal
from proxy.metadata.store import ShardFenced, ShardOwner
from proxy.metadata.streams import shard_of, topic_shard
from proxy.metadata.topic_index import TieredTopic, cutover_ready, stream_of
from proxy.partition.rules import RecoveryError
from proxy.peer.clients import PeerUnavailable
from proxy.peer.codec import TOPIC_OPS_PROTOCOL
from proxy.peer.messages import ADMIN_OPS
from proxy.routing.fleet import FleetView
from proxy.upkeep.ports import SealHost, owner_or_peer
from proxy.upkeep.seals import Sealed, Seals
from proxy.upkeep.topic_checks import check_topics

log = logging.getLogger("tierproxy.cutover")

STABLE_READS = 2  # equal log-end reads in a row before cutting over
READ_INTERVAL_S = 0.1
IDLE_POLL_S = 0.5  # between rounds when nothing waits (a metadata record wakes it sooner)
WAITING_POLL_S = 0.1  # between rounds while a cutover waits for drained reports
FAILED_TOPIC_S = 5.0  # a topic whose cutover failed is tried again after this
RESTART_FAILED_S = 5.0  # streams whose start failed are rebuilt again after this,
RESTART_FAILED_MAX_S = 80.0  # doubled after each failed retry up to this (a WAL read each)
TOPICS_CHECK_S = 5.0  # between two looks at Kafka's tiered topics (partitions, deletion)
GONE_WAIT_S = 5.0  # how long a DeleteTopics' check waits for Kafka's brokers to agree
NUDGE_S = 1.0  # a produce to a partition not known here asks for a look at most this often


@dataclass(frozen=True, slots=True)
class Cut:
    """One partition's cutover: where Kafka's log starts and ends (the cutover), and its
    last stable offset (below the end while a transaction is open: carried across)."""

    partition: int
    stream: int
    log_start: int
    end: int
    last_stable: int


class CutoverHost(SealHost, Protocol):
    """The cutover loop (cutover.py): reads Kafka, writes cutovers for the shards owned
    here, asks the other proxies what they drained."""

    @property
    def kafka_settings(self) -> dict:
        """aiokafka's connection settings for the upstream cluster."""
        ...

    @property
    def fleet(self) -> FleetView: ...

    @property
    def seals(self) -> Seals: ...

    def drained(self) -> frozenset[str]: ...

    async def changed(self, timeout_s: float) -> None: ...

    async def start_streams(self, shard: int, streams: list[int]) -> None: ...

    async def describe_topics(self, names: list[str]) -> TopicsAnswer:
        """What Kafka says of the topics (`TopicsAnswer`), and which cluster said it."""
        ...

    def peer_protocol(self, member: str) -> int:
        """The peer protocol level of `member` (its last heartbeat's)."""
        ...


class CutoverLoop:
    def __init__(self, service: CutoverHost) -> None:
        self.service = service
        self._consumer: AIOKafkaConsumer | None = None
        self._committed: AIOKafkaConsumer | None = None  # ListOffsets read_committed: LSO
        # topic id -> partition count (by id: a topic created again under a name is
        # another topic, with its own count)
        self._partitions: dict[uuid.UUID, int] = {}
        self._next_topics_check = 0.0  # time.monotonic()
        self._unknown: frozenset[uuid.UUID] = frozenset()  # topics unknown to Kafka last check
        self._foreign: frozenset[uuid.UUID] = frozenset()  # tiered in another Kafka cluster
        self.looks = 0  # looks at Kafka's tiered topics judged so far (none: judged too)
        self._nudged: dict[uuid.UUID, float] = {}  # topic id -> no nudge before (monotonic)
        self._failed: dict[uuid.UUID, float] = {}  # topic id -> no cutover before (monotonic)
        self._next_restart = 0.0  # no restart of failed streams before (monotonic)
        self._restart_after = RESTART_FAILED_S

    async def run(self) -> None:
        service = self.service
        kafka = service.kafka_settings
        self._consumer = AIOKafkaConsumer(**kafka, group_id=None, enable_auto_commit=False)
        self._committed = AIOKafkaConsumer(
            **kafka,
            group_id=None,
            enable_auto_commit=False,
            isolation_level="read_committed",
        )
        try:  # a cancel during a start still stops both (the proxy stopping early)
            await start_client(self._consumer)
            await start_client(self._committed)
            while True:
                waiting = False
                # each step on its own: one that fails (Kafka away, a topic deleted in
                # Kafka under a pending cutover) does not hold the others up
                for step in (
                    self._check_topics,
                    self._cut_over_ready_streams,
                    self._untier_streams,
                    self._restart_failed_streams,
                    service.seals.expire,
                ):
                    try:
                        waiting = await step() is True or waiting
                    except (KafkaError, ShardFenced, OSError) as exc:
                        log.warning("cutover: %s: %r; trying again", step.__name__, exc)
                        await asyncio.sleep(1.0)
                    except Exception:  # a bug: said, and the loop goes on (it alone cuts
                        # over, untiers and finds deletions; ended, none happens again)
                        log.exception("cutover: %s failed; trying again", step.__name__)
                        await asyncio.sleep(1.0)
                await asyncio.sleep(0.05)  # at most 20 rounds a second, however busy
                # a drained report comes in a heartbeat, which wakes nothing here: while
                # produce waits for a cutover, look again soon
                await service.changed(WAITING_POLL_S if waiting else IDLE_POLL_S)
        finally:
            try:
                await self._consumer.stop()
            finally:
                await self._committed.stop()

    def _reports(self) -> list[frozenset[str]]:
        """Every live proxy's drained topics: this one's now, the others' last heartbeat."""
        fleet = self.service.fleet
        reports = [self.service.drained()]
        for member in fleet.live():
            if member.name == self.service.name:
                continue
            heartbeat = fleet.heartbeat(member.name)
            reports.append(heartbeat.drained if heartbeat is not None else frozenset())
        return reports

    async def _cut_over_ready_streams(self) -> bool:
        """Cut over the streams of this proxy's shards whose topic every live proxy reports
        drained; whether some still wait for those reports."""
        service = self.service
        waiting_for_reports = False
        now = time.monotonic()
        for topic in service.topics.topics():
            if now < self._failed.get(topic.topic_id, 0.0):
                continue
            try:
                waiting_for_reports = await self._cut_over_topic(topic) or waiting_for_reports
            except (KafkaError, ShardFenced, OSError) as exc:
                # the others go on: one topic's failing reads (a partition with no
                # leader, the topic deleted in Kafka) can each take the request timeout
                self._failed[topic.topic_id] = time.monotonic() + FAILED_TOPIC_S
                log.warning("cutover of %s: %r; trying again in %.0f s",
                            topic.name, exc, FAILED_TOPIC_S)  # fmt: skip
        return waiting_for_reports

    async def _cut_over_topic(self, topic: TieredTopic) -> bool:
        """Cut over the topic's streams of this proxy's shards if every live proxy reports
        it drained; whether some wait for those reports."""
        service = self.service
        partitions = await self._partition_count(topic.name, topic.topic_id)
        waiting = [
            (p, stream_of(topic, p))
            for p in range(partitions)
            if service.state(stream_of(topic, p)).stream(stream_of(topic, p)) is None
        ]
        mine = [  # a sealed stream is being untiered: never cut over then
            (p, s)
            for p, s in waiting
            if service.shard_owner(shard_of(s, service.config.shard_count)) is not None
            and s not in service.seals
        ]
        if not mine:
            return False
        if not cutover_ready(topic, self._reports()):
            return True
        ends, stable = await self._stable_ends(topic.name, [p for p, _ in mine])
        assert self._consumer is not None  # run() made it
        starts = await self._consumer.beginning_offsets(
            [TopicPartition(topic.name, p) for p, _ in mine]
        )
        by_shard: dict[int, list[Cut]] = {}
        for partition, stream in mine:
            tp = TopicPartition(topic.name, partition)
            shard = shard_of(stream, service.config.shard_count)
            cut = Cut(partition, stream, starts[tp], ends[tp], min(stable[tp], ends[tp]))
            by_shard.setdefault(shard, []).append(cut)
        for shard, cuts in sorted(by_shard.items()):
            await self._cut_over(topic, shard, cuts)
        return False

    async def _cut_over(self, topic: TieredTopic, shard: int, cuts: list[Cut]) -> None:
        """Write the StreamCutover of every partition of one shard in one transaction:
        produce to them waits until then, so one write instead of one per partition keeps
        the hold short."""
        service = self.service
        owner = service.shard_owner(shard)
        cuts = [cut for cut in cuts if cut.stream not in service.seals]  # sealed meanwhile
        if owner is None or not cuts:
            return
        state = owner.state
        now = now_ms()
        records = [
            StreamCutover(
                state.generation,
                cut.stream,
                state.next_incarnation(cut.stream),
                owner.epoch,
                topic.topic_id,
                cut.partition,
                min(cut.log_start, cut.end),
                cut.end,
                cut.end,
                now,
                cut.last_stable,
            )
            for cut in cuts
        ]
        verdicts = await owner.write(records)
        started: list[int] = []
        for cut, verdict in zip(cuts, verdicts, strict=True):
            name, partition = topic.name, cut.partition
            if not verdict.accepted:
                log.warning("cutover of %s-%d refused: %s", name, partition, verdict.reason)
                continue
            carried = ""
            if cut.last_stable < cut.end:
                carried = f"; transactions open since offset {cut.last_stable} carried across"
            log.info("%s-%d is tiered from offset %d (stream %d)%s", name, partition, cut.end,
                     cut.stream, carried)  # fmt: skip
            started.append(cut.stream)
        await service.start_streams(shard, started)  # one rebuild: each reads Kafka's tail

    async def _restart_failed_streams(self) -> None:
        """Streams of this proxy's shards whose start failed (the rebuild after their
        cutover, or an un-seal: Kafka's tail unreadable for a transaction open at the
        cutover, a WAL read error) are rebuilt again, RESTART_FAILED_S after, twice as
        long after each retry that fails (up to RESTART_FAILED_MAX_S: each reads the WAL):
        nothing else starts them before their shard changes hands. Meanwhile requests for
        them are answered NOT_LEADER_OR_FOLLOWER at once (`PartitionSet.not_rebuilt`)."""
        service = self.service
        partitions = service.partitions
        now = time.monotonic()
        if partitions is None or not partitions.not_rebuilt:
            self._restart_after, self._next_restart = RESTART_FAILED_S, 0.0
            return
        if not self._next_restart:  # a failed start seen first: tried RESTART_FAILED_S on
            self._next_restart = now + self._restart_after
        if now < self._next_restart:
            return
        jobs = []
        for shard, owner in service.owned_shards().items():
            streams = [
                s
                for s in owner.state.stream_ids()
                if s in partitions.not_rebuilt and s not in service.seals
            ]
            if streams:
                log.info("metadata shard %d: streams %s whose start failed: starting again",
                         shard, streams)  # fmt: skip
                jobs.append((shard, service.start_streams(shard, streams)))
        # the shards at once: one read of Kafka's tail does not hold the others up
        results = await asyncio.gather(*(job for _, job in jobs), return_exceptions=True)
        failed = False
        for (shard, _), result in zip(jobs, results, strict=True):
            if isinstance(result, RecoveryError | KafkaError | OSError | TimeoutError):
                log.warning("metadata shard %d: streams not started again: %r", shard, result)
            elif isinstance(result, BaseException):  # a bug: said with its traceback
                log.error("metadata shard %d: streams not started again", shard, exc_info=result)
            failed = failed or isinstance(result, BaseException)
        if failed:
            self._restart_after = min(self._restart_after * 2, RESTART_FAILED_MAX_S)
        self._next_restart = time.monotonic() + self._restart_after

    async def _untier_streams(self) -> None:
        """Streams of this proxy's shards whose topic went back to passthrough: stop them
        and write StreamUntier, if they hold nothing past the cutover (the rules refuse it
        otherwise, and the stream stays tiered). Those whose topic Kafka deleted: stop
        them and drop them whatever they hold, their WAL entries with them."""
        service = self.service
        partitions = service.partitions
        assert partitions is not None  # the service is started
        for owner in service.owned_shards().values():
            state = owner.state
            for stream in state.stream_ids():
                info = state.stream(stream)
                if info is None or service.topics.topic(info.topic_id) is not None:
                    continue
                deleted = self._deleted_ms(info.topic_id)
                partition = partitions.get(stream)
                if (
                    deleted is None
                    and partition is not None
                    and partition.log_end_offset > info.cutover_offset
                ):
                    log.error("stream %d holds offsets past its cutover: it stays tiered", stream)
                    continue
                await partitions.remove(stream)
                if deleted is not None:
                    partitions.disown([stream])  # its WAL entries: never uploaded now
                now = now_ms()
                untier = StreamUntier(
                    state.generation, stream, info.incarnation, owner.epoch, now, deleted
                )
                [verdict] = await owner.write([untier])
                service.seals.untiered(stream)
                what = "untiered" if deleted is None else "dropped (its topic was deleted)"
                log.info("stream %d %s: %s", stream, what, verdict.outcome.value)

    def _deleted_ms(self, topic_id: uuid.UUID) -> int | None:
        """When the topic's mode became DELETED; None if it is not."""
        readers = self.service.readers
        mode = readers[topic_shard(topic_id, len(readers))].state.topic(topic_id)
        return mode.since_ms if mode is not None and mode.mode is TopicMode.DELETED else None

    # -- tiered topics deleted in Kafka ----------------------------------------------------

    async def _check_topics(self) -> None:
        """Every TOPICS_CHECK_S, what Kafka says of the tiered topics now, by one Metadata
        request for all, judged by `check_topics` (topic_checks.py): partitions added
        (CreatePartitions, through the fleet or not) grow the count, so the new
        partitions of this proxy's shards are cut over like the first ones (empty;
        produce to them waits for that, `cutover_hold_ms`); a deleted topic of a topic
        shard owned here is marked DELETED, and one tiered before its mode record named
        its Kafka cluster gets the cluster that answered its id."""
        now = time.monotonic()
        if now < self._next_topics_check:
            return
        self._next_topics_check = now + TOPICS_CHECK_S
        service = self.service
        tiered = service.topics.topics()
        if not tiered:
            self.looks += 1
            return
        answer = await service.describe_topics([t.name for t in tiered])
        check = check_topics(tiered, answer, self._partitions, self._unknown)
        self._unknown = check.unknown
        self.looks += 1
        for topic_id, count in check.grown.items():
            log.info("topic id %s has %d partitions, not %d", topic_id, count,
                     self._partitions[topic_id])  # fmt: skip
            self._partitions[topic_id] = count
        # Said once for the fleet, by the owner of metadata shard 0 (every proxy looks):
        # a proxy that does not own it now notes nothing, so it says it if it takes it.
        speaks = service.shard_owner(0) is not None
        foreign = frozenset(t.topic_id for t in check.foreign)
        if speaks and foreign - self._foreign:
            log.error(
                "Kafka cluster %s answers for tiered topics of another cluster (%s): "
                "is the fleet pointed at a copy of its cluster? Their deletion is not "
                "judged from this cluster's answers",
                answer.cluster_id,
                ", ".join(f"{t.name} of {t.kafka_cluster}" for t in check.foreign),
            )
        if speaks:
            self._foreign = foreign
        if speaks and check.held:
            log.error(
                "Kafka has lost %d tiered topics at once (%s): %d are marked deleted per "
                "look at Kafka; stop the fleet now if Kafka is broken rather than its "
                "topics deleted",
                len(check.deleted) + len(check.held),
                ", ".join(t.name for t in check.deleted + check.held),
                len(check.deleted),
            )
        for topic in check.stamp + check.deleted:
            owner = service.shard_owner(topic_shard(topic.topic_id, service.config.shard_count))
            if owner is None:
                continue
            if topic in check.deleted:
                await self._mark_deleted(owner, topic.name, topic.topic_id)
            else:  # its cluster recorded, if the topic is still as the look saw it
                mode = owner.state.topic(topic.topic_id)
                seen = TopicModeSet(topic.topic_id, topic.name, TopicMode.TIERED, topic.since_ms)
                cluster = self._recorded_cluster(answer.cluster_id)
                if mode == seen and cluster is not None:  # not untiered meanwhile
                    await owner.write([replace(mode, kafka_cluster=cluster)])

    async def _mark_deleted(self, owner: ShardOwner, topic: str, topic_id: uuid.UUID) -> str:
        mode = owner.state.topic(topic_id)
        cluster = self._recorded_cluster(mode.kafka_cluster if mode is not None else None)
        record = TopicModeSet(topic_id, topic, TopicMode.DELETED, now_ms(), cluster)
        [verdict] = await owner.write([record])
        log.warning(
            "tiered topic %s (topic id %s) was deleted in Kafka: its partitions are dropped "
            "from the fleet (%s)",
            topic,
            topic_id,
            verdict.outcome.value,
        )
        return f"{topic} is deleted"

    async def _deleted_here(
        self, owner: ShardOwner, topic: str, topic_id: uuid.UUID
    ) -> tuple[int, str]:
        """At the owner of the topic's shard, after a DeleteTopics Kafka answered with
        success: DELETED once Kafka's brokers no longer answer that id for the name
        (they apply the deletion each in its own time: waited for up to GONE_WAIT_S),
        asked of the cluster the topic was tiered in."""
        mode = owner.state.topic(topic_id)
        if mode is None or mode.mode is not TopicMode.TIERED:
            return 0, f"{topic} (topic id {topic_id}) is not tiered"
        deadline = time.monotonic() + GONE_WAIT_S
        while True:
            try:
                answer = await self.service.describe_topics([topic])
                found = answer.topic_id(topic)
            except (LookupError, OSError) as exc:
                return ErrorCode.unknown_server_error, f"Kafka's topic {topic}: {exc}"
            if mode.kafka_cluster not in (None, answer.cluster_id):
                return ErrorCode.invalid_request, (
                    f"{topic} was tiered in Kafka cluster {mode.kafka_cluster}; "
                    f"cluster {answer.cluster_id} answers: not marked deleted"
                )
            if found != topic_id:
                return 0, await self._mark_deleted(owner, topic, topic_id)
            if time.monotonic() > deadline:
                return ErrorCode.invalid_request, f"Kafka still has {topic} as topic id {topic_id}"
            await asyncio.sleep(READ_INTERVAL_S)

    def _recorded_cluster(self, cluster: str | None) -> str | None:
        """`cluster` as a topic's mode record may name it: None while a live member runs a
        release before TopicModeSet version 2 (peer protocol 10), which would refuse the
        record and keep the topic as it was (a topic tiered then would never be cut over
        there); such a record is stamped with its cluster once every member reads it."""
        service = self.service
        fleet = service.fleet
        members = [m.name for m in fleet.live() if m.name != service.name]
        if any(service.peer_protocol(m) < TOPIC_OPS_PROTOCOL for m in members):
            return None
        return cluster

    def known_partitions(self, topic_id: uuid.UUID) -> int | None:
        """The topic's partition count as this loop last read it from Kafka (None: not
        read yet). With `looks`, what a produce to a partition not cut over is told."""
        return self._partitions.get(topic_id)

    def look_soon(self) -> None:
        """The next round looks at Kafka's tiered topics (within IDLE_POLL_S)."""
        self._next_topics_check = 0.0

    async def nudge(self, topic: TieredTopic, partition: int) -> None:
        """A produce waits for the cutover of a partition past the tiered topic's count
        known here (added by a CreatePartitions): this loop and the owner of the
        partition's shard, the one that cuts it over, look at Kafka now rather than at
        their next look, at most once a second per topic. Not for a partition this
        loop knows of: a tier under load would send a `look` for every held produce on
        the peer connections that carry the hand-off's appends. Failures are logged:
        the looks find it anyway."""
        known = self._partitions.get(topic.topic_id)
        now = time.monotonic()
        if known is None or partition < known or now < self._nudged.get(topic.topic_id, 0.0):
            return
        self._nudged[topic.topic_id] = now + NUDGE_S
        self.look_soon()
        service = self.service
        shard = shard_of(stream_of(topic, partition), service.config.shard_count)
        owner = owner_or_peer(service, shard)
        if not isinstance(owner, tuple):  # owned here (looking soon), or by nobody now
            return
        member = service.readers[shard].state.owner
        if service.peer_protocol(member) < TOPIC_OPS_PROTOCOL:
            message = f"{member} runs a release without the admin op look"
        else:
            try:
                code, message = await service.peers.admin(owner, "look", topic.name, topic.topic_id)
            except (PeerUnavailable, TimeoutError, OSError) as exc:
                code, message = -1, repr(exc)
            if code == 0:
                return
        log.info("%s-%d: the look at Kafka of %s, owner of metadata shard %d, not asked "
                 "for: %s", topic.name, partition, member, shard, message)  # fmt: skip

    async def topic_deleted(self, topic: str, topic_id: uuid.UUID) -> tuple[int, str]:
        """A DeleteTopics of tiered `topic` Kafka answered with success, through this
        proxy: marked DELETED by the owner of its topic shard, here or asked over the
        peer protocol, then read back here (within GONE_WAIT_S), so that the client's
        next request to this proxy finds the name free. (error code, message)."""
        code, message = await self._at_owner("deleted", topic, topic_id, forwarded=False)
        if code == 0:
            readers = self.service.readers
            reader = readers[topic_shard(topic_id, len(readers))]
            try:
                async with asyncio.timeout(GONE_WAIT_S):
                    await reader.read_to_end()
            except TimeoutError:
                log.warning("the mark of %s as deleted not read back in %.0f s", topic, GONE_WAIT_S)
        return code, message

    async def _partition_count(self, topic: str, topic_id: uuid.UUID, fresh: bool = False) -> int:
        """The topic's partition count: the last look's, or Kafka's now if none was
        taken or `fresh` (an untier or a seal: the look's may be up to TOPICS_CHECK_S
        old, and a partition added since may hold records past its cutover already)."""
        count = self._partitions.get(topic_id)
        if count is None or fresh:
            try:
                found, partitions = (await self.service.describe_topics([topic])).topic(topic)
            except LookupError:  # the name is nobody's now, or Kafka said nothing of it
                return count or 0
            if found != topic_id:  # the name is another topic's: not this one's count
                return count or 0
            count = max(partitions, count or 0)
            self._partitions[topic_id] = count
        return count

    async def _stable_ends(
        self, topic: str, partitions: list[int]
    ) -> tuple[dict[TopicPartition, int], dict[TopicPartition, int]]:
        """The log ends of the partitions, read until two reads in a row agree (with no
        produce in flight the high watermark, what ListOffsets gives, reaches the log
        end), and their last stable offsets (ListOffsets read_committed), read first.

        A transaction open there is not waited for (produce is held, so a producer that
        sends more records in it could not end it before the coordinator's timeout, which
        fences it): it is carried across (partition/carried.py). Its marker lands in
        Kafka's log past the cutover, where the marker follower finds it. The stream
        seeds its producer state from Kafka's log from the last stable offset up to the
        cutover; read before the ends, it is at most the one at the cutover (only markers
        reach Kafka's log meanwhile, and they only move it up), so that read misses no
        batch of a transaction open at the cutover."""
        assert self._consumer is not None and self._committed is not None
        tps = [TopicPartition(topic, p) for p in partitions]
        stable = await self._committed.end_offsets(tps)
        last, same = None, 0
        while same < STABLE_READS:
            ends = await self._consumer.end_offsets(tps)
            same = same + 1 if ends == last else 1
            last = ends
            if same < STABLE_READS:
                await asyncio.sleep(READ_INTERVAL_S)
        assert last is not None
        return last, stable

    # -- the admin API ---------------------------------------------------------------------

    async def admin(self, op: str, topic: str, topic_id: uuid.UUID) -> tuple[int, str]:
        """tier / untier a topic: written by the owner of its topic shard, wherever it is."""
        service = self.service
        if op not in ADMIN_OPS or op == "configs":  # configs: the service's (topic_configs)
            return ErrorCode.invalid_request, f"unknown admin operation {op!r}"
        if op == "look":  # a peer's produce waits for a partition this loop may not know
            self.look_soon()
            return 0, "looking at Kafka's tiered topics"
        # The command names the topic only (id zero); a proxy forwarding it to the
        # shard's owner names the id too. A forwarded request is never forwarded again:
        # during a shard-group rebalance two proxies can each see the other as the owner,
        # and it would bounce between them until every hop timed out.
        forwarded = topic_id.int != 0
        answer: TopicsAnswer | None = None
        if not forwarded:  # ask Kafka for the topic's id
            try:
                answer = await service.describe_topics([topic])
                topic_id, _ = answer.topic(topic)
            except LookupError as exc:
                return ErrorCode.unknown_topic_or_partition, str(exc)
            except OSError as exc:
                return ErrorCode.not_coordinator, f"cannot reach Kafka: {exc}"
        if op in ("seal", "unseal"):  # from the owner of the topic's shard, untiering it
            return await self._seal(op, topic, topic_id)
        if op == "deleted" and not forwarded:
            return ErrorCode.invalid_request, "a deleted topic is named by its topic id"
        if op == "tier" and not forwarded:
            previous = service.topics.topic(topic)
            if previous is not None and previous.topic_id != topic_id:
                # The name's previous topic, deleted in Kafka directly, and not yet found
                # so by the look (TOPICS_CHECK_S): marked first, or two TIERED topics
                # would share the name and a Produce by name could reach the old one.
                code, message = await self.topic_deleted(topic, previous.topic_id)
                if code != 0:
                    return code, (
                        f"cannot tier {topic}: its previous topic (topic id "
                        f"{previous.topic_id}) is still tiered: {message}"
                    )
        return await self._at_owner(op, topic, topic_id, forwarded, answer)

    async def _at_owner(
        self,
        op: str,
        topic: str,
        topic_id: uuid.UUID,
        forwarded: bool,
        answer: TopicsAnswer | None = None,
    ) -> tuple[int, str]:
        """The op done by the owner of the topic's shard: here, or sent to it once.
        `answer`: Kafka's answer that gave `topic_id`, if this proxy asked for it."""
        service = self.service
        shard = topic_shard(topic_id, service.config.shard_count)
        owner = owner_or_peer(service, shard)
        if owner is None:
            return ErrorCode.not_coordinator, f"metadata shard {shard} has no live owner right now"
        if isinstance(owner, tuple):  # owned by another proxy: its peer address
            member = service.readers[shard].state.owner
            if op == "deleted" and service.peer_protocol(member) < TOPIC_OPS_PROTOCOL:
                return ErrorCode.coordinator_not_available, (
                    f"the owner of metadata shard {shard} runs a release without the "
                    f"admin op {op}: its own look at Kafka finds the topic's change"
                )
            if forwarded:
                return ErrorCode.not_coordinator, (
                    f"metadata shard {shard} is not owned here (forwarded here as its owner): "
                    "its ownership is moving"
                )
            try:
                return await service.peers.admin(owner, op, topic, topic_id)
            except (PeerUnavailable, TimeoutError, OSError) as exc:
                # the owner the metadata names is down (killed, its claim not expired
                # yet) or restarting: retriable, as Kafka answers while its controller
                # moves; the shard is claimed again or taken over meanwhile
                return ErrorCode.coordinator_not_available, (
                    f"the owner of metadata shard {shard} did not answer: {exc}"
                )
        if op == "deleted":
            return await self._deleted_here(owner, topic, topic_id)
        sealed = Sealed(topic, topic_id)
        if op == "untier":
            try:
                partitions = await self._partition_count(topic, topic_id, fresh=True)
            except OSError as exc:
                return ErrorCode.not_coordinator, f"cannot reach Kafka: {exc}"
            states = [reader.state for reader in service.readers]
            refusal = topic_untier_refusal(states, topic_id, partitions)
            if not refusal:
                sealed, refusal = await service.seals.seal_topic(topic, topic_id, partitions)
            if refusal:
                return ErrorCode.policy_violation, f"cannot untier {topic}: {refusal}"
        mode = TopicMode.TIERED if op == "tier" else TopicMode.PASSTHROUGH
        cluster = None
        if op == "tier":  # the topic id is of the cluster that answers it: recorded
            try:  # a forwarded tier: the owner asks (the cluster id is not forwarded)
                answer = answer or await service.describe_topics([topic])
                found = answer.topic_id(topic)
            except LookupError as exc:
                return ErrorCode.unknown_topic_or_partition, f"Kafka's topic {topic}: {exc}"
            except OSError as exc:
                return ErrorCode.not_coordinator, f"cannot reach Kafka: {exc}"
            if found != topic_id:
                return ErrorCode.unknown_topic_or_partition, (
                    f"Kafka's topic {topic} is topic id {found} now, not {topic_id}"
                )
            cluster = self._recorded_cluster(answer.cluster_id)
        record = TopicModeSet(topic_id, topic, mode, now_ms(), cluster)
        try:
            [verdict] = await owner.write([record])
        except ShardFenced as exc:
            await service.seals.unseal_topic(sealed)
            return ErrorCode.not_coordinator, str(exc)
        if verdict.outcome.value == "refuse":
            await service.seals.unseal_topic(sealed)
            return ErrorCode.policy_violation, verdict.reason
        return 0, f"{topic} is {mode.name.lower()}"

    async def _seal(self, op: str, topic: str, topic_id: uuid.UUID) -> tuple[int, str]:
        seals = self.service.seals
        if op == "unseal":
            streams = seals.streams_of(topic_id)
            await seals.unseal_here(streams)
            return 0, f"{len(streams)} partitions of {topic} started again"
        try:
            partitions = await self._partition_count(topic, topic_id, fresh=True)
        except OSError as exc:
            return ErrorCode.not_coordinator, f"cannot reach Kafka: {exc}"
        streams, refusal = await seals.seal_here(topic_id, partitions)
        if refusal:
            return ErrorCode.policy_violation, refusal
        return 0, f"{len(streams)} partitions of {topic} sealed on {self.service.name}"
