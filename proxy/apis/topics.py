"""The topics array of a request that names partitions by topic (Produce, Fetch,
ListOffsets, DeleteRecords): read once, here, into views that locate each entry in the
body, and written again with some of each topic's partitions kept (a split).

Each API reads its own partition entries (`read_partition`); the walk around them (the
topic's key, the counts, the topic's tagged fields) is the same for all four. Pure: no
I/O, no asyncio. Entries are located (spans of the body), never copied.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Generic, TypeVar

from proxy.kafka.wire import read_count, skip_tagged_fields, write_array_length

TopicKey = str | uuid.UUID  # a topic's name, or its id (Produce and Fetch from v13)
Span = slice  # of the request body
K = TypeVar("K", str, TopicKey)  # how the API names a topic: by name, or by name or id
P = TypeVar("P")  # an API's view of one partition's entry


@dataclass(frozen=True, slots=True)
class TopicView(Generic[K, P]):
    topic: K
    key_span: Span  # the name (or topic id)
    partitions: tuple[P, ...]
    tags_span: Span  # the topic's tagged-field section; empty before the flexible versions


def read_topics(
    body: memoryview,
    offset: int,
    flexible: bool,
    read_key: Callable[[memoryview, int], tuple[K, int]],
    read_partition: Callable[[memoryview, int], tuple[P, int]],
    arrays: tuple[str, str] = ("topics", "partitions"),
) -> tuple[list[TopicView[K, P]], int]:
    """The topics array at `offset` and the offset after it. `read_key(body, start)` reads
    a topic's name (or id), `read_partition(body, start)` one partition's entry, its
    tagged fields included: each returns what it read and the offset after it. `arrays`:
    the two arrays' names in the API's schema (for the error a malformed count raises)."""
    topics: list[TopicView[K, P]] = []
    count, offset = read_count(body, offset, flexible, arrays[0])
    for _ in range(count):
        key_start, partitions = offset, []
        topic, offset = read_key(body, offset)
        key_span = slice(key_start, offset)
        partition_count, offset = read_count(body, offset, flexible, arrays[1])
        for _ in range(partition_count):
            partition, offset = read_partition(body, offset)
            partitions.append(partition)
        tags_start = offset
        offset = skip_tagged_fields(body, offset) if flexible else offset
        topics.append(TopicView(topic, key_span, tuple(partitions), slice(tags_start, offset)))
    return topics, offset


def kept_topic(
    body: memoryview, topic: TopicView[K, P], kept: list[bytes | memoryview], flexible: bool
) -> Iterable[bytes | memoryview]:
    """A topic's entry for the split request: its key and tags as they came, around the
    entries `kept` of its partitions (only the count is written anew)."""
    return (
        body[topic.key_span],
        write_array_length(len(kept), flexible),
        *kept,
        body[topic.tags_span],
    )
