"""A stream's owner changing while a batch is on its way to the old one (owners.py).

The next batch of the stream must not reach the new owner before the old owner's answer
is in `SequenceHoles`: else the hole it carries misses the drop, and the new owner sees a
gap no drop explains (OUT_OF_ORDER_SEQUENCE_NUMBER, which librdkafka takes as fatal) or,
for a producer it does not know, takes the later batch first. Hand-offs to one owner stay
pipelined. The peer calls are a fake that records each call as its first step runs (when
`PeerClients` would write it) and answers when the test says; what is checked is the
sender's ordering, which no real fleet makes happen on demand. The fault suite
(`tests/integration/faults/`) moves owners under load with real proxies.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
from kio.schema.errors import ErrorCode

from proxy.handoff.objects import S3WalLocation
from proxy.partition.rules import ProduceResult
from proxy.partition.sequence_holes import ProducerBatch, SequenceHoles
from proxy.peer.clients import PeerUnavailable
from proxy.peer.messages import AppendRequest
from proxy.tiered.owners import AtOwner, Part, ToOwner

STREAM = 11
A, B = ("127.0.0.1", 1001), ("127.0.0.1", 1002)
PID, EPOCH = 5, 0


class Peers:
    """Each call recorded as (owner, first sequence, hole) when it is made; answered by
    the test through `answer`."""

    def __init__(self) -> None:
        self.calls: list[tuple[tuple[str, int], int, int]] = []
        self._answers: dict[int, asyncio.Future[ProduceResult]] = {}

    async def append(self, address, stream, acks, timeout_ms, **kw) -> ProduceResult:
        batch = kw["batch"]
        self.calls.append((address, batch.first_sequence, kw["hole"]()))
        answer = self._answers.setdefault(
            batch.first_sequence, asyncio.get_running_loop().create_future()
        )
        return await answer

    def answer(self, first_sequence: int, result: ProduceResult | BaseException) -> None:
        answer = self._answers.setdefault(
            first_sequence, asyncio.get_running_loop().create_future()
        )
        if isinstance(result, BaseException):
            answer.set_exception(result)
        else:
            answer.set_result(result)


class Sender:
    """What `ToOwner` needs of the tiered service; notify: direct (no S3-WAL)."""

    def __init__(self) -> None:
        self.holes = SequenceHoles()
        self.peers = Peers()
        self.s3wal = None
        self.stages = SimpleNamespace(since=lambda *_: None)
        self.owner = A
        self.sends_headers = False

    def state(self, stream: int):
        return SimpleNamespace(owner="member")

    def owner_address(self, stream: int):
        return self.owner

    def peer_protocol(self, member: str) -> int:
        return 99

    def count_peer_bytes(self, address, direction: str, size: int) -> None:
        pass


def part(seq: int, timeout_ms: int = 30_000) -> Part:
    batch = ProducerBatch(PID, EPOCH, seq, seq + 9)
    topic = SimpleNamespace(name="t")
    return Part(topic, 0, STREAM, batch, memoryview(b"records"), -1, timeout_ms)  # type: ignore[arg-type]


class S3Wal:
    """The S3-WAL writer's surface `ToOwner` uses: each append PUT at once, each
    location's releases counted."""

    def __init__(self) -> None:
        self.appended = 0
        self.released: list[S3WalLocation] = []

    async def append(self, stream: int, records) -> S3WalLocation:
        self.appended += 1
        return S3WalLocation(f"wal/{self.appended}", 0, len(records), stream, 0)

    def release(self, location: S3WalLocation) -> None:
        self.released.append(location)


async def settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


NOT_LEADER = ProduceResult(ErrorCode.not_leader_or_follower)


