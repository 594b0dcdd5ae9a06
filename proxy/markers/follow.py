"""The marker follower's decisions, pure (docs/tiering.md, "Transactions").

Kafka's coordinator writes each transaction's marker into Kafka's own log of every
partition in the transaction; for a tiered partition that log, past the cutover, holds
nothing else. The owner of the partition reads it from where the stream's committed state
says (`TieredPartition.marker_resume`) and appends every marker it finds to the stream.
This module decides, from what a Fetch answered, which batches are markers to append,
where the next read starts, what an error code means for the follow, and which broker
each partition is read from; `follower.py` is the asyncio runner that does it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Hashable, Iterable
from enum import Enum
from typing import TypeVar

from kio.schema.errors import ErrorCode

from proxy.records.batches import BatchHeader, whole_batches

Identity = tuple[int, int, int]  # (producer id, producer epoch, timestamp): Marker.identity
K = TypeVar("K", bound=Hashable)


class Resume:
    """TXN.md's resume rule. After a restart the follow starts at the committed state's
    `marker_position`, while the stream may already hold markers from past it (appended,
    made durable by the WAL, not yet in a snapshot): `expected`, their identities in
    order. Until that list is empty, an upstream marker equal to its head is already in
    the stream (skip it, pop the head), and any other one was considered and skipped by
    Kafka's rules before (skip it again: appending it now would put it after markers that
    came later upstream). Once it is empty, every marker is new."""

    __slots__ = ("expected",)

    def __init__(self, expected: Iterable[Identity] = ()) -> None:
        self.expected: deque[Identity] = deque(expected)

    def is_new(self, identity: Identity) -> bool:
        if not self.expected:
            return True
        if self.expected[0] == identity:
            self.expected.popleft()
        return False

    def resync(self, surviving: Identity | None) -> int:
        """Kafka's log no longer holds where the follow was (`reset_position`): retention
        dropped markers not read yet, or an unclean election cut the log. The expected
        markers Kafka dropped will never come, and the head of the list would wait for
        one of them for ever, every later marker skipped. `surviving`: the first marker
        of Kafka's log from where the follow goes on that is in the list (None if none
        is). Those before it are dropped (all of them without one); the rule then holds
        for the rest as before. How many were dropped."""
        dropped = 0
        if surviving is not None and surviving in self.expected:
            while self.expected[0] != surviving:
                self.expected.popleft()
                dropped += 1
        else:
            dropped = len(self.expected)
            self.expected.clear()
        return dropped


def control_batches(
    records: bytes | bytearray | memoryview, position: int
) -> tuple[list[tuple[BatchHeader, memoryview]], int]:
    """The control batches of one partition's Fetch answer that end at or past
    `position`, in order, and where the next read starts: past the last whole batch
    (a broker may cut the last one short), or `position` when the answer held none.
    Other batches (records written to Kafka directly past the cutover, which the clamp
    already warns about) are passed over. CorruptBatchError for bytes that are no batches."""
    batches, _ = whole_batches(records)
    found = [(h, b) for h, b in batches if h.is_control and h.last_offset >= position]
    if batches:
        position = max(position, batches[-1][0].next_offset)
    return found, position


class Step(Enum):
    """What a partition's error code in a Fetch answer means for its follow."""

    READ = "read"  # no error: walk its records
    RELOCATE = "relocate"  # its leader moved or is unknown: refresh metadata, read again
    RESET = "reset"  # OFFSET_OUT_OF_RANGE: move to Kafka's log (see `reset_position`)
    WAIT = "wait"  # another error: read again after a pause


_RELOCATE = frozenset(
    code.value
    for code in (
        ErrorCode.not_leader_or_follower,
        ErrorCode.unknown_topic_or_partition,
        ErrorCode.leader_not_available,
        ErrorCode.replica_not_available,
        ErrorCode.fenced_leader_epoch,
        ErrorCode.unknown_leader_epoch,
        ErrorCode.kafka_storage_error,
        ErrorCode.not_coordinator,
    )
)


def step_for(error_code: int) -> Step:
    if error_code == 0:
        return Step.READ
    if error_code in _RELOCATE:
        return Step.RELOCATE
    if error_code == ErrorCode.offset_out_of_range.value:
        return Step.RESET
    return Step.WAIT


def reset_position(position: int, log_start: int, log_end: int) -> int:
    """Where to read after OFFSET_OUT_OF_RANGE at `position`: Kafka's log start when
    retention dropped what was not read yet (those markers are lost to the stream: the
    caller warns), its log end when the log is shorter than what was read (an unclean
    leader election cut it: the markers written from now on land from there)."""
    if position < log_start:
        return log_start
    if position > log_end:
        return log_end
    return position


def group_by_leader(
    keys: Iterable[K], leader_of: Callable[[K], int | None]
) -> tuple[dict[int, list[K]], list[K]]:
    """The keys by their leader broker (one Fetch per broker for all its partitions),
    and those whose leader is not known now (to look up again)."""
    groups: dict[int, list[K]] = {}
    unknown: list[K] = []
    for key in keys:
        leader = leader_of(key)
        if leader is None or leader < 0:
            unknown.append(key)
        else:
            groups.setdefault(leader, []).append(key)
    return groups, unknown


__all__ = [
    "Identity",
    "Resume",
    "Step",
    "control_batches",
    "group_by_leader",
    "reset_position",
    "step_for",
]
