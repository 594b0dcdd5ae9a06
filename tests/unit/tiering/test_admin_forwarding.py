"""Where a tier/untier request goes (`CutoverLoop.admin`): the command's request (topic id
zero) is forwarded to the shard's owner named by the metadata; a forwarded request (id
set) is never forwarded again, but answered NOT_COORDINATOR (the command retries), so two
proxies that each see the other as the owner during a rebalance cannot bounce it between
them until every hop times out; an owner that does not answer (killed, its claim not
expired yet) is answered COORDINATOR_NOT_AVAILABLE, so the command retries until it is
back or replaced. The service is a stand-in: only the routing is tested
here; tests/integration/tiering/test_tiered_cutover.py runs it on real proxies."""

from __future__ import annotations

import asyncio
import uuid
from types import SimpleNamespace

from kio.schema.errors import ErrorCode

from proxy.apis.api03_metadata import TopicsAnswer
from proxy.metadata.topic_index import TieredTopic
from proxy.peer.clients import PeerUnavailable
from proxy.upkeep.cutover import CutoverLoop

TOPIC_ID = uuid.UUID(int=7)
OTHER = ("127.0.0.1", 9)
OWNER_C = ("127.0.0.1", 10)


class Peers:
    def __init__(self) -> None:
        self.calls: list[tuple] = []

    async def admin(self, address, op, topic, topic_id):
        self.calls.append((address, op, topic, topic_id))
        return 0, f"{topic} is tiered"


def service(peers: Peers) -> SimpleNamespace:
    async def describe_topics(names):
        return TopicsAnswer("cluster-a", {name: (TOPIC_ID, 1) for name in names}, frozenset(), {})

    state = SimpleNamespace(owner="b")
    return SimpleNamespace(
        describe_topics=describe_topics,
        config=SimpleNamespace(shard_count=1),
        shard_owner=lambda shard: None,  # not owned here
        readers=[SimpleNamespace(state=state)],
        peer_address=lambda member: OTHER if member == "b" else None,
        peers=peers,
        peer_protocol=lambda member: 10,
        topics=SimpleNamespace(topic=lambda key: None),  # no topic of the name tiered yet
    )


def test_the_commands_request_is_forwarded_once_to_the_owner():
    peers = Peers()
    loop = CutoverLoop(service(peers))  # type: ignore[arg-type]
    assert asyncio.run(loop.admin("tier", "orders", uuid.UUID(int=0))) == (0, "orders is tiered")
    assert peers.calls == [(OTHER, "tier", "orders", TOPIC_ID)]  # with the id: forwarded


def test_a_forwarded_request_is_not_forwarded_again():
    peers = Peers()
    loop = CutoverLoop(service(peers))  # type: ignore[arg-type]
    code, message = asyncio.run(loop.admin("tier", "orders", TOPIC_ID))
    assert code == ErrorCode.not_coordinator and ErrorCode(code).retriable
    assert "not owned here" in message
    assert peers.calls == []


class DownPeers(Peers):
    async def admin(self, address, op, topic, topic_id):
        self.calls.append((address, op, topic, topic_id))
        raise PeerUnavailable(f"peer {address}: cannot connect: [Errno 111] Connection refused")


def test_an_owner_that_does_not_answer_is_a_retriable_error():
    peers = DownPeers()
    loop = CutoverLoop(service(peers))  # type: ignore[arg-type]
    code, message = asyncio.run(loop.admin("tier", "orders", uuid.UUID(int=0)))
    assert code == ErrorCode.coordinator_not_available and ErrorCode(code).retriable
    assert "did not answer" in message and "Connection refused" in message
    assert peers.calls == [(OTHER, "tier", "orders", TOPIC_ID)]


def test_the_ops_of_protocol_10_are_not_sent_to_an_older_owner():
    """`deleted` and `look` are new at peer protocol 10: an owner of an older release would
    close the connection on them (and with it the appends it carries)."""
    for level, sent in ((9, False), (10, True)):
        peers = Peers()
        host = service(peers)
        host.peer_protocol = lambda member, level=level: level
        loop = CutoverLoop(host)  # type: ignore[arg-type]
        code, message = asyncio.run(loop._at_owner("deleted", "orders", TOPIC_ID, False))  # noqa: SLF001
        if sent:
            assert code == 0
        else:
            assert code == ErrorCode.coordinator_not_available and "release" in message
        loop._partitions[TOPIC_ID] = 1  # noqa: SLF001
        asyncio.run(loop.nudge(TieredTopic(TOPIC_ID, "orders", 1), 1))
        assert peers.calls == (
            [(OTHER, op, "orders", TOPIC_ID) for op in ("deleted", "look")] if sent else []
        )


