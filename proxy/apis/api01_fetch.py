"""Fetch (api key 1), v4-v18: KIP-951 node endpoints in answers from v16, the KIP-392
rack id in requests from v11.

As for Produce, a v16+ answer may name a partition's new leader in the top-level tagged
field `node_endpoints`. That section comes after all the partitions, so finding it means
walking the answer: per partition a few fixed fields and one jump over its records, no
per-record work and no copy. An answer without node endpoints is returned as it came.
"""

from __future__ import annotations

from proxy.kafka.codec import load_response_types, load_types, response_type
from proxy.kafka.rewrite import node_endpoints_rewriter
from proxy.kafka.schema_walk import field_offset
from proxy.kafka.wire import read_string

API_KEY = 1
FIRST_NODE_ENDPOINTS_VERSION = 16
RESPONSES = load_response_types(API_KEY)
rewrite_response = node_endpoints_rewriter(API_KEY, FIRST_NODE_ENDPOINTS_VERSION, RESPONSES)

REQUESTS = load_types(API_KEY, "request")
FIRST_RACK_ID_VERSION = 11  # KIP-392


def request_rack_id(api_version: int, body: memoryview) -> str | None:
    """The rack id a consumer sent (`client.rack`, KIP-392), or None if empty or absent.

    It follows every topic and forgotten topic of the request, so finding it walks the
    request: the connection asks once, not for every Fetch (FrameError if malformed).
    """
    if api_version < FIRST_RACK_ID_VERSION:
        return None
    request = response_type(REQUESTS, API_KEY, api_version)
    offset = field_offset(request, body, "rack_id")
    rack, _ = read_string(body, offset, request.__flexible__)
    return rack or None
