"""Reading Kafka's DeleteTopics answer, for every served version (written with kio, read by
hand). And the plan (proxy/tiered/topic_deletes.py): forwarded whole, the tiered topics
Kafka deleted marked before the client has Kafka's answer, as it came."""

from __future__ import annotations

import asyncio
import datetime
import logging
import uuid

import pytest
from kio.schema.errors import ErrorCode

from proxy.apis.api20_delete_topics import DeletedTopic, read_delete_topics_response
from proxy.kafka.codec import encode
from proxy.kafka.frames import FrameError
from proxy.metadata.topic_index import TieredTopic
from proxy.tiered.topic_deletes import plan_delete_topics
from tests.support.after_upstream import HEAD, TieredTopics, run_after_upstream
from tests.support.kio_types import mod, only_fields, served

REQUESTS, RESPONSES, VERSIONS = served(20)
MS = datetime.timedelta(milliseconds=1)
ORDERS, PAYMENTS = uuid.uuid4(), uuid.uuid4()


def test_every_kio_delete_topics_version_is_served():
    assert VERSIONS == sorted(RESPONSES) == [1, 2, 3, 4, 5, 6]


def request(version: int, *names: str) -> bytes:
    module = mod(REQUESTS, version)
    topics = ()
    if version >= 6:
        topics = tuple(
            only_fields(module.DeleteTopicState, name=n, topic_id=uuid.UUID(int=0)) for n in names
        )
    fields = {"topics": topics, "topic_names": names, "timeout": 30_000 * MS}
    return encode(only_fields(REQUESTS[version], **fields))


def answer(version: int, *results: tuple[str | None, uuid.UUID, ErrorCode]) -> bytes:
    module = mod(RESPONSES, version)
    entries = tuple(
        only_fields(
            module.DeletableTopicResult,
            name=name,
            topic_id=topic_id,
            error_code=error,
            error_message=None if error == ErrorCode.none else "no",
        )
        for name, topic_id, error in results
    )
    return encode(only_fields(RESPONSES[version], throttle_time=0 * MS, responses=entries))


@pytest.mark.parametrize("version", VERSIONS)
def test_each_topics_name_id_and_error_are_read(version):
    body = answer(
        version,
        ("orders-ü", ORDERS, ErrorCode.none),
        ("payments", PAYMENTS, ErrorCode.topic_authorization_failed),
    )
    with_id = version >= 6
    assert read_delete_topics_response(version, body) == [
        DeletedTopic("orders-ü", ORDERS if with_id else None, 0),
        DeletedTopic("payments", PAYMENTS if with_id else None, 29),
    ]


def test_v6_reads_a_null_name_and_the_zero_id_as_none():
    zero = uuid.UUID(int=0)
    body = answer(
        6,
        (None, ORDERS, ErrorCode.unknown_topic_id),
        ("x", zero, ErrorCode.unknown_topic_or_partition),
    )
    assert read_delete_topics_response(6, body) == [
        DeletedTopic(None, ORDERS, ErrorCode.unknown_topic_id.value),
        DeletedTopic("x", None, 3),
    ]


def test_truncated_bodies_and_unserved_versions_are_frame_errors():
    body = answer(5, ("orders", ORDERS, ErrorCode.none))
    with pytest.raises(FrameError, match="DeleteTopics v5 response"):
        read_delete_topics_response(5, body[:-3])
    with pytest.raises(FrameError, match="bytes after the end"):
        read_delete_topics_response(5, body + b"\x00")
    with pytest.raises(FrameError, match="unsupported version 0"):
        read_delete_topics_response(0, body)


class _Tiering:
    """What the plan reads of the tiering service: a pure stand-in for a unit test; its
    mark records the topics asked and answers `code`."""

    def __init__(self, tiered: list[TieredTopic], code: int = 0) -> None:
        self.topics = TieredTopics(tiered)
        self.code = code
        self.asked: list[tuple[str, uuid.UUID]] = []
        self.forgotten: list[list[str] | None] = []  # configs, by name

    async def topic_deleted(self, topic: str, topic_id: uuid.UUID) -> tuple[int, str]:
        self.asked.append((topic, topic_id))
        await asyncio.sleep(0)
        return self.code, "the owner of metadata shard 3 did not answer"

    async def configs_changed(self, topics: list[str] | None) -> None:
        self.forgotten.append(topics)


TIERED = [TieredTopic(ORDERS, "orders", 1), TieredTopic(PAYMENTS, "payments", 1)]


def _run(tiering: _Tiering, version: int, req: bytes, ans: bytes):
    make = lambda frame, body: plan_delete_topics(tiering, frame)  # noqa: E731
    return run_after_upstream(make, tiering.asked, version, req, ans)


def test_no_tiered_topic_goes_to_kafka_with_nothing_after():
    req = request(4, "orders")
    assert _run(_Tiering([]), 4, req, answer(4, ("orders", ORDERS, ErrorCode.none))) is None


@pytest.mark.parametrize("version", VERSIONS)
def test_forward_first_then_the_deleted_tiered_topics_marked_then_kafkas_answer(version):
    tiering = _Tiering(TIERED)
    req = request(version, "orders", "payments", "plain")
    ans = answer(
        version,
        ("orders", ORDERS, ErrorCode.none),
        ("payments", PAYMENTS, ErrorCode.topic_authorization_failed),  # not deleted
        ("plain", uuid.uuid4(), ErrorCode.none),  # not tiered
    )
    frame, asked_before, body = _run(tiering, version, req, ans)
    assert frame == (b"S", HEAD, req)  # the request upstream as it came
    assert asked_before == []  # nothing marked before Kafka answered
    assert tiering.asked == [("orders", ORDERS)]
    assert tiering.forgotten == [["orders"]]  # a topic created again has its own configs
    assert body == ans  # Kafka's answer, byte for byte


def test_v6_matches_by_topic_id_a_topic_created_again_under_the_name_is_not_the_tiered_one():
    tiering = _Tiering(TIERED)
    other = uuid.uuid4()  # "orders" deleted and created again since: the new one deleted
    ans = answer(6, ("orders", other, ErrorCode.none), (None, PAYMENTS, ErrorCode.none))
    assert _run(tiering, 6, request(6, "orders"), ans)[2] == ans
    assert tiering.asked == [("payments", PAYMENTS)]


def test_a_failed_mark_is_logged_and_kafkas_answer_given(caplog):
    tiering = _Tiering(TIERED, code=ErrorCode.coordinator_not_available.value)
    ans = answer(5, ("orders", ORDERS, ErrorCode.none))
    with caplog.at_level(logging.WARNING, "tierproxy.tiering"):
        assert _run(tiering, 5, request(5, "orders"), ans)[2] == ans
    assert "orders answered before the fleet dropped it" in caplog.text
    assert "did not answer" in caplog.text


def test_an_unreadable_answer_is_passed_on_with_nothing_marked():
    tiering = _Tiering(TIERED)
    assert _run(tiering, 4, request(4, "orders"), b"\x00\x00")[2] == b"\x00\x00"
    assert tiering.asked == []
