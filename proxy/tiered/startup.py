"""The start of a tiered service (service.py), part by part.

Each part's undo is pushed on the service's `AsyncExitStack` as the part is started (or
just before, when a start that fails halfway leaves something to close), so `stop()` is
the stack's close: the parts stop in the reverse order, each only if it got that far,
and a start that fails midway (or is cancelled) closes exactly what it opened
(docs/ARCHITECTURE.md, "A start that fails"). The order of the pushes is the stop order
read backwards; three places where it matters:

- the compactor and the background loops are closed before the group is left: their
  commits go through the shards' owners;
- the uploader's restart loop is cancelled before the group is left, and the uploader
  closed after it: leaving uploads what the shards acknowledged (the release's flush),
  which must not race a restart;
- the partitions are closed after the group (leaving answers their appends in flight),
  the WAL after the partitions;
- the marker follower starts once the group gave this proxy its shards and stops before
  the group is left: the markers it appended (a catch-up answered) are in the WAL the
  release flushes, and none is appended after it (the next owner reads them again from
  Kafka's log, where they stay).
"""

from __future__ import annotations

import asyncio
import logging
from contextlib import AsyncExitStack
from typing import Protocol

from prometheus_client import CollectorRegistry

from proxy.apis.fetch_split import TieredFetchResult
from proxy.config.tiering import TieringConfig
from proxy.handoff.objects import writer_id_for
from proxy.handoff.writer import S3WalMetrics, S3WalReader, S3WalWriter
from proxy.lifecycle import settle
from proxy.markers.follower import MarkerFollower
from proxy.markers.verifier import TxnVerifier
from proxy.metadata.group import ShardAssignment, ensure_metadata_topic
from proxy.metrics import Stages
from proxy.objects.bandwidth import Bandwidth
from proxy.objects.local import LocalDirectoryStore
from proxy.objects.metrics import ObjectStoreMetrics
from proxy.objects.s3 import S3Store
from proxy.objects.store import ObjectStore
from proxy.partition.partition_set import PartitionSet
from proxy.partition.referenced import ReferencingLog
from proxy.partition.sequence_holes import SequenceHoles
from proxy.peer.messages import AdminRequest, FetchRequest
from proxy.peer.server import PeerServer
from proxy.reads.blockcache import BlockCache
from proxy.tiered import shards
from proxy.tiered.catch_up import CatchUpHost, catch_up_here
from proxy.tiered.owners import AtOwner, ToOwner
from proxy.tiered.reads import ReadsHost, TieredReads
from proxy.tiered.shard_reads import ShardReadHost, read_here
from proxy.tiered.shards import ShardsHost
from proxy.tiered.topic_configs import TopicConfigs
from proxy.tiered.uploads import UploadLoop, UploadsHost
from proxy.upkeep.backfill import commit_backfill
from proxy.upkeep.clean_job import commit_clean_job
from proxy.upkeep.compactor import Compactor
from proxy.upkeep.cutover import CutoverLoop
from proxy.upkeep.log_cleaner import LogCleaner
from proxy.upkeep.orphan_sweep import OrphanSweep
from proxy.upkeep.ports import BackfillHost, TrimHost, UpkeepHost
from proxy.upkeep.retention import Retention
from proxy.upkeep.trims import trim_stream
from proxy.upload.plan import ObjectIdAllocator
from proxy.wal.log import WriteAheadLog
from proxy.wal.port import Log
from proxy.wal.s3log import S3WalConfig, S3WriteAheadLog
from proxy.wal.s3log_objects import log_prefix
from proxy.wal.types import WalConfig

log = logging.getLogger("tierproxy.tiering")


class StartHost(
    ReadsHost,
    UploadsHost,
    ShardsHost,
    UpkeepHost,
    BackfillHost,
    TrimHost,
    CatchUpHost,
    ShardReadHost,
    Protocol,
):
    """The tiered service as its start sees it: what the parts are made of, and where
    each part, once made, is kept (None before)."""

    name: str
    kafka_settings: dict
    topic_configs: TopicConfigs
    holes: SequenceHoles
    stages: Stages  # where a tiered produce's time goes (ProxyMetrics.produce_stages)
    allocate: ObjectIdAllocator
    cutover: CutoverLoop
    retention: Retention
    at_owner: AtOwner
    to_owner: ToOwner
    bandwidth: Bandwidth | None
    store: ObjectStore | None
    wal: WriteAheadLog | S3WriteAheadLog | None
    log: Log | None
    referencing: ReferencingLog | None
    partitions: PartitionSet | None
    block_cache: BlockCache | None
    reads: TieredReads
    peer_server: PeerServer | None
    s3wal_reader: S3WalReader | None
    s3wal: S3WalWriter | None
    uploads: UploadLoop | None
    assignment: ShardAssignment | None
    compactor: Compactor | None
    log_cleaner: LogCleaner | None
    orphans: OrphanSweep | None
    markers: MarkerFollower | None
    txn_verifier: TxnVerifier | None

    @property
    def started_at(self) -> float: ...

    def dirty_shards(self) -> list[int]: ...

    async def on_peer_fetch(self, request: FetchRequest) -> TieredFetchResult: ...

    async def on_peer_admin(self, request: AdminRequest) -> tuple[int, str]: ...


