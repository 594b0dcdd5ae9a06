"""Gaps the proxy made, on random interleavings of failed and succeeded hand-offs
(docs/sequencer.md, "Gaps the proxy made").

A model of the path a batch takes: an idempotent client (5 requests in flight; on a
retriable error it stops, lets what is in flight come back, then resends from its oldest
batch not acknowledged, as librdkafka does) sends through a proxy that is not the owner
(its S3-WAL PUTs end in any order and may fail; hand-offs are sent in order on one
connection, which may be lost), to the owner (the real `PartitionSequencer` and
`partition_rules.refusal`; it may fail to read a batch, have its partition down during a
hand-over, or restart and forget what it knew). The proxy itself may restart too.

Whatever happens: the client, which never skips a sequence, is never answered 45; no
batch is appended twice; and once the faults stop, every batch is acknowledged.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.partition.rules import ProduceResult, refusal, sequence
from proxy.partition.sequence_holes import DROP_CODES, ProducerBatch, SequenceHoles
from proxy.partition.sequencer import Duplicate, PartitionSequencer, PendingAppend
from tests.support.batches import build_batch

S = 3
PID = 77
NOW = 1_700_000_000_000
BATCHES = 12
WINDOW = 5
SIZES = [1 + i % 3 for i in range(BATCHES)]
FIRST = [sum(SIZES[:i]) for i in range(BATCHES)]


def records(index: int) -> bytes:
    count = SIZES[index]
    return build_batch(
        [b"%d" % index] * count, timestamps=[NOW] * count, producer_id=PID, producer_epoch=0,
        base_sequence=FIRST[index],
    )  # fmt: skip


@dataclass(eq=False)
class HandOff:
    index: int
    state: str = "put"  # put -> ready -> sent -> done
    connection: int = -1


@dataclass
class World:
    sequencer: PartitionSequencer = field(default_factory=lambda: PartitionSequencer(0))
    owner_holes: SequenceHoles = field(default_factory=SequenceHoles)
    sender_holes: SequenceHoles = field(default_factory=SequenceHoles)
    partition_up: bool = True
    chain: list[HandOff] = field(default_factory=list)  # the sender's, in arrival order
    transit: deque[tuple[HandOff, int]] = field(default_factory=deque)  # (hand-off, hole)
    connection: int = 0
    # the client
    in_flight: set[int] = field(default_factory=set)
    acked: set[int] = field(default_factory=set)
    next_index: int = 0
    draining: bool = False
    # what happened
    appended: list[int] = field(default_factory=list)  # batch indexes, in log order
    answered_45: list[str] = field(default_factory=list)

    # -- the client --------------------------------------------------------------------

    def client_send(self) -> None:
        if self.draining:
            if self.in_flight:
                return
            self.draining = False
            self.next_index = min(set(range(BATCHES)) - self.acked, default=BATCHES)
        while self.next_index < BATCHES and self.next_index in self.acked:
            self.next_index += 1
        if self.next_index >= BATCHES or len(self.in_flight) >= WINDOW:
            return
        index = self.next_index
        self.next_index += 1
        self.in_flight.add(index)
        self.chain.append(HandOff(index))

    def answer(self, hand_off: HandOff, result: ProduceResult) -> None:
        """The sender relays the owner's (or its own) answer to the client."""
        hand_off.state = "done"
        self.sender_holes.observe(S, ProducerBatch.of(records(hand_off.index)), result.error_code)
        self.in_flight.discard(hand_off.index)
        if result.error_code == 0:
            self.acked.add(hand_off.index)
        elif result.error_code == 45:
            self.answered_45.append(result.error_message or "")
        else:
            assert result.error_code in DROP_CODES, result
            self.draining = True

    # -- the sender (not the owner) ------------------------------------------------------

    def put(self, pick: int, ok: bool) -> None:
        waiting = [h for h in self.chain if h.state == "put"]
        if not waiting:
            return
        hand_off = waiting[pick % len(waiting)]
        if ok:
            hand_off.state = "ready"
        else:  # the S3-WAL PUT failed: answered 56, recorded as dropped
            self.sender_holes.dropped(S, ProducerBatch.of(records(hand_off.index)))
            self.answer(hand_off, ProduceResult(56))
        self._send_ready()

    def _send_ready(self) -> None:
        """Hand-offs go on the connection in arrival order, each once its PUT is done."""
        while self.chain and self.chain[0].state != "put":
            hand_off = self.chain.pop(0)
            if hand_off.state == "ready":
                batch = ProducerBatch.of(records(hand_off.index))
                hole = self.sender_holes.hole_before(S, batch)
                hand_off.state, hand_off.connection = "sent", self.connection
                self.transit.append((hand_off, hole))

    def connection_lost(self) -> None:
        """Whatever is in transit is lost: recorded as dropped at once, answered 6."""
        lost, self.transit = list(self.transit), deque()
        self.connection += 1
        for hand_off, _ in lost:
            self.sender_holes.dropped(S, ProducerBatch.of(records(hand_off.index)))
        for hand_off, _ in lost:
            self.answer(hand_off, ProduceResult(6))

    def sender_restart(self) -> None:
        """The client's connection to the sender breaks: every request in flight fails;
        what the sender held is gone (its PUTs never handed off), its table too."""
        self.connection_lost()
        for hand_off in self.chain:
            hand_off.state = "done"
        self.chain.clear()
        self.sender_holes = SequenceHoles()
        self.in_flight.clear()
        self.draining = True

    # -- the owner -----------------------------------------------------------------------

    def deliver(self, read_fails: bool) -> None:
        if not self.transit:
            return
        hand_off, hole = self.transit.popleft()
        batch = ProducerBatch.of(records(hand_off.index))
        assert batch is not None
        if hole >= 0:
            seq = ProducerBatch(PID, batch.producer_epoch, hole, hole)
            self.owner_holes.dropped(S, seq)
        if read_fails or not self.partition_up:
            self.owner_holes.dropped(S, batch)
            self.answer(hand_off, ProduceResult(56 if read_fails else 6))
            return
        result = sequence(self.sequencer, records(hand_off.index), NOW, self.owner_holes, S)
        if isinstance(result, PendingAppend):
            assert self.sequencer.commit(result) == 0
            self.appended.append(hand_off.index)
            answer = ProduceResult(0, result.base_offset)
        elif isinstance(result, Duplicate):
            answer = ProduceResult(0, result.base_offset)
        else:
            answer = refusal(result, S, self.owner_holes)
            if answer.error_code in DROP_CODES:
                self.owner_holes.dropped(S, batch)
        self.owner_holes.observe(S, batch, answer.error_code)
        self.answer(hand_off, answer)

    def owner_restart(self) -> None:
        """The owner's process dies: its connections with it, its table; the log stays
        (the WAL and the objects), the partition is down until claimed again."""
        self.connection_lost()
        self.owner_holes = SequenceHoles()
        self.partition_up = False

    # -- steps ---------------------------------------------------------------------------

    def step(self, action: int, pick: int) -> None:
        match action:
            case 0 | 1:
                self.client_send()
            case 2 | 3:
                self.put(pick, ok=True)
            case 4:
                self.put(pick, ok=False)
            case 5 | 6:
                self.deliver(read_fails=False)
            case 7:
                self.deliver(read_fails=True)
            case 8:
                self.connection_lost()
            case 9:
                self.owner_restart()
            case 10:
                self.partition_up = not self.partition_up  # a hand-over starts or ends
            case 11:
                self.sender_restart()

    def heal(self) -> None:
        """No more faults: the client must get every batch acknowledged."""
        self.partition_up = True
        for _ in range(50 * BATCHES):
            if len(self.acked) == BATCHES:
                return
            for _ in range(WINDOW):
                self.client_send()
            while any(h.state == "put" for h in self.chain):
                self.put(0, ok=True)
            while self.transit:
                self.deliver(read_fails=False)


