"""What Kafka's answer about the tiered topics means for the fleet: the decision of the
cutover loop's look at Kafka every `TOPICS_CHECK_S` (cutover.py; docs/tiering.md,
"Partitions added to a tiered topic" and "Deleting a tiered topic"). Pure: no I/O.

Kafka answers each tiered topic's name with a topic id and a partition count, "no such
topic" (UNKNOWN_TOPIC_OR_PARTITION), or another error, which says nothing and is left out:

- the same id with more partitions than the loop knew: the topic grew (CreatePartitions);
  Kafka never takes partitions away, so a smaller count is not one to act on;
- another id: the topic was deleted and created again under the name (a broker behind
  in applying the metadata answers the old id, never a newer one): deleted;
- no such topic in this answer and in the one before: deleted. Once is not enough: a
  broker that has not applied a topic yet answers as for a deleted one.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from proxy.metadata.topic_index import TieredTopic

KafkaTopic = tuple[uuid.UUID, int]  # Kafka's topic id and partition count for a name


@dataclass(frozen=True, slots=True)
class TopicCheck:
    grown: dict[uuid.UUID, int]  # topic id -> its partition count, above the one known
    deleted: tuple[TieredTopic, ...]
    unknown: frozenset[uuid.UUID]  # the topics Kafka knew no topic of that name for now


def check_topics(
    tiered: Iterable[TieredTopic],
    found: Mapping[str, KafkaTopic | None],
    counts: Mapping[uuid.UUID, int],
    unknown_before: frozenset[uuid.UUID],
) -> TopicCheck:
    """Kafka's answer `found` (name -> (id, count), None: no such topic, absent: another
    error) judged for the tiered topics, given the partition counts known (`counts`,
    by topic id: a topic not in it is not judged grown) and the topics Kafka knew no
    topic of that name for in the check before (`unknown_before`)."""
    grown: dict[uuid.UUID, int] = {}
    deleted: list[TieredTopic] = []
    unknown: set[uuid.UUID] = set()
    for topic in tiered:
        if topic.name not in found:
            continue
        answer = found[topic.name]
        if answer is None:
            unknown.add(topic.topic_id)
            if topic.topic_id in unknown_before:
                deleted.append(topic)
        elif answer[0] != topic.topic_id:
            deleted.append(topic)
        elif (known := counts.get(topic.topic_id)) is not None and answer[1] > known:
            grown[topic.topic_id] = answer[1]
    return TopicCheck(grown, tuple(deleted), frozenset(unknown))
