"""KIP-890 partition verification of tiered partitions, the pure parts: the request, the
coordinator's verdicts and the Produce answers Kafka gives (markers/verify.py), the peer
protocol's transaction trailer, and the owner's gate (partition/txn_gate.py) with a fake
coordinator: which batches wait, in what order they go on, and the ABA guard."""

from __future__ import annotations

import asyncio

import pytest
from kio.schema.add_partitions_to_txn.v4.request import AddPartitionsToTxnRequest
from kio.schema.errors import ErrorCode

from proxy.apis.api24_add_partitions_to_txn import AddPartitionsAnswer
from proxy.kafka.codec import decode
from proxy.markers.verify import (
    NOT_ADDED_MESSAGE,
    Verification,
    coordinator_codes,
    produce_refusal,
    verify_request,
)
from proxy.partition.rules import ProduceResult
from proxy.partition.sequence_holes import ProducerBatch
from proxy.partition.txn_gate import NOT_ONGOING_MESSAGE, Producer, VerificationGate
from proxy.peer.codec import (
    SEQUENCES_PROTOCOL,
    STABLE_PROTOCOL,
    TXN_PROTOCOL,
    decode_frame,
    encode_frame,
    for_peer,
)
from proxy.peer.messages import AppendRequest

E = ErrorCode
TXN = Verification("app-1", 4000, 3, (("orders", 0), ("orders", 2), ("audit", 1)))


def test_the_request_is_the_brokers_batched_form_and_only_verifies():
    other = Verification("app-2", 4001, 0, (("orders", 1),))
    request = decode(AddPartitionsToTxnRequest, verify_request([TXN, other]))
    first, second = request.transactions
    assert (first.transactional_id, first.producer_id, first.producer_epoch) == ("app-1", 4000, 3)
    assert first.verify_only and second.verify_only
    assert {(t.name, tuple(t.partitions)) for t in first.topics} == {
        ("orders", (0, 2)),
        ("audit", (1,)),
    }
    with pytest.raises(ValueError, match="named twice"):
        verify_request([TXN, Verification("app-1", 4000, 4, (("x", 0),))])


def answer(top: int = 0, **codes: int) -> AddPartitionsAnswer:
    topics = (("orders", ((0, codes.get("o0", 0)), (2, codes.get("o2", 0)))),)
    return AddPartitionsAnswer(4, 0, top, (("app-1", topics), ("app-9", (("audit", ((1, 48),)),))))


def test_the_coordinators_verdicts_as_kafkas_manager_passes_them_on():
    codes = coordinator_codes(answer(o0=E.transaction_abortable.value), TXN)
    # audit-1 is not named for app-1 (app-9's answer is another transaction's): verified
    assert codes == {("orders", 0): 120, ("orders", 2): 0, ("audit", 1): 0}
    fenced = coordinator_codes(answer(o2=E.producer_fenced.value), TXN)
    assert fenced[("orders", 2)] == E.invalid_producer_epoch.value
    top = coordinator_codes(answer(top=E.cluster_authorization_failed.value), TXN)
    assert set(top.values()) == {E.invalid_txn_state.value}
    top = coordinator_codes(answer(top=E.not_coordinator.value), TXN)
    assert set(top.values()) == {E.not_coordinator.value}


