"""Which topics are tiered, by name and by id, from every shard's metadata (pure).

Topic modes are spread over the shards (`topic_shard`); a proxy follows them all and asks
this index, per Produce partition, whether the topic is tiered and which stream it is.
Rebuilt from the shards' states when any of them changed; no I/O.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from dataclasses import dataclass

from proxy.metadata.records import TopicMode, TopicModeSet
from proxy.metadata.state import MetadataState
from proxy.metadata.streams import shard_of, stream_id


@dataclass(frozen=True, slots=True)
class TieredTopic:
    topic_id: uuid.UUID
    name: str
    since_ms: int
    kafka_cluster: str | None = None  # the Kafka cluster the topic id is of (records.py)


class TopicIndex:
    """The tiered topics of a set of shard states; `stale()` after any state changed."""

    def __init__(self, states: list[MetadataState]) -> None:
        self._states = states
        self._by_name: dict[str, TieredTopic] = {}
        self._by_id: dict[uuid.UUID, TieredTopic] = {}
        self._fresh = False

    def stale(self) -> None:
        self._fresh = False

    def _rebuild(self) -> None:
        by_name, by_id = {}, {}
        for state in self._states:
            for topic_id in state.topic_ids():
                mode: TopicModeSet | None = state.topic(topic_id)
                if mode is not None and mode.mode is TopicMode.TIERED:
                    tiered = TieredTopic(topic_id, mode.topic, mode.since_ms, mode.kafka_cluster)
                    by_name[mode.topic] = by_id[topic_id] = tiered
        self._by_name, self._by_id, self._fresh = by_name, by_id, True

    def topic(self, key: str | uuid.UUID) -> TieredTopic | None:
        """The tiered topic a Produce request names (v13 by id, earlier by name)."""
        if not self._fresh:
            self._rebuild()
        return self._by_id.get(key) if isinstance(key, uuid.UUID) else self._by_name.get(key)

    def topics(self) -> list[TieredTopic]:
        if not self._fresh:
            self._rebuild()
        return sorted(self._by_id.values(), key=lambda t: t.name)

    def any(self) -> bool:
        if not self._fresh:
            self._rebuild()
        return bool(self._by_id)

    def state_of(self, stream: int) -> MetadataState:
        return self._states[shard_of(stream, len(self._states))]


def stream_of(topic: TieredTopic, partition: int) -> int:
    return stream_id(topic.topic_id, partition)


def drained_topics(topics: Iterable[TieredTopic], in_flight: dict) -> frozenset[str]:
    """The tiered topics (ids, as text) for which this proxy has no Produce in flight to
    Kafka (counted by name, or by id for Produce v13): it may report them drained, so
    their partitions can be cut over."""
    return frozenset(
        str(t.topic_id)
        for t in topics
        if not in_flight.get(t.name) and not in_flight.get(t.topic_id)
    )


def cutover_ready(topic: TieredTopic, reports: Iterable[frozenset[str]]) -> bool:
    """Every live proxy reports the topic drained: nothing it forwards to Kafka can land
    above the log end the cutover reads."""
    key = str(topic.topic_id)
    return all(key in drained for drained in reports)
