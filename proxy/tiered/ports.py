"""What the tiered handlers need of the tiered service, and what the service needs of
the proxy it runs in: narrow `typing.Protocol` ports (upkeep/ports.py holds the upkeep
runners' ones).

A Kafka API's tiered handler (produce.py, fetch.py, offsets.py, epochs.py, deletes.py)
and the metrics (metrics.py) are handed the service but see only the capabilities their
port names, so each is checked by mypy and can be given a small twin in a test. The
service in turn sees the proxy (server/app.py) only as a `TieringHost`: it imports
nothing from proxy/server/. Ports whose types would import this module back live beside
their consumer: `ReadsHost` (reads.py), `TxnHost` (txn.py), `StartHost`
(startup.py), and the small ones of owners.py, shards.py and uploads.py.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import Protocol

from proxy.apis.api03_metadata import TopicsAnswer
from proxy.config import ProxyConfig
from proxy.config.tiering import TieringConfig
from proxy.handoff.reader import S3WalReader
from proxy.metadata.state import MetadataState
from proxy.metadata.topic_index import TopicIndex
from proxy.metrics import ProxyMetrics, Stages
from proxy.objects.bandwidth import Bandwidth
from proxy.partition.partition_set import PartitionSet
from proxy.partition.produce_rules import ProduceRules
from proxy.partition.referenced import ReferencingLog
from proxy.partition.rules import ProduceResult
from proxy.reads.logcache import LogCache
from proxy.routing.fleet import FleetView
from proxy.tiered.beyond_cutover import BeyondCutover
from proxy.tiered.leader_epochs import LeaderEpochs
from proxy.tiered.reads import TieredReads
from proxy.upkeep.ports import TopicConfigsPort, TrimHost
from proxy.upload.uploader import Uploader
from proxy.wal.log import WriteAheadLog
from proxy.wal.s3log import S3WriteAheadLog

SendToKafka = Callable[[object], Awaitable[memoryview]]


class TieringHost(Protocol):
    """The proxy a tiered service runs in (server/app.py's `Proxy`)."""

    @property
    def config(self) -> ProxyConfig: ...

    @property
    def metrics(self) -> ProxyMetrics: ...

    @property
    def fleet(self) -> FleetView: ...

    @property
    def started_at(self) -> float:
        """Wall-clock seconds the proxy started at (its heartbeat's)."""
        ...

    async def describe_topics(self, names: list[str]) -> TopicsAnswer: ...

    async def partition_leader_epochs(self, name: str) -> dict[int, int]: ...

    def at_leader(self, topic: str, partition: int) -> AbstractAsyncContextManager[SendToKafka]:
        """A connection of the proxy's own to the partition's leader: a request -> the
        body of its answer (LookupError: no leader; OSError: not reached)."""
        ...


class TieredMetadata(Protocol):
    """The tiered topics and their streams' metadata, as every proxy reads them."""

    @property
    def topics(self) -> TopicIndex: ...

    def state(self, stream: int) -> MetadataState:
        """The metadata of the shard that holds `stream`."""
        ...

    async def changed(self, timeout_s: float) -> None:
        """Wait for the next metadata record, at most `timeout_s`."""
        ...


class ReadHandlers(TieredMetadata, Protocol):
    """Fetch, ListOffsets and OffsetForLeaderEpoch on tiered partitions (fetch.py,
    offsets.py, epochs.py, timestamps.py)."""

    @property
    def fetch_stages(self) -> Stages: ...

    @property
    def reads(self) -> TieredReads: ...

    @property
    def partitions(self) -> PartitionSet | None: ...

    @property
    def beyond_cutover(self) -> BeyondCutover: ...

    @property
    def leader_epochs(self) -> LeaderEpochs: ...

    def at_leader(self, topic: str, partition: int) -> AbstractAsyncContextManager[SendToKafka]:
        """As `TieringHost.at_leader`: Kafka's own answers about its part of a log."""
        ...


class DeletesHost(ReadHandlers, TrimHost, Protocol):
    """DeleteRecords on tiered partitions (deletes.py): checked like a read, then
    trimmed at each stream's owner (upkeep/trims.py)."""

    @property
    def topic_configs(self) -> TopicConfigsPort: ...


class ProduceHost(Protocol):
    """Produce on tiered partitions (produce.py)."""

    @property
    def topics(self) -> TopicIndex: ...

    @property
    def bandwidth(self) -> Bandwidth | None: ...

    @property
    def max_batch_bytes(self) -> int: ...

    @property
    def stages(self) -> Stages: ...

    def is_tiered(self, topic: str | uuid.UUID, partition: int) -> bool: ...

    async def produce_rules(self, topic: str | uuid.UUID) -> ProduceRules | None: ...

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
    ) -> ProduceResult | None: ...


class MetricsHost(Protocol):
    """What /metrics shows of the tiered service (metrics.py)."""

    @property
    def config(self) -> TieringConfig: ...

    @property
    def wal(self) -> WriteAheadLog | S3WriteAheadLog | None: ...

    @property
    def uploader(self) -> Uploader | None: ...

    @property
    def s3wal_reader(self) -> S3WalReader | None: ...

    @property
    def log_cache(self) -> LogCache: ...

    @property
    def beyond_cutover(self) -> BeyondCutover: ...

    @property
    def referencing(self) -> ReferencingLog | None: ...

    @property
    def held_locations(self) -> int: ...