@pytest.mark.parametrize(
    ("code", "version", "answered", "message"),
    [
        (0, 11, None, None),
        (E.transaction_abortable, 10, E.invalid_txn_state, NOT_ADDED_MESSAGE),
        (E.transaction_abortable, 3, E.invalid_txn_state, NOT_ADDED_MESSAGE),
        (E.transaction_abortable, 11, E.transaction_abortable, None),
        (E.invalid_txn_state, 11, E.invalid_txn_state, NOT_ADDED_MESSAGE),
        (E.invalid_producer_epoch, 11, E.invalid_producer_epoch, None),
        (E.invalid_producer_id_mapping, 9, E.invalid_producer_id_mapping, None),
        (E.coordinator_not_available, 11, E.not_enough_replicas, "COORDINATOR_NOT_AVAILABLE"),
        (E.network_exception, 9, E.not_enough_replicas, "NETWORK_EXCEPTION"),
        (E.not_coordinator, 11, E.not_enough_replicas, "NOT_COORDINATOR"),
        (E.concurrent_transactions, 11, E.not_enough_replicas, "CONCURRENT_TRANSACTIONS"),
        (E.concurrent_transactions, 12, E.concurrent_transactions, None),
    ],
)
def test_the_produce_answer_per_version(code, version, answered, message):
    result = produce_refusal(int(code), version)
    if answered is None:
        assert result is None
        return
    assert result is not None and result.error_code == answered.value
    if message is None:
        assert result.error_message is None
    else:
        assert message in (result.error_message or "")


# -- the peer protocol's trailer ----------------------------------------------------------

BATCH = ProducerBatch(4000, 3, 0, 4)


def test_the_transaction_trailer_round_trips_and_goes_only_to_peers_that_read_it():
    request = AppendRequest(
        7,
        12,
        -1,
        3000,
        records=b"batch",
        batch=BATCH,
        hole=-1,
        transactional_id="app-1 \u00e9",
        produce_version=11,
    )
    assert decode_frame(encode_frame(request)) == request
    assert for_peer(request, TXN_PROTOCOL) is request
    older = for_peer(request, STABLE_PROTOCOL)
    assert older.transactional_id is None and older.produce_version == -1
    assert older.batch == BATCH
    assert decode_frame(encode_frame(older)) == older
    oldest = for_peer(request, SEQUENCES_PROTOCOL - 1)
    assert oldest.batch is None and oldest.transactional_id is None
    with pytest.raises(ValueError, match="only with its batch"):
        AppendRequest(1, 1, -1, 1, records=b"", transactional_id="t", produce_version=11)
    with pytest.raises(ValueError, match="produce version"):
        AppendRequest(1, 1, -1, 1, records=b"", batch=BATCH, produce_version=11)


# -- the owner's gate -------------------------------------------------------------------

P = Producer(4000, 3, transactional=True)


async def turns_until(condition, turns: int = 20) -> None:
    """Let the loop run until `condition` holds (a few turns: no I/O is involved)."""
    for _ in range(turns):
        if condition():
            return
        await asyncio.sleep(0)
    assert condition()


class Coordinator:
    """A fake coordinator whose answers the test releases one by one."""

    def __init__(self) -> None:
        self.asked: list[tuple[int, int]] = []
        self.answers: list[asyncio.Future[ProduceResult | None]] = []

    async def verify(self, producer_id: int, epoch: int) -> ProduceResult | None:
        self.asked.append((producer_id, epoch))
        future: asyncio.Future[ProduceResult | None] = asyncio.get_running_loop().create_future()
        self.answers.append(future)
        return await future


async def test_only_a_transactional_batch_with_no_transaction_open_waits():
    gate, coordinator = VerificationGate(), Coordinator()
    assert gate.must_wait(P, coordinator.verify, open_here=False)
    assert not gate.must_wait(P, coordinator.verify, open_here=True)
    assert not gate.must_wait(P, None, open_here=False)  # verification turned off
    plain = Producer(4000, 3, transactional=False)
    assert not gate.must_wait(plain, coordinator.verify, open_here=False)
    gate.marker_queued(4000)  # it ends the open transaction before the batch is sequenced
    assert gate.must_wait(P, coordinator.verify, open_here=True)
    gate.marker_sequenced(4000)
    assert not gate.must_wait(P, coordinator.verify, open_here=True)


