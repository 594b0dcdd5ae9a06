"""Reading an InitProducerId request's transactional id and Kafka's answer, for every
served version (written with kio, read by hand). And the plan (proxy/tiered/fencing.py):
which requests get a catch-up after Kafka's answer, forward first and catch up after,
and that the client always gets Kafka's answer as it came."""

from __future__ import annotations

import asyncio
import datetime
import logging

import pytest
from kio.schema.errors import ErrorCode

from proxy.apis.api22_init_producer_id import (
    read_init_producer_id_response,
    read_transactional_id,
)
from proxy.kafka.codec import encode
from proxy.kafka.frames import FrameError
from proxy.tiered.fencing import plan_init_producer_id
from tests.support.after_upstream import HEAD, run_after_upstream
from tests.support.kio_types import only_fields, served

REQUESTS, RESPONSES, VERSIONS = served(22)
MS = datetime.timedelta(milliseconds=1)


def test_every_kio_init_producer_id_version_is_served():
    assert VERSIONS == sorted(RESPONSES) == [0, 1, 2, 3, 4, 5, 6]


def request(version: int, txn_id: str | None) -> bytes:
    return encode(
        only_fields(
            REQUESTS[version],
            transactional_id=txn_id,
            transaction_timeout=60_000 * MS,
            producer_id=-1,
            producer_epoch=-1,
            enable2_pc=False,
            keep_prepared_txn=False,
        )
    )


def answer(version: int, error: ErrorCode, producer_id: int, epoch: int) -> bytes:
    return encode(
        only_fields(
            RESPONSES[version],
            throttle_time=0 * MS,
            error_code=error,
            producer_id=producer_id,
            producer_epoch=epoch,
            ongoing_txn_producer_id=-1,
            ongoing_txn_producer_epoch=-1,
        )
    )


@pytest.mark.parametrize("version", VERSIONS)
def test_the_transactional_id_and_the_answer_are_read(version):
    assert read_transactional_id(version, request(version, "tx-ü")) == "tx-ü"
    assert read_transactional_id(version, request(version, None)) is None
    read = read_init_producer_id_response(answer(version, ErrorCode.none, 4001, 7))
    assert (read.error_code, read.producer_id, read.producer_epoch) == (0, 4001, 7)
    read = read_init_producer_id_response(answer(version, ErrorCode.producer_fenced, -1, -1))
    assert (read.error_code, read.producer_id) == (ErrorCode.producer_fenced.value, -1)


def test_truncated_bodies_and_unserved_versions_are_frame_errors():
    with pytest.raises(FrameError, match="InitProducerId response"):
        read_init_producer_id_response(answer(0, ErrorCode.none, 1, 1)[:10])
    with pytest.raises(FrameError, match="InitProducerId v2 request"):
        read_transactional_id(2, request(2, "tx")[:2])
    with pytest.raises(FrameError, match="unsupported version 99"):
        read_transactional_id(99, request(0, "tx"))


class _Topics:
    def __init__(self, tiered: bool) -> None:
        self.tiered = tiered

    def any(self) -> bool:
        return self.tiered


class _Tiering:
    """What the plan reads of the tiering service: a pure stand-in for a unit test; its
    producer catch-up records the producer ids asked and answers `failures`."""

    def __init__(self, tiered: bool = True, failures: list[str] | None = None) -> None:
        self.topics = _Topics(tiered)
        self.failures = failures or []
        self.asked: list[int] = []

    async def catch_up_producer(self, producer_id: int) -> list[str]:
        self.asked.append(producer_id)
        await asyncio.sleep(0)
        return self.failures


def _run(tiering: _Tiering, version: int, req: bytes, ans: bytes):
    """(the plan's upstream frame, what was asked before upstream answered, the client's
    answer); None if the request goes upstream with nothing after."""
    make = lambda frame, body: plan_init_producer_id(tiering, frame, body, version)  # noqa: E731
    return run_after_upstream(make, tiering.asked, version, req, ans)


def test_no_tiered_topic_or_no_transactional_id_goes_to_kafka_with_nothing_after():
    ok = answer(4, ErrorCode.none, 4001, 3)
    assert _run(_Tiering(tiered=False), 4, request(4, "tx"), ok) is None
    assert _run(_Tiering(), 4, request(4, None), ok) is None  # idempotent: nothing to fence


@pytest.mark.parametrize("version", VERSIONS)
def test_forward_first_then_the_producers_partitions_caught_up_then_kafkas_answer(version):
    tiering = _Tiering()
    req, ans = request(version, "tx"), answer(version, ErrorCode.none, 4001, 3)
    frame, asked_before, body = _run(tiering, version, req, ans)
    assert frame == (b"S", HEAD, req)  # the request upstream as it came
    assert asked_before == []  # nothing caught up before Kafka answered
    assert tiering.asked == [4001]
    assert body == ans  # Kafka's answer, byte for byte


def test_a_new_producer_id_or_an_error_catches_nothing_up():
    for ans in (
        answer(3, ErrorCode.none, 4001, 0),  # epoch 0: a producer id with no past
        answer(3, ErrorCode.concurrent_transactions, -1, -1),  # the abort is under way
        answer(3, ErrorCode.producer_fenced, -1, -1),
        b"\x00\x00",  # unreadable: passed on for the client to judge
    ):
        tiering = _Tiering()
        assert _run(tiering, 3, request(3, "tx"), ans)[2] == ans
        assert tiering.asked == []


def test_a_failed_catch_up_is_logged_and_kafkas_answer_given(caplog):
    tiering = _Tiering(failures=["member b answered 7: not caught up"])
    ans = answer(5, ErrorCode.none, 4001, 9)
    with caplog.at_level(logging.WARNING, "tierproxy.transactions"):
        assert _run(tiering, 5, request(5, "tx"), ans)[2] == ans
    assert "member b answered 7" in caplog.text and "'tx' (producer id 4001)" in caplog.text
