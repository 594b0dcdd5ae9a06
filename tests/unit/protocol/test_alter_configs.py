"""Reading Kafka's AlterConfigs and IncrementalAlterConfigs answers, for every served
version (written with kio, read by hand). And the plan (proxy/tiered/config_changes.py):
forwarded whole, the tiered topics whose configs Kafka changed read again by the fleet
before the client has Kafka's answer, as it came."""

from __future__ import annotations

import asyncio
import datetime
import uuid

import pytest
from kio.schema.errors import ErrorCode
from kio.static.primitive import i8

from proxy.apis.api33_alter_configs import (
    BROKER_RESOURCE,
    TOPIC_RESOURCE,
    AlteredResource,
    read_alter_configs_response,
)
from proxy.apis.api44_incremental_alter_configs import read_incremental_alter_configs_response
from proxy.kafka.codec import encode
from proxy.kafka.frames import FrameError
from proxy.metadata.topic_index import TieredTopic
from proxy.tiered.config_changes import plan_config_changes
from tests.support.after_upstream import HEAD, TieredTopics, run_after_upstream
from tests.support.kio_types import mod, only_fields, served

MS = datetime.timedelta(milliseconds=1)
APIS = {
    33: (served(33), read_alter_configs_response),
    44: (served(44), read_incremental_alter_configs_response),
}
CASES = [(key, version) for key, ((_, _, versions), _) in APIS.items() for version in versions]


def test_every_kio_version_is_served():
    assert APIS[33][0][2] == [0, 1, 2]
    assert APIS[44][0][2] == [0, 1]


def request(api_key: int, version: int, *topics: str) -> bytes:
    requests = APIS[api_key][0][0]
    module = mod(requests, version)
    resources = tuple(
        only_fields(module.AlterConfigsResource, resource_type=i8(2), resource_name=t, configs=())
        for t in topics
    )
    return encode(only_fields(requests[version], resources=resources, validate_only=False))


def answer(api_key: int, version: int, *results: tuple[int, str, ErrorCode]) -> bytes:
    responses = APIS[api_key][0][1]
    module = mod(responses, version)
    entries = tuple(
        only_fields(
            module.AlterConfigsResourceResponse,
            error_code=error,
            error_message=None if error == ErrorCode.none else "no",
            resource_type=i8(kind),
            resource_name=name,
        )
        for kind, name, error in results
    )
    return encode(only_fields(responses[version], throttle_time=0 * MS, responses=entries))


@pytest.mark.parametrize(("api_key", "version"), CASES)
def test_each_resources_error_type_and_name_are_read(api_key, version):
    body = answer(
        api_key,
        version,
        (TOPIC_RESOURCE, "orders-ü", ErrorCode.none),
        (TOPIC_RESOURCE, "payments", ErrorCode.policy_violation),
        (BROKER_RESOURCE, "", ErrorCode.none),
    )
    assert APIS[api_key][1](version, body) == [
        AlteredResource(0, TOPIC_RESOURCE, "orders-ü"),
        AlteredResource(ErrorCode.policy_violation.value, TOPIC_RESOURCE, "payments"),
        AlteredResource(0, BROKER_RESOURCE, ""),
    ]


@pytest.mark.parametrize("api_key", [33, 44])
def test_truncated_bodies_and_unserved_versions_are_frame_errors(api_key):
    read = APIS[api_key][1]
    body = answer(api_key, 1, (TOPIC_RESOURCE, "orders", ErrorCode.none))
    name = "AlterConfigs" if api_key == 33 else "IncrementalAlterConfigs"
    with pytest.raises(FrameError, match=f"{name} v1 response"):
        read(1, body[:-3])
    with pytest.raises(FrameError, match="bytes after the end"):
        read(1, body + b"\x00")
    with pytest.raises(FrameError, match="unsupported version 3"):
        read(3, body)


class _Tiering:
    """What the plan reads of the tiering service: a pure stand-in for a unit test; it
    records the topics whose configs it was told changed."""

    def __init__(self, tiered: list[TieredTopic]) -> None:
        self.topics = TieredTopics(tiered)
        self.asked: list[list[str] | None] = []

    async def configs_changed(self, topics: list[str] | None) -> None:
        self.asked.append(topics)
        await asyncio.sleep(0)


TIERED = [TieredTopic(uuid.uuid4(), "orders", 1), TieredTopic(uuid.uuid4(), "payments", 1)]


def _run(tiering: _Tiering, api_key: int, version: int, req: bytes, ans: bytes):
    read = APIS[api_key][1]
    make = lambda frame, body: plan_config_changes(tiering, frame, read)  # noqa: E731
    return run_after_upstream(make, tiering.asked, version, req, ans)


def test_no_tiered_topic_goes_to_kafka_with_nothing_after():
    req = request(44, 1, "orders")
    ans = answer(44, 1, (TOPIC_RESOURCE, "orders", ErrorCode.none))
    assert _run(_Tiering([]), 44, 1, req, ans) is None


@pytest.mark.parametrize(("api_key", "version"), CASES)
def test_forward_first_then_the_changed_tiered_topics_read_again_then_kafkas_answer(
    api_key, version
):
    tiering = _Tiering(TIERED)
    req = request(api_key, version, "orders", "payments", "plain")
    ans = answer(
        api_key,
        version,
        (TOPIC_RESOURCE, "orders", ErrorCode.none),
        (TOPIC_RESOURCE, "payments", ErrorCode.invalid_config),  # not changed
        (TOPIC_RESOURCE, "plain", ErrorCode.none),  # not tiered
    )
    frame, asked_before, body = _run(tiering, api_key, version, req, ans)
    assert frame == (b"S", HEAD, req)  # the request upstream as it came
    assert asked_before == []  # nothing read again before Kafka answered
    assert tiering.asked == [["orders"]]
    assert body == ans  # Kafka's answer, byte for byte


def test_a_brokers_config_changed_makes_every_topic_read_again():
    """A broker's (or the cluster's) default is what a topic without its own value
    takes: every topic's configs are read again."""
    tiering = _Tiering(TIERED)
    ans = answer(33, 1, (BROKER_RESOURCE, "", ErrorCode.none))
    assert _run(tiering, 33, 1, request(33, 1), ans)[2] == ans
    assert tiering.asked == [None]


def test_nothing_changed_or_an_unreadable_answer_reads_nothing_again():
    tiering = _Tiering(TIERED)
    ans = answer(44, 0, (TOPIC_RESOURCE, "orders", ErrorCode.invalid_config))
    assert _run(tiering, 44, 0, request(44, 0, "orders"), ans)[2] == ans
    assert _run(tiering, 44, 0, request(44, 0, "orders"), b"\x00\x00")[2] == b"\x00\x00"
    assert tiering.asked == []
