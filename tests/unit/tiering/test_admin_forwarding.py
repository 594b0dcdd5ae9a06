"""Where a tier/untier request goes (`CutoverLoop.admin`): the command's request (topic id
zero) is forwarded to the shard's owner named by the metadata; a forwarded request (id
set) is never forwarded again, but answered NOT_COORDINATOR (the command retries), so two
proxies that each see the other as the owner during a rebalance cannot bounce it between
them until every hop times out. The service is a stand-in: only the routing is tested
here; tests/integration/tiering/test_tiered_cutover.py runs it on real proxies."""

from __future__ import annotations

import asyncio
import uuid
from types import SimpleNamespace

from kio.schema.errors import ErrorCode

from proxy.upkeep.cutover import CutoverLoop

TOPIC_ID = uuid.UUID(int=7)
OTHER = ("127.0.0.1", 9)


class Peers:
    def __init__(self) -> None:
        self.calls: list[tuple] = []

    async def admin(self, address, op, topic, topic_id):
        self.calls.append((address, op, topic, topic_id))
        return 0, f"{topic} is tiered"


def service(peers: Peers) -> SimpleNamespace:
    async def describe_topic(topic):
        return TOPIC_ID, 1

    state = SimpleNamespace(owner="b")
    return SimpleNamespace(
        describe_topic=describe_topic,
        config=SimpleNamespace(shard_count=1),
        shard_owner=lambda shard: None,  # not owned here
        readers=[SimpleNamespace(state=state)],
        peer_address=lambda member: OTHER if member == "b" else None,
        peers=peers,
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
