"""What a tiered service does when the group (metadata/group.py) gives it a metadata
shard or takes one away (docs/tiering.md, "Shard owners"): the partitions of the shard's
streams are rebuilt and started here, or stopped. The release of a shard (its uploads
committed first) is the uploads' (uploads.py).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Protocol

from proxy.markers.upstream_log import SEED_TIMEOUT_S, TIMEOUT_S, UpstreamLog
from proxy.metadata.records import TopicMode, TopicModeSet
from proxy.metadata.state import MetadataState
from proxy.metadata.store import ShardOwner, ShardReader
from proxy.metadata.streams import shard_of, topic_shard
from proxy.metadata.topic_index import TopicIndex
from proxy.objects.store import ObjectStore
from proxy.partition.committed import committed_blocks
from proxy.partition.partition_set import PartitionSet
from proxy.partition.rules import RecoveryError

log = logging.getLogger("tierproxy.tiering")


class ShardsHost(Protocol):
    """What the shard callbacks need of the tiered service."""

    @property
    def name(self) -> str: ...

    @property
    def readers(self) -> Sequence[ShardReader]: ...

    @property
    def partitions(self) -> PartitionSet | None: ...

    @property
    def store(self) -> ObjectStore | None: ...

    @property
    def kafka_settings(self) -> dict: ...

    @property
    def topics(self) -> TopicIndex: ...

    @property
    def claimed_epochs(self) -> dict[int, int]:
        """shard -> the latest epoch at which this process claimed it (owned())."""
        ...

    @property
    def losing(self) -> set[int]:
        """The shards being given up (from `lost` until `owned` again): no stream of theirs
        is started, whichever rebuild ends meanwhile (their owner still commits what it
        holds before it releases them)."""
        ...

    def is_sealed(self, stream: int) -> bool:
        """Whether an untier sealed the stream (upkeep/seals.py): it is not started."""
        ...

    def notify(self) -> None:
        """Wake whoever waits for a change (a partition started)."""
        ...

    async def batch_base(self, stream: int, offset: int) -> int:
        """The base offset of the stream's batch holding `offset` (TieringService)."""
        ...


async def owned(service: ShardsHost, owner: ShardOwner) -> None:
    """A shard became this proxy's: rebuild and start its streams' partitions. When
    another member claimed it since this one last did, what this one's WAL holds of its
    streams is not their log (an unclean takeover went on without it): disowned first."""
    epochs = service.claimed_epochs
    epochs[owner.shard] = max(epochs.get(owner.shard, 0), owner.epoch)
    service.losing.discard(owner.shard)
    if owner.previous_owner not in ("", service.name):
        disown(service, owner.state, owner.previous_owner)
    await recover_streams(service, owner.state, owner.state.stream_ids())


def disown(service: ShardsHost, state: MetadataState, since: str) -> None:
    """The WAL entries of the shard's streams written so far are stale: `since` owned the
    shard after this member (PartitionSet.disown)."""
    partitions = service.partitions
    assert partitions is not None  # the service is started
    log.debug(
        "metadata shard %d: %s owned it since %s did: the WAL entries of its streams written "
        "before are not used (uploaded or lost with its takeover)",
        *(state.shard, since, service.name),
    )
    partitions.disown(s for s in state.stream_ids() if partitions.get(s) is None)


def claimed_elsewhere(service: ShardsHost, shard: int) -> None:
    """When another member claimed the shard after this process last did (at a later
    epoch): the WAL entries this member wrote for its streams, not served here now, are
    stale (disown). Called when the shard's reader reads a claim, and once a lost shard's
    partitions are stopped, whichever comes last: a member paused past the takeover bound
    learns both on resuming, in either order, and its uploader would otherwise try their
    entries again and again and hold the WAL until it claims the shard again. Harmless
    after a clean hand-over (its entries are uploaded); never wrong, as a later claim of
    another member makes them not the streams' log whatever happens next (owned() would
    disown them at this member's next claim). The epoch, not only the name: the
    service's reader may not have read this process's own newer claim yet, and the
    entries written under it are the log."""
    state = service.readers[shard].state
    if state.owner in ("", service.name):
        return
    if state.epoch <= service.claimed_epochs.get(shard, 0):
        return  # a claim from before this process's own last one
    try:
        disown(service, state, state.owner)
    except Exception:  # the metadata reader calls this: it must go on
        log.exception("metadata shard %d: disowning its streams' WAL entries failed", shard)


class ClaimWatch:
    """Calls `claimed_elsewhere` when a shard's last claim changes hands, as the service's
    reader of the shard applies a record (its `on_record`): a check per record, the
    disowning only when the owner changed. Before the service's partitions exist (its
    start), nothing: the start disowns what its readers' states say."""

    def __init__(self, service: ShardsHost) -> None:
        self._service = service
        self._owners: dict[int, str] = {}  # shard -> its last claim's owner, last looked at

    def record(self, shard: int) -> None:
        owner = self._service.readers[shard].state.owner
        if owner == self._owners.get(shard):
            return
        self._owners[shard] = owner
        if self._service.partitions is not None:
            claimed_elsewhere(self._service, shard)


