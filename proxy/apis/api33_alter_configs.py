"""AlterConfigs (api key 33), v0-v2: the answer a proxy that tiers topics reads, to read a
tiered topic's changed configs again before the client learns of the change
(proxy/tiered/config_changes.py). IncrementalAlterConfigs (api44) answers the same way.

The request goes upstream as it came. The answer is `throttle_time_ms, responses[
error_code, error_message, resource_type, resource_name]`, flexible from v2 (compact
strings and arrays, tagged fields); IncrementalAlterConfigs' is the same, flexible from
v1. Only each resource's error code, type and name are read, by hand
(proxy/kafka/wire.py), as every network body is; the answer itself is passed on untouched.
"""

from __future__ import annotations

from dataclasses import dataclass

from kio.static.protocol import Entity

from proxy.kafka.api_keys import ApiKey
from proxy.kafka.codec import load_response_types, response_type
from proxy.kafka.frames import malformed
from proxy.kafka.versions import api_name
from proxy.kafka.wire import (
    INT8,
    expect_end,
    read_count,
    read_int16,
    read_int32,
    read_string,
    skip,
    skip_nullable_string,
    skip_tagged_fields,
)

API_KEY = ApiKey.ALTER_CONFIGS
RESPONSES = load_response_types(API_KEY)

# Kafka's ConfigResource.Type codes
TOPIC_RESOURCE = 2
BROKER_RESOURCE = 4


@dataclass(frozen=True, slots=True)
class AlteredResource:
    """One resource's result: Kafka's error code (0: altered), its type and name (a
    topic's name; a broker's id as a string, empty for the cluster-wide default)."""

    error_code: int
    resource_type: int
    name: str


def read_alter_configs_response(
    api_version: int, body: memoryview | bytes
) -> list[AlteredResource]:
    """Every resource's result, in the answer's order. FrameError if the version is not
    served or the body is malformed or truncated."""
    return read_altered(RESPONSES, API_KEY, api_version, body)


def read_altered(
    types: dict[int, type[Entity]], api_key: int, api_version: int, body: memoryview | bytes
) -> list[AlteredResource]:
    """The results of an answer of AlterConfigs' shape (`types`: its kio classes, for
    the first flexible version)."""
    flexible = response_type(types, api_key, api_version).__flexible__
    buf = memoryview(body)
    found: list[AlteredResource] = []
    with malformed(f"{api_name(api_key)} v{api_version} response"):
        _, offset = read_int32(buf, 0)  # throttle_time_ms
        count, offset = read_count(buf, offset, flexible, "responses")
        for _ in range(count):
            error_code, offset = read_int16(buf, offset)
            offset = skip_nullable_string(buf, offset, flexible)  # error_message
            end = skip(buf, offset, 1)
            resource_type = INT8.unpack_from(buf, offset)[0]
            name, offset = read_string(buf, end, flexible)
            if flexible:
                offset = skip_tagged_fields(buf, offset)
            found.append(AlteredResource(error_code, resource_type, name or ""))
        if flexible:
            offset = skip_tagged_fields(buf, offset)
        expect_end(buf, offset)
    return found
