"""The tiered data plane inside one proxy (docs/tiering.md, "In the proxy").

`TieringService` wires the pieces: a `ShardReader` per metadata shard (every proxy knows
every topic's mode and every stream's owner), its share of the shards through the
consumer group (`ShardAssignment`), one local WAL and `PartitionSet` for the streams of
the shards it owns, an uploader that commits through those shards' owners, the peer
listener and clients, and the S3-WAL writer that hands batches to owners elsewhere.

A Produce partition of a tiered topic goes, by `produce()`:
- to the local `TieredPartition` if this proxy owns its stream;
- else to the owner (owners.py): `notify: s3` PUTs it to an S3-WAL object and sends the
  location, `notify: direct` sends the bytes; the owner's answer is the client's.
A partition whose topic is tiered but whose cutover is not written yet waits for it
(`cutover_hold_ms`); an unreachable owner answers NOT_LEADER_OR_FOLLOWER (retriable).

The start and its undo are startup.py's; a shard given or taken is shards.py's, the
uploader uploads.py's. Nothing is handed the service as such: each handler and runner
takes the port it needs (ports.py here, upkeep/ports.py), which the service satisfies.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import uuid
from contextlib import AbstractAsyncContextManager, AsyncExitStack

from kio.schema.errors import ErrorCode
from prometheus_client import CollectorRegistry

from proxy.apis.api03_metadata import TopicsAnswer
from proxy.apis.api24_add_partitions_to_txn import Key
from proxy.apis.fetch_split import TieredFetchResult
from proxy.config.tiering import TieringConfig
from proxy.handoff.objects import writer_prefix
from proxy.handoff.writer import S3WalReader, S3WalWriter
from proxy.lifecycle import start_or_undo
from proxy.markers.follower import MarkerFollower
from proxy.markers.verifier import TxnVerifier
from proxy.metadata.group import ShardAssignment
from proxy.metadata.state import MetadataState
from proxy.metadata.store import ShardOwner, ShardReader
from proxy.metadata.streams import shard_of
from proxy.metadata.topic_index import TopicIndex, drained_topics, stream_of
from proxy.metrics import Stages
from proxy.objects.bandwidth import Bandwidth
from proxy.objects.format import ObjectFormatError
from proxy.objects.store import ObjectStore, ObjectStoreError
from proxy.partition.owner import TieredPartition
from proxy.partition.partition_set import PartitionSet
from proxy.partition.produce_rules import ProduceRules
from proxy.partition.referenced import ReferencingLog
from proxy.partition.rules import ProduceResult
from proxy.partition.sequence_holes import ProducerBatch, SequenceHoles
from proxy.partition.txn_gate import Verify
from proxy.peer.clients import PeerClients
from proxy.peer.codec import CONFIGS_PROTOCOL
from proxy.peer.messages import AdminRequest, FetchRequest
from proxy.peer.server import PeerServer
from proxy.reads.blockcache import BlockCache
from proxy.reads.logcache import LogCache
from proxy.records.batches import CorruptBatchError
from proxy.routing.fleet import OLD_PEER_PROTOCOL
from proxy.tiered import shard_reads, shards
from proxy.tiered.beyond_cutover import BeyondCutover
from proxy.tiered.catch_up import catch_up, catch_up_producer
from proxy.tiered.changes import Changes
from proxy.tiered.hold import ProduceHold
from proxy.tiered.leader_epochs import LeaderEpochs
from proxy.tiered.owners import AtOwner, Part, ToOwner, not_owner, start_failed
from proxy.tiered.ports import SendToKafka, TieringHost
from proxy.tiered.reads import TieredReads
from proxy.tiered.startup import start_parts
from proxy.tiered.timestamps import OwnerAway, StreamSearch
from proxy.tiered.topic_configs import TopicConfigs
from proxy.tiered.uploads import UploadLoop
from proxy.upkeep.compactor import Compactor
from proxy.upkeep.cutover import CutoverLoop
from proxy.upkeep.log_cleaner import LogCleaner
from proxy.upkeep.orphan_sweep import OrphanSweep
from proxy.upkeep.retention import Retention
from proxy.upkeep.seals import Seals
from proxy.upload.plan import ObjectIdAllocator
from proxy.upload.uploader import Uploader
from proxy.wal.log import WriteAheadLog
from proxy.wal.port import Log
from proxy.wal.s3log import S3WriteAheadLog

log = logging.getLogger("tierproxy.tiering")

CONFIGS_WAIT_S = 2.0  # how long a config change waits for each member told of it
_NO_TOPIC_ID = uuid.UUID(int=0)


class TieringService:
    """The tiered service of one proxy. Its handlers and runners each see it through a
    narrow port (tiered/ports.py, upkeep/ports.py); the parts that exist once `start()`
    ran (startup.py) are None before."""

    def __init__(self, proxy: TieringHost, kafka_settings: dict) -> None:
        self._host = proxy
        self.config: TieringConfig = proxy.config.tiering
        self.name: str = proxy.config.fleet.name
        self.fleet = proxy.fleet
        self.registry: CollectorRegistry = proxy.metrics.registry
        # where a tiered produce's and fetch's time goes (docs/tiering.md)
        self.stages: Stages = proxy.metrics.produce_stages
        self.fetch_stages: Stages = proxy.metrics.fetch_stages
        self.kafka_settings = kafka_settings  # aiokafka's connection settings for Kafka
        shard_count = self.config.shard_count
        topic = self.config.metadata_topic
        self.readers = [
            ShardReader(
                kafka_settings,
                topic,
                k,
                shard_count,
                on_record=functools.partial(self._on_record, k),
            )
            for k in range(shard_count)
        ]
        self.claimed_epochs: dict[int, int] = {}  # shard -> this process's latest claim
        self.losing: set[int] = set()  # shards being given up (shards.lost): nothing started
        self._claims = shards.ClaimWatch(self)
        self.topics = TopicIndex([reader.state for reader in self.readers])
        self.in_flight: dict[str, int] = {}  # topic name -> passthrough produce in flight
        self._changes = Changes()  # the next metadata record (changes.py)
        self.log_cache = LogCache(self.config.log_cache_bytes)
        self.peers = PeerClients()
        self.allocate = ObjectIdAllocator.drawn()
        self._stack = AsyncExitStack()  # each started part's undo (startup.py)
        self._stopped = False
        self._zones_by_address: dict[tuple[str, int], str] = {}
        # the batches this proxy answered retriable without appending, to tell a sequence
        # gap it made from one the client made (sequence_holes.py; docs/sequencer.md)
        self.holes = SequenceHoles()
        # a produce to a stream not cut over or not started yet waits, in arrival order
        self.hold = ProduceHold(self)
        self.to_owner = ToOwner(self)  # a batch for a stream owned elsewhere (owners.py)
        self.at_owner = AtOwner(self)  # a peer's batch for a stream owned here
        self.cutover = CutoverLoop(self)
        self.seals = Seals(self)
        # tiered topics' configs, Kafka's: retention's and produce's (topic_configs.py)
        self.topic_configs = TopicConfigs(kafka_settings)
        self.retention = Retention(self)
        # Kafka's answers clamped at a tiered partition's cutover (beyond_cutover.py)
        self.beyond_cutover = BeyondCutover()
        # the partitions' current leader epochs, for ListOffsets answers (leader_epochs.py)
        self.leader_epochs = LeaderEpochs(proxy.partition_leader_epochs)
        # a partition's records above this are refused (MESSAGE_TOO_LARGE): one entry must
        # fit a WAL segment, and an S3-WAL object
        self.max_batch_bytes = min(self.config.wal_segment_bytes, self.config.s3wal_max_bytes)
        # the parts `start()` makes, in its order (startup.py)
        self.bandwidth: Bandwidth | None = None
        self.store: ObjectStore | None = None
        self.wal: WriteAheadLog | S3WriteAheadLog | None = None
        # the WAL as the partitions, the uploader and the reads see it: with the batches
        # taken by reference (local WAL; partition/referenced.py), else `wal` itself
        self.log: Log | None = None
        self.referencing: ReferencingLog | None = None
        self.partitions: PartitionSet | None = None
        self.block_cache: BlockCache | None = None
        self._reads: TieredReads | None = None
        self.peer_server: PeerServer | None = None
        self.s3wal_reader: S3WalReader | None = None
        self.s3wal: S3WalWriter | None = None
        self.uploads: UploadLoop | None = None
        self.assignment: ShardAssignment | None = None
        self.compactor: Compactor | None = None  # compactor.py; started once shards are owned
        self.log_cleaner: LogCleaner | None = None  # log_cleaner.py; compacted topics
        self.orphans: OrphanSweep | None = None  # orphan_sweep.py; runs on shard 0's owner
        # follows Kafka's log of the partitions owned here for transaction markers
        self.markers: MarkerFollower | None = None  # proxy/markers/
        # asks the coordinator before a transaction starts in a partition owned here (KIP-890)
        self.txn_verifier: TxnVerifier | None = None

    # -- lifecycle -----------------------------------------------------------------------

    async def start(self) -> None:
        """Start the parts in order (startup.py), each one's undo pushed on a stack as it
        starts. A step that fails (or a cancel) closes the stack: what the steps before it
        started, and the step's own part if it got that far; the error is raised."""
        await start_or_undo(lambda: start_parts(self, self._stack), self.stop)

    async def stop(self) -> None:
        """Stop what `start` started, in the reverse order (the stack's close), once: a
        second call does nothing."""
        if self._stopped:
            return
        self._stopped = True
        await self._stack.aclose()

    @property
    def reads(self) -> TieredReads:
        """The reads of tiered partitions; made by `start()` before any handler runs."""
        assert self._reads is not None, "the tiered service is not started"
        return self._reads

    @reads.setter
    def reads(self, reads: TieredReads) -> None:
        self._reads = reads

    @property
    def uploader(self) -> Uploader | None:
        """The uploader running now; None before the start, or between two."""
        return self.uploads.uploader if self.uploads is not None else None

    @property
    def peer_port(self) -> int:
        return self.peer_server.port if self.peer_server is not None else 0

    @property
    def advertised_peer_port(self) -> int:
        """The peer port the heartbeat tells the fleet: `advertised_peer_port` if set."""
        return self.config.advertised_peer_port or self.peer_port

    def drained(self) -> frozenset[str]:
        """What the heartbeat reports: tiered topics with no passthrough produce in flight."""
        return drained_topics(self.topics.topics(), self.in_flight)

    def uploader_lag(self) -> tuple[int, float] | None:
        """(WAL bytes not yet uploaded, seconds the oldest has waited), for the heartbeat."""
        uploader = self.uploader
        if uploader is None:
            return None
        return uploader.stats.backlog_bytes, round(uploader.backlog_seconds, 3)

    def dirty_shards(self) -> list[int]:
        """Shards this proxy owned last and did not hand over cleanly: its WAL may hold
        what it acknowledged for them, so the group gives them back to it."""
        return [
            r.shard for r in self.readers if r.state.owner == self.name and not r.state.released
        ]

    # -- shards --------------------------------------------------------------------------

    def shard_owner(self, shard: int) -> ShardOwner | None:
        """The shard's owner here; None while this proxy does not own it."""
        return self.assignment.owner(shard) if self.assignment is not None else None

    def owned_shards(self) -> dict[int, ShardOwner]:
        """The shards this proxy owns now, with their owners."""
        assignment = self.assignment
        if assignment is None:
            return {}
        return {k: o for k in assignment.owned() if (o := assignment.owner(k)) is not None}

    def owned_here(self, stream: int) -> bool:
        return self.shard_owner(shard_of(stream, self.config.shard_count)) is not None

    def is_sealed(self, stream: int) -> bool:
        return stream in self.seals

    async def recover_streams(self, state: MetadataState, streams: list[int]) -> None:
        """Rebuild and start partitions of one shard's streams (shards.py)."""
        await shards.recover_streams(self, state, streams)

    async def start_streams(self, shard: int, streams: list[int]) -> None:
        """Streams just cut over in a shard this proxy owns (one rebuild for all)."""
        assert self.partitions is not None
        owner = self.shard_owner(shard)
        streams = [s for s in streams if self.partitions.get(s) is None]
        if owner is not None and streams:
            await self.recover_streams(owner.state, streams)

    def at_leader(self, topic: str, partition: int) -> AbstractAsyncContextManager[SendToKafka]:
        """A connection of the proxy's own to a partition's leader (offsets.py asks Kafka
        for its part of a tiered log's MAX_TIMESTAMP)."""
        return self._host.at_leader(topic, partition)

    async def describe_topics(self, names: list[str]) -> TopicsAnswer:
        """What Kafka says of upstream topics, and which cluster said it."""
        return await self._host.describe_topics(names)

    # -- peers ---------------------------------------------------------------------------

    def count_peer_bytes(self, address: tuple[str, int], direction: str, size: int) -> None:
        owner_zone = self._zones_by_address.get(address)
        if owner_zone is None:
            for member in self.fleet.live():
                heartbeat = self.fleet.heartbeat(member.name)
                if heartbeat is not None and (member.host, heartbeat.peer_port) == address:
                    owner_zone = self._zones_by_address[address] = member.zone
        self._host.metrics.peer_bytes.labels(
            self._host.config.fleet.zone, owner_zone or "unknown", self.config.notify, direction
        ).inc(size)

    def owner_address(self, stream: int) -> tuple[str, int] | None:
        """Where the stream's owner takes peer requests; None if it is this proxy (its
        partition not started yet, or not any more) or not live."""
        owner = self.state(stream).owner
        if owner == self.name:
            return None
        return self.peer_address(owner)

    def peer_address(self, member: str) -> tuple[str, int] | None:
        """Where a live member of the fleet takes peer requests; None if it is not live
        or runs without tiering."""
        if not member:
            return None
        live = {m.name: m for m in self.fleet.live()}
        heartbeat = self.fleet.heartbeat(member)
        if member not in live or heartbeat is None or not heartbeat.peer_port:
            return None
        return live[member].host, heartbeat.peer_port

    def live_peers(self) -> list[str]:
        """The live members of the fleet but this proxy."""
        return [m.name for m in self.fleet.live() if m.name != self.name]

    @property
    def held_locations(self) -> int:
        """S3-WAL locations held for owners that may still need them (owners.HeldLocations)."""
        return self.to_owner.held.count

    @property
    def takes_references(self) -> bool:
        """This owner takes batches handed over by location by reference, from their
        header (docs/wal.md): a local WAL, `owner_takes_references`."""
        return self.config.owner_takes_references and self.config.wal_mode == "local"

    @property
    def sends_headers(self) -> bool:
        """Hand-offs by location carry the batch's header (an owner may take it by
        reference: its own choice): `owner_takes_references`."""
        return self.config.owner_takes_references

    def peer_protocol(self, member: str) -> int:
        """The peer protocol level of `member`, from its last heartbeat; a member not heard
        from counts as the oldest, so nothing it might refuse is sent to it."""
        heartbeat = self.fleet.heartbeat(member) if member else None
        return OLD_PEER_PROTOCOL if heartbeat is None else heartbeat.peer_protocol

    def fleet_at(self, level: int) -> bool:
        """Every live member of the fleet but this one is at peer protocol `level` or
        later (this one is)."""
        return all(
            self.peer_protocol(m.name) >= level for m in self.fleet.live() if m.name != self.name
        )

    @property
    def started_at(self) -> float:
        """When this proxy started (its heartbeat says it): in its S3-WAL writer id."""
        return self._host.started_at

    def live_writer_prefixes(self) -> tuple[str, ...]:
        """How the S3-WAL writer ids of the members alive now begin (objects.writer_prefix):
        their objects are theirs to delete (the orphan sweep leaves them)."""
        fleet = self._host.fleet
        prefixes = []
        for member in fleet.live():
            heartbeat = fleet.heartbeat(member.name)
            if heartbeat is not None:
                prefixes.append(writer_prefix(member.name, heartbeat.started_at))
        prefixes.append(writer_prefix(self.name, self.started_at))  # this one, heard or not
        return tuple(prefixes)

    def heard_protocol(self, member: str) -> int | None:
        """`member`'s peer protocol level from its last heartbeat; None if not heard from."""
        heartbeat = self.fleet.heartbeat(member) if member else None
        return None if heartbeat is None else heartbeat.peer_protocol

    async def read_everywhere(self, shard: int, offset: int, timeout_s: float) -> list[str]:
        """Every live member reads `shard` until every record below `offset` is applied
        (shard_reads.py): the members that did not within `timeout_s`."""
        return await shard_reads.read_everywhere(self, shard, offset, timeout_s)

    async def batch_base(self, stream: int, offset: int) -> int:
        """The base offset of the stream's batch holding `offset` (timestamps.py); `offset`
        when it cannot be read now (logged): the LSO then stops at the log start."""
        try:
            return await StreamSearch(self, stream).batch_holding(offset)
        except (OwnerAway, ObjectFormatError, ObjectStoreError, CorruptBatchError) as exc:
            log.warning("stream %d: the batch holding offset %d: %r", stream, offset, exc)
            return offset

    async def on_peer_fetch(self, request: FetchRequest) -> TieredFetchResult:
        """A peer's read of the tail of a stream owned here (reads.py)."""
        return await self.reads.serve_tail(request)

    async def on_peer_admin(self, request: AdminRequest) -> tuple[int, str]:
        """A peer's tier / untier / seal / unseal / deleted / look (upkeep/cutover.py), or
        configs: a topic's configs (no topic: every topic's) changed through that peer."""
        if request.op == "configs":
            self.topic_configs.changed([request.topic] if request.topic else None)
            return 0, f"the configs of {request.topic or 'every topic'} are read again"
        return await self.cutover.admin(request.op, request.topic, request.topic_id)

    async def configs_changed(self, topics: list[str] | None) -> None:
        """Before an AlterConfigs or IncrementalAlterConfigs Kafka answered is answered:
        these tiered topics' configs (None: every topic's) forgotten here and by every
        live member that reads the admin op configs, so that their next produces take
        the new ones (config_changes.py). A member not told in time is logged: it reads
        them again within a minute."""
        self.topic_configs.changed(topics)
        names: list[str] = [""] if topics is None else topics  # "": every topic's
        calls = [
            self._tell_configs(member, name)
            for member in self.live_peers()
            if self.peer_protocol(member) >= CONFIGS_PROTOCOL
            for name in names
        ]
        if calls:
            await asyncio.gather(*calls)

    async def _tell_configs(self, member: str, topic: str) -> None:
        address = self.peer_address(member)
        if address is None:
            return  # not live any more, or without tiering: it serves no tiered produce
        try:
            code, message = await self.peers.admin(
                address, "configs", topic, _NO_TOPIC_ID, timeout_s=CONFIGS_WAIT_S
            )
        except Exception as exc:  # unreachable (PeerUnavailable, OSError), late, or bad
            code, message = -1, repr(exc)
        if code != 0:
            log.warning(
                "%s not told the configs of %s changed (%s): it reads them again within a minute",
                member,
                topic or "every topic",
                message,
            )

    async def topic_deleted(self, topic: str, topic_id: uuid.UUID) -> tuple[int, str]:
        """Before a DeleteTopics Kafka answered with success is answered: the tiered
        topic dropped from the fleet (upkeep/cutover.py); (error code, message)."""
        return await self.cutover.topic_deleted(topic, topic_id)

    async def catch_up(self, keys: list[Key]) -> frozenset[Key]:
        """Before AddPartitionsToTxn is answered: these tiered partitions' transaction
        markers caught up at their owners (catch_up.py); those that failed."""
        return await catch_up(self, keys)

    async def catch_up_producer(self, producer_id: int) -> list[str]:
        """Before InitProducerId is answered: every tiered partition where the producer
        has a transaction open caught up at its owner (catch_up.py); what failed."""
        return await catch_up_producer(self, producer_id)

    # -- metadata changes ----------------------------------------------------------------

    def _on_record(self, shard: int, offset: int, verdict: object) -> None:
        self.topics.stale()
        self.notify()
        self._claims.record(shard)

    def notify(self) -> None:
        """Wake whoever waits in `changed`."""
        self._changes.notify()

    async def changed(self, timeout_s: float) -> None:
        """Wait for the next metadata record, at most `timeout_s`."""
        await self._changes.wait(timeout_s)

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
        records: memoryview | None,
        acks: int,
        timeout_ms: int,
        rules: ProduceRules | None = None,
        transactional_id: str | None = None,
        produce_version: int = -1,
    ) -> ProduceResult | None:
        """One partition of a Produce request for a tiered topic, checked against `rules`
        (`produce_rules`) already; None for acks=0. The owner stamps the batch if the topic
        uses LogAppendTime: here by `rules`, elsewhere by the owner's own. Its answer is
        recorded in `holes` (a retriable error: a drop; success: holes filled) before
        anything else runs: no later batch can be handed off without knowing it.
        `transactional_id` and `produce_version`: a transactional Produce's, for the
        owner's verification with the coordinator (KIP-890, `verifier_for`)."""
        found = self.topics.topic(topic)
        if found is None:  # untiered since the split: the client retries through Kafka
            return not_owner(f"topic {topic} is no longer tiered")
        if records is None:
            return ProduceResult(ErrorCode.invalid_request, error_message="null records")
        if partition < 0:  # Kafka's answer; no stream has such a partition
            return ProduceResult(
                ErrorCode.unknown_topic_or_partition,
                error_message=f"{found.name} has no partition {partition}",
            )
        stream = stream_of(found, partition)
        batch = ProducerBatch.of(records) if acks != 0 else None
        try:
            part = Part(
                found,
                partition,
                stream,
                batch,
                records,
                acks,
                timeout_ms,
                rules,
                transactional_id,
                produce_version,
            )
            result = await self._produce(part)
        except BaseException:
            self.holes.dropped(stream, batch)
            raise
        if result is not None:
            self.holes.observe(stream, batch, result.error_code)
        return result

    async def _produce(self, part: Part) -> ProduceResult | None:
        stream = part.stream
        assert self.partitions is not None
        if self.hold.needed(stream):  # not ready yet, or an earlier produce held (hold.py)
            refused = await self.hold.wait(part.topic, part.partition, stream)
            if refused is not None:
                return refused
        if stream in self.seals:
            return not_owner(f"{part.topic.name}-{part.partition} is being untiered")
        if self.partitions.get(stream) is not None:
            append_time = part.rules.log_append_time if part.rules is not None else None
            verify = self.verifier_for(stream, part.transactional_id, part.produce_version)
            partitions = self.partitions
            if self.to_owner.busy(stream):  # taken over here with batches on their way
                here = functools.partial(
                    partitions.produce, stream, part.records, part.acks, append_time, verify
                )
                return await self.to_owner.here_after_handoffs(
                    stream, part.batch, part.timeout_ms, here
                )
            return await partitions.produce(stream, part.records, part.acks, append_time, verify)
        why = self.not_served(stream)
        if why is not None:
            return not_owner(f"{part.topic.name}-{part.partition}: {why}")
        return await self.to_owner.send(part)

    def verifier_for(
        self, stream: int, transactional_id: str | None, produce_version: int
    ) -> Verify | None:
        """How the owner verifies a transactional batch of `stream` with the coordinator
        (KIP-890: txn_gate.py, markers/verifier.py); None: not verified (no transactional
        id, verification turned off, or not started)."""
        verifier = self.txn_verifier
        if verifier is None or transactional_id is None or produce_version < 0:
            return None
        info = self.state(stream).stream(stream)
        topic = None if info is None else self.topics.topic(info.topic_id)
        if info is None or topic is None:
            return None
        key = (topic.name, info.partition)
        return functools.partial(verifier.verify, transactional_id, produce_version, key)

    async def partition_here(
        self, stream: int, deadline: float | None = None
    ) -> TieredPartition | None:
        """The stream's partition if it is started here; one owned here and being started
        (its cutover just read, its shard just claimed, a failed start being retried) is
        waited for until `deadline` (else cutover_hold_ms: hold.py). None: not owned here,
        its start failed (`not_served`), or not started by the deadline. Every caller that
        needs the partition at the owner takes it here."""
        partitions = self.partitions
        if partitions is None:
            return None
        partition = partitions.get(stream)
        if partition is None and self.owned_here(stream):
            await self.hold.wait_for_partition(stream, deadline)
            partition = partitions.get(stream)
        return partition

    def not_served(self, stream: int) -> str | None:
        """Why a stream owned here is not served: its last start failed
        (`PartitionSet.not_rebuilt`, retried by the cutover loop); None otherwise, also when
        another proxy owns it (that is its owner's matter)."""
        failed = None if self.partitions is None else self.partitions.not_rebuilt.get(stream)
        if failed is None or not self.owned_here(stream):
            return None
        return start_failed(failed)

    def started(self, stream: int) -> bool:
        return self.partitions is not None and self.partitions.get(stream) is not None

    def start_failed(self, stream: int) -> bool:
        return self.partitions is not None and stream in self.partitions.not_rebuilt
