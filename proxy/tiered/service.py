"""The tiered data plane inside one proxy (docs/tiering.md, "In the proxy").

`TieringService` wires the pieces: a `ShardReader` per metadata shard (every proxy knows
every topic's mode and every stream's owner), its share of the shards through the
consumer group (`ShardAssignment`), one local WAL and `PartitionSet` for the streams of
the shards it owns, an uploader that commits through those shards' owners, the peer
listener and clients, and the S3-WAL writer that hands batches to owners elsewhere.

A Produce partition of a tiered topic goes, by `produce()`:
- to the local `TieredPartition` if this proxy owns its stream;
- else to the owner: `notify: s3` PUTs it to an S3-WAL object and sends the location,
  `notify: direct` sends the bytes; the owner's answer is the client's.
A partition whose topic is tiered but whose cutover is not written yet waits for it
(`cutover_hold_ms`); an unreachable owner answers NOT_LEADER_OR_FOLLOWER (retriable).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

from proxy.apis.fetch_split import TieredFetchResult
from proxy.config.tiering import TieringConfig
from proxy.handoff.objects import writer_id_for
from proxy.handoff.writer import S3WalMetrics, S3WalReader, S3WalWriter
from proxy.metadata.group import ShardAssignment, ensure_metadata_topic
from proxy.metadata.records import ObjectCommit
from proxy.metadata.state import MetadataState
from proxy.metadata.store import ShardOwner, ShardReader
from proxy.metadata.streams import shard_of
from proxy.metadata.topic_index import TieredTopic, TopicIndex, drained_topics, stream_of
from proxy.objects.bandwidth import Bandwidth
from proxy.objects.local import LocalDirectoryStore
from proxy.objects.metrics import ObjectStoreMetrics
from proxy.objects.s3 import S3Store
from proxy.objects.store import ObjectStore
from proxy.partition.committed import committed_headers
from proxy.partition.owner import PartitionSet
from proxy.partition.produce_rules import ProduceRules
from proxy.partition.rules import NOT_LEADER_OR_FOLLOWER, ProduceResult
from proxy.partition.sequence_holes import ProducerBatch, SequenceHoles
from proxy.peer.clients import PeerClients, PeerUnavailable
from proxy.peer.codec import AdminRequest, AppendRequest, for_peer, frame_size
from proxy.peer.messages import AppendResponse, FetchRequest
from proxy.peer.server import PeerServer
from proxy.reads.blockcache import BlockCache
from proxy.reads.logcache import LogCache
from proxy.records.batches import CorruptBatchError
from proxy.routing.fleet import OLD_PEER_PROTOCOL
from proxy.server.lifecycle import settle, start_or_undo
from proxy.tiered.beyond_cutover import BeyondCutover
from proxy.tiered.leader_epochs import LeaderEpochs
from proxy.tiered.reads import TieredReads
from proxy.tiered.topic_configs import TopicConfigs
from proxy.tiered.txn_refusal import TxnRefusals
from proxy.upkeep.backfill import commit_backfill
from proxy.upkeep.compactor import Compactor
from proxy.upkeep.cutover import CutoverLoop
from proxy.upkeep.orphan_plan import commit_age_limit
from proxy.upkeep.orphan_sweep import OrphanSweep
from proxy.upkeep.retention import Retention
from proxy.upkeep.seals import Seals
from proxy.upkeep.trims import trim_stream
from proxy.upload.plan import ObjectIdAllocator
from proxy.upload.uploader import CommitRefused, UploadedObject, Uploader, UploaderConfig
from proxy.wal.log import WriteAheadLog
from proxy.wal.s3log import S3WalConfig, S3WriteAheadLog
from proxy.wal.s3log_objects import log_prefix
from proxy.wal.types import WalConfig

log = logging.getLogger("tierproxy.tiering")

CORRUPT_MESSAGE = 2
REQUEST_TIMED_OUT = 7
INVALID_REQUEST = 42
COMMIT_OWNER_WAIT_S = 30.0  # an upload during a rebalance waits this long for the owners
UPLOADER_RESTART_S = 1.0
ACKS0_RELEASE_DELAY_S = 30.0  # an acks=0 batch's S3-WAL location is released this late


def uploader_config(config: TieringConfig) -> UploaderConfig:
    """The uploader's settings from the `tiering` section."""
    return UploaderConfig(
        upload_bytes=config.upload_bytes,
        upload_interval_s=config.upload_interval_s,
        max_commit_age_s=commit_age_limit(config.orphan_grace_s),
        object_format_version=config.object_format_version,
    )


