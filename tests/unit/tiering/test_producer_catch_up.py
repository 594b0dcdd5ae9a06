"""InitProducerId's catch-up (proxy/tiered/catch_up.py, `catch_up_producer`): the
partitions owned here where the producer has a transaction open, and every live member
of the fleet that reads the producer catch-up request; what failed is reported, the
members that predate it are not asked. A stand-in host: a pure unit test."""

from __future__ import annotations

import asyncio

from proxy.peer.codec import PRODUCER_CATCH_UP_PROTOCOL
from proxy.peer.messages import ProducerCatchUpRequest
from proxy.tiered.catch_up import catch_up_here, catch_up_producer, producer_streams

PID = 4000


class _Partition:
    def __init__(self, producers: set[int]) -> None:
        self.producers = producers

    def has_transaction_of(self, producer_id: int) -> bool:
        return producer_id in self.producers


class _Partitions:
    def __init__(self, by_stream: dict[int, _Partition]) -> None:
        self.by_stream = by_stream

    def streams(self) -> list[int]:
        return list(self.by_stream)

    def get(self, stream: int) -> _Partition | None:
        return self.by_stream.get(stream)


class _Markers:
    def __init__(self) -> None:
        self.caught_up: list[list[int]] = []

    async def catch_up(self, streams) -> None:
        self.caught_up.append(sorted(streams))


class _Peers:
    def __init__(self, answers: dict[tuple[str, int], tuple[int, str]]) -> None:
        self.answers = answers
        self.asked: list[tuple[tuple[str, int], int, int]] = []

    async def catch_up_producer(self, address, producer_id: int, timeout_ms: int):
        self.asked.append((address, producer_id, timeout_ms))
        await asyncio.sleep(0)
        return self.answers[address]


class _Host:
    def __init__(self, partitions: dict[int, _Partition], members: dict[str, int], answers):
        self.partitions = _Partitions(partitions)
        self.markers = _Markers()
        self.peers = _Peers(answers)
        self.members = members  # name -> peer protocol level

    def live_peers(self) -> list[str]:
        return list(self.members)

    def peer_protocol(self, member: str) -> int:
        return self.members[member]

    def peer_address(self, member: str) -> tuple[str, int] | None:
        return (member, 9000)

    async def partition_here(self, stream: int) -> _Partition | None:
        partition = self.partitions.get(stream)
        assert partition is not None, "every partition is started"
        return partition


def test_the_producers_partitions_here_and_every_member_that_reads_it_are_caught_up():
    host = _Host(
        {1: _Partition({PID}), 2: _Partition({PID + 1}), 3: _Partition({PID, PID + 1})},
        {"b": PRODUCER_CATCH_UP_PROTOCOL, "c": PRODUCER_CATCH_UP_PROTOCOL - 1},
        {("b", 9000): (0, "")},
    )
    assert producer_streams(host, PID) == [1, 3]
    assert asyncio.run(catch_up_producer(host, PID, timeout_s=2.0)) == []
    assert host.markers.caught_up == [[1, 3]]
    assert host.peers.asked == [(("b", 9000), PID, 2000)]  # c predates the request


def test_nothing_open_here_reads_nothing_and_a_members_refusal_is_reported():
    host = _Host(
        {1: _Partition({PID + 1})},
        {"b": PRODUCER_CATCH_UP_PROTOCOL},
        {("b", 9000): (7, "stream 9: not caught up")},
    )
    failures = asyncio.run(catch_up_producer(host, PID, timeout_s=2.0))
    assert host.markers.caught_up == []
    assert failures == ["member b answered 7: stream 9: not caught up"]


def test_the_owners_side_of_the_peer_request():
    host = _Host({5: _Partition({PID})}, {}, {})
    request = ProducerCatchUpRequest(1, PID, 2000)
    assert asyncio.run(catch_up_here(host, request)) == (0, "")
    assert host.markers.caught_up == [[5]]
    host.markers = None  # the follower is not running: the owner cannot catch up
    code, message = asyncio.run(catch_up_here(host, request))
    assert code != 0 and "not caught up: streams [5] here" in message
