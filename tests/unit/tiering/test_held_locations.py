"""The sender's side of batches taken by reference (owners.py): which hand-offs carry the
batch's header, and an S3-WAL location kept until its owner releases it (`HeldLocations`).

The owner's side, on a real WAL and store, is tests/integration/wal/test_referencing_log.py;
real fleets in S3-notify mode take every eligible batch by reference (the tiering and
fault suites). Here the peer calls are answered by the test: what is checked is that no
location is released while its owner may need it, and each exactly once after.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from proxy.handoff.objects import S3WalLocation
from proxy.partition.rules import ProduceResult
from proxy.partition.sequence_holes import ProducerBatch, SequenceHoles
from proxy.peer.clients import PeerUnavailable
from proxy.peer.codec import REFERENCE_PROTOCOL
from proxy.records.batches import HEADER_SIZE
from proxy.tiered.owners import HeldLocations, Part, ToOwner, _header_to_send
from tests.support.batches import build_batch
from tests.support.waiting import eventually

STREAM = 11
A = ("127.0.0.1", 1001)
B = ("127.0.0.2", 1001)
RULES = SimpleNamespace(log_append_time=False)


def records(*, transactional: bool = False, batches: int = 1) -> bytes:
    one = build_batch(
        [b"value"] * 3, producer_id=5, producer_epoch=0, base_sequence=0,
        transactional=transactional,
    )  # fmt: skip
    return one * batches


def part(data: bytes, *, acks: int = -1, rules=RULES, txn: str | None = None) -> Part:
    batch = ProducerBatch(5, 0, 0, 2)
    topic = SimpleNamespace(name="t")
    return Part(topic, 0, STREAM, batch, memoryview(data), acks, 30_000, rules, txn)  # type: ignore[arg-type]


def test_only_a_single_plain_batch_with_acks_on_a_createtime_topic_sends_its_header():
    data = records()
    assert _header_to_send(part(data)) == data[:HEADER_SIZE]
    assert _header_to_send(part(data, acks=0)) is None
    assert _header_to_send(part(data, rules=SimpleNamespace(log_append_time=True))) is None
    assert _header_to_send(part(data, rules=None)) is None
    assert _header_to_send(part(data, txn="t1")) is None
    assert _header_to_send(part(records(transactional=True))) is None
    assert _header_to_send(part(records(batches=2))) is None  # two batches: read by the owner
    assert _header_to_send(part(b"not a batch at all, but long enough" * 3)) is None


class Peers:
    """`append` answers what the test sets; `held` records each ask and answers the
    indexes the test says (or fails)."""

    def __init__(self) -> None:
        self.answer: ProduceResult | BaseException = ProduceResult(0, 100, referenced=True)
        self.headers: list[bytes | None] = []
        self.asked: list[list[S3WalLocation]] = []
        self.members: list[tuple[object, str | None]] = []  # whom each ask named
        self.releases: asyncio.Queue[tuple[int, ...] | BaseException] = asyncio.Queue()

    async def append(self, address, stream, acks, timeout_ms, **kw) -> ProduceResult:
        # the header goes with the owner's name: PeerClients sends it only to that member
        assert kw["header"] is None or kw["member"] == "member-a"
        self.headers.append(kw["header"])
        if isinstance(self.answer, BaseException):
            raise self.answer
        return self.answer

    async def held(
        self, address, locations, timeout_ms, *, peer_protocol, member=None
    ) -> tuple[int, ...]:
        assert peer_protocol >= REFERENCE_PROTOCOL
        self.asked.append(list(locations))
        self.members.append((address, member))
        answer = await self.releases.get()
        if isinstance(answer, BaseException):
            raise answer
        return answer


class S3Wal:
    def __init__(self) -> None:
        self.appended = 0
        self.released: list[S3WalLocation] = []

    async def append(self, stream: int, data) -> S3WalLocation:
        self.appended += 1
        return S3WalLocation(f"wal/{self.appended}", 0, len(data), stream, 0)

    def release(self, location: S3WalLocation) -> None:
        self.released.append(location)


class Sender:
    def __init__(self) -> None:
        self.holes = SequenceHoles()
        self.peers = Peers()
        self.s3wal = S3Wal()
        self.stages = SimpleNamespace(since=lambda *_: None)
        self.sends_headers = True
        self.level: int | None = REFERENCE_PROTOCOL
        self.addresses: dict[str, object] = {}  # where members are, if not at A

    def state(self, stream: int):
        return SimpleNamespace(owner="member-a")

    def owner_address(self, stream: int):
        return A

    def peer_protocol(self, member: str) -> int:
        return self.level or 1

    def heard_protocol(self, member: str) -> int | None:
        return self.level

    def peer_address(self, member: str):
        return self.addresses.get(member, A)

    def count_peer_bytes(self, address, direction: str, size: int) -> None:
        pass


async def settle() -> None:
    for _ in range(50):
        await asyncio.sleep(0)


async def test_a_referenced_answer_keeps_the_location_until_the_owner_releases_it():
    sender = Sender()
    to_owner = ToOwner(sender)  # type: ignore[arg-type]
    result = await to_owner.send(part(records()))
    assert result is not None and result.referenced
    assert sender.peers.headers == [records()[:HEADER_SIZE]]
    await settle()
    assert sender.s3wal.released == [] and len(to_owner.held) == 1
    [asked] = sender.peers.asked
    sender.peers.releases.put_nowait(())  # still needed: asked again
    await settle()
    assert sender.s3wal.released == [] and len(sender.peers.asked) == 2
    sender.peers.releases.put_nowait((0,))
    await settle()
    assert sender.s3wal.released == asked and len(to_owner.held) == 0
    await to_owner.held.close()


async def test_an_answer_not_referenced_releases_at_once_and_a_lost_one_is_held():
    sender = Sender()
    to_owner = ToOwner(sender)  # type: ignore[arg-type]
    sender.peers.answer = ProduceResult(0, 100)  # the owner read the bytes first
    await to_owner.send(part(records()))
    await settle()  # the call's own callback, next on the loop
    assert len(sender.s3wal.released) == 1 and len(to_owner.held) == 0
    sender.peers.answer = PeerUnavailable("the connection dropped")
    await to_owner.send(part(records()))  # the owner may have taken it by reference
    await settle()
    assert len(sender.s3wal.released) == 1 and len(to_owner.held) == 1
    sender.peers.releases.put_nowait((0,))  # it had not: unknown there, released
    await settle()
    assert len(sender.s3wal.released) == 2 and len(to_owner.held) == 0
    await to_owner.held.close()


async def test_a_failed_ask_is_asked_again_and_releases_nothing():
    sender = Sender()
    held = HeldLocations(sender)  # type: ignore[arg-type]
    held.RETRY_FIRST_S = 0.01
    location = S3WalLocation("wal/1", 0, 10, STREAM, 0)
    held.add("member-a", location)
    await settle()
    sender.peers.releases.put_nowait(PeerUnavailable("away"))
    await asyncio.sleep(0.05)
    assert sender.s3wal.released == [] and len(sender.peers.asked) == 2
    sender.peers.releases.put_nowait((0,))
    await settle()
    assert sender.s3wal.released == [location]
    await held.close()


async def test_an_owner_not_heard_from_is_not_asked_and_one_rolled_back_holds_nothing():
    sender = Sender()
    held = HeldLocations(sender)  # type: ignore[arg-type]
    held.RETRY_FIRST_S = 0.01
    sender.level = None  # not heard from: it may be a level-13 owner that is down
    location = S3WalLocation("wal/1", 0, 10, STREAM, 0)
    held.add("member-a", location)
    await asyncio.sleep(0.05)
    assert sender.peers.asked == [] and sender.s3wal.released == []
    sender.level = REFERENCE_PROTOCOL - 1  # back at a level whose WAL holds no reference
    await asyncio.sleep(0.1)
    assert sender.peers.asked == [] and sender.s3wal.released == [location]
    await held.close()


async def test_a_closed_set_holds_nothing_more():
    sender = Sender()
    held = HeldLocations(sender)  # type: ignore[arg-type]
    await held.close()
    held.add("member-a", S3WalLocation("wal/1", 0, 10, STREAM, 0))
    assert len(held) == 0 and sender.s3wal.released == []


async def test_an_owner_is_asked_where_it_is_now_and_only_about_its_own():
    """Held locations go with their owner's name: asked at the address the fleet gives it
    now (back elsewhere after a restart, it still holds them), each ask naming it (the
    proxy at an address that is not that member is not asked: PeerClients.held), and
    another member's locations never in its asks."""
    sender = Sender()
    held = HeldLocations(sender)  # type: ignore[arg-type]
    first = S3WalLocation("wal/1", 0, 10, STREAM, 0)
    second = S3WalLocation("wal/2", 0, 10, STREAM, 0)
    held.add("member-a", first)
    await settle()
    sender.addresses["member-x"] = B
    held.add("member-x", second)
    await settle()
    assert sorted(sender.peers.members) == [(A, "member-a"), (B, "member-x")]
    by_member = dict(zip(sender.peers.members, sender.peers.asked, strict=True))
    assert by_member[A, "member-a"] == [first] and by_member[B, "member-x"] == [second]
    sender.addresses["member-a"] = B  # member-a back at another address
    sender.peers.releases.put_nowait(())  # its first ask: still needed
    await settle()
    sender.peers.releases.put_nowait((0,))  # member-x's: released
    await settle()
    assert len(held) == 1 and sender.s3wal.released == [second]
    assert sender.peers.members[-1] == (B, "member-a")  # asked again, where it is now
    sender.peers.releases.put_nowait((0,))
    await settle()
    assert sorted(loc.object_key for loc in sender.s3wal.released) == ["wal/1", "wal/2"]
    assert len(held) == 0
    await held.close()


async def test_an_owner_not_live_keeps_its_locations_and_is_asked_once_back():
    sender = Sender()
    held = HeldLocations(sender)  # type: ignore[arg-type]
    held.RETRY_FIRST_S = 0.01
    sender.addresses["member-a"] = None  # not live: no address
    location = S3WalLocation("wal/1", 0, 10, STREAM, 0)
    held.add("member-a", location)
    await asyncio.sleep(0.05)
    assert sender.peers.asked == [] and sender.s3wal.released == [] and len(held) == 1
    sender.addresses["member-a"] = B  # back, at another address
    await eventually(lambda: sender.peers.asked, what="asked once back")
    assert sender.peers.members == [(B, "member-a")]
    sender.peers.releases.put_nowait((0,))
    await settle()
    assert sender.s3wal.released == [location] and len(held) == 0
    await held.close()
