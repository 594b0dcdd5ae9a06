"""Reading an AddPartitionsToTxn request and answering it as Kafka answers a request it
does not attempt, for every served version; requests written and answers read back with
kio. And the decision: which requests are refused, which go to Kafka."""

from __future__ import annotations

import asyncio
import logging

import pytest
from kio.schema.errors import ErrorCode

from proxy.apis.api24_add_partitions_to_txn import (
    read_add_partitions_to_txn_request,
    refused_answer,
    refused_partitions,
)
from proxy.kafka.codec import decode, encode
from proxy.kafka.frames import FrameError
from proxy.tiered.txn_refusal import (
    REFUSAL_ERROR,
    TxnRefusals,
    plan_add_partitions_to_txn,
)
from tests.support.kio_types import mod, served

REQUESTS, RESPONSES, VERSIONS = served(24)
CLIENT_VERSIONS = [v for v in VERSIONS if v < 4]
BATCHED_VERSIONS = [v for v in VERSIONS if v >= 4]
NOT_ATTEMPTED = ErrorCode.operation_not_attempted
TIERED = {"tiered", "tiered-2"}


def test_every_kio_add_partitions_to_txn_version_is_served():
    assert VERSIONS == sorted(RESPONSES) == [0, 1, 2, 3, 4, 5]


def _topics(m, topics: dict[str, list[int]]) -> tuple:
    return tuple(
        m.AddPartitionsToTxnTopic(name=name, partitions=tuple(ps)) for name, ps in topics.items()
    )


def client_request(version: int, topics: dict[str, list[int]], txn_id: str = "tx-1") -> bytes:
    m = mod(REQUESTS, version)
    return encode(
        m.AddPartitionsToTxnRequest(
            v3_and_below_transactional_id=txn_id,
            v3_and_below_producer_id=4000,
            v3_and_below_producer_epoch=3,
            v3_and_below_topics=_topics(m, topics),
        )
    )


def batched_request(version: int, transactions: dict[str, dict[str, list[int]]]) -> bytes:
    m = mod(REQUESTS, version)
    return encode(
        m.AddPartitionsToTxnRequest(
            transactions=tuple(
                m.AddPartitionsToTxnTransaction(
                    transactional_id=txn_id,
                    producer_id=7000 + n,
                    producer_epoch=n,
                    verify_only=n % 2 == 1,
                    topics=_topics(m, topics),
                )
                for n, (txn_id, topics) in enumerate(transactions.items())
            )
        )
    )


def _results(topic_results) -> dict[tuple[str, int], ErrorCode]:
    return {
        (t.name, p.partition_index): p.partition_error_code
        for t in topic_results
        for p in t.results_by_partition
    }


@pytest.mark.parametrize("version", CLIENT_VERSIONS)
def test_a_client_request_is_read(version):
    body = client_request(version, {"plain": [0, 2], "tiered": [1]}, "my-txn")
    view = read_add_partitions_to_txn_request(version, body)
    assert view.api_version == version
    (txn,) = view.transactions
    assert (txn.transactional_id, txn.producer_id, txn.producer_epoch) == ("my-txn", 4000, 3)
    assert not txn.verify_only
    assert view.keys() == [("plain", 0), ("plain", 2), ("tiered", 1)]


@pytest.mark.parametrize("version", BATCHED_VERSIONS)
def test_a_batched_request_is_read(version):
    body = batched_request(version, {"a": {"plain": [0]}, "b": {"tiered": [3, 4]}})
    view = read_add_partitions_to_txn_request(version, body)
    a, b = view.transactions
    assert (a.transactional_id, a.producer_id, a.producer_epoch, a.verify_only) == (
        "a", 7000, 0, False
    )  # fmt: skip
    assert (b.transactional_id, b.producer_id, b.producer_epoch, b.verify_only) == (
        "b", 7001, 1, True
    )  # fmt: skip
    assert view.keys() == [("plain", 0), ("tiered", 3), ("tiered", 4)]


@pytest.mark.parametrize("version", VERSIONS)
def test_a_truncated_or_padded_request_is_a_frame_error(version):
    if version < 4:
        body = client_request(version, {"t": [0, 1]})
    else:
        body = batched_request(version, {"x": {"t": [0, 1]}})
    for cut in range(len(body)):
        with pytest.raises(FrameError, match="AddPartitionsToTxn"):
            read_add_partitions_to_txn_request(version, body[:cut])
    with pytest.raises(FrameError, match="after the end"):
        read_add_partitions_to_txn_request(version, body + b"\x00")


def test_a_huge_partition_count_is_a_frame_error_not_an_allocation():
    body = bytearray(client_request(0, {"t": [0]}))
    count_at = len(body) - 8  # int32 count, then one int32 partition
    body[count_at : count_at + 4] = (0x7FFFFFFF).to_bytes(4, "big")
    with pytest.raises(FrameError):
        read_add_partitions_to_txn_request(0, bytes(body))


def test_an_unserved_version_is_a_frame_error():
    with pytest.raises(FrameError, match="unsupported version 6"):
        read_add_partitions_to_txn_request(6, b"")