def two_shards(peers: Peers) -> SimpleNamespace:
    """Two shards: the topic's (1) owned by b, partitions 0-2's streams' (0) by c."""
    host = service(peers)
    host.config = SimpleNamespace(shard_count=2)
    host.readers = [SimpleNamespace(state=SimpleNamespace(owner=o)) for o in ("c", "b")]
    host.peer_address = {"b": OTHER, "c": OWNER_C}.get
    return host


def test_a_produce_to_a_partition_not_cut_over_asks_its_owner_to_look_once_a_second():
    """The look is asked of the owner of the partition's stream shard, the one that cuts
    it over: asked of the topic shard's owner (b), it was the wrong proxy, and the
    produce waited for the owner's next periodic look."""
    peers = Peers()
    loop = CutoverLoop(two_shards(peers))  # type: ignore[arg-type]
    topic = TieredTopic(TOPIC_ID, "orders", 1)
    loop._next_topics_check = 1e12  # noqa: SLF001
    asyncio.run(loop.nudge(topic, 1))  # the count not known yet: the loop reads it anyway
    assert peers.calls == [] and loop._next_topics_check == 1e12  # noqa: SLF001
    loop._partitions[TOPIC_ID] = 1  # noqa: SLF001
    asyncio.run(loop.nudge(topic, 0))  # a partition it knows: its cutover is coming
    assert peers.calls == [] and loop._next_topics_check == 1e12  # noqa: SLF001
    asyncio.run(loop.nudge(topic, 1))  # added since the last look
    assert peers.calls == [(OWNER_C, "look", "orders", TOPIC_ID)]
    assert loop._next_topics_check == 0.0  # noqa: SLF001  # and this proxy looks too
    asyncio.run(loop.nudge(topic, 2))  # within NUDGE_S: not again
    assert len(peers.calls) == 1


def test_a_nudge_of_a_partition_owned_here_asks_no_peer():
    peers = Peers()
    host = two_shards(peers)
    host.shard_owner = lambda shard: SimpleNamespace() if shard == 0 else None
    loop = CutoverLoop(host)  # type: ignore[arg-type]
    loop._partitions[TOPIC_ID] = 3  # noqa: SLF001
    asyncio.run(loop.nudge(TieredTopic(TOPIC_ID, "orders", 1), 2))
    assert peers.calls == [] and loop._next_topics_check == 0.0  # noqa: SLF001


def test_a_tier_at_an_owner_that_cannot_reach_kafka_is_a_retriable_error():
    """A tier forwarded to the owner asks Kafka there for the cluster id: not reaching
    Kafka is NOT_COORDINATOR (retriable), as at the proxy the command reached, never
    UNKNOWN_TOPIC_OR_PARTITION (a topic Kafka does not know)."""
    host = service(Peers())
    host.shard_owner = lambda shard: SimpleNamespace()  # owned here

    async def unreachable(names):
        raise ConnectionRefusedError(111, "Connection refused")

    host.describe_topics = unreachable
    loop = CutoverLoop(host)  # type: ignore[arg-type]
    code, message = asyncio.run(loop.admin("tier", "orders", TOPIC_ID))  # forwarded here
    assert code == ErrorCode.not_coordinator and ErrorCode(code).retriable
    assert "cannot reach Kafka" in message
    code, message = asyncio.run(loop.admin("tier", "orders", uuid.UUID(int=0)))
    assert code == ErrorCode.not_coordinator and "cannot reach Kafka" in message


def test_a_tier_at_its_owner_asks_kafka_once():
    host = service(Peers())
    written = []

    class Owner:
        async def write(self, records):
            written.extend(records)
            return [SimpleNamespace(outcome=SimpleNamespace(value="accept"), reason="")]

    host.shard_owner = lambda shard: Owner()
    asked = []
    describe = host.describe_topics

    async def counted(names):
        asked.append(names)
        return await describe(names)

    host.describe_topics = counted
    loop = CutoverLoop(host)  # type: ignore[arg-type]
    loop._recorded_cluster = lambda cluster: cluster  # noqa: SLF001  # the fleet is at 10
    assert asyncio.run(loop.admin("tier", "orders", uuid.UUID(int=0))) == (0, "orders is tiered")
    assert asked == [["orders"]]
    [record] = written
    assert (record.topic_id, record.kafka_cluster) == (TOPIC_ID, "cluster-a")
