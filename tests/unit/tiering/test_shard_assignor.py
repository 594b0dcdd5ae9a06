"""The shard group's assignor (docs/metadata.md, "The Kafka adapter"): dirty shards go back
to the member that claims them, the rest are spread evenly and deterministically, and what
a member sends in its subscription is read with care."""

from __future__ import annotations

import logging
from itertools import permutations

import pytest
from aiokafka.coordinator.protocol import ConsumerProtocolMemberMetadata

from proxy.metadata.assignor import (
    ASSIGNOR_NAME,
    MemberClaims,
    ShardAssignor,
    assign_shards,
    decode_user_data,
    dirty_shards,
    encode_user_data,
)
from proxy.metadata.codec import encode
from proxy.metadata.records import ShardClaim, ShardRelease
from proxy.metadata.state import MetadataState

TOPIC = "__tierproxy_metadata"


def claims(dirty=(), previous=()) -> MemberClaims:
    return MemberClaims(frozenset(dirty), frozenset(previous))


def counts(assignment: dict[str, list[int]]) -> list[int]:
    return sorted(len(shards) for shards in assignment.values())


def test_shards_are_spread_evenly_by_member_id():
    members = {m: claims() for m in ("c", "a", "b")}
    assert assign_shards(range(8), members) == {"a": [0, 1, 2], "b": [3, 4, 5], "c": [6, 7]}
    assert assign_shards(range(2), members) == {"a": [0], "b": [1], "c": []}
    assert assign_shards(range(8), {}) == {}


def test_a_dirty_shard_goes_to_its_claimer_whatever_the_balance():
    members = {"a": claims(), "b": claims(dirty=[5, 6, 7]), "c": claims(dirty=[9])}
    result = assign_shards(range(8), members)
    assert {5, 6, 7} <= set(result["b"])
    assert result == {"a": [0, 1, 2], "b": [5, 6, 7], "c": [3, 4]}  # 9 is no shard
    everything_dirty = {"a": claims(), "b": claims(dirty=range(8))}
    assert assign_shards(range(8), everything_dirty) == {"a": [], "b": list(range(8))}


def test_a_shard_claimed_dirty_by_two_members_goes_to_the_lowest_member_id():
    members = {"m-2": claims(dirty=[1]), "m-1": claims(dirty=[1, 2]), "m-3": claims()}
    result = assign_shards(range(4), members)
    assert result["m-1"][:2] == [1, 2] and 1 not in result["m-2"]
    assert sorted(sum(result.values(), [])) == [0, 1, 2, 3]


def test_members_keep_their_shards_where_the_balance_allows():
    # b joins a and c, which had every shard: each gives up as few as it must
    members = {"a": claims(previous=[0, 1, 2, 3]), "b": claims(), "c": claims(previous=[4, 5])}
    result = assign_shards(range(6), members)
    assert counts(result) == [2, 2, 2]
    assert set(result["a"]) <= {0, 1, 2, 3} and result["c"] == [4, 5]
    # balance first: b gives one up; with an odd count, the extra shard goes to b, which
    # keeps it, not to a (the lower id), which would take it from b
    members = {"a": claims(previous=[3]), "b": claims(previous=[0, 1, 2])}
    assert assign_shards(range(4), members) == {"a": [2, 3], "b": [0, 1]}
    assert assign_shards(range(5), members) == {"a": [3, 4], "b": [0, 1, 2]}


def test_the_assignment_does_not_depend_on_the_order_members_are_given_in():
    members = {
        "a": claims(dirty=[2], previous=[2, 3]),
        "b": claims(previous=[0, 1, 4, 5, 6]),
        "c": claims(dirty=[7]),
        "d": claims(),
    }
    results = [
        assign_shards(reversed(range(10)), {m: members[m] for m in order})
        for order in permutations(members)
    ]
    assert all(result == results[0] for result in results)
    assert counts(results[0]) == [2, 2, 3, 3]
    assert sorted(sum(results[0].values(), [])) == list(range(10))