def test_the_refused_partitions_are_those_of_tiered_topics_per_transaction():
    body = batched_request(4, {"a": {"plain": [0]}, "b": {"tiered": [1], "plain": [2]}})
    view = read_add_partitions_to_txn_request(4, body)
    assert refused_partitions(view, lambda t, p: t in TIERED) == {"b": [("tiered", 1)]}
    plain = read_add_partitions_to_txn_request(0, client_request(0, {"plain": [0, 1]}))
    assert refused_partitions(plain, lambda t, p: t in TIERED) == {}


@pytest.mark.parametrize("version", CLIENT_VERSIONS)
def test_the_answer_refuses_tiered_partitions_and_attempts_no_other(version):
    layout = {"plain": [0, 2], "tiered": [1, 0], "tiered-2": [5]}
    view = read_add_partitions_to_txn_request(version, client_request(version, layout))
    refused = {key for keys in refused_partitions(view, lambda t, p: t in TIERED).values()
               for key in keys}  # fmt: skip
    answer = decode(RESPONSES[version], refused_answer(view, refused, REFUSAL_ERROR, 7))
    assert answer.throttle_time.total_seconds() == 0.007
    assert [t.name for t in answer.results_by_topic_v3_and_below] == list(layout)
    assert _results(answer.results_by_topic_v3_and_below) == {
        ("plain", 0): NOT_ATTEMPTED,
        ("plain", 2): NOT_ATTEMPTED,
        ("tiered", 1): ErrorCode(REFUSAL_ERROR),
        ("tiered", 0): ErrorCode(REFUSAL_ERROR),
        ("tiered-2", 5): ErrorCode(REFUSAL_ERROR),
    }


@pytest.mark.parametrize("version", BATCHED_VERSIONS)
def test_a_batched_answer_names_every_transaction(version):
    body = batched_request(version, {"a": {"plain": [0]}, "b": {"tiered": [1], "plain": [2]}})
    view = read_add_partitions_to_txn_request(version, body)
    answer = decode(RESPONSES[version], refused_answer(view, {("tiered", 1)}, REFUSAL_ERROR))
    assert answer.error_code == ErrorCode.none
    by_txn = {r.transactional_id: _results(r.topic_results) for r in answer.results_by_transaction}
    assert by_txn == {
        "a": {("plain", 0): NOT_ATTEMPTED},
        "b": {("tiered", 1): ErrorCode(REFUSAL_ERROR), ("plain", 2): NOT_ATTEMPTED},
    }


def test_the_refusal_is_a_code_clients_do_not_retry_and_can_abort():
    # docs/tiering.md, "Transactions": each client tried with each candidate
    assert ErrorCode(REFUSAL_ERROR) == ErrorCode.topic_authorization_failed


class _Topics:
    def __init__(self, tiered: set[str]) -> None:
        self.tiered = tiered

    def any(self) -> bool:
        return bool(self.tiered)


class _Tiering:
    """What the plan reads of the tiering service: a pure stand-in for a unit test."""

    def __init__(self, tiered: set[str]) -> None:
        self.topics = _Topics(tiered)
        self.txn_refusals = TxnRefusals(limit=2)

    def is_tiered(self, topic: str, partition: int) -> bool:
        return topic in self.topics.tiered


def _plan(tiering, version: int, body: bytes):
    async def run():
        plan = plan_add_partitions_to_txn(tiering, memoryview(body), version, "client:1")
        if plan is None:
            return None
        return plan.merge(version, None, plan.local.result())

    return asyncio.run(run())


def test_a_request_naming_no_tiered_topic_goes_to_kafka_as_it_came():
    assert _plan(_Tiering(set()), 0, client_request(0, {"tiered": [0]})) is None  # none tiered
    assert _plan(_Tiering(TIERED), 3, client_request(3, {"plain": [0]})) is None


def test_a_request_naming_a_tiered_topic_is_answered_here(caplog):
    tiering = _Tiering(TIERED)
    with caplog.at_level(logging.WARNING, logger="tierproxy.transactions"):
        body = _plan(tiering, 1, client_request(1, {"plain": [0], "tiered": [2]}))
    answer = decode(RESPONSES[1], body)
    assert _results(answer.results_by_topic_v3_and_below) == {
        ("plain", 0): NOT_ATTEMPTED,
        ("tiered", 2): ErrorCode(REFUSAL_ERROR),
    }
    (record,) = caplog.records
    assert record.levelno == logging.WARNING
    assert "'tx-1'" in record.getMessage() and "tiered topic tiered " in record.getMessage()


def test_the_refusal_is_logged_once_per_transactional_id(caplog):
    tiering = _Tiering(TIERED)
    with caplog.at_level(logging.WARNING, logger="tierproxy.transactions"):
        for txn_id in ("one", "one", "two", "one", "two"):
            _plan(tiering, 0, client_request(0, {"tiered": [0], "tiered-2": [1]}, txn_id))
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 2 and tiering.txn_refusals.count == 5
    assert "'one'" in warned[0] and "tiered topics tiered, tiered-2 " in warned[0]
    assert "'two'" in warned[1]


def test_the_warned_ids_are_bounded_the_oldest_forgotten(caplog):
    refusals = TxnRefusals(limit=2)
    with caplog.at_level(logging.WARNING, logger="tierproxy.transactions"):
        for txn_id in ("a", "b", "c", "b", "a"):
            refusals.note(txn_id, [("t", 0)], "client")
    assert [r.getMessage().split()[5] for r in caplog.records] == ["'a'", "'b'", "'c'", "'a'"]
