"""What the upkeep runners need of the tiered service, as narrow ports.

Each runner (seals, retention, trims, backfill, compactor, orphan sweep; cutover.py's
`CutoverHost` extends `SealHost` with what the cutover loop needs) is handed the tiered
service (proxy/tiered/service.py) but sees it only through the `typing.Protocol` below
that names the few capabilities it uses: the shards' metadata, the shards owned here,
the peers. So a runner can be given a small twin in a test, mypy checks what it reads,
and this package imports nothing from proxy/tiered/ (which starts the runners). The
service satisfies every port structurally: nothing here subclasses.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Protocol

from prometheus_client import CollectorRegistry

from proxy.apis.api03_metadata import TopicsAnswer
from proxy.cleaner.plan import CleanerConfig
from proxy.config.tiering import TieringConfig
from proxy.metadata.state import MetadataState
from proxy.metadata.store import ShardOwner, ShardReader
from proxy.metadata.topic_index import TopicIndex
from proxy.objects.bandwidth import Bandwidth
from proxy.objects.store import ObjectStore
from proxy.partition.owner import TieredPartition
from proxy.partition.partition_set import PartitionSet
from proxy.peer.clients import PeerClients
from proxy.reads.blockcache import BlockCache
from proxy.upkeep.retention_plan import RetentionConfig
from proxy.upload.uploader import Uploader


class Shards(Protocol):
    """The metadata shards as this proxy sees them: every shard read, some owned here."""

    @property
    def config(self) -> TieringConfig: ...

    @property
    def readers(self) -> Sequence[ShardReader]: ...

    def state(self, stream: int) -> MetadataState:
        """The metadata of the shard that holds `stream`."""
        ...

    def shard_owner(self, shard: int) -> ShardOwner | None:
        """The shard's owner here; None while this proxy does not own it."""
        ...

    def owned_shards(self) -> dict[int, ShardOwner]:
        """The shards this proxy owns now, with their owners."""
        ...


class UpkeepHost(Shards, Protocol):
    """The background passes over the object store (compactor.py, orphan_sweep.py)."""

    def live_writer_prefixes(self) -> tuple[str, ...]:
        """How the S3-WAL writer ids of the members alive now begin (objects.writer_prefix)."""
        ...

    @property
    def store(self) -> ObjectStore | None: ...

    @property
    def block_cache(self) -> BlockCache | None: ...

    @property
    def bandwidth(self) -> Bandwidth | None: ...

    @property
    def registry(self) -> CollectorRegistry:
        """Where the passes' metrics go (/metrics)."""
        ...


class Peers(Protocol):
    """The other proxies, reached through the peer protocol."""

    @property
    def peers(self) -> PeerClients: ...

    def peer_address(self, member: str) -> tuple[str, int] | None:
        """Where a live member takes peer requests; None if it is not live."""
        ...


class ShardsAndPeers(Shards, Peers, Protocol):
    """The shards and the proxies that own them elsewhere (`owner_or_peer`)."""


def owner_or_peer(service: ShardsAndPeers, shard: int) -> ShardOwner | tuple[str, int] | None:
    """Where a request about `shard` is served: its owner if this proxy owns it, else the
    peer address of the member its metadata names as owner; None if that member is not
    live (no live owner right now: the caller refuses with a retriable error)."""
    owner = service.shard_owner(shard)
    if owner is not None:
        return owner
    return service.peer_address(service.readers[shard].state.owner)


class OwnedPartitions(Protocol):
    """The partitions of the streams owned here (None before the start made them)."""

    @property
    def partitions(self) -> PartitionSet | None: ...


class TrimWriter(OwnedPartitions, Protocol):
    """What writing a trim asks (trims.write_trim)."""

    def fleet_at(self, level: int) -> bool:
        """Every live member of the fleet is at peer protocol `level` or later."""
        ...


class TrimHost(ShardsAndPeers, TrimWriter, Protocol):
    """DeleteRecords' trim of a stream (trims.py), at the owner of its shard."""

    @property
    def uploader(self) -> Uploader | None: ...

    async def batch_base(self, stream: int, offset: int) -> int:
        """The base offset of the stream's batch holding `offset` (`offset` itself when a
        batch begins there or none holds it): where Kafka's LSO lands past a log start."""
        ...

    async def partition_here(
        self, stream: int, deadline: float | None = None
    ) -> TieredPartition | None:
        """The stream's partition if it is started here, one owned here and being started
        waited for until `deadline` at most (tiered/hold.py); None if it is not served
        here."""
        ...

    async def read_everywhere(self, shard: int, offset: int, timeout_s: float) -> list[str]:
        """Every live member reads `shard` until every record below `offset` is applied
        (tiered/shard_reads.py): the members that did not within `timeout_s`."""
        ...


class BackfillHost(ShardsAndPeers, Protocol):
    """An offload job's commit (backfill.py), at the owner of the stream's shard."""

    @property
    def store(self) -> ObjectStore | None: ...


class RetentionHost(Shards, TrimWriter, Protocol):
    """The retention task (retention.py): trims the streams of the shards owned here."""

    @property
    def topic_configs(self) -> TopicConfigsPort: ...

    @property
    def block_cache(self) -> BlockCache | None: ...

    async def describe_topics(self, names: list[str]) -> TopicsAnswer:
        """What Kafka says of the upstream topics (topic ids, partition counts)."""
        ...


class TopicConfigsPort(Protocol):
    """Kafka's configs of tiered topics (proxy/tiered/topic_configs.py)."""

    async def get(
        self, topics: Collection[str], *, refresh: bool = False
    ) -> dict[str, RetentionConfig]:
        """Each topic's retention config; a topic Kafka does not describe is left out."""
        ...

    async def delete_below(self, topic: str, partition: int, offset: int) -> int:
        """Kafka's records of the partition below `offset` deleted; its low watermark."""
        ...


class SealHost(ShardsAndPeers, OwnedPartitions, Protocol):
    """Untier's seals (seals.py): close a topic's partitions where they are owned."""

    @property
    def name(self) -> str: ...

    @property
    def topics(self) -> TopicIndex: ...

    async def recover_streams(self, state: MetadataState, streams: list[int]) -> None: ...


class CleanerConfigsPort(Protocol):
    """Kafka's log cleaner configs of tiered topics (proxy/tiered/topic_configs.py)."""

    async def cleaner(
        self, topics: Collection[str], *, refresh: bool = False
    ) -> dict[str, CleanerConfig]:
        """Each topic's cleaner config; a topic Kafka does not describe is left out."""
        ...


class CleanerHost(UpkeepHost, Protocol):
    """The log cleaner of compacted topics (log_cleaner.py)."""

    @property
    def topic_configs(self) -> CleanerConfigsPort: ...