async def open_store(
    config: TieringConfig, registry: CollectorRegistry | None = None
) -> ObjectStore:
    """The configured store; an S3 store counts its requests on `registry` (/metrics)."""
    settings = config.object_store
    if settings.kind == "s3":
        assert settings.s3 is not None
        return await S3Store.open(settings.s3, metrics=ObjectStoreMetrics(registry))
    return LocalDirectoryStore(settings.directory)


FETCHED_DIRECTORY = "fetched"  # under wal.directory: the bytes of batches taken by reference


async def open_wal(
    config: TieringConfig, name: str, store: ObjectStore
) -> WriteAheadLog | S3WriteAheadLog:
    """The local WAL, or in `wal.mode: s3` the log in the store (no local disk: the ack
    waits for a PUT, docs/wal.md)."""
    if config.wal_mode == "s3":
        s3_config = S3WalConfig(
            log_prefix(name),
            capacity_bytes=config.wal_capacity_bytes,
            max_object_bytes=config.s3wal_max_bytes,
        )
        return await S3WriteAheadLog.open(s3_config, store)
    config.wal_directory.mkdir(parents=True, exist_ok=True)
    return await WriteAheadLog.open(
        WalConfig(
            str(config.wal_directory),
            segment_bytes=config.wal_segment_bytes,
            capacity_bytes=config.wal_capacity_bytes,
        )
    )


async def open_log(
    config: TieringConfig, wal: WriteAheadLog | S3WriteAheadLog, reader: S3WalReader
) -> tuple[Log, ReferencingLog | None]:
    """The WAL as the partitions see it: over the local WAL, the batches taken by
    reference, their bytes fetched into `wal.directory`/fetched (partition/referenced.py);
    opened whether or not new ones are taken (`owner_takes_references`), as the WAL may
    hold references from before. `wal.mode: s3` takes none: the WAL itself."""
    if config.wal_mode == "s3":
        return wal, None
    directory = config.wal_directory / FETCHED_DIRECTORY
    directory.mkdir(parents=True, exist_ok=True)
    fetched = await WriteAheadLog.open(
        WalConfig(
            str(directory),
            segment_bytes=config.wal_segment_bytes,
            capacity_bytes=config.wal_capacity_bytes,
        )
    )
    try:  # new batches by reference while their bytes stay below half the WAL's capacity
        room = config.wal_capacity_bytes // 2
        referencing = await ReferencingLog.open(wal, fetched, reader, room_bytes=room)
    except BaseException:
        await fetched.close()
        raise
    return referencing, referencing


def run_task(stack: AsyncExitStack, coroutine, name: str) -> asyncio.Task[None]:
    """Start a background task whose undo (cancel, then wait for it) is on `stack`. One
    that ends with an exception says so at once (ERROR, with its traceback): before, a
    dead cutover loop was silent until the proxy stopped, and nothing was cut over."""
    task = asyncio.create_task(coroutine, name=name)
    task.add_done_callback(_said_if_failed)

    async def cancel() -> None:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    stack.push_async_callback(cancel)
    return task


def _said_if_failed(task: asyncio.Task[None]) -> None:
    if task.cancelled() or task.exception() is None:
        return
    log.error("background task %s ended: %r", task.get_name(), task.exception(),
              exc_info=task.exception())  # fmt: skip


