"""The pure state of a client connection: frame sizes, request headers, answer order."""

from __future__ import annotations

import datetime

import pytest
from kio.schema.api_versions.v3.request import ApiVersionsRequest
from kio.schema.metadata.v12.request import MetadataRequest
from kio.schema.produce.v9.request import ProduceRequest
from kio.static.primitive import i16, i32Timedelta

from proxy.kafka.messages import encode_request
from proxy.server.connection_state import (
    AnswerOrder,
    RejectedFrame,
    Slot,
    api_versions_answer,
    check_forwardable,
    check_request_size,
    read_request_header,
)


def _frame(request) -> memoryview:
    return memoryview(encode_request(request, correlation_id=7))[4:]  # unframed


def _produce(acks: int) -> ProduceRequest:
    timeout = i32Timedelta.parse(datetime.timedelta(seconds=30))
    return ProduceRequest(transactional_id=None, acks=i16(acks), timeout=timeout, topic_data=())


def test_frame_sizes():
    check_request_size(0, 100)
    check_request_size(100, 100)
    with pytest.raises(RejectedFrame) as negative:
        check_request_size(-1, 100)
    assert negative.value.reason == "negative_frame_size"
    with pytest.raises(RejectedFrame) as oversized:
        check_request_size(101, 100)
    assert oversized.value.reason == "oversized_frame"


def test_an_unreadable_header_is_rejected_with_its_reason():
    with pytest.raises(RejectedFrame) as rejected:
        read_request_header(memoryview(b"\x00"))
    assert rejected.value.reason  # the label of tierproxy_rejected_frames


@pytest.mark.parametrize(("acks", "expects_answer"), [(-1, True), (1, True), (0, False)])
def test_a_produce_with_acks_0_expects_no_answer(acks, expects_answer):
    frame = _frame(_produce(acks))
    assert check_forwardable(read_request_header(frame), frame) is expects_answer


def test_other_requests_expect_an_answer():
    frame = _frame(
        MetadataRequest(
            topics=(), allow_auto_topic_creation=False, include_topic_authorized_operations=False
        )
    )
    assert check_forwardable(read_request_header(frame), frame) is True


@pytest.mark.parametrize(
    ("api_key", "api_version", "reason"),
    [(0, 99, "unsupported_version"), (7, 3, "unknown_api_key")],  # 7: inter-broker
)
def test_an_unknown_api_or_version_is_never_forwarded(api_key, api_version, reason):
    frame = bytearray(_frame(_produce(1)))
    frame[0:4] = api_key.to_bytes(2, "big") + api_version.to_bytes(2, "big")
    with pytest.raises(RejectedFrame) as rejected:
        check_forwardable(read_request_header(memoryview(frame)), memoryview(frame))
    assert rejected.value.reason == reason


def test_api_versions_answer_carries_the_encoded_body():
    frame = _frame(ApiVersionsRequest(client_software_name="t", client_software_version="1"))
    header = read_request_header(frame)
    answer = api_versions_answer(header, frame[header.size :], lambda v: b"BODY%d" % v, dict)
    assert answer.endswith(b"BODY3")
    assert answer[:4] == (7).to_bytes(4, "big")  # the correlation id


def test_answers_leave_in_request_order():
    order = AnswerOrder(max_inflight=2)
    first, second = Slot(1, 0, 9), Slot(2, 18, 3, local=True)
    order.owe(first, 1.0)
    order.forwarded(first)
    order.owe(second, 2.0)
    assert not order.has_room and not order.all_answered
    second.data = (b"local",)  # answered here first ...
    assert list(order.ready()) == []  # ... but waits for the answer owed before it
    assert order.next_from_upstream() is first
    first.data = (b"upstream",)
    assert order.answered_upstream() is first
    assert list(order.ready()) == [first, second]
    assert order.has_room and order.all_answered
    assert order.next_from_upstream() is None


def test_a_streamed_answer_waits_for_its_turn():
    order = AnswerOrder(max_inflight=10)
    local, streamed = Slot(1, 0, 9, local=True), Slot(2, 1, 17)
    order.owe(local, 0.0)
    order.owe(streamed, 0.0)
    assert not order.is_next(streamed)
    local.data = (b"x",)
    assert list(order.ready()) == [local]
    assert order.is_next(streamed)
    order.streamed(streamed)
    assert order.all_answered