@settings(max_examples=400, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 11), st.integers(0, 7)), max_size=120))
def test_no_proxy_made_gap_is_answered_45_and_nothing_is_appended_twice(steps):
    world = World()
    for action, pick in steps:
        world.step(action, pick)
        assert not world.answered_45, world.answered_45
        assert len(set(world.appended)) == len(world.appended), world.appended
    world.heal()
    assert not world.answered_45, world.answered_45
    assert world.appended == list(range(BATCHES))  # each once, in order
    assert world.acked == set(range(BATCHES))


def test_a_gap_the_client_makes_is_still_answered_45():
    world = World()
    world.chain.extend([HandOff(0), HandOff(2)])  # batch 1 never sent by the client
    world.put(0, ok=True)
    world.put(0, ok=True)
    world.deliver(read_fails=False)
    world.deliver(read_fails=False)
    assert world.appended == [0] and len(world.answered_45) == 1


class _Forgetful(SequenceHoles):
    def dropped(self, stream: int, batch: ProducerBatch | None) -> None:
        pass


def test_without_the_holes_a_failed_put_makes_a_45():
    """What issue 18 was: one PUT failing while the next one's goes through."""
    for forgetful in (True, False):
        world = World()
        if forgetful:
            world.owner_holes, world.sender_holes = _Forgetful(), _Forgetful()
        for _ in range(3):
            world.client_send()
        world.put(1, ok=True)  # batch 1's PUT ends first, then batch 0's fails: 56
        world.put(0, ok=False)
        world.put(0, ok=True)
        assert [h.index for h, _ in world.transit] == [1, 2]
        world.heal()
        assert bool(world.answered_45) == forgetful, world.answered_45
