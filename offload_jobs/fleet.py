"""What an offload job's driver asks the fleet (docs/offload.md): the backfill gaps or the
committed ranges of a tiered topic, read from the metadata topic, its configs, and the
commits of the objects its tasks wrote, handed to a proxy's peer listener (the owner of
each stream's shard writes them).

asyncio lives here, on the driver only; executors never import this module.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field

from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

from proxy.kafka.topic_configs import cleanup_policies
from proxy.metadata.reader import ShardReader
from proxy.metadata.records import TopicMode
from proxy.metadata.state import MetadataState
from proxy.metadata.streams import StreamInfo, shard_of
from proxy.peer.clients import PeerClients, PeerUnavailable
from proxy.peer.messages import CleanCommitRequest


class NotTiered(LookupError):
    """The topic has no tiered partition the fleet's metadata knows."""


@dataclass(frozen=True, slots=True)
class PartitionGaps:
    partition: int
    stream_id: int
    log_start_offset: int
    cutover_offset: int
    gaps: tuple[tuple[int, int], ...]  # [start, end) of [log start, cutover) in no object


@dataclass(frozen=True, slots=True)
class TopicGaps:
    topic: str
    topic_id: uuid.UUID
    partitions: tuple[PartitionGaps, ...]  # the cut-over partitions, by number


async def topic_configs(kafka_settings: dict, topic: str, names: Sequence[str]) -> dict:
    """The topic's configs `names` as Kafka resolves them (name -> value)."""
    admin = AIOKafkaAdminClient(**kafka_settings)
    await admin.start()
    try:
        resource = ConfigResource(ConfigResourceType.TOPIC, topic, dict.fromkeys(names))
        [response] = await admin.describe_configs([resource])
    finally:
        await admin.close()
    [(error_code, message, _, _, entries)] = response.resources
    if error_code != 0:
        raise LookupError(f"topic {topic}: DescribeConfigs answers {error_code} {message}")
    return {e[0]: e[1] for e in entries if e[0] in names}


async def is_compacted(kafka_settings: dict, topic: str) -> bool:
    """Whether the topic's cleanup.policy holds `compact`: Kafka's cleaner leaves offset
    holes in its log, which a migration read from the cluster must then take
    (`ReaderSettings.allow_gaps`); in any other topic a hole is a fault."""
    policy = (await topic_configs(kafka_settings, topic, ["cleanup.policy"])).get("cleanup.policy")
    return "compact" in cleanup_policies(policy)


async def read_states(
    kafka_settings: dict, metadata_topic: str, shard_count: int, *, timeout_s: float = 120.0
) -> list[MetadataState]:
    """Every shard of the metadata as it says now (read to its end, committed records
    only). TimeoutError if the metadata topic cannot be read to its end in `timeout_s` (a
    wrong name waits for partitions that never come)."""
    readers = [
        ShardReader(kafka_settings, metadata_topic, k, shard_count) for k in range(shard_count)
    ]
    try:
        async with asyncio.timeout(timeout_s):
            await asyncio.gather(*(reader.start() for reader in readers))
            await asyncio.gather(*(reader.read_to_end() for reader in readers))
        return [reader.state for reader in readers]
    finally:
        await asyncio.gather(*(reader.close() for reader in readers))


def topic_streams(
    states: Sequence[MetadataState], metadata_topic: str, topic: str
) -> tuple[uuid.UUID, list[tuple[MetadataState, StreamInfo]]]:
    """The tiered topic's id and its cut-over partitions' streams, each with its shard's
    state; NotTiered if there are none."""
    topic_id = None
    for state in states:
        for known in state.topic_ids():
            mode = state.topic(known)
            if mode is not None and mode.topic == topic and mode.mode is TopicMode.TIERED:
                topic_id = known
    if topic_id is None:
        raise NotTiered(
            f"topic {topic} is not tiered in metadata topic {metadata_topic} "
            "(tierproxy topics tier it first; the migration moves what is below its cutover)"
        )
    found = []
    for state in states:
        for stream in state.stream_ids():
            info = state.stream(stream)
            if info is not None and info.topic_id == topic_id:
                found.append((state, info))
    if not found:
        raise NotTiered(f"topic {topic} is tiered but no partition is cut over yet")
    return topic_id, sorted(found, key=lambda f: f[1].partition)


async def read_gaps(
    kafka_settings: dict,
    metadata_topic: str,
    shard_count: int,
    topic: str,
    *,
    timeout_s: float = 120.0,
) -> TopicGaps:
    """The topic's tiered partitions and what each still needs from Kafka, as every shard
    of the metadata says now (`read_states`)."""
    states = await read_states(kafka_settings, metadata_topic, shard_count, timeout_s=timeout_s)
    topic_id, streams = topic_streams(states, metadata_topic, topic)
    found = []
    for state, info in streams:
        assert shard_of(info.stream_id, shard_count) == state.shard
        gaps = tuple(state.backfill_gaps(info.stream_id))
        found.append(
            PartitionGaps(
                info.partition, info.stream_id, info.log_start_offset, info.cutover_offset, gaps
            )
        )
    return TopicGaps(topic, topic_id, tuple(found))


@dataclass(frozen=True, slots=True)
class ObjectToCommit:
    object_id: int
    size: int
    stream_id: int
    start_offset: int
    end_offset: int


@dataclass
class CommitOutcome:
    committed: int = 0
    already: int = 0  # the same object was committed before (a re-run)
    refused: list[str] = field(default_factory=list)  # each with the owner's reason


async def commit_objects(
    peer: tuple[str, int], objects: Sequence[ObjectToCommit], *, timeout_s: float = 60.0
) -> CommitOutcome:
    """Ask the proxy at `peer` to commit each object through its shard's owner, a stream's
    objects in offset order (backfill may come in any order; this order makes a log read
    from the lowest offset usable as early as possible)."""
    outcome = CommitOutcome()
    clients = PeerClients(admin_timeout_s=timeout_s)
    try:
        for o in sorted(objects, key=lambda o: (o.stream_id, o.start_offset)):
            code, message = await clients.backfill(
                peer, o.object_id, o.size, o.stream_id, o.start_offset, o.end_offset
            )
            if code != 0:
                outcome.refused.append(f"error {code}: {message}")
            elif message.endswith("committed already"):
                outcome.already += 1
            else:
                outcome.committed += 1
    finally:
        await clients.close()
    return outcome


async def commit_cleaned(
    peer: tuple[str, int], requests: Sequence[CleanCommitRequest], *, timeout_s: float = 300.0
) -> list[tuple[int, int, str]]:
    """Ask the proxy at `peer` to commit each stream's cleaned objects through its shard's
    owner: (stream, error code, message) per request. A request the peer cannot be asked
    (connection lost, no answer in `timeout_s`) is answered -1 with the reason: its
    outcome is not known (the orphan sweep deletes objects no commit names)."""
    out = []
    clients = PeerClients(admin_timeout_s=timeout_s)
    try:
        for request in requests:
            try:
                code, message = await clients.clean_commit(peer, request)
            except (OSError, TimeoutError, PeerUnavailable) as exc:
                code, message = -1, f"no answer from {peer[0]}:{peer[1]}: {exc!r}"
            out.append((request.stream_id, code, message))
    finally:
        await clients.close()
    return out
