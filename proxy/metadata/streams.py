"""Streams: their ids, their shards, and the ranges of a tiered stream (docs/metadata.md).

A stream is one tiered partition. Its id is a hash of (topic id, partition), its shard the
id modulo the shard count, and shard k's records live in partition k of the metadata topic,
written by the producer whose transactional.id is `transactional_id(k, topic)`. Pure: no I/O.
"""

from __future__ import annotations

import hashlib
import struct
from bisect import bisect_left, bisect_right
from dataclasses import dataclass, field
from uuid import UUID

from proxy.metadata.records import StreamCutover
from proxy.objects.keys import ObjectKind, object_key

STREAM_ID_BITS = 63  # fits the WAL's i64 and the object index's u64
OFFLOAD_ID_BIT = 1 << 63  # object ids with this bit set are the offload jobs'


def stream_id(topic_id: UUID, partition: int) -> int:
    """The stream of a tiered partition: 63 bits of BLAKE2b over the topic id and the
    partition. Any proxy or Spark task computes it with no lookup; a topic deleted and
    created again under the same name has a new topic id, so it never inherits objects."""
    if not 0 <= partition < 1 << 31:
        raise ValueError(f"partition {partition} is not a Kafka partition number")
    data = topic_id.bytes + partition.to_bytes(4, "big")
    digest = hashlib.blake2b(data, digest_size=8, person=b"tierproxy-stream").digest()
    return int.from_bytes(digest, "big") >> (64 - STREAM_ID_BITS)


def shard_of(stream: int, shard_count: int) -> int:
    """The shard, and so the metadata topic partition, holding a stream's records."""
    if shard_count < 1:
        raise ValueError(f"shard count {shard_count}: needs at least 1")
    return stream % shard_count


def topic_shard(topic_id: UUID, shard_count: int) -> int:
    """The shard, and so the partition, holding a topic's mode record."""
    if shard_count < 1:
        raise ValueError(f"shard count {shard_count}: needs at least 1")
    digest = hashlib.blake2b(topic_id.bytes, digest_size=8, person=b"tierproxy-topic").digest()
    return int.from_bytes(digest, "big") % shard_count


def transactional_id(shard: int, topic: str) -> str:
    """The transactional.id of the producer that writes partition `shard` of the metadata
    `topic`. Named after the topic: transactional ids are unique per Kafka cluster, and
    two fleets sharing an upstream (each with its own metadata topic) must not fence
    each other."""
    return f"tierproxy-{topic}-shard-{shard}"


def offload_object_id(stream: int, start_offset: int, end_offset: int) -> int:
    """The object id of an offload job's stream object holding [start, end) of a stream:
    the same range gives the same id, so a job that runs again writes the same key. The top
    bit is set, so it never equals an id the upload path allocates (top bit clear)."""
    data = struct.pack(">Qqq", stream, start_offset, end_offset)
    digest = hashlib.blake2b(data, digest_size=8, person=b"tierproxy-object").digest()
    return OFFLOAD_ID_BIT | int.from_bytes(digest, "big") >> 1


@dataclass(frozen=True, slots=True)
class StreamRange:
    """Offsets [start_offset, end_offset) of a stream, read from the object named."""

    stream_id: int
    start_offset: int
    end_offset: int
    object_id: int
    object_kind: ObjectKind
    object_size: int

    @property
    def object_key(self) -> str:
        return object_key(self.object_id, self.object_kind)


@dataclass(frozen=True, slots=True)
class StreamInfo:
    """A tiered stream: Kafka holds [log start, cutover), the proxy [cutover, end)."""

    stream_id: int
    topic_id: UUID
    partition: int
    incarnation: int
    cutover_offset: int
    log_start_offset: int
    end_offset: int  # the next offset to be committed
    tiered_at_ms: int
    # Kafka's last stable offset at the cutover (StreamCutover.stable_offset): below the
    # cutover when a transaction was open there, carried across
    cutover_stable_offset: int = 0


@dataclass(slots=True)
class TieredStream:
    """A stream's live ranges, sorted and never overlapping; `starts` mirrors them for
    binary search. Invariant: they cover [max(cutover, log start), end) without a gap,
    every one ends above the log start and at most at the end."""

    cutover: StreamCutover
    log_start: int
    end: int
    ranges: list[StreamRange] = field(default_factory=list)
    starts: list[int] = field(default_factory=list)

    def info(self) -> StreamInfo:
        c = self.cutover
        return StreamInfo(
            c.stream_id,
            c.topic_id,
            c.partition,
            c.incarnation,
            c.cutover_offset,
            self.log_start,
            self.end,
            c.at_ms,
            c.stable_offset,
        )

    def holding(self, offset: int) -> int:
        """Index of the range holding `offset`, or -1."""
        at = bisect_right(self.starts, offset) - 1
        return at if at >= 0 and self.ranges[at].end_offset > offset else -1

    def overlapping(self, start: int, end: int) -> list[StreamRange]:
        at = max(bisect_right(self.starts, start) - 1, 0)
        found = []
        while at < len(self.ranges) and self.ranges[at].start_offset < end:
            if self.ranges[at].end_offset > start:
                found.append(self.ranges[at])
            at += 1
        return found

    def insert(self, new: StreamRange) -> None:
        at = bisect_left(self.starts, new.start_offset)
        self.starts.insert(at, new.start_offset)
        self.ranges.insert(at, new)

    def remove(self, old: StreamRange) -> None:
        at = bisect_left(self.starts, old.start_offset)
        del self.starts[at], self.ranges[at]

    def tail_gap(self) -> str | None:
        """Where the invariant's coverage of [max(cutover, log start), end) breaks."""
        position = max(self.cutover.cutover_offset, self.log_start)
        for r in self.ranges:
            if r.end_offset <= position:
                continue
            if r.start_offset > position:
                break
            position = r.end_offset
        if position < self.end:
            stream = self.cutover.stream_id
            return f"stream {stream}: offsets [{position}, {self.end}) are in no object"
        return None