async def test_a_batch_for_a_new_owner_waits_for_the_old_owners_answer_and_carries_its_drop():
    sender = Sender()
    to_owner = ToOwner(sender)  # type: ignore[arg-type]
    first = asyncio.create_task(to_owner.send(part(0)))
    await settle()
    assert sender.peers.calls == [(A, 0, -1)]
    sender.owner = B  # the stream's shard claimed by B while batch 0 is at A
    second = asyncio.create_task(to_owner.send(part(10)))
    third = asyncio.create_task(to_owner.send(part(20)))
    await settle()
    assert sender.peers.calls == [(A, 0, -1)]  # held: A has not answered batch 0
    assert to_owner.busy(STREAM)
    sender.peers.answer(0, NOT_LEADER)  # A let the stream go: batch 0 was not appended
    await settle()
    # B hears of the drop from the hole batch 10 carries, and batch 20 stays behind it
    assert sender.peers.calls == [(A, 0, -1), (B, 10, 0), (B, 20, 0)]
    assert (await first).error_code == ErrorCode.not_leader_or_follower
    sender.peers.answer(10, NOT_LEADER)  # B's gap explained: resend in order
    sender.peers.answer(20, NOT_LEADER)
    assert [(await t).error_code for t in (second, third)] == [ErrorCode.not_leader_or_follower] * 2
    assert not to_owner.busy(STREAM)


async def test_batches_for_one_owner_stay_pipelined():
    sender = Sender()
    to_owner = ToOwner(sender)  # type: ignore[arg-type]
    sends = [asyncio.create_task(to_owner.send(part(seq))) for seq in (0, 10, 20)]
    await settle()
    assert sender.peers.calls == [(A, 0, -1), (A, 10, -1), (A, 20, -1)]  # none waits
    for seq in (0, 10, 20):
        sender.peers.answer(seq, ProduceResult(0, base_offset=seq))
    assert [(await s).base_offset for s in sends] == [0, 10, 20]
    assert not to_owner.busy(STREAM)


async def test_a_call_lost_with_its_connection_is_a_drop_before_the_next_owner_is_called():
    sender = Sender()
    to_owner = ToOwner(sender)  # type: ignore[arg-type]
    first = asyncio.create_task(to_owner.send(part(0)))
    await settle()
    sender.owner = B
    second = asyncio.create_task(to_owner.send(part(10)))
    await settle()
    sender.peers.answer(0, PeerUnavailable("connection to A reset"))
    await settle()
    assert sender.peers.calls == [(A, 0, -1), (B, 10, 0)]
    assert (await first).error_code == ErrorCode.not_leader_or_follower
    sender.peers.answer(10, ProduceResult(0, base_offset=100))
    assert (await second).base_offset == 100


async def test_a_cancelled_send_counts_as_a_drop_and_holds_nothing():
    """Only a shutdown cancels a send (a client gone does not: split_answers.py); its
    call ends with it, unanswered, and counts as a drop, as the caller's record has it."""
    sender = Sender()
    to_owner = ToOwner(sender)  # type: ignore[arg-type]
    first = asyncio.create_task(to_owner.send(part(0)))
    await settle()
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    assert not to_owner.busy(STREAM)
    sender.owner = B
    second = asyncio.create_task(to_owner.send(part(10)))
    await settle()
    assert sender.peers.calls == [(A, 0, -1), (B, 10, 0)]
    sender.peers.answer(10, ProduceResult(0, base_offset=10))
    assert (await second).base_offset == 10


async def test_a_batch_for_a_stream_taken_over_here_waits_for_the_handoffs_on_their_way():
    sender = Sender()
    to_owner = ToOwner(sender)  # type: ignore[arg-type]
    first = asyncio.create_task(to_owner.send(part(0)))
    await settle()
    here: list[int] = []

    async def produce_here(seq: int) -> ProduceResult:
        here.append(seq)
        return ProduceResult(0, base_offset=seq)

    # the stream is now owned and started here: its next batches go to the partition
    assert to_owner.busy(STREAM)
    local = [
        asyncio.create_task(
            to_owner.here_after_handoffs(
                STREAM,
                ProducerBatch(PID, EPOCH, seq, seq + 9),
                30_000,
                lambda s=seq: produce_here(s),
            )
        )
        for seq in (10, 20)
    ]
    await settle()
    assert here == []  # batch 0's fate at A is not known yet
    sender.peers.answer(0, NOT_LEADER)
    await settle()
    assert here == [10, 20]  # in the order they came, after the answer
    assert sender.holes.hole_before(STREAM, ProducerBatch(PID, EPOCH, 10, 19)) == 0
    assert [(await t).base_offset for t in local] == [10, 20]
    assert (await first).error_code == ErrorCode.not_leader_or_follower
    assert not to_owner.busy(STREAM)


