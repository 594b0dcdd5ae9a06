"""Kafka's largest timestamp below a tiered partition's cutover, asked of Kafka itself
(docs/tiering.md, "Reading a tiered topic": MAX_TIMESTAMP).

A tiered partition's log is Kafka's part below the cutover C, then the stream. Kafka's
own MAX_TIMESTAMP answer covers its whole log, which may hold records past C that are
not the partition's (a transaction marker its coordinator wrote, records written to a
broker directly). When that answer lies at or past C, the largest timestamp *below* C
is not in it, and Kafka has no request that answers it directly. Its timestamp lookup
does: ListOffsets(T) answers the first record at or above the log start, in offset
order, whose timestamp is at least T. Whether such a record lies below C is monotone in
T, so a binary search over T (one ListOffsets each, at most ~42 for millisecond
timestamps, nearly always one: the first probe asks whether Kafka's part reaches the
stream's largest at all) finds the largest timestamp below C, and the lookup of it its
first record in offset order: Kafka's MAX_TIMESTAMP rule (the first batch with the
largest max timestamp, the first record in it with that timestamp).

Reading Kafka's part instead (a Fetch of [log start, C)) would cost a read of all of it
per request, across zones when the leader is in another; the lookups use Kafka's time
index.

One place where Kafka's lookup is not monotone: it searches only the first segment whose
largest timestamp reaches T, from the log start. When that segment's largest is a
record below the log start (deleted, still counted by Kafka's segment), the lookup
answers none although later segments below C may hold records reaching T. A "none" is
therefore taken as "search higher": if the largest below C lies above every such deleted
record, the search still finds it exactly; if not, Kafka's own answer (the passthrough
twin's) is the deleted record, which no Fetch returns either (the difference
docs/tiering.md names).

Kafka's log may also start below the partition's: DeleteRecords moves both, but the
stream's retention moves the partition's first and Kafka's after it (upkeep/
retention.py; not at all while Kafka refuses the delete), and may move it past a range
below the cutover that Kafka alone holds. A lookup answering a record below the
partition's log start (`start`) is answered as a none: such a record is no longer the
partition's.

`largest_below` is the search, pure but for the lookup it is given; `kafka_lookup` is
one ListOffsets on a connection to the leader (`ReadHandlers.at_leader`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from kio.schema.list_offsets.v5.request import (
    ListOffsetsPartition,
    ListOffsetsRequest,
    ListOffsetsTopic,
)
from kio.schema.types import BrokerId, TopicName
from kio.static.primitive import i8, i32, i64

from proxy.apis.api02_list_offsets import read_list_offsets_response
from proxy.records.timestamp_search import Found

# timestamp -> Kafka's first record at or after it
Lookup = Callable[[int], Awaitable[Found | None]]
Send = Callable[[object], Awaitable[memoryview]]  # a request -> the body of its answer
READ_UNCOMMITTED = 0
_VERSION = 5  # ListOffsets with leader epochs, served by every Kafka since 2.2


class KafkaRefused(Exception):
    """Kafka answered a lookup with an error code (`error_code`)."""

    def __init__(self, error_code: int, where: str) -> None:
        super().__init__(f"{where}: Kafka answers error code {error_code}")
        self.error_code = error_code


async def largest_below(
    cutover: int, lookup: Lookup, floor: int, ceiling: int, start: int
) -> Found | None:
    """The record of Kafka's part in [`start`, `cutover`) with the largest timestamp, the
    first in offset order with it, if that timestamp is at least `floor`; None if none
    is. `ceiling` bounds every timestamp of Kafka's log (its MAX_TIMESTAMP answer);
    `start` is the partition's log start (Kafka's may be lower)."""
    best: Found | None = None
    low, high = floor, ceiling + 1  # the answer's timestamp, if any, is in [low, high)
    probe = low  # first: does Kafka's part reach `floor` at all?
    while low < high:
        got = await lookup(probe)
        if got is None or got.offset < start:  # deleted records (module docstring): higher
            low = probe + 1
        elif got.offset < cutover:
            best, low = got, max(got.timestamp, probe) + 1
        else:  # nothing below the cutover reaches `probe`
            high = probe
        probe = (low + high) // 2
    return best


async def kafka_lookup(send: Send, topic: str, partition: int, timestamp: int) -> Found | None:
    """Kafka's answer to ListOffsets(`timestamp`) for one partition, read_uncommitted, from
    its leader (`send`); None when no record reaches it. KafkaRefused on an error code."""
    request = ListOffsetsRequest(
        replica_id=BrokerId(-1),
        isolation_level=i8(READ_UNCOMMITTED),
        topics=(
            ListOffsetsTopic(
                name=TopicName(topic),
                partitions=(
                    ListOffsetsPartition(partition_index=i32(partition), timestamp=i64(timestamp)),
                ),
            ),
        ),
    )
    body = await send(request)
    answer = read_list_offsets_response(_VERSION, body).get((topic, partition))
    where = f"{topic}-{partition}: ListOffsets {timestamp}"
    if answer is None:
        raise KafkaRefused(-1, where)
    if answer.error_code != 0:
        raise KafkaRefused(answer.error_code, where)
    if answer.offset < 0:
        return None
    return Found(answer.timestamp, answer.offset, answer.leader_epoch)