async def start_parts(service: StartHost, stack: AsyncExitStack) -> None:
    """Start the service's parts in order, each one's undo pushed on `stack`."""
    config, registry = service.config, service.registry
    stack.push_async_callback(settle, (reader.close() for reader in service.readers))
    stack.push_async_callback(service.topic_configs.close)
    await ensure_metadata_topic(service.kafka_settings, config.metadata_topic, config.shard_count)
    await settle(reader.start() for reader in service.readers)
    await settle(reader.caught_up() for reader in service.readers)
    bandwidth = service.bandwidth = Bandwidth(
        config.bandwidth_bytes_per_s, config.bandwidth_burst_bytes, registry
    )
    stack.callback(bandwidth.close)
    store = service.store = await open_store(config, registry)
    stack.push_async_callback(store.close)
    wal = service.wal = await open_wal(config, service.name, store)
    stack.push_async_callback(wal.close)
    service.s3wal_reader = S3WalReader(store)
    the_log, referencing = await open_log(config, wal, service.s3wal_reader)
    service.log, service.referencing = the_log, referencing
    if referencing is not None:
        stack.push_async_callback(referencing.close)  # before the WAL's own close
    partitions = service.partitions = PartitionSet(
        the_log,
        on_broken=shards.partition_broken,
        log_cache=service.log_cache,
        holes=service.holes,
        stages=service.stages,
    )
    stack.push_async_callback(partitions.close)
    if referencing is not None:
        referencing.on_fetched = partitions.fetched
        referencing.skip = partitions.stale  # a disowned stream's entries: never fetched
    for reader in service.readers:  # before the uploader reads the WAL
        if reader.state.owner not in ("", service.name):
            shards.disown(service, reader.state, reader.state.owner)
    if config.transaction_partition_verification:  # before a partition is owned here
        verifier = service.txn_verifier = TxnVerifier(service.kafka_settings, registry)
        stack.push_async_callback(verifier.close)
        await verifier.start()
    cache = service.block_cache = BlockCache(
        store, capacity_bytes=config.block_cache_bytes, registry=registry
    )
    stack.push_async_callback(cache.close)
    service.reads = TieredReads(service, cache, service.log_cache)
    await _start_peer_listener(service, stack)
    if config.notify == "s3":
        s3wal = service.s3wal = S3WalWriter(
            store,
            writer_id_for(service.name, service.started_at),
            max_delay_s=config.s3wal_max_delay_ms / 1000,
            idle_s=config.s3wal_idle_ms / 1000,
            max_bytes=config.s3wal_max_bytes,
            metrics=S3WalMetrics(registry),
            stages=service.stages,
        )
        stack.push_async_callback(s3wal.close)
        stack.push_async_callback(service.to_owner.held.close)  # before the writer's close
    uploads = service.uploads = UploadLoop(
        service, the_log, store, service.allocate, stale=partitions.stale
    )
    stack.push_async_callback(uploads.close)
    assignment = service.assignment = ShardAssignment(
        service.kafka_settings,
        config.metadata_topic,
        config.shard_count,
        service.name,
        group_id=config.group,
        session_timeout_ms=config.session_timeout_ms,
        dirty_shards=service.dirty_shards,
        on_owned=lambda shard, owner: shards.owned(service, owner),
        on_lost=lambda shard: shards.lost(service, shard),
        on_release=uploads.release,
        unclean_takeover_after_s=config.unclean_takeover_after_s,
    )
    stack.push_async_callback(assignment.close)  # hands the shards over, all uploaded
    run_task(stack, uploads.run(), "uploader")  # cancelled first: no restart races the hand-over
    await assignment.start()
    markers = service.markers = MarkerFollower(service, registry)
    stack.push_async_callback(markers.close)  # before the group is left (docstring)
    await markers.start()
    compactor = service.compactor = Compactor.for_service(service, service.allocate)
    stack.push_async_callback(compactor.close)
    compactor.start()
    run_task(stack, service.cutover.run(), "cutover")
    run_task(stack, service.retention.run(), "retention")
    log_cleaner = service.log_cleaner = LogCleaner(service, service.allocate, compactor.lock)
    stack.callback(log_cleaner.close)
    run_task(stack, log_cleaner.run(), "log-cleaner")
    orphans = service.orphans = OrphanSweep.for_service(service)
    run_task(stack, orphans.run(), "orphan-sweep")


async def _start_peer_listener(service: StartHost, stack: AsyncExitStack) -> None:
    """The peer listener, its handlers the service's; the peer clients close after it."""
    config = service.config
    stack.push_async_callback(service.peers.close)
    server = service.peer_server = PeerServer(
        config.peer_bind_host,
        config.peer_port,
        service.at_owner.append,
        service.on_peer_admin,
        service.on_peer_fetch,
        on_backfill=lambda request: commit_backfill(service, request),
        on_clean_commit=lambda request: commit_clean_job(service, service.log_cleaner, request),
        on_trim=lambda request: trim_stream(service, request),
        on_catch_up=lambda request: catch_up_here(service, request),
        on_producers=service.reads.producers_here,
        on_shard_read=lambda request: read_here(service, request),
        on_held=service.at_owner.held,
        name=service.name,
    )
    stack.push_async_callback(server.close)
    await server.start()