async def test_the_owner_records_a_batch_it_refuses_for_want_of_its_topic_config_as_a_drop():
    """The owner answers KAFKA_STORAGE_ERROR (retriable, not appended) when it cannot read
    the topic's configs: a drop, so that the producer's next batch, if it gets through,
    is answered NOT_LEADER_OR_FOLLOWER for the gap rather than Kafka's 45."""

    class Owner:
        name = "owner"
        holes = SequenceHoles()
        partitions = object()
        s3wal_reader = object()
        stages = SimpleNamespace(since=lambda *_: None)
        referencing = None
        takes_references = False

        def state(self, stream: int):
            return SimpleNamespace(stream=lambda s: SimpleNamespace(topic_id="topic"))

        async def produce_rules(self, topic):
            return None  # Kafka did not describe the topic

        async def partition_here(self, stream: int):
            return object()

        def not_served(self, stream: int):
            return None

        def verifier_for(self, *args):
            return None

    owner = Owner()
    batch = ProducerBatch(PID, EPOCH, 0, 9)
    request = AppendRequest(0, STREAM, -1, 30_000, records=b"records", batch=batch)
    result = await AtOwner(owner).append(request)  # type: ignore[arg-type]
    assert result.error_code == ErrorCode.kafka_storage_error
    assert owner.holes.hole_before(STREAM, ProducerBatch(PID, EPOCH, 10, 19)) == 0


async def test_a_wait_on_the_old_owner_ends_with_the_waiting_requests_own_timeout():
    """A call to the old owner lives as long as its request's timeout (up to the
    client's, plus 5 s); a later batch waits at most its own, then is answered
    NOT_LEADER_OR_FOLLOWER and recorded as a drop, and the next still waits its turn."""
    sender = Sender()
    to_owner = ToOwner(sender)  # type: ignore[arg-type]
    first = asyncio.create_task(to_owner.send(part(0)))
    await settle()
    sender.owner = B
    result = await to_owner.send(part(10, timeout_ms=50))
    assert result is not None and result.error_code == ErrorCode.not_leader_or_follower
    assert sender.peers.calls == [(A, 0, -1)]  # never handed to B
    third = asyncio.create_task(to_owner.send(part(20)))
    await settle()
    assert sender.peers.calls == [(A, 0, -1)]  # batch 0 is still unanswered
    sender.peers.answer(0, ProduceResult(0, base_offset=0))
    await settle()
    assert sender.peers.calls == [(A, 0, -1), (B, 20, 10)]  # batch 10's drop goes with it
    sender.peers.answer(20, NOT_LEADER)
    await first, third


async def test_every_s3_wal_location_is_released_once_whatever_ends_its_send():
    sender = Sender()
    sender.s3wal = S3Wal()  # type: ignore[assignment]
    to_owner = ToOwner(sender)  # type: ignore[arg-type]
    answered = asyncio.create_task(to_owner.send(part(0)))
    await settle()
    assert sender.s3wal.released == []  # the owner has not read it yet
    sender.owner = B
    timed_out = await to_owner.send(part(10, timeout_ms=20))  # never handed over
    assert timed_out is not None and timed_out.error_code == ErrorCode.not_leader_or_follower
    assert len(sender.s3wal.released) == 1
    cancelled = asyncio.create_task(to_owner.send(part(20)))
    await settle()
    cancelled.cancel()  # waiting for batch 0's answer: never handed over
    with pytest.raises(asyncio.CancelledError):
        await cancelled
    assert len(sender.s3wal.released) == 2
    sender.peers.answer(0, ProduceResult(0, base_offset=0))
    await answered
    assert len(sender.s3wal.released) == 3
    assert len(set(sender.s3wal.released)) == 3
    assert not to_owner.busy(STREAM)
