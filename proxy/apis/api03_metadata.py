"""Metadata (api key 3), v0-v13: every broker of the answer is shown at its proxy address.

Only the brokers' addresses are rewritten; the topics and partitions that follow them
(the bulk of a large cluster's answer) are copied through as bytes. Node ids are kept,
so leader, replica and controller ids need no change.
"""

from __future__ import annotations

from dataclasses import dataclass
from uuid import UUID

from kio.schema.errors import ErrorCode

from proxy.errors import UnknownTopic
from proxy.kafka.api_keys import ApiKey
from proxy.kafka.codec import load_response_types, response_type
from proxy.kafka.frames import malformed
from proxy.kafka.rewrite import Advertise, rewrite_address_array
from proxy.kafka.schema_walk import array_items, field_offset, item_type
from proxy.kafka.wire import read_array_length, read_int16, read_int32, read_string

API_KEY = ApiKey.METADATA
RESPONSES = load_response_types(API_KEY)


def rewrite_response(
    api_version: int, body: memoryview, advertise: Advertise
) -> bytes | memoryview:
    response = response_type(RESPONSES, API_KEY, api_version)
    return rewrite_address_array(response, "brokers", body, advertise)


def read_brokers(api_version: int, body: memoryview) -> list[tuple[int, str, int, str | None]]:
    """(node id, host, port, rack) of every broker of an answer: the proxy's own Metadata
    requests learn each broker's zone from its `broker.rack` (None before v1 or unset)."""
    response = response_type(RESPONSES, API_KEY, api_version)
    item = item_type(response, "brokers")
    flexible = response.__flexible__
    has_rack = "rack" in item.__dataclass_fields__
    brokers = []
    with malformed(f"Metadata v{api_version} brokers"):
        for offset in array_items(response, body, "brokers"):
            node_id, pos = read_int32(body, field_offset(item, body, "node_id", offset))
            host, pos = read_string(body, pos, flexible)
            port, pos = read_int32(body, pos)
            rack = read_string(body, pos, flexible)[0] if has_rack else None
            brokers.append((node_id, host or "", port, rack or None))
    return brokers


def read_topics(api_version: int, body: memoryview) -> list[tuple[int, str, UUID | None, int]]:
    """(error code, name, topic id, partition count) of every topic of an answer (v10+
    carry topic ids; None before): what `tierproxy topics tier` needs to name a stream."""
    response = response_type(RESPONSES, API_KEY, api_version)
    item = item_type(response, "topics")
    flexible = response.__flexible__
    has_id = "topic_id" in item.__dataclass_fields__
    topics = []
    with malformed(f"Metadata v{api_version} topics"):
        for offset in array_items(response, body, "topics"):
            error_code, _ = read_int16(body, field_offset(item, body, "error_code", offset))
            name, _ = read_string(body, field_offset(item, body, "name", offset), flexible)
            topic_id = None
            if has_id:
                start = field_offset(item, body, "topic_id", offset)
                topic_id = UUID(bytes=bytes(body[start : start + 16]))
            partitions_at = field_offset(item, body, "partitions", offset)
            partitions, _ = read_array_length(body, partitions_at, flexible)
            topics.append((error_code, name or "", topic_id, max(partitions, 0)))
    return topics


def read_cluster_id(api_version: int, body: memoryview) -> str | None:
    """The id of the Kafka cluster that answered (v2+; None before, or if it has none)."""
    response = response_type(RESPONSES, API_KEY, api_version)
    if "cluster_id" not in response.__dataclass_fields__:
        return None
    with malformed(f"Metadata v{api_version} cluster id"):
        at = field_offset(response, body, "cluster_id")
        return read_string(body, at, response.__flexible__)[0] or None


@dataclass(frozen=True, slots=True)
class TopicsAnswer:
    """What one Metadata answer says of the topics it was asked about, and which Kafka
    cluster said it: a topic's id is a random UUID of that cluster, so an answer from
    another cluster (a fleet pointed at a copy) says nothing of the fleet's topics."""

    cluster_id: str | None
    found: dict[str, tuple[UUID, int]]  # name -> (topic id, partition count)
    unknown: frozenset[str]  # UNKNOWN_TOPIC_OR_PARTITION: no such topic
    # name -> another error code, or 0 without a topic id or partitions: says nothing
    errors: dict[str, int]

    def topic_id(self, name: str) -> UUID | None:
        """Kafka's id for the topic of that name; None if Kafka knows no such topic.
        LookupError if it answered another error, or not about that name."""
        if name in self.found:
            return self.found[name][0]
        if name in self.unknown:
            return None
        code = self.errors.get(name)
        if code is None:
            raise LookupError(f"topic {name} is not in Kafka's answer")
        if code == 0:  # no error, and no id (a Metadata answer before v10) or no partitions
            raise LookupError(f"topic {name}: Kafka's answer gives it no topic id or partitions")
        raise LookupError(f"topic {name}: Kafka answers error code {code}")

    def topic(self, name: str) -> tuple[UUID, int]:
        """(topic id, partition count) of the topic of that name: UnknownTopic if Kafka
        knows no such topic, LookupError for any other answer."""
        if self.topic_id(name) is None:
            raise UnknownTopic(f"topic {name}: Kafka does not know it")
        return self.found[name]


def read_topics_answer(api_version: int, body: memoryview) -> TopicsAnswer:
    """The topics of an answer, by what Kafka says of each, with the cluster's id."""
    found: dict[str, tuple[UUID, int]] = {}
    unknown: set[str] = set()
    errors: dict[str, int] = {}
    for error_code, name, topic_id, partitions in read_topics(api_version, body):
        if error_code == 0 and topic_id is not None and topic_id.int != 0 and partitions:
            found[name] = (topic_id, partitions)
        elif error_code == ErrorCode.unknown_topic_or_partition:
            unknown.add(name)
        else:
            errors[name] = error_code
    return TopicsAnswer(read_cluster_id(api_version, body), found, frozenset(unknown), errors)


def read_partition_leaders(
    api_version: int, body: memoryview, topic: str
) -> tuple[int, dict[int, tuple[int, int, int]]]:
    """(the topic's error code, {partition: (error code, leader id, leader epoch)}) of
    one topic of an answer: the offload jobs' cluster reader fetches from each leader.
    The leader epoch is -1 before v7. LookupError if the answer does not name the topic."""
    response = response_type(RESPONSES, API_KEY, api_version)
    item = item_type(response, "topics")
    flexible = response.__flexible__
    has_epoch = "leader_epoch" in item_type(item, "partitions").__dataclass_fields__
    with malformed(f"Metadata v{api_version} topics"):
        for offset in array_items(response, body, "topics"):
            name, _ = read_string(body, field_offset(item, body, "name", offset), flexible)
            if name != topic:
                continue
            error_code, _ = read_int16(body, field_offset(item, body, "error_code", offset))
            leaders = {}
            for at in array_items(item, body, "partitions", offset):
                code, pos = read_int16(body, at)
                index, pos = read_int32(body, pos)
                leader, pos = read_int32(body, pos)
                epoch = read_int32(body, pos)[0] if has_epoch else -1
                leaders[index] = (code, leader, epoch)
            return error_code, leaders
    raise LookupError(f"topic {topic} is not in the Metadata answer")
