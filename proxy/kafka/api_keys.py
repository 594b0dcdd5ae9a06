"""The Kafka API keys the proxy's code names: the one table every module takes them from.

Kafka's names (`ApiKeys` in clients/.../protocol/ApiKeys.java). An `IntEnum`, so a member
is the int on the wire and compares equal to a header's `api_key`. The versions of each
API are in the generated `api_table`; a unit test checks these names against it.
"""

from __future__ import annotations

from enum import IntEnum


class ApiKey(IntEnum):
    PRODUCE = 0
    FETCH = 1
    LIST_OFFSETS = 2
    METADATA = 3
    CONTROLLED_SHUTDOWN = 7  # inter-broker only, absent from kio; its v0 has an odd header
    FIND_COORDINATOR = 10
    API_VERSIONS = 18
    DELETE_TOPICS = 20
    DELETE_RECORDS = 21
    INIT_PRODUCER_ID = 22
    OFFSET_FOR_LEADER_EPOCH = 23
    ADD_PARTITIONS_TO_TXN = 24
    ALTER_CONFIGS = 33
    INCREMENTAL_ALTER_CONFIGS = 44
    DESCRIBE_CLUSTER = 60
    DESCRIBE_PRODUCERS = 61
