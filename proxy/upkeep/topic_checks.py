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

A deletion drops everything the fleet holds of the topic, acknowledged records included,
so it is judged only from the cluster the topic id is of: a topic's mode record names the
Kafka cluster that answered its id when it was tiered, and an answer from another cluster
(a fleet pointed at a copy of the cluster: a disaster-recovery cluster fed by
MirrorMaker 2 under the same names, with the metadata topic mirrored too) judges none of
its topics deleted. A topic tiered before records named their cluster is proven of the
cluster that answers its own id (a random UUID of that cluster): `stamp` says so, and
the owner of its topic shard records it. Until then such a topic is judged deleted only
when every tiered topic that names a cluster names the one answering. And a look judges
at most `most` topics deleted: Kafka losing many topics at once is more likely a broken
cluster than an operator's work, and the rest wait for the next looks (`held`), loud in
the log, while an operator can still stop the fleet.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from proxy.apis.api03_metadata import TopicsAnswer
from proxy.metadata.topic_index import TieredTopic

MOST_DELETED = 4  # topics a look judges deleted at most (the rest: the next looks)


@dataclass(frozen=True, slots=True)
class TopicCheck:
    grown: dict[uuid.UUID, int]  # topic id -> its partition count, above the one known
    deleted: tuple[TieredTopic, ...]
    unknown: frozenset[uuid.UUID]  # the topics Kafka knew no topic of that name for now
    held: tuple[TieredTopic, ...] = ()  # judged deleted past `most`: for the next looks
    foreign: tuple[TieredTopic, ...] = ()  # tiered in another cluster than the answer's
    stamp: tuple[TieredTopic, ...] = ()  # no cluster recorded; proven of the answer's


def check_topics(
    tiered: Iterable[TieredTopic],
    answer: TopicsAnswer,
    counts: Mapping[uuid.UUID, int],
    unknown_before: frozenset[uuid.UUID],
    most: int = MOST_DELETED,
) -> TopicCheck:
    """Kafka's `answer` judged for the tiered topics, given the partition counts known
    (`counts`, by topic id: a topic not in it is not judged grown) and the topics Kafka
    knew no topic of that name for in the check before (`unknown_before`)."""
    tiered = list(tiered)
    cluster = answer.cluster_id
    named = {t.kafka_cluster for t in tiered if t.kafka_cluster is not None}
    unnamed_judged = cluster is not None and named == {cluster}
    grown: dict[uuid.UUID, int] = {}
    deleted: list[TieredTopic] = []
    unknown: set[uuid.UUID] = set()
    foreign: list[TieredTopic] = []
    stamp: list[TieredTopic] = []
    for topic in tiered:
        found = answer.found.get(topic.name)
        same = found is not None and found[0] == topic.topic_id
        if same and topic.kafka_cluster is None and cluster is not None:
            stamp.append(topic)
        if same:
            assert found is not None
            known = counts.get(topic.topic_id)
            if known is not None and found[1] > known:
                grown[topic.topic_id] = found[1]
            continue
        if topic.kafka_cluster is None:
            if not unnamed_judged:
                continue
        elif topic.kafka_cluster != cluster:
            foreign.append(topic)
            continue
        if found is not None:  # another id under the name
            deleted.append(topic)
        elif topic.name in answer.unknown:
            unknown.add(topic.topic_id)
            if topic.topic_id in unknown_before:
                deleted.append(topic)
    return TopicCheck(
        grown,
        tuple(deleted[:most]),
        frozenset(unknown),
        tuple(deleted[most:]),
        tuple(foreign),
        tuple(stamp),
    )
