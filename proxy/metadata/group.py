"""The metadata topic and the consumer group that shares its shards out
(docs/metadata.md, "The Kafka adapter").

`ensure_metadata_topic` creates the compacted topic, one partition per shard. A
`ShardAssignment` joins the consumer group that subscribes to it: the group's partition
assignment, made by `ShardAssignor` (shard_assignor.py), is the shard assignment. For each
shard assigned, one task runs a `ShardOwner` (metastore.py); a revoked shard's owner is
released (or closed, if the caller still holds some of the shard's records) before the
group moves on. The group's consumer never reads a record: it pauses what it is given and
polls only to stay a member.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable, Collection
from typing import Any, TypeVar

from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import KafkaError
from kio.schema.errors import ErrorCode

from proxy.metadata.assignor import ShardAssignor
from proxy.metadata.client_start import start_client
from proxy.metadata.records import MetadataError
from proxy.metadata.store import ShardFenced, ShardOwner

log = logging.getLogger("tierproxy.metadata")
T = TypeVar("T")

DELETE_RETENTION_MS = 24 * 3600 * 1000  # a tombstone outlives any reader's catch-up
SEGMENT_MS = 3600 * 1000  # Kafka compacts closed segments only: roll them hourly
DEFAULT_GROUP = "tierproxy-shards"
# beyond the session timeout (the upload's bound), what a revoked shard's hand-over may
# take: on_lost and the ShardRelease's transaction
HANDOVER_MARGIN_MS = 15_000
# A step of giving a shard up (its partitions closed, its uploads, its release) still
# running after this long is logged, once: the shard is claimed again only after it.
SLOW_STEP_S = 30.0


class MetadataTopicError(MetadataError):
    """The metadata topic cannot be used as it is: not creatable, or not as configured."""


def metadata_topic_configs(replication_factor: int) -> dict[str, str]:
    return {
        "cleanup.policy": "compact",
        "min.insync.replicas": str(min(2, replication_factor)),
        "delete.retention.ms": str(DELETE_RETENTION_MS),
        "segment.ms": str(SEGMENT_MS),
        "min.compaction.lag.ms": "0",
    }


async def ensure_metadata_topic(
    kafka_settings: dict, topic: str, shard_count: int, *, timeout_s: float = 30.0
) -> None:
    """Create the metadata topic with one partition per shard if it is missing (replication
    factor min(3, brokers)), then check it: `shard_count` partitions, each with a leader,
    and compacted. Raises MetadataTopicError naming the topic and what is wrong."""
    if shard_count < 1:
        raise ValueError(f"shard count {shard_count}: needs at least 1")
    admin = AIOKafkaAdminClient(**kafka_settings)
    try:
        await admin.start()  # inside: a start that fails leaves connections to close
        brokers = len((await admin.describe_cluster())["brokers"])
        replicas = min(3, max(1, brokers))
        new = NewTopic(topic, shard_count, replicas, topic_configs=metadata_topic_configs(replicas))
        response = await admin.create_topics([new])
        for entry in getattr(response, "topic_errors", None) or response.topics:
            code = entry[1] if isinstance(entry, tuple) else entry.error_code
            if code not in (0, ErrorCode.topic_already_exists):
                raise MetadataTopicError(f"cannot create the metadata topic {topic}: error {code}")
        async with asyncio.timeout(timeout_s):
            while True:  # a new topic reaches each broker in its own time
                if await _partitions_ready(admin, topic, shard_count) and await _compacted(
                    admin, topic
                ):
                    break
                await asyncio.sleep(0.1)
    except TimeoutError:
        raise MetadataTopicError(
            f"metadata topic {topic}: no leader for every partition, or no config, "
            f"after {timeout_s} s"
        ) from None
    finally:
        await admin.close()


async def _partitions_ready(admin: AIOKafkaAdminClient, topic: str, shard_count: int) -> bool:
    [described] = await admin.describe_topics([topic])
    if described["error_code"] != 0:
        return False  # not known to this broker yet
    partitions = described["partitions"]
    if len(partitions) != shard_count:
        raise MetadataTopicError(
            f"metadata topic {topic} has {len(partitions)} partitions, the shard count is "
            f"{shard_count}: the count is fixed when the topic is created, and changing it "
            "would move almost every stream to another shard"
        )
    return all(p["error_code"] == 0 and p["leader"] >= 0 for p in partitions)


async def _compacted(admin: AIOKafkaAdminClient, topic: str) -> bool:
    """True for a compacted topic, False when the broker asked does not know it yet."""
    resource = ConfigResource(ConfigResourceType.TOPIC, topic, {"cleanup.policy": None})
    [response] = await admin.describe_configs([resource])
    [(error_code, _, _, _, entries)] = response.resources
    policy = next((e[1] for e in entries if e[0] == "cleanup.policy"), None)
    if error_code != 0 or policy is None:
        return False
    if "compact" not in policy.split(","):
        raise MetadataTopicError(
            f"metadata topic {topic} has cleanup.policy={policy}: it must be compacted, "
            "or retention deletes the fleet's metadata"
        )
    return True


OnOwned = Callable[[int, ShardOwner], Awaitable[None]]
OnShard = Callable[[int], Awaitable[Any]]


class ShardAssignment:
    """This proxy's share of the shards, as the consumer group `group_id` assigns them.

    The member named `name` owns each shard it is assigned: one task per shard starts a
    `ShardOwner` (which may wait for a last owner that did not release the shard, see
    `held()`), awaits `on_owned(shard, owner)`, and only then counts the shard as owned.
    Should the owner be lost while the shard is still assigned (a failed write, say), it
    starts another after `restart_after_s` (default: the session timeout, so that a
    member that lost the group hears of it first).

    A revoked shard's task is stopped before the rebalance goes on: `on_lost(shard)` is
    awaited (stop serving the shard's partitions), then `on_release(shard)`: True when
    everything this member acknowledged for the shard is in committed objects, and the
    owner writes a ShardRelease; False and the owner is only closed, the shard stays
    dirty and the group gives it back to this member. Without `on_release` every shard
    is released (a member that keeps nothing outside the metadata). `dirty_shards()` names
    the shards this member must get back although this process never owned them (a
    restart): the shards whose last claim is this member's and were not released. It is
    read from readers that may lag the owners' own, so a shard this process released
    (and has not claimed since) is never taken from it as dirty: a reader that had not
    read the release yet gave every released shard back to its last owner, and the
    member that joined got none until the next rebalance."""

    def __init__(
        self,
        kafka_settings: dict,
        topic: str,
        shard_count: int,
        name: str,
        *,
        group_id: str = DEFAULT_GROUP,
        session_timeout_ms: int = 10000,
        restart_after_s: float | None = None,
        dirty_shards: Callable[[], Collection[int]] | None = None,
        on_owned: OnOwned | None = None,
        on_lost: OnShard | None = None,
        on_release: Callable[[int], Awaitable[bool]] | None = None,
        **owner_options: Any,
    ) -> None:
        self.topic = topic
        self.shard_count = shard_count
        self.name = name
        self.rebalances = 0  # assignments received from the group
        self._kafka = kafka_settings
        self._group_id = group_id
        self._session_timeout_ms = session_timeout_ms
        self._restart_after_s = (
            session_timeout_ms / 1000 if restart_after_s is None else restart_after_s
        )
        self._dirty_shards = dirty_shards
        self._on_owned = on_owned
        self._on_lost = on_lost
        self._on_release = on_release
        self._owner_options = owner_options
        self._assignor = ShardAssignor(self._dirty)
        self._consumer: AIOKafkaConsumer | None = None
        self._poller: asyncio.Task[None] | None = None
        self._tasks: dict[int, asyncio.Task[None]] = {}
        self._starting: dict[int, ShardOwner] = {}
        self._owners: dict[int, ShardOwner] = {}
        self._unreleased: set[int] = set()  # claimed by this process, not released since
        # released by this process, not claimed here since: `dirty_shards()` reads other
        # readers than the owners', which may not have read the release yet
        self._released: set[int] = set()
        self._closing = False

    async def start(self) -> None:
        rebalance_timeout = self._session_timeout_ms + HANDOVER_MARGIN_MS
        settings = {k: v for k, v in self._kafka.items() if k != "request_timeout_ms"}
        self._consumer = AIOKafkaConsumer(
            **settings,
            group_id=self._group_id,
            enable_auto_commit=False,
            auto_offset_reset="latest",
            session_timeout_ms=self._session_timeout_ms,
            heartbeat_interval_ms=max(100, self._session_timeout_ms // 3),
            # A rebalance revokes every shard, and each is handed over before the member
            # rejoins: its upload (bounded by the session timeout, tiered/uploads.py) and
            # its ShardRelease. A member that rejoins later than the rebalance timeout is
            # put out of the group, its shards go to others, whose start fences it: its
            # hand-over fails, the shards stay dirty and wait for it, and every member
            # revokes again. So the group waits for the hand-over; a dead member still
            # leaves after the session timeout, its heartbeats having stopped.
            rebalance_timeout_ms=rebalance_timeout,
            # aiokafka sends JoinGroup with the client's request timeout; the coordinator
            # may hold the answer for the rebalance timeout (Kafka's consumer does this too)
            request_timeout_ms=max(
                self._kafka.get("request_timeout_ms", 40000), rebalance_timeout + 5000
            ),
            # One assignor only: aiokafka 0.14 sends one JoinGroup per assignor, each with
            # a longer protocol list, so with two every join changes the member's metadata
            # and two members starting together rebalance each other for up to a minute
            # (aio-libs/aiokafka#1168).
            partition_assignment_strategy=(self._assignor,),
        )
        self._consumer.subscribe([self.topic], listener=_Listener(self))
        await start_client(self._consumer)
        self._poller = asyncio.create_task(self._poll(), name=f"shard-group-{self.name}")

    def assigned(self) -> list[int]:
        """The shards the group gave this member (owned, or becoming owned)."""
        return sorted(self._tasks)

    def owned(self) -> list[int]:
        """The shards this member owns now: claimed, `on_owned` done, and not lost since."""
        return sorted(shard for shard, owner in self._owners.items() if owner.owning)

    def owner(self, shard: int) -> ShardOwner | None:
        owner = self._owners.get(shard)
        return owner if owner is not None and owner.owning else None

    def held(self) -> dict[int, str]:
        """The shards assigned to this member that wait for their last owner, which did
        not release them: shard -> that member's name."""
        return {s: o.held_by for s, o in sorted(self._starting.items()) if o.held_by}

    async def close(self) -> None:
        """Stop every owner (released, or closed: see `on_release`), then leave the group,
        so that the next owners start after."""
        self._closing = True
        if self._poller is not None:
            self._poller.cancel()
            await asyncio.gather(self._poller, return_exceptions=True)
        await self._release(list(self._tasks))
        if self._consumer is not None:
            await self._consumer.stop()

    def _dirty(self) -> set[int]:
        dirty = set(self._unreleased)
        if self._dirty_shards is not None:
            dirty.update(set(self._dirty_shards()) - self._released)
        return dirty

    async def _poll(self) -> None:
        # The member leaves the group when it has not polled for max.poll.interval.ms;
        # its partitions are paused, so nothing is ever returned.
        assert self._consumer is not None
        while True:
            try:
                await self._consumer.getmany(timeout_ms=1000)
            except KafkaError as exc:
                log.warning("shard group %s: %s", self._group_id, exc)
                await asyncio.sleep(1.0)

    def _assign(self, partitions: set[TopicPartition]) -> None:
        assert self._consumer is not None
        self._consumer.pause(*partitions)
        self.rebalances += 1
        if self._closing:
            return
        shards = sorted(tp.partition for tp in partitions if tp.topic == self.topic)
        log.info("%s is assigned metadata shards %s", self.name, shards)
        for shard in shards:
            if shard >= self.shard_count:
                log.error(
                    "metadata topic %s has a partition %d: more than the %d shards",
                    self.topic,
                    shard,
                    self.shard_count,
                )
                continue
            if shard not in self._tasks:
                self._tasks[shard] = asyncio.create_task(
                    self._own(shard), name=f"shard-owner-{shard}"
                )

    async def _release(self, shards: list[int]) -> None:
        tasks = [self._tasks.pop(shard) for shard in shards if shard in self._tasks]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _own(self, shard: int) -> None:
        # aiokafka's start and stop methods can swallow a cancellation, so the task checks
        # that the shard is still its own after each of them, not only at cancellation.
        me = asyncio.current_task()
        while self._tasks.get(shard) is me:
            owner = ShardOwner(
                self._kafka, self.topic, shard, self.shard_count, self.name, **self._owner_options
            )
            self._starting[shard] = owner
            serving = False  # on_owned was called: on_lost is owed
            try:
                await self._watched(shard, functools.partial(_claiming, owner), owner.start())
                self._forget(self._starting, shard, owner)
                if self._tasks.get(shard) is me:
                    serving = True
                    if self._on_owned is not None:
                        await self._on_owned(shard, owner)
                    self._owners[shard] = owner
                    reason = await owner.lost()
                    log.warning("%s: shard %d lost while assigned: %s", self.name, shard, reason)
            except (KafkaError, ShardFenced, OSError) as exc:
                log.warning("%s could not own shard %d: %r", self.name, shard, exc)
            except Exception:
                log.exception("%s could not own shard %d", self.name, shard)
            finally:
                if owner.epoch:  # it claimed (or its claim failed midway): dirty until released
                    self._unreleased.add(shard)
                    self._released.discard(shard)
                self._forget(self._starting, shard, owner)
                try:  # still `owner(shard)` while on_release commits what it holds
                    await self._stop(shard, owner, serving)
                finally:
                    self._forget(self._owners, shard, owner)
            if self._tasks.get(shard) is me:
                await asyncio.sleep(self._restart_after_s)

    @staticmethod
    def _forget(owners: dict[int, ShardOwner], shard: int, owner: ShardOwner) -> None:
        if owners.get(shard) is owner:
            del owners[shard]

    async def _stop(self, shard: int, owner: ShardOwner, serving: bool) -> None:
        """on_lost, then release the owner if on_release says everything is committed,
        else close it. A hook that fails counts as "not everything is committed"."""
        if serving and self._on_lost is not None:
            try:
                await self._watched(shard, "stopping its partitions", self._on_lost(shard))
            except Exception:
                log.exception("%s: on_lost of shard %d failed", self.name, shard)
        release = False
        if owner.owning:
            try:
                release = self._on_release is None or await self._watched(
                    shard, "uploading what it holds", self._on_release(shard)
                )
            except Exception:
                log.exception("%s: on_release of shard %d failed", self.name, shard)
        if release:
            try:
                await self._watched(shard, "its release", owner.release())
                self._unreleased.discard(shard)
                self._released.add(shard)
            except (KafkaError, ShardFenced, OSError) as exc:
                log.warning("%s could not release shard %d: %r", self.name, shard, exc)
            except Exception:
                log.exception("%s could not release shard %d", self.name, shard)
        else:
            await self._watched(shard, "closing its owner", owner.close())
        if owner.state.owner not in ("", self.name):  # another member claimed it since
            self._unreleased.discard(shard)

    async def _watched(
        self, shard: int, step: str | Callable[[], str | None], awaitable: Awaitable[T]
    ) -> T:
        """`await awaitable`, logged if it takes SLOW_STEP_S or more: nothing else would
        say why a shard lost while assigned is not claimed again. `step` names it, or
        says at that moment what it waits for (None: a wait logged otherwise)."""

        def slow() -> None:
            doing = step() if callable(step) else f"giving it up: {step}"
            if doing is not None:
                log.warning(
                    "%s: metadata shard %d: %s has taken %.0f s so far",
                    *(self.name, shard, doing, SLOW_STEP_S),
                )

        handle = asyncio.get_running_loop().call_later(SLOW_STEP_S, slow)
        try:
            return await awaitable
        finally:
            handle.cancel()


def _claiming(owner: ShardOwner) -> str | None:
    if owner.held_by is not None:  # waits for its last owner: logged by the owner
        return None
    return f"claiming it ({owner.stage})"


class _Listener(ConsumerRebalanceListener):
    def __init__(self, assignment: ShardAssignment) -> None:
        self._assignment = assignment

    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        await self._assignment._release([tp.partition for tp in revoked])

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        self._assignment._assign(assigned)
