"""KIP-890 partition verification of tiered partitions, the pure half (docs/tiering.md,
"Transactions": verification). The asyncio runner is `verifier.py`.

A transactional batch that reaches a tiered partition's owner while its producer has no
transaction open there starts one. If the batch is a zombie (sent before the
coordinator aborted the transaction, arriving after the abort's marker), no marker will
ever end that transaction and the partition's last stable offset stays where it is for
ever: read_committed consumers stop. Kafka closed the same hole with KIP-890 part 1
(`transaction.partition.verification.enable`, on by default since 3.6): before it appends
the first transactional batch of a producer with no ongoing transaction in the
partition, the leader asks the coordinator (AddPartitionsToTxn v4+, `verify_only`, the
broker-to-broker batched form) whether the partition is part of that producer's
ongoing transaction with that epoch; if not, the Produce is refused.

This module holds Kafka's rules (apache/kafka, 4.1: `AddPartitionsToTxnManager`,
`ReplicaManager.handleProduceAppend`): the request (`verify_request`, encoded with kio),
what each partition of the coordinator's answer means (`coordinator_codes`) and what a
Produce of a given version is answered (`produce_refusal`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from kio.schema.add_partitions_to_txn.v4.request import (
    AddPartitionsToTxnRequest,
    AddPartitionsToTxnTopic,
    AddPartitionsToTxnTransaction,
)
from kio.schema.errors import ErrorCode
from kio.schema.types import ProducerId, TopicName, TransactionalId
from kio.static.primitive import i16, i32

from proxy.apis.api24_add_partitions_to_txn import (
    AddPartitionsAnswer,
    Key,
    read_add_partitions_to_txn_response,
)
from proxy.kafka.codec import encode
from proxy.partition.rules import ProduceResult

VERIFY_VERSION = 4  # the first batched (broker-to-broker) version, with verify_only
# Produce versions: through 10 a partition the coordinator does not know is answered
# INVALID_TXN_STATE; 11 (KIP-890) answers TRANSACTION_ABORTABLE; 12+ is transactions v2,
# where Kafka adds the partition itself (the proxy hides v2: it verifies, as for 11)
LAST_DEFAULT_ERROR_PRODUCE_VERSION = 10
FIRST_ADD_PARTITION_PRODUCE_VERSION = 12

NOT_ADDED_MESSAGE = "Partition was not added to the transaction"

# the coordinator's answers a producer is told to retry (NOT_ENOUGH_REPLICAS: retriable,
# and it does not make the client refresh its metadata)
_UNVERIFIED = frozenset(
    {
        ErrorCode.network_exception.value,
        ErrorCode.coordinator_load_in_progress.value,
        ErrorCode.coordinator_not_available.value,
        ErrorCode.not_coordinator.value,
    }
)


@dataclass(frozen=True, slots=True)
class Verification:
    """One transaction's partitions to verify: one entry of the batched request."""

    transactional_id: str
    producer_id: int
    producer_epoch: int
    partitions: tuple[Key, ...]


def verify_request(transactions: Sequence[Verification]) -> bytes:
    """The AddPartitionsToTxn v4 body (no header) asking, for each transaction, whether
    its partitions are in it (`verify_only`: nothing is added). Each transactional id
    at most once (the answer is keyed by it)."""
    ids = [t.transactional_id for t in transactions]
    if len(set(ids)) != len(ids):
        raise ValueError(f"a transactional id named twice in one verification: {ids}")
    return encode(
        AddPartitionsToTxnRequest(
            transactions=tuple(
                AddPartitionsToTxnTransaction(
                    transactional_id=TransactionalId(t.transactional_id),
                    producer_id=ProducerId(t.producer_id),
                    producer_epoch=i16(t.producer_epoch),
                    verify_only=True,
                    topics=_topics(t.partitions),
                )
                for t in transactions
            )
        )
    )


def _topics(partitions: Iterable[Key]) -> tuple[AddPartitionsToTxnTopic, ...]:
    by_topic: dict[str, list[int]] = {}
    for topic, partition in partitions:
        by_topic.setdefault(topic, []).append(partition)
    return tuple(
        AddPartitionsToTxnTopic(
            name=TopicName(topic), partitions=tuple(i32(p) for p in sorted(set(ps)))
        )
        for topic, ps in by_topic.items()
    )


def read_verify_answer(body: memoryview | bytes) -> AddPartitionsAnswer:
    """The coordinator's answer (FrameError if malformed)."""
    return read_add_partitions_to_txn_response(VERIFY_VERSION, body)


def coordinator_codes(answer: AddPartitionsAnswer, verification: Verification) -> dict[Key, int]:
    """Each partition of `verification` -> the coordinator's verdict, as Kafka's
    AddPartitionsToTxnManager passes it on: a top-level error for every partition
    (CLUSTER_AUTHORIZATION_FAILED as INVALID_TXN_STATE: a producer must not see it),
    PRODUCER_FENCED as INVALID_PRODUCER_EPOCH (what producers expect here), a partition
    the answer does not name as verified (0)."""
    top = answer.error_code
    if top:
        if top == ErrorCode.cluster_authorization_failed.value:
            top = ErrorCode.invalid_txn_state.value
        return dict.fromkeys(verification.partitions, top)
    codes = dict.fromkeys(verification.partitions, 0)
    for transactional_id, topics in answer.transactions:
        if transactional_id != verification.transactional_id:
            continue
        for name, partitions in topics:
            for partition, code in partitions:
                if (name, partition) in codes:
                    if code == ErrorCode.producer_fenced.value:
                        code = ErrorCode.invalid_producer_epoch.value
                    codes[(name, partition)] = code
    return codes


def produce_refusal(code: int, produce_version: int) -> ProduceResult | None:
    """What a Produce of `produce_version` is answered for a partition whose verification
    ended with `code` (0: verified, None: append it). Kafka's mapping: TRANSACTION_ABORTABLE
    becomes INVALID_TXN_STATE for Produce v10 and older; INVALID_TXN_STATE carries
    "Partition was not added to the transaction"; a coordinator that could not answer
    (and CONCURRENT_TRANSACTIONS before v12) becomes NOT_ENOUGH_REPLICAS, which every
    client retries; any other code is answered as it is, with no message."""
    if code == 0:
        return None
    if (
        code == ErrorCode.transaction_abortable.value
        and produce_version <= LAST_DEFAULT_ERROR_PRODUCE_VERSION
    ):
        code = ErrorCode.invalid_txn_state.value
    if code == ErrorCode.invalid_txn_state.value:
        return ProduceResult(code, error_message=NOT_ADDED_MESSAGE)
    if code in _UNVERIFIED or (
        code == ErrorCode.concurrent_transactions.value
        and produce_version < FIRST_ADD_PARTITION_PRODUCE_VERSION
    ):
        return unverified(code)
    return ProduceResult(code)


def unverified(code: int) -> ProduceResult:
    """The retriable answer for a verification that could not be done (`code` names why)."""
    return ProduceResult(
        ErrorCode.not_enough_replicas.value,
        error_message=(
            "Unable to verify the partition has been added to the transaction. "
            f"Underlying error: {error_name(code)}"
        ),
    )


def error_name(code: int) -> str:
    """Kafka's name of an error code (`Errors.toString`), e.g. COORDINATOR_NOT_AVAILABLE."""
    try:
        return ErrorCode(code).name.upper()
    except ValueError:
        return f"UNKNOWN_SERVER_ERROR({code})"
