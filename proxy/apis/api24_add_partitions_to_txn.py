"""AddPartitionsToTxn (api key 24), v0-v5: read a request naming tiered partitions, and
answer it here, per partition, as Kafka answers one it refuses.

Two forms. v0-v3 (v3 flexible) are the client's: one transaction, `transactional_id,
producer_id, producer_epoch, topics[name, partitions[int32]]`, answered `throttle_time_ms,
results_by_topic[name, results_by_partition[partition_index, error_code]]`. v4+ are the
broker's batched form (KIP-890: a partition leader verifying with the coordinator):
`transactions[transactional_id, producer_id, producer_epoch, verify_only, topics]`,
answered `throttle_time_ms, error_code, results_by_transaction[transactional_id,
topic_results]`. Kafka's Java producer builds v0-v3 only (`Builder.forClient`), librdkafka
and aiokafka send v0; and as the proxy's ApiVersions hides the transaction version
feature (api18), no client takes the transactions-v2 path that would skip this request.

`read_add_partitions_to_txn_request` reads either form into `AddPartitionsView`;
`refused_answer` encodes (with kio) Kafka's answer to a request it does not attempt:
the refused partitions carry the error, every other partition of the same transaction
OPERATION_NOT_ATTEMPTED, as Kafka's KafkaApis answers when any partition of the request
fails its checks. Nothing of such a request is added anywhere.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Collection
from dataclasses import dataclass
from functools import cache

from kio.schema.errors import ErrorCode
from kio.static.protocol import Entity

from proxy.kafka.api_keys import ApiKey
from proxy.kafka.codec import encode, load_response_types, load_types, response_type
from proxy.kafka.frames import FrameError, malformed
from proxy.kafka.wire import (
    INT32,
    expect_end,
    read_count,
    read_int16,
    read_int32,
    read_int64,
    read_string,
    read_topic_key,
    skip,
    skip_tagged_fields,
)

API_KEY = ApiKey.ADD_PARTITIONS_TO_TXN
REQUESTS = load_types(API_KEY, "request")
RESPONSES = load_response_types(API_KEY)
FIRST_BATCHED_VERSION = 4  # transactions[...]: the broker-to-broker form

Key = tuple[str, int]  # (topic, partition)


@dataclass(frozen=True, slots=True)
class TxnTopicView:
    name: str
    partitions: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class TxnView:
    transactional_id: str
    producer_id: int
    producer_epoch: int
    verify_only: bool  # v4+ only; False before
    topics: tuple[TxnTopicView, ...]

    def keys(self) -> list[Key]:
        return [(t.name, p) for t in self.topics for p in t.partitions]


@dataclass(frozen=True, slots=True)
class AddPartitionsView:
    api_version: int
    transactions: tuple[TxnView, ...]  # one before v4

    def keys(self) -> list[Key]:
        return [key for txn in self.transactions for key in txn.keys()]


@cache
def _flexible(api_version: int) -> bool:
    return response_type(REQUESTS, API_KEY, api_version).__flexible__  # FrameError if unserved


def read_add_partitions_to_txn_request(
    api_version: int, body: memoryview | bytes
) -> AddPartitionsView:
    """Every transaction and partition named; FrameError if the version is not served or
    the body is malformed or truncated."""
    flexible = _flexible(api_version)
    buf = memoryview(body)
    with malformed(f"AddPartitionsToTxn v{api_version} request"):
        if api_version < FIRST_BATCHED_VERSION:
            txn, offset = _read_transaction(buf, 0, flexible, batched=False)
            transactions = [txn]
        else:
            count, offset = read_count(buf, 0, flexible, "transactions")
            transactions = []
            for _ in range(count):
                txn, offset = _read_transaction(buf, offset, flexible, batched=True)
                transactions.append(txn)
        offset = skip_tagged_fields(buf, offset) if flexible else offset
        expect_end(buf, offset)
    return AddPartitionsView(api_version, tuple(transactions))


def _read_transaction(
    buf: memoryview, offset: int, flexible: bool, batched: bool
) -> tuple[TxnView, int]:
    transactional_id, offset = read_string(buf, offset, flexible)
    if transactional_id is None:
        raise FrameError(f"null transactional id before byte {offset}")
    producer_id, offset = read_int64(buf, offset)
    producer_epoch, offset = read_int16(buf, offset)
    verify_only = False
    if batched:
        end = skip(buf, offset, 1)
        verify_only, offset = buf[offset] != 0, end
    topics = []
    count, offset = read_count(buf, offset, flexible, "topics")
    for _ in range(count):
        name, offset = read_topic_key(buf, offset, False, flexible)
        partition_count, offset = read_count(buf, offset, flexible, "partitions")
        end = skip(buf, offset, 4 * partition_count)
        partitions = tuple(INT32.unpack_from(buf, at)[0] for at in range(offset, end, 4))
        offset = skip_tagged_fields(buf, end) if flexible else end
        topics.append(TxnTopicView(str(name), partitions))
    if batched:  # the transaction's own tags; before v4 its fields are the request's
        offset = skip_tagged_fields(buf, offset)
    txn = TxnView(transactional_id, producer_id, producer_epoch, verify_only, tuple(topics))
    return txn, offset


def refused_partitions(
    view: AddPartitionsView, refuse: Callable[[str, int], bool]
) -> dict[str, list[Key]]:
    """transactional id -> the partitions `refuse` says no to, for the transactions
    naming any; empty: the request may go to Kafka as it came."""
    refused: dict[str, list[Key]] = {}
    for txn in view.transactions:
        keys = [key for key in txn.keys() if refuse(*key)]
        if keys:
            refused.setdefault(txn.transactional_id, []).extend(keys)
    return refused


def refused_answer(
    view: AddPartitionsView, refused: Collection[Key], error_code: int, throttle_ms: int = 0
) -> bytes:
    """The answer body (no header) to a request Kafka does not attempt: each partition in
    `refused` answered `error_code`, every other OPERATION_NOT_ATTEMPTED, topics and
    partitions in the request's order (a topic named twice is answered once, as Kafka's
    map-based answer does)."""
    response = response_type(RESPONSES, API_KEY, view.api_version)
    partition_type, topic_type, txn_type = _entry_types(response)
    error, not_attempted = ErrorCode(error_code), ErrorCode.operation_not_attempted

    def topic_results(txn: TxnView) -> tuple:
        by_topic: dict[str, dict[int, ErrorCode]] = {}
        for name, partition in txn.keys():
            code = error if (name, partition) in refused else not_attempted
            by_topic.setdefault(name, {})[partition] = code
        return tuple(
            topic_type(
                name=name,
                results_by_partition=tuple(
                    partition_type(partition_index=p, partition_error_code=code)
                    for p, code in partitions.items()
                ),
            )
            for name, partitions in by_topic.items()
        )

    throttle = datetime.timedelta(milliseconds=throttle_ms)
    if view.api_version < FIRST_BATCHED_VERSION:
        (txn,) = view.transactions
        return encode(
            response(throttle_time=throttle, results_by_topic_v3_and_below=topic_results(txn))
        )
    return encode(
        response(
            throttle_time=throttle,
            error_code=ErrorCode.none,
            results_by_transaction=tuple(
                txn_type(transactional_id=txn.transactional_id, topic_results=topic_results(txn))
                for txn in view.transactions
            ),
        )
    )


@cache
def _entry_types(response: type[Entity]) -> tuple[type, type, type | None]:
    """(partition result, topic result, transaction result or None) classes of a version."""
    module = __import__(response.__module__, fromlist=["_"])
    txn_type = getattr(module, "AddPartitionsToTxnResult", None)
    return module.AddPartitionsToTxnPartitionResult, module.AddPartitionsToTxnTopicResult, txn_type


# -- the answer, as Kafka gives it -------------------------------------------------------

TopicAnswer = tuple[str, tuple[tuple[int, int], ...]]  # (name, ((partition, error code), ...))


@dataclass(frozen=True, slots=True)
class AddPartitionsAnswer:
    """Kafka's answer, read by hand (proxy/kafka/codec.py: no kio decode of network
    bytes), in its order. Before v4 one transaction whose id the answer does not carry
    (None)."""

    api_version: int
    throttle_ms: int
    error_code: int  # v4+: the top-level code; 0 before
    transactions: tuple[tuple[str | None, tuple[TopicAnswer, ...]], ...]

    def codes(self) -> dict[Key, int]:
        """(topic, partition) -> its error code (the top-level one if that is set)."""
        return {
            (name, partition): self.error_code or code
            for _, topics in self.transactions
            for name, partitions in topics
            for partition, code in partitions
        }


def read_add_partitions_to_txn_response(
    api_version: int, body: memoryview | bytes
) -> AddPartitionsAnswer:
    """FrameError if the version is not served or the body is malformed or truncated."""
    flexible = _flexible(api_version)
    buf = memoryview(body)
    with malformed(f"AddPartitionsToTxn v{api_version} response"):
        throttle_ms, offset = read_int32(buf, 0)
        error_code = 0
        if api_version < FIRST_BATCHED_VERSION:
            topics, offset = _read_topic_answers(buf, offset, flexible)
            transactions: list[tuple[str | None, tuple[TopicAnswer, ...]]] = [(None, topics)]
        else:
            error_code, offset = read_int16(buf, offset)
            count, offset = read_count(buf, offset, flexible, "results_by_transaction")
            transactions = []
            for _ in range(count):
                transactional_id, offset = read_string(buf, offset, flexible)
                topics, offset = _read_topic_answers(buf, offset, flexible)
                offset = skip_tagged_fields(buf, offset)
                transactions.append((transactional_id, topics))
        offset = skip_tagged_fields(buf, offset) if flexible else offset
        expect_end(buf, offset)
    return AddPartitionsAnswer(api_version, throttle_ms, error_code, tuple(transactions))


def _read_topic_answers(
    buf: memoryview, offset: int, flexible: bool
) -> tuple[tuple[TopicAnswer, ...], int]:
    topics = []
    count, offset = read_count(buf, offset, flexible, "topic results")
    for _ in range(count):
        name, offset = read_topic_key(buf, offset, False, flexible)
        partition_count, offset = read_count(buf, offset, flexible, "partition results")
        partitions = []
        for _ in range(partition_count):
            partition, offset = read_int32(buf, offset)
            code, offset = read_int16(buf, offset)
            offset = skip_tagged_fields(buf, offset) if flexible else offset
            partitions.append((partition, code))
        offset = skip_tagged_fields(buf, offset) if flexible else offset
        topics.append((str(name), tuple(partitions)))
    return tuple(topics), offset


def answer_with_errors(
    answer: AddPartitionsAnswer, errors: Collection[Key], error_code: int
) -> bytes:
    """Kafka's answer re-encoded (with kio) with each partition in `errors` answered
    `error_code` instead (tagged fields Kafka may have added are left out)."""
    response = response_type(RESPONSES, API_KEY, answer.api_version)
    partition_type, topic_type, txn_type = _entry_types(response)

    def topic_results(topics: tuple[TopicAnswer, ...]) -> tuple:
        return tuple(
            topic_type(
                name=name,
                results_by_partition=tuple(
                    partition_type(
                        partition_index=p,
                        partition_error_code=ErrorCode(error_code if (name, p) in errors else code),
                    )
                    for p, code in partitions
                ),
            )
            for name, partitions in topics
        )

    throttle = datetime.timedelta(milliseconds=answer.throttle_ms)
    if answer.api_version < FIRST_BATCHED_VERSION:
        ((_, topics),) = answer.transactions
        return encode(
            response(throttle_time=throttle, results_by_topic_v3_and_below=topic_results(topics))
        )
    return encode(
        response(
            throttle_time=throttle,
            error_code=ErrorCode(answer.error_code),
            results_by_transaction=tuple(
                txn_type(transactional_id=txn_id, topic_results=topic_results(topics))
                for txn_id, topics in answer.transactions
            ),
        )
    )
