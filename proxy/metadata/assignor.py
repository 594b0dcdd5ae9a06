"""Which member of the shard group gets which shard (docs/metadata.md, "The Kafka adapter").

A shard whose last owner did not release it waits for that owner (metastore.py), so the
group must give the shard back to it: each member names, in the user data of its
subscription, its *dirty* shards (its own claim is the last, and it did not release them)
and the shards it had. `assign_shards` gives each dirty shard to the member that claims
it, then spreads the rest evenly, keeping a member's shards where balance allows. It is
pure; `ShardAssignor` is the object aiokafka's consumer takes in
`partition_assignment_strategy`.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass

from aiokafka.cluster import ClusterMetadata
from aiokafka.coordinator.protocol import (
    ConsumerProtocolMemberAssignment,
    ConsumerProtocolMemberMetadata,
)

from proxy.metadata.state import MetadataState

log = logging.getLogger("tierproxy.metadata")

ASSIGNOR_NAME = "tierproxy-shards"
USER_DATA_VERSION = 1


@dataclass(frozen=True, slots=True)
class MemberClaims:
    """What a member asks for: shards it must get back, and shards it had."""

    dirty: frozenset[int] = frozenset()
    previous: frozenset[int] = frozenset()


def encode_user_data(dirty: Iterable[int], previous: Iterable[int]) -> bytes:
    """A subscription's user data: JSON, versioned."""
    document = {
        "version": USER_DATA_VERSION,
        "dirty": sorted(set(dirty)),
        "previous": sorted(set(previous)),
    }
    return json.dumps(document, separators=(",", ":")).encode()


def decode_user_data(data: bytes) -> MemberClaims:
    """The claims in a subscription's user data; ValueError for anything else."""
    try:
        document = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"user data is not JSON ({exc})") from None
    if not isinstance(document, dict) or document.get("version") != USER_DATA_VERSION:
        version = document.get("version") if isinstance(document, dict) else None
        raise ValueError(f"user data of version {version!r}; this assignor reads 1")
    lists = [document.get("dirty", []), document.get("previous", [])]
    for shards in lists:
        if not isinstance(shards, list) or not all(
            isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in shards
        ):
            raise ValueError(f"user data names {shards!r}: not a list of shards")
    return MemberClaims(frozenset(lists[0]), frozenset(lists[1]))


def assign_shards(
    shards: Iterable[int], members: Mapping[str, MemberClaims]
) -> dict[str, list[int]]:
    """Each member's shards. A dirty shard goes to the member that claims it (the lowest
    member id if several do), whatever the balance: only that member can serve what it
    acknowledged. The others go where the counts stay as even as possible (a member that
    got more dirty shards gets fewer of the rest), each to the member that had it if that
    member has room, the rest in shard order to the members with room, by member id."""
    ids = sorted(members)
    if not ids:
        return {}
    result: dict[str, list[int]] = {member: [] for member in ids}
    free = []
    for shard in sorted(set(shards)):
        claimer = next((m for m in ids if shard in members[m].dirty), None)
        if claimer is None:
            free.append(shard)
        else:
            result[claimer].append(shard)
    # how many each member ends with: fill the lowest first; a tie goes to the member
    # that had the most of the free shards (it keeps them), then to the lowest id
    had = {m: len(members[m].previous.intersection(free)) for m in ids}
    target = {m: len(result[m]) for m in ids}
    for _ in free:
        target[min(ids, key=lambda m: (target[m], -had[m], m))] += 1
    left = set(free)
    for member in ids:
        for shard in sorted(members[member].previous & left):
            if len(result[member]) < target[member]:
                result[member].append(shard)
                left.discard(shard)
    for shard in sorted(left):
        member = next(m for m in ids if len(result[m]) < target[m])
        result[member].append(shard)
    return {member: sorted(result[member]) for member in ids}


def dirty_shards(states: Iterable[MetadataState], name: str) -> list[int]:
    """The shards member `name` must get back: its claim is the last, and it did not
    release them. A proxy computes them from its readers before it joins the group."""
    return sorted(s.shard for s in states if s.owner == name and not s.released)


class ShardAssignor:
    """The shard group's assignor, as aiokafka's consumer uses one: it reads `name` and
    calls `metadata(topics)` to join, `assign(cluster, members)` when it leads the group
    and `on_assignment(assignment)` after each rebalance. aiokafka's own assignors are
    classes used through classmethods; this one is an instance, so that each member
    reports its own dirty shards (`dirty_shards()`, asked at every join)."""

    name = ASSIGNOR_NAME
    version = 0

    def __init__(self, dirty_shards: Callable[[], Collection[int]] = frozenset) -> None:
        self._dirty_shards = dirty_shards
        self.previous: frozenset[int] = frozenset()

    def metadata(self, topics: Iterable[str]) -> ConsumerProtocolMemberMetadata:
        try:
            dirty = set(self._dirty_shards())
        except Exception:  # a member that cannot tell still joins; its shards may wait
            log.exception("the shard group's dirty shards could not be computed")
            dirty = set()
        user_data = encode_user_data(dirty, self.previous)
        return ConsumerProtocolMemberMetadata(self.version, list(topics), user_data)

    def assign(
        self, cluster: ClusterMetadata, members: Mapping[str, ConsumerProtocolMemberMetadata]
    ) -> dict[str, ConsumerProtocolMemberAssignment]:
        claims = {}
        for member_id, metadata in members.items():
            try:
                claims[member_id] = decode_user_data(metadata.user_data)
            except ValueError as exc:
                log.warning("shard group member %s: %s; its claims are ignored", member_id, exc)
                claims[member_id] = MemberClaims()
        given: dict[str, list[tuple[str, list[int]]]] = {member_id: [] for member_id in members}
        for topic in sorted({t for metadata in members.values() for t in metadata.subscription}):
            partitions = cluster.partitions_for_topic(topic)
            if partitions is None:
                log.warning("shard group: no partitions known for topic %s", topic)
                continue
            subscribed = {m: claims[m] for m in members if topic in members[m].subscription}
            for member_id, shards in assign_shards(partitions, subscribed).items():
                given[member_id].append((topic, shards))
        return {
            member_id: ConsumerProtocolMemberAssignment(self.version, given[member_id], b"")
            for member_id in members
        }

    def on_assignment(self, assignment: ConsumerProtocolMemberAssignment) -> None:
        self.previous = frozenset(tp.partition for tp in assignment.partitions())