def _mode(service: ShardsHost, state: MetadataState, stream: int) -> TopicModeSet | None:
    """The mode record of the stream's topic, if the stream is in `state` (the owner's:
    the service's reader of the shard may not have read a cutover just written) and the
    record is read (the topic's shard's reader: a topic is tiered before its cutover)."""
    info = state.stream(stream)
    if info is None:
        return None
    readers = service.readers
    return readers[topic_shard(info.topic_id, len(readers))].state.topic(info.topic_id)


def _dropped(service: ShardsHost, state: MetadataState, stream: int) -> bool:
    """The stream's topic was deleted in Kafka (its mode record says DELETED), its
    StreamUntier not written yet: the stream is only dropped, whatever it holds, so it is
    not started. Rebuilding it could need Kafka's log of a topic that is gone: that
    failure kept the whole shard from being owned, and so from dropping it."""
    mode = _mode(service, state, stream)
    if mode is None or mode.mode is not TopicMode.DELETED:
        return False
    log.info("stream %d of deleted topic %s not started: it is dropped", stream, mode.topic)
    return True


async def recover_streams(service: ShardsHost, state: MetadataState, streams: list[int]) -> None:
    """Rebuild and start partitions of one shard's streams: from the metadata, the WAL
    and, for what the WAL no longer holds, the committed objects' batch headers; a
    stream that starts from its cutover, from the producers of Kafka's log below it too
    (partition/carried.py)."""
    partitions, store = service.partitions, service.store
    assert partitions is not None and store is not None  # the service is started
    count, losing, epochs = len(service.readers), service.losing, service.claimed_epochs
    # a shard being given up starts nothing (`lost`), and a stream starts only under the
    # claim it was rebuilt for: one claimed again meanwhile is left to the retry of
    # failed starts (PartitionSet.recover), which rebuilds it from the new claim's state
    claims = {s: epochs.get(shard_of(s, count)) for s in streams}
    streams = [
        s
        for s in streams
        if shard_of(s, count) not in losing
        and not service.is_sealed(s)
        and not _dropped(service, state, s)
    ]

    def read_committed(stream: int, start: int, end: int):
        return committed_blocks(store, state, stream, start, end)

    upstream = UpstreamLog(service.kafka_settings)  # connected if a rebuild reads Kafka

    async def read_upstream(stream: int, lowest: int | None, end: int):
        info = state.stream(stream)
        # an untiered topic's stream is rebuilt until its StreamUntier (which a stream
        # holding records past its cutover never gets): its mode record names it
        mode = _mode(service, state, stream)
        if info is None or mode is None or mode.mode is TopicMode.DELETED:
            raise RecoveryError(f"stream {stream}: its topic is not known, or deleted")
        if lowest is not None:  # a transaction open at the cutover: needed
            return await upstream.tail(mode.topic, info.partition, end, lowest, TIMEOUT_S)
        # only the idempotent producers': not long, the rebuild goes on without them. The
        # read ends at its deadline with what it read; this bound, a second longer, holds
        # connecting and metadata too, which the read's own deadline does not
        async with asyncio.timeout(SEED_TIMEOUT_S + 1):
            return await upstream.tail(mode.topic, info.partition, end, None, SEED_TIMEOUT_S)

    def may_start(stream: int) -> bool:  # its shard neither given up nor claimed again
        shard = shard_of(stream, count)
        return shard not in losing and epochs.get(shard) == claims[stream]

    failed: Exception | None = None
    try:
        await partitions.recover(
            streams,
            state,
            read_committed=read_committed,
            read_upstream=read_upstream,
            may_start=may_start,
        )
    except Exception as exc:  # the others were started: noted below all the same
        failed = exc
    finally:
        await upstream.close()
    for stream in streams:  # a transaction open below a log start inside a batch
        partition = partitions.get(stream)
        if partition is not None and partition.opened_below(partition.log_start_offset):
            start = partition.log_start_offset
            partition.note_start_batch(start, await service.batch_base(stream, start))
    service.notify()
    if failed is not None:
        raise failed


async def lost(service: ShardsHost, shard: int) -> None:
    """A shard is being taken away: stop its partitions (in-flight appends answered)."""
    partitions = service.partitions
    assert partitions is not None
    service.losing.add(shard)  # a rebuild ending from now on starts nothing of it
    count = len(service.readers)
    streams = set(service.readers[shard].state.stream_ids())
    streams.update(s for s in partitions.known() if shard_of(s, count) == shard)  # cut over
    # just now, which the reader may not have read yet; each one started, being rebuilt
    # (not started when it ends) or whose start failed (not this proxy's to retry now)
    started = [s for s in streams if partitions.get(s) is not None]
    await asyncio.gather(*(partitions.remove(s) for s in started))  # each closed at once
    for stream in streams.difference(started):
        await partitions.remove(stream)  # nothing to close: forgotten, no task each
    claimed_elsewhere(service, shard)


def partition_broken(stream: int, error: BaseException) -> None:
    log.error("stream %d: the WAL failed (%r); restart this proxy", stream, error)
