"""Reading an AddPartitionsToTxn request and Kafka's answer, and re-answering partitions
with another error, for every served version; requests and answers written and read back
with kio. And the plan (proxy/tiered/txn.py): which requests go to Kafka with a catch-up
after, forward first and catch up after, and what the client is answered."""

from __future__ import annotations

import asyncio
import datetime

import pytest
from kio.schema.errors import ErrorCode

from proxy.apis.api24_add_partitions_to_txn import (
    answer_with_errors,
    read_add_partitions_to_txn_request,
    read_add_partitions_to_txn_response,
)
from proxy.kafka.codec import decode, encode
from proxy.kafka.frames import FrameError
from proxy.tiered.txn import RETRY_ERROR, plan_add_partitions_to_txn
from tests.support.after_upstream import run_after_upstream
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


def kafka_answer(version: int, transactions: dict[str | None, dict[str, dict[int, int]]]) -> bytes:
    """An answer as Kafka writes it: {transactional id (None before v4): {topic: {p: code}}}."""
    m = mod(RESPONSES, version)

    def topics(by_topic):
        return tuple(
            m.AddPartitionsToTxnTopicResult(
                name=name,
                results_by_partition=tuple(
                    m.AddPartitionsToTxnPartitionResult(
                        partition_index=p, partition_error_code=ErrorCode(code)
                    )
                    for p, code in partitions.items()
                ),
            )
            for name, partitions in by_topic.items()
        )

    throttle = datetime.timedelta(milliseconds=7)
    if version < 4:
        ((_, by_topic),) = transactions.items()
        return encode(
            m.AddPartitionsToTxnResponse(
                throttle_time=throttle, results_by_topic_v3_and_below=topics(by_topic)
            )
        )
    return encode(
        m.AddPartitionsToTxnResponse(
            throttle_time=throttle,
            error_code=ErrorCode.none,
            results_by_transaction=tuple(
                m.AddPartitionsToTxnResult(transactional_id=txn_id, topic_results=topics(t))
                for txn_id, t in transactions.items()
            ),
        )
    )


CONCURRENT = ErrorCode.concurrent_transactions


@pytest.mark.parametrize("version", CLIENT_VERSIONS)
def test_kafkas_client_answer_is_read_and_re_answered(version):
    body = kafka_answer(version, {None: {"plain": {0: 0, 2: 0}, "tiered": {1: 0}}})
    answer = read_add_partitions_to_txn_response(version, body)
    assert answer.throttle_ms == 7 and answer.error_code == 0
    assert answer.codes() == {("plain", 0): 0, ("plain", 2): 0, ("tiered", 1): 0}
    assert answer_with_errors(answer, (), RETRY_ERROR) == body  # byte for byte
    again = decode(RESPONSES[version], answer_with_errors(answer, {("tiered", 1)}, RETRY_ERROR))
    assert again.throttle_time.total_seconds() == 0.007
    assert _results(again.results_by_topic_v3_and_below) == {
        ("plain", 0): ErrorCode.none,
        ("plain", 2): ErrorCode.none,
        ("tiered", 1): CONCURRENT,
    }


@pytest.mark.parametrize("version", BATCHED_VERSIONS)
def test_kafkas_batched_answer_is_read_and_re_answered(version):
    body = kafka_answer(version, {"a": {"plain": {0: 0}}, "b": {"tiered": {1: 0, 2: 48}}})
    answer = read_add_partitions_to_txn_response(version, body)
    assert answer.codes() == {("plain", 0): 0, ("tiered", 1): 0, ("tiered", 2): 48}
    assert answer_with_errors(answer, (), RETRY_ERROR) == body
    again = decode(RESPONSES[version], answer_with_errors(answer, {("tiered", 1)}, RETRY_ERROR))
    by_txn = {r.transactional_id: _results(r.topic_results) for r in again.results_by_transaction}
    assert by_txn == {
        "a": {("plain", 0): ErrorCode.none},
        "b": {("tiered", 1): CONCURRENT, ("tiered", 2): ErrorCode(48)},
    }