@dataclass(frozen=True, slots=True)
class _Part:
    """One partition of a Produce request for a tiered topic, on its way to the owner."""

    topic: TieredTopic
    partition: int
    stream: int
    batch: ProducerBatch | None  # whose batches (sequence_holes.py); None for acks=0
    records: object
    acks: int
    timeout_ms: int
    rules: ProduceRules | None = None  # the topic's produce checks (produce_rules.py)


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _not_owner(message: str) -> ProduceResult:
    return ProduceResult(NOT_LEADER_OR_FOLLOWER, error_message=message)


async def open_store(config: TieringConfig, registry=None) -> ObjectStore:
    """The configured store; an S3 store counts its requests on `registry` (/metrics)."""
    settings = config.object_store
    if settings.kind == "s3":
        assert settings.s3 is not None
        return await S3Store.open(settings.s3, metrics=ObjectStoreMetrics(registry))
    return LocalDirectoryStore(settings.directory)


class TieringService:
    def __init__(self, proxy, kafka_settings: dict) -> None:  # proxy: server.app.Proxy
        self.proxy = proxy
        self.config: TieringConfig = proxy.config.tiering
        self.name: str = proxy.config.fleet.name
        self._kafka = kafka_settings
        shard_count = self.config.shard_count
        topic = self.config.metadata_topic
        self.readers = [
            ShardReader(kafka_settings, topic, k, shard_count, on_record=self._on_record)
            for k in range(shard_count)
        ]
        self.topics = TopicIndex([reader.state for reader in self.readers])
        self.in_flight: dict[str, int] = {}  # topic name -> passthrough produce in flight
        self._changed = asyncio.Event()
        self.store: ObjectStore | None = None
        self.block_cache: BlockCache | None = None
        self.log_cache = LogCache(self.config.log_cache_bytes)
        self.reads: TieredReads | None = None
        self.bandwidth: Bandwidth | None = None  # bandwidth.py; set at start
        self.wal: WriteAheadLog | S3WriteAheadLog | None = None
        self.partitions: PartitionSet | None = None
        self.uploader: Uploader | None = None
        self.assignment: ShardAssignment | None = None
        self.peer_server: PeerServer | None = None
        self.peers = PeerClients()
        self.s3wal: S3WalWriter | None = None
        self.s3wal_reader: S3WalReader | None = None
        self._allocate = ObjectIdAllocator.drawn()
        self._tasks: list[asyncio.Task[None]] = []
        self._stopped = False
        # stream -> the latest peer request's future, done once its batch is queued (owner)
        # or its request is written (non-owner): keeps a stream's batches in order
        self._arrivals: dict[int, asyncio.Future[None]] = {}
        self._sends: dict[int, asyncio.Future[None]] = {}
        self._zones_by_address: dict[tuple[str, int], str] = {}
        # the batches this proxy answered retriable without appending, to tell a sequence
        # gap it made from one the client made (sequence_holes.py; docs/sequencer.md)
        self.holes = SequenceHoles()
        self.cutover = CutoverLoop(self)
        self.seals = Seals(self)
        self.compactor: Compactor | None = None  # compactor.py; started once shards are owned
        # tiered topics' configs, Kafka's: retention's and produce's (topic_configs.py)
        self.topic_configs = TopicConfigs(kafka_settings)
        self.retention = Retention(self)
        # Kafka's answers clamped at a tiered partition's cutover (beyond_cutover.py)
        self.beyond_cutover = BeyondCutover()
        # AddPartitionsToTxn refused for tiered topics (tiered_txn_refusal.py)
        self.txn_refusals = TxnRefusals()
        # the partitions' current leader epochs, for ListOffsets answers (leader_epochs.py)
        self.leader_epochs = LeaderEpochs(proxy.partition_leader_epochs)
        self.orphans: OrphanSweep | None = None  # orphan_sweep.py; runs on shard 0's owner
        # a partition's records above this are refused (MESSAGE_TOO_LARGE): one entry must
        # fit a WAL segment, and an S3-WAL object
        self.max_batch_bytes = min(self.config.wal_segment_bytes, self.config.s3wal_max_bytes)

    # -- lifecycle -----------------------------------------------------------------------

    async def start(self) -> None:
        """Start the parts in order. A step that fails (or a cancel) stops what the steps
        before it started, and the step's own part if it got that far: `stop()` undoes any
        prefix of the start; the error is raised."""
        await start_or_undo(self._start, self.stop)

    async def _start(self) -> None:
        config = self.config
        await ensure_metadata_topic(self._kafka, config.metadata_topic, config.shard_count)
        await settle(reader.start() for reader in self.readers)
        await settle(reader.caught_up() for reader in self.readers)
        registry = self.proxy.metrics.registry
        self.bandwidth = Bandwidth(
            config.bandwidth_bytes_per_s, config.bandwidth_burst_bytes, registry
        )
        self.store = await open_store(config, registry)
        if config.wal_mode == "s3":  # no local disk: the ack waits for a PUT (docs/wal.md)
            self.wal = await S3WriteAheadLog.open(
                S3WalConfig(
                    log_prefix(self.name),
                    capacity_bytes=config.wal_capacity_bytes,
                    max_object_bytes=config.s3wal_max_bytes,
                ),
                self.store,
            )
        else:
            config.wal_directory.mkdir(parents=True, exist_ok=True)
            self.wal = await WriteAheadLog.open(
                WalConfig(
                    str(config.wal_directory),
                    segment_bytes=config.wal_segment_bytes,
                    capacity_bytes=config.wal_capacity_bytes,
                )
            )
        self.partitions = PartitionSet(
            self.wal,
            on_broken=self._partition_broken,
            log_cache=self.log_cache,
            holes=self.holes,
        )
        self.block_cache = BlockCache(
            self.store, capacity_bytes=config.block_cache_bytes, registry=registry
        )
        self.reads = TieredReads(self, self.block_cache, self.log_cache)
        self.peer_server = PeerServer(
            config.peer_bind_host,
            config.peer_port,
            self._on_peer_append,
            self._on_peer_admin,
            self._on_peer_fetch,
            on_backfill=lambda request: commit_backfill(self, request),
            on_trim=lambda request: trim_stream(self, request),
            name=self.name,
        )
        await self.peer_server.start()
        self.s3wal_reader = S3WalReader(self.store)
        if config.notify == "s3":
            self.s3wal = S3WalWriter(
                self.store,
                writer_id_for(self.name, time.time()),
                max_delay_s=config.s3wal_max_delay_ms / 1000,
                max_bytes=config.s3wal_max_bytes,
                metrics=S3WalMetrics(registry),
            )
        self._tasks.append(asyncio.create_task(self._upload_forever(), name="uploader"))
        self.assignment = ShardAssignment(
            self._kafka,
            config.metadata_topic,
            config.shard_count,
            self.name,
            group_id=config.group,
            session_timeout_ms=config.session_timeout_ms,
            dirty_shards=self.dirty_shards,
            on_owned=self._owned,
            on_lost=self._lost,
            on_release=self._release,
            unclean_takeover_after_s=config.unclean_takeover_after_s,
        )
        await self.assignment.start()
        self.compactor = Compactor.for_service(self, self._allocate)
        self.compactor.start()
        self._tasks.append(asyncio.create_task(self.cutover.run(), name="cutover"))
        self._tasks.append(asyncio.create_task(self.retention.run(), name="retention"))
        self.orphans = OrphanSweep.for_service(self)
        self._tasks.append(asyncio.create_task(self.orphans.run(), name="orphan-sweep"))

    async def stop(self) -> None:
        """Stop what `start` started, in the reverse order, each part only if it got that
        far (so it undoes a start that failed midway), once: a second call does nothing.
        Two deliberate exceptions to the reverse order: the compactor stops first (its
        commits go through the shards' owners), and the uploader's restart loop is
        cancelled before the group is left (the release's flush must not race a restart)."""
        if self._stopped:
            return
        self._stopped = True
        if self.compactor is not None:  # first: its commits go through the shards' owners
            await self.compactor.close()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.assignment is not None:  # closes partitions, uploads, releases
            await self.assignment.close()
        if self.uploader is not None:
            await self.uploader.close()
        if self.partitions is not None:
            await self.partitions.close()
        if self.peer_server is not None:
            await self.peer_server.close()
        await self.peers.close()
        if self.s3wal is not None:
            await self.s3wal.close()
        if self.wal is not None:
            await self.wal.close()
        if self.block_cache is not None:
            await self.block_cache.close()
        if self.store is not None:
            await self.store.close()
        if self.bandwidth is not None:
            self.bandwidth.close()
        await self.topic_configs.close()
        await asyncio.gather(*(reader.close() for reader in self.readers))

    @property
    def peer_port(self) -> int:
        return self.peer_server.port if self.peer_server is not None else 0

    def drained(self) -> frozenset[str]:
        """What the heartbeat reports: tiered topics with no passthrough produce in flight."""
        return drained_topics(self.topics.topics(), self.in_flight)

    def uploader_lag(self) -> tuple[int, float] | None:
        """(WAL bytes not yet uploaded, seconds the oldest has waited), for the heartbeat."""
        if self.uploader is None:
            return None
        return self.uploader.stats.backlog_bytes, round(self.uploader.backlog_seconds, 3)

    def dirty_shards(self) -> list[int]:
        """Shards this proxy owned last and did not hand over cleanly: its WAL may hold
        what it acknowledged for them, so the group gives them back to it."""
        return [
            r.shard for r in self.readers if r.state.owner == self.name and not r.state.released
        ]

    # -- metadata changes ----------------------------------------------------------------

    def _on_record(self, offset: int, verdict: object) -> None:
        self.topics.stale()
        self._notify()

    def _notify(self) -> None:
        """Wake whoever waits in `changed` (a new event for the next wait)."""
        self._changed.set()
        self._changed = asyncio.Event()

    async def changed(self, timeout_s: float) -> None:
        """Wait for the next metadata record, at most `timeout_s`."""
        event = self._changed
        try:
            async with asyncio.timeout(timeout_s):
                await event.wait()
        except TimeoutError:
            pass

    def state(self, stream: int) -> MetadataState:
        return self.readers[shard_of(stream, self.config.shard_count)].state

    # -- produce ---------------------------------------------------------------------------

    def is_tiered(self, topic: str | uuid.UUID, partition: int) -> bool:
        found = self.topics.topic(topic)
        return found is not None

    async def produce_rules(self, topic: str | uuid.UUID) -> ProduceRules | None:
        """What a tiered topic's produce must pass, from its configs in Kafka
        (produce_rules.py); None: not tiered, or Kafka did not describe it."""
        found = self.topics.topic(topic)
        return None if found is None else await self.topic_configs.produce_rules(found.name)

    async def produce(
        self,
        topic: str | uuid.UUID,
        partition: int,
        records,
        acks: int,
        timeout_ms: int,
        rules: ProduceRules | None = None,
    ) -> ProduceResult | None:
        """One partition of a Produce request for a tiered topic, checked against `rules`
        (`produce_rules`) already; None for acks=0. The owner stamps the batch if the topic
        uses LogAppendTime: here by `rules`, elsewhere by the owner's own. Its answer is
        recorded in `holes` (a retriable error: a drop; success: holes filled) before
        anything else runs: no later batch can be handed off without knowing it."""
        found = self.topics.topic(topic)
        if found is None:  # untiered since the split: the client retries through Kafka
            return _not_owner(f"topic {topic} is no longer tiered")
        if records is None:
            return ProduceResult(INVALID_REQUEST, error_message="null records")
        stream = stream_of(found, partition)
        batch = ProducerBatch.of(records) if acks != 0 else None
        try:
            part = _Part(found, partition, stream, batch, records, acks, timeout_ms, rules)
            result = await self._produce(part)
        except BaseException:
            self.holes.dropped(stream, batch)
            raise
        if result is not None:
            self.holes.observe(stream, batch, result.error_code)
        return result

    async def _produce(self, part: _Part) -> ProduceResult | None:
        found, partition, stream = part.topic, part.partition, part.stream
        if self.state(stream).stream(stream) is None:
            if not await self._wait_for_cutover(found, stream):
                return ProduceResult(
                    REQUEST_TIMED_OUT,
                    error_message=f"{found.name}-{partition} is being cut over to tiered",
                )
        assert self.partitions is not None
        if stream in self.seals:
            return _not_owner(f"{found.name}-{partition} is being untiered")
        if self.partitions.get(stream) is None and self._owned_here(stream):
            await self._wait_for_partition(stream)  # cut over or taken over just now
        if self.partitions.get(stream) is not None:
            append_time = part.rules.log_append_time if part.rules is not None else None
            return await self.partitions.produce(stream, part.records, part.acks, append_time)
        return await self._produce_remote(part)

    def _owned_here(self, stream: int) -> bool:
        assert self.assignment is not None
        return self.assignment.owner(shard_of(stream, self.config.shard_count)) is not None

    async def _wait_for_partition(self, stream: int) -> None:
        """A stream of a shard owned here whose partition is being started (its cutover
        was just read, or the shard just claimed): wait for it, at most cutover_hold_ms,
        unless it is sealed for an untier or its topic is no longer tiered."""
        assert self.partitions is not None
        deadline = time.monotonic() + self.config.cutover_hold_ms / 1000
        while self.partitions.get(stream) is None and self._owned_here(stream):
            info = self.state(stream).stream(stream)
            if stream in self.seals or info is None or self.topics.topic(info.topic_id) is None:
                return
            left = deadline - time.monotonic()
            if left <= 0:
                return
            await self.changed(min(left, 0.1))

    async def _wait_for_cutover(self, topic: TieredTopic, stream: int) -> bool:
        deadline = time.monotonic() + self.config.cutover_hold_ms / 1000
        while self.state(stream).stream(stream) is None:
            left = deadline - time.monotonic()
            if left <= 0 or self.topics.topic(topic.topic_id) is None:
                return False
            await self.changed(left)
        return True

    async def _produce_remote(self, part: _Part) -> ProduceResult | None:
        topic, partition, stream, batch = part.topic, part.partition, part.stream, part.batch
        records, acks, timeout_ms = part.records, part.acks, part.timeout_ms
        address = self._owner_address(stream)
        if address is None:
            return _not_owner(f"{topic.name}-{partition}: no live owner right now")
        protocol = self.peer_protocol(self.state(stream).owner)
        # A stream's batches reach the owner in the order they came (producer sequence
        # numbers): each call is made after the previous one's, which PeerClients writes
        # first, whichever S3-WAL PUT ends first.
        previous = self._sends.get(stream)
        started = asyncio.get_running_loop().create_future()
        self._sends[stream] = started
        location = None  # released once the owner answered: s3walgc.py
        try:
            if self.s3wal is not None:
                location = await self.s3wal.append(stream, records)
                payload = {"location": location}
            else:
                payload = {"records": records}
            if previous is not None:
                await asyncio.wait([previous])
            call = asyncio.ensure_future(
                self.peers.append(
                    address,
                    stream,
                    acks,
                    timeout_ms,
                    **payload,
                    batch=batch,
                    hole=lambda: self.holes.hole_before(stream, batch),
                    on_lost=lambda: self.holes.dropped(stream, batch),
                    peer_protocol=protocol,
                )
            )
            await asyncio.sleep(0)  # its first step queues the request, before the next's
        except CorruptBatchError as exc:  # the S3-WAL writer checks each batch's CRC
            return ProduceResult(CORRUPT_MESSAGE, error_message=str(exc))  # the owner's answer
        except Exception as exc:  # the S3-WAL PUT failed, or the batch is invalid
            log.warning("produce to %s-%d failed: %r", topic.name, partition, exc)
            self.holes.dropped(stream, batch)  # before the next hand-off of the stream goes
            if location is not None and self.s3wal is not None:
                self.s3wal.release(location)
            return ProduceResult(56, error_message=f"could not hand the batch over: {exc}")
        finally:
            started.set_result(None)
            if self._sends.get(stream) is started:
                del self._sends[stream]
        request = for_peer(
            AppendRequest(0, stream, acks, timeout_ms, **payload, batch=batch), protocol
        )
        self.count_peer_bytes(address, "to_owner", frame_size(request))
        try:
            result = await call
        except (PeerUnavailable, TimeoutError, OSError) as exc:
            return _not_owner(f"{topic.name}-{partition}: owner at {address}: {exc}")
        finally:  # answered: the owner read the batch first; failed: nothing acknowledged
            if location is not None and self.s3wal is not None:
                self._release_location(location, acks)
        if result is not None:
            self.count_peer_bytes(
                address, "from_owner", frame_size(AppendResponse.from_result(0, result))
            )
        return result

    def _release_location(self, location, acks: int) -> None:
        """acks=0 gets no answer (the call returns once the request is written): its
        batch is released later, when the owner has long read it; nothing was promised."""
        assert self.s3wal is not None
        if acks == 0:
            loop = asyncio.get_running_loop()
            loop.call_later(ACKS0_RELEASE_DELAY_S, self.s3wal.release, location)
        else:
            self.s3wal.release(location)

    def count_peer_bytes(self, address: tuple[str, int], direction: str, size: int) -> None:
        owner_zone = self._zones_by_address.get(address)
        if owner_zone is None:
            for member in self.proxy.fleet.live():
                heartbeat = self.proxy.fleet.heartbeat(member.name)
                if heartbeat is not None and (member.host, heartbeat.peer_port) == address:
                    owner_zone = self._zones_by_address[address] = member.zone
        self.proxy.metrics.peer_bytes.labels(
            self.proxy.config.fleet.zone, owner_zone or "unknown", self.config.notify, direction
        ).inc(size)

    def _owner_address(self, stream: int) -> tuple[str, int] | None:
        owner = self.state(stream).owner
        if owner == self.name:
            return None  # this proxy's partition is not started yet (or not any more)
        return self.peer_address(owner)

    def peer_address(self, member: str) -> tuple[str, int] | None:
        """Where a live member of the fleet takes peer requests; None if it is not live
        or runs without tiering."""
        if not member:
            return None
        live = {m.name: m for m in self.proxy.fleet.live()}
        heartbeat = self.proxy.fleet.heartbeat(member)
        if member not in live or heartbeat is None or not heartbeat.peer_port:
            return None
        return live[member].host, heartbeat.peer_port

    def peer_protocol(self, member: str) -> int:
        """The peer protocol level of `member`, from its last heartbeat; a member not heard
        from counts as the oldest, so nothing it might refuse is sent to it."""
        heartbeat = self.proxy.fleet.heartbeat(member) if member else None
        return OLD_PEER_PROTOCOL if heartbeat is None else heartbeat.peer_protocol

    # -- what peers ask ------------------------------------------------------------------

    async def _on_peer_append(self, request: AppendRequest) -> ProduceResult:
        """A peer's batch for a stream owned here. The S3 reads run concurrently, but the
        batches are queued to the partition in the order the requests arrived (a producer's
        sequence numbers must arrive in order)."""
        assert self.partitions is not None and self.s3wal_reader is not None
        stream = request.stream_id
        batch = request.batch if request.acks != 0 else None
        if batch is not None and request.hole >= 0:  # what the sender dropped before it
            pid, epoch, seq = batch.producer_id, batch.producer_epoch, request.hole
            hole = ProducerBatch(pid, epoch, seq, seq)
            self.holes.dropped(stream, hole)
        previous = self._arrivals.get(stream)
        queued = asyncio.get_running_loop().create_future()
        self._arrivals[stream] = queued
        try:
            records = request.records
            if records is None:
                assert request.location is not None
                records = await self.s3wal_reader.read(request.location)
            rules = await self._stream_rules(stream)  # before the order is kept: may wait
            if previous is not None:
                await asyncio.wait([previous])
            if self.partitions.get(stream) is None and self._owned_here(stream):
                await self._wait_for_partition(stream)
            if self.partitions.get(stream) is None:
                self.holes.dropped(stream, batch)
                return _not_owner(f"stream {stream} is not owned by {self.name}")
            if rules is None:
                return ProduceResult(56, error_message=f"stream {stream}: no topic config")
            append_time = rules.log_append_time
            call = asyncio.ensure_future(
                self.partitions.produce(stream, records, request.acks, append_time)
            )
            await asyncio.sleep(0)  # its first step queues the batch, before the next's
        except BaseException:  # the S3-WAL read failed: answered 56, the batch not appended
            self.holes.dropped(stream, batch)  # before the stream's next arrival goes on
            raise
        finally:
            queued.set_result(None)
            if self._arrivals.get(stream) is queued:
                del self._arrivals[stream]
        result = await call
        if result is not None:
            self.holes.observe(stream, batch, result.error_code)
        return result if result is not None else ProduceResult(0)

    async def _stream_rules(self, stream: int) -> ProduceRules | None:
        """The produce rules of a stream's topic, at its owner (LogAppendTime)."""
        info = self.state(stream).stream(stream)
        return None if info is None else await self.produce_rules(info.topic_id)

    async def _on_peer_fetch(self, request: FetchRequest) -> TieredFetchResult:
        assert self.reads is not None
        return await self.reads.serve_tail(request)

    async def _on_peer_admin(self, request: AdminRequest) -> tuple[int, str]:
        return await self.cutover.admin(request.op, request.topic, request.topic_id)

    # -- shards --------------------------------------------------------------------------

    async def _owned(self, shard: int, owner: ShardOwner) -> None:
        """A shard became this proxy's: rebuild and start its streams' partitions."""
        await self.recover_streams(owner.state, owner.state.stream_ids())

    async def recover_streams(self, state: MetadataState, streams: list[int]) -> None:
        """Rebuild and start partitions of one shard's streams: from the metadata, the WAL
        and, for what the WAL no longer holds, the committed objects' batch headers."""
        assert self.partitions is not None and self.store is not None
        store = self.store
        streams = [s for s in streams if s not in self.seals]  # until the untier is written

        def read_committed(stream: int, start: int, end: int):
            return committed_headers(store, state, stream, start, end)

        await self.partitions.recover(streams, state, read_committed=read_committed)
        self._notify()

    async def start_stream(self, shard: int, stream: int) -> None:
        """A stream just cut over in a shard this proxy owns."""
        assert self.partitions is not None and self.assignment is not None
        owner = self.assignment.owner(shard)
        if owner is not None and self.partitions.get(stream) is None:
            await self.recover_streams(owner.state, [stream])

    async def _lost(self, shard: int) -> None:
        """A shard is being taken away: stop its partitions (in-flight appends answered)."""
        assert self.partitions is not None
        streams = [s for s in self.readers[shard].state.stream_ids() if self.partitions.get(s)]
        await asyncio.gather(*(self.partitions.remove(s) for s in streams))

    async def _release(self, shard: int) -> bool:
        """Whether everything acknowledged for the shard is committed: upload it now."""
        uploader = self.uploader
        if uploader is None or uploader.failed is not None:
            return False
        try:
            async with asyncio.timeout(self.config.session_timeout_ms / 1000):
                await uploader.flush()
        except Exception as exc:
            log.warning("shard %d handed over uncleanly: the upload failed: %r", shard, exc)
            return False
        return True

    def _partition_broken(self, stream: int, error: BaseException) -> None:
        log.error("stream %d: the WAL failed (%r); restart this proxy", stream, error)

    # -- the uploader --------------------------------------------------------------------

    async def _upload_forever(self) -> None:
        assert self.wal is not None and self.store is not None
        config = uploader_config(self.config)
        while True:
            self.uploader = Uploader(
                self.wal,
                self.store,
                self._commit,
                self._allocate,
                committed_end=lambda stream: self.state(stream).stream_end(stream),
                config=config,
            )
            self.uploader.start()
            error = await self.uploader.stopped()
            log.warning("uploader stopped (%s); restarting in %s s", error, UPLOADER_RESTART_S)
            await asyncio.sleep(UPLOADER_RESTART_S)

    async def _commit(self, objects: Sequence[UploadedObject]) -> None:
        """One ObjectCommit per (object, shard), written by that shard's owner here."""
        by_shard: dict[int, list[tuple[UploadedObject, tuple]]] = {}
        for uploaded in objects:
            for shard, ranges in uploaded.ranges_by_shard(self.config.shard_count).items():
                by_shard.setdefault(shard, []).append((uploaded, ranges))
        for shard, items in sorted(by_shard.items()):
            owner = await self._owner_for_commit(shard)
            if time.monotonic() > min(o.commit_by for o, _ in items):
                # the orphan sweep may delete it now: the restarted uploader uploads again
                raise CommitRefused(f"shard {shard}: the objects' PUT is too old to commit")
            now = _now_ms()
            commits = [
                ObjectCommit(
                    owner.state.generation, o.object_id, o.kind, o.size, owner.epoch, now, ranges
                )
                for o, ranges in items
            ]
            for verdict in await owner.write(commits):
                if verdict.outcome.value == "refuse":
                    raise CommitRefused(f"shard {shard}: {verdict.reason}")
            for _, ranges in items:  # the log cache may let these go now
                for r in ranges:
                    self.log_cache.uploaded(r.stream_id, r.end_offset)

    async def _owner_for_commit(self, shard: int) -> ShardOwner:
        assert self.assignment is not None
        deadline = time.monotonic() + COMMIT_OWNER_WAIT_S
        while (owner := self.assignment.owner(shard)) is None:
            if time.monotonic() > deadline:
                raise CommitRefused(f"shard {shard} is not owned here")
            await asyncio.sleep(0.1)
        return owner