def test_user_data_round_trips_and_anything_else_is_refused():
    data = encode_user_data([3, 1, 1], [2])
    assert data == b'{"version":1,"dirty":[1,3],"previous":[2]}'
    assert decode_user_data(data) == claims(dirty=[1, 3], previous=[2])
    for bad, what in [
        (b"", "not JSON"),
        (b"\xff", "not JSON"),
        (b"[1]", "version None"),
        (b'{"version":2,"dirty":[]}', "version 2"),
        (b'{"version":1,"dirty":[-1]}', "not a list of shards"),
        (b'{"version":1,"previous":"0"}', "not a list of shards"),
        (b'{"version":1,"dirty":[true]}', "not a list of shards"),
    ]:
        with pytest.raises(ValueError, match=what):
            decode_user_data(bad)


def test_dirty_shards_are_those_last_claimed_by_the_member_and_not_released():
    states = [MetadataState(k, 4) for k in range(4)]
    for k, owner in [(0, "proxy-a"), (1, "proxy-a"), (2, "proxy-b")]:
        states[k].apply(*encode(ShardClaim(0, 1, owner, 1)), 0)
    states[1].apply(*encode(ShardRelease(0, 1, "proxy-a", 2)), 1)
    assert dirty_shards(states, "proxy-a") == [0]
    assert dirty_shards(states, "proxy-b") == [2]
    assert dirty_shards(states, "proxy-c") == []


class cluster_with:  # noqa: N801 - stands in for aiokafka's ClusterMetadata
    """The one thing an assignor asks the cluster: a topic's partitions."""

    def __init__(self, partitions: int) -> None:
        self._partitions = set(range(partitions))

    def partitions_for_topic(self, topic: str) -> set[int] | None:
        return self._partitions if topic == TOPIC else None


def subscription(assignor: ShardAssignor) -> ConsumerProtocolMemberMetadata:
    # what the group coordinator hands the leader: the encoded metadata, decoded
    return ConsumerProtocolMemberMetadata.decode(assignor.metadata([TOPIC]).encode())


def test_the_aiokafka_assignor_gives_each_member_its_dirty_shards():
    a, b = ShardAssignor(lambda: [3]), ShardAssignor()
    assert a.name == b.name == ASSIGNOR_NAME
    members = {"member-b": subscription(b), "member-a": subscription(a)}
    result = a.assign(cluster_with(4), members)
    assert result["member-a"].partitions()[0].topic == TOPIC
    given = {m: [tp.partition for tp in result[m].partitions()] for m in result}
    assert given == {"member-a": [0, 3], "member-b": [1, 2]}
    b.on_assignment(result["member-b"])
    assert decode_user_data(subscription(b).user_data) == claims(previous=[1, 2])


def test_a_member_with_bad_user_data_is_assigned_as_one_claiming_nothing(caplog):
    a = ShardAssignor(lambda: [0, 1])
    stranger = ConsumerProtocolMemberMetadata(0, [TOPIC], b'{"version":9}')
    with caplog.at_level(logging.WARNING, logger="tierproxy.metadata"):
        result = a.assign(cluster_with(4), {"a": subscription(a), "z": stranger})
    assert "shard group member z: user data of version 9" in caplog.text
    assert "claims are ignored" in caplog.text
    given = {m: [tp.partition for tp in result[m].partitions()] for m in result}
    assert given == {"a": [0, 1], "z": [2, 3]}


def test_a_member_whose_dirty_shards_fail_joins_claiming_none(caplog):
    def broken() -> list[int]:
        raise RuntimeError("readers not started")

    with caplog.at_level(logging.ERROR, logger="tierproxy.metadata"):
        data = subscription(ShardAssignor(broken)).user_data
    assert decode_user_data(data) == claims()
    assert "dirty shards could not be computed" in caplog.text