@pytest.mark.parametrize("version", VERSIONS)
def test_a_truncated_or_padded_answer_is_a_frame_error(version):
    txn = None if version < 4 else "x"
    body = kafka_answer(version, {txn: {"t": {0: 0, 1: 0}}})
    for cut in range(len(body)):
        with pytest.raises(FrameError, match="AddPartitionsToTxn"):
            read_add_partitions_to_txn_response(version, body[:cut])
    with pytest.raises(FrameError, match="after the end"):
        read_add_partitions_to_txn_response(version, body + b"\x00")


def test_concurrent_transactions_is_what_every_client_retries():
    # librdkafka, the Java producer and aiokafka retry AddPartitionsToTxn on it
    assert ErrorCode(RETRY_ERROR) == CONCURRENT and CONCURRENT.retriable


class _Topics:
    def __init__(self, tiered: set[str]) -> None:
        self.tiered = tiered

    def any(self) -> bool:
        return bool(self.tiered)


class _Tiering:
    """What the plan reads of the tiering service: a pure stand-in for a unit test; its
    catch-up records what it was asked and when, and fails the partitions in `failing`."""

    def __init__(self, tiered: set[str], failing: frozenset = frozenset()) -> None:
        self.topics = _Topics(tiered)
        self.failing = failing
        self.asked: list[list[tuple[str, int]]] = []

    def is_tiered(self, topic: str, partition: int) -> bool:
        return topic in self.topics.tiered

    async def catch_up(self, keys):
        self.asked.append(keys)
        await asyncio.sleep(0)
        return frozenset(k for k in keys if k in self.failing)


def _run(tiering, version: int, request: bytes, answer: bytes):
    """(the plan's upstream frame, what it asked before upstream answered, the client's
    answer); None if the request goes upstream with nothing after."""
    make = lambda frame, body: plan_add_partitions_to_txn(tiering, frame, body, version)  # noqa: E731
    return run_after_upstream(make, tiering.asked, version, request, answer)


def test_a_request_naming_no_tiered_topic_goes_to_kafka_as_it_came():
    answer = kafka_answer(0, {None: {"tiered": {0: 0}}})
    assert _run(_Tiering(set()), 0, client_request(0, {"tiered": [0]}), answer) is None
    assert _run(_Tiering(TIERED), 3, client_request(3, {"plain": [0]}), answer) is None


@pytest.mark.parametrize("version", CLIENT_VERSIONS)
def test_forward_first_catch_up_after_then_kafkas_answer(version):
    tiering = _Tiering(TIERED)
    request = client_request(version, {"plain": [0], "tiered": [2, 1]})
    answer = kafka_answer(version, {None: {"plain": {0: 0}, "tiered": {2: 0, 1: 0}}})
    frame, asked_before, body = _run(tiering, version, request, answer)
    assert frame == (b"S", b"H" * 10, request)  # the request upstream as it came
    assert asked_before == []  # nothing caught up before Kafka answered
    assert tiering.asked == [[("tiered", 1), ("tiered", 2)]]
    assert body == answer  # Kafka's answer, byte for byte


def test_only_the_partitions_kafka_added_are_caught_up():
    tiering = _Tiering(TIERED)
    request = client_request(0, {"tiered": [0, 1]})
    answer = kafka_answer(0, {None: {"tiered": {0: 0, 1: 53}}})  # 53: invalid txn state
    assert _run(tiering, 0, request, answer)[2] == answer
    assert tiering.asked == [[("tiered", 0)]]
    failed = kafka_answer(0, {None: {"tiered": {0: 51, 1: 51}}})  # Kafka said wait
    tiering = _Tiering(TIERED)
    assert _run(tiering, 0, request, failed)[2] == failed
    assert tiering.asked == []


def test_a_failed_catch_up_answers_concurrent_transactions():
    tiering = _Tiering(TIERED, failing=frozenset({("tiered-2", 5)}))
    request = client_request(1, {"plain": [0], "tiered": [1], "tiered-2": [5]})
    answer = kafka_answer(1, {None: {"plain": {0: 0}, "tiered": {1: 0}, "tiered-2": {5: 0}}})
    body = _run(tiering, 1, request, answer)[2]
    assert _results(decode(RESPONSES[1], body).results_by_topic_v3_and_below) == {
        ("plain", 0): ErrorCode.none,
        ("tiered", 1): ErrorCode.none,
        ("tiered-2", 5): CONCURRENT,
    }