async def test_a_producers_batches_keep_their_order_behind_a_verification():
    gate, coordinator = VerificationGate(), Coordinator()
    queued: list[str] = []
    opened = False

    def enqueue(name: str):
        async def run() -> None:
            nonlocal opened
            queued.append(name)
            opened = True  # the first transactional batch opens the transaction
            return None

        return run

    first = asyncio.ensure_future(
        gate.in_turn(P, coordinator.verify, lambda pid: opened, enqueue("first"))
    )
    await asyncio.sleep(0)
    assert coordinator.asked == [(4000, 3)]
    # the same producer's next batch (even a non-transactional one) waits behind it
    plain = Producer(4000, 3, transactional=False)
    assert gate.must_wait(plain, coordinator.verify, open_here=False)
    second = asyncio.ensure_future(
        gate.in_turn(P, coordinator.verify, lambda pid: opened, enqueue("second"))
    )
    other = Producer(5000, 0, transactional=True)  # another producer does not wait for it
    assert not gate.must_wait(other, coordinator.verify, open_here=True)
    await asyncio.sleep(0)
    assert queued == [] and len(coordinator.asked) == 1
    coordinator.answers[0].set_result(None)
    assert await first is None and await second is None
    assert queued == ["first", "second"]
    assert len(coordinator.asked) == 1  # the second found the transaction open
    assert not gate.waiting


async def test_a_refused_batch_is_not_queued_and_the_next_one_is_verified_again():
    gate, coordinator = VerificationGate(), Coordinator()
    queued: list[int] = []

    async def enqueue() -> None:
        queued.append(1)

    refusal = ProduceResult(E.invalid_txn_state.value, error_message=NOT_ADDED_MESSAGE)
    first = asyncio.ensure_future(gate.in_turn(P, coordinator.verify, lambda pid: False, enqueue))
    second = asyncio.ensure_future(gate.in_turn(P, coordinator.verify, lambda pid: False, enqueue))
    await asyncio.sleep(0)
    coordinator.answers[0].set_result(refusal)
    assert await first == refusal
    await turns_until(lambda: len(coordinator.asked) == 2)
    coordinator.answers[1].set_result(None)
    assert await second is None
    assert queued == [1]


async def test_a_marker_queued_during_the_verification_refuses_the_batch():
    """Kafka's verification guard: the marker may end the very transaction the
    coordinator vouched for; the batch would open one that no marker ends."""
    gate, coordinator = VerificationGate(), Coordinator()
    queued: list[int] = []

    async def enqueue() -> None:
        queued.append(1)

    call = asyncio.ensure_future(gate.in_turn(P, coordinator.verify, lambda pid: False, enqueue))
    await asyncio.sleep(0)
    gate.marker_queued(P.producer_id)
    gate.marker_queued(9999)  # another producer's marker changes nothing
    coordinator.answers[0].set_result(None)
    refused = await call
    assert refused is not None and refused.error_code == E.invalid_txn_state.value
    assert refused.error_message == NOT_ONGOING_MESSAGE
    assert queued == []


async def test_a_cancelled_call_lets_the_next_one_go():
    gate, coordinator = VerificationGate(), Coordinator()
    queued: list[int] = []

    async def enqueue() -> None:
        queued.append(1)

    first = asyncio.ensure_future(gate.in_turn(P, coordinator.verify, lambda pid: False, enqueue))
    second = asyncio.ensure_future(gate.in_turn(P, coordinator.verify, lambda pid: False, enqueue))
    await asyncio.sleep(0)
    first.cancel()
    await turns_until(lambda: len(coordinator.asked) == 2)
    coordinator.answers[1].set_result(None)
    assert await second is None and queued == [1]


async def test_the_gate_knows_whose_batches_wait_for_a_verification():
    """InitProducerId's catch-up (tiered/fencing.py) takes a partition where the producer
    has a batch waiting: the coordinator may have vouched for it before it fenced."""
    gate, coordinator = VerificationGate(), Coordinator()
    assert not gate.waits_for(4000)

    async def enqueue() -> None:
        return None

    call = asyncio.ensure_future(gate.in_turn(P, coordinator.verify, lambda _: False, enqueue))
    await turns_until(lambda: coordinator.answers)
    assert gate.waits_for(4000) and not gate.waits_for(4001)
    coordinator.answers[0].set_result(None)
    assert await call is None
    assert not gate.waits_for(4000)
