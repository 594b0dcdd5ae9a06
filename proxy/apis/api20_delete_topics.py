"""DeleteTopics (api key 20), v1-v6: the answer a proxy that tiers topics reads, to drop a
tiered topic Kafka deleted before the client learns of it (proxy/tiered/topic_deletes.py).

The request goes upstream as it came. The answer is `throttle_time_ms, responses[name,
(v6) topic_id, error_code, (v5+) error_message]`, flexible from v4 (compact strings and
arrays, tagged fields); v6's name is nullable (a topic deleted by id that Kafka did not
know). Only each topic's name, id and error code are read, by hand (proxy/kafka/wire.py),
as every network body is; the answer itself is passed on untouched.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from proxy.kafka.api_keys import ApiKey
from proxy.kafka.codec import load_response_types, response_type
from proxy.kafka.frames import malformed
from proxy.kafka.wire import (
    expect_end,
    read_count,
    read_int16,
    read_int32,
    read_string,
    skip,
    skip_nullable_string,
    skip_tagged_fields,
)

API_KEY = ApiKey.DELETE_TOPICS
RESPONSES = load_response_types(API_KEY)
FIRST_TOPIC_ID_VERSION = 6
FIRST_ERROR_MESSAGE_VERSION = 5


@dataclass(frozen=True, slots=True)
class DeletedTopic:
    """One topic's result: its name (None: v6, a topic id Kafka did not know), its id
    (from v6; None before, or Kafka's zero id), Kafka's error code (0: deleted)."""

    name: str | None
    topic_id: uuid.UUID | None
    error_code: int


def read_delete_topics_response(api_version: int, body: memoryview | bytes) -> list[DeletedTopic]:
    """Every topic's result, in the answer's order. FrameError if the version is not
    served or the body is malformed or truncated."""
    flexible = response_type(RESPONSES, API_KEY, api_version).__flexible__
    buf = memoryview(body)
    found: list[DeletedTopic] = []
    with malformed(f"DeleteTopics v{api_version} response"):
        _, offset = read_int32(buf, 0)  # throttle_time_ms
        count, offset = read_count(buf, offset, flexible, "responses")
        for _ in range(count):
            name, offset = read_string(buf, offset, flexible)
            topic_id = None
            if api_version >= FIRST_TOPIC_ID_VERSION:
                end = skip(buf, offset, 16)
                topic_id = uuid.UUID(bytes=bytes(buf[offset:end]))
                offset = end
            error_code, offset = read_int16(buf, offset)
            if api_version >= FIRST_ERROR_MESSAGE_VERSION:
                offset = skip_nullable_string(buf, offset, flexible)
            if flexible:
                offset = skip_tagged_fields(buf, offset)
            found.append(DeletedTopic(name, None if topic_id == _ZERO else topic_id, error_code))
        if flexible:
            offset = skip_tagged_fields(buf, offset)
        expect_end(buf, offset)
    return found


_ZERO = uuid.UUID(int=0)
