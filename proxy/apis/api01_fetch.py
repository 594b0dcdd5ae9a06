"""Fetch (api key 1), v4-v18 responses: KIP-951 node endpoints from v16.

As for Produce, a v16+ answer may name a partition's new leader in the top-level tagged
field `node_endpoints`. That section comes after all the partitions, so finding it means
walking the answer: per partition a few fixed fields and one jump over its records, no
per-record work and no copy. An answer without node endpoints is returned as it came.
"""

from __future__ import annotations

from proxy.protocol.codec import load_response_types, response_type
from proxy.protocol.rewrite import Advertise, rewrite_tagged_address_array

API_KEY = 1
FIRST_NODE_ENDPOINTS_VERSION = 16
RESPONSES = load_response_types(API_KEY)


def rewrite_response(
    api_version: int, body: memoryview, advertise: Advertise
) -> bytes | memoryview:
    response = response_type(RESPONSES, API_KEY, api_version)
    if api_version < FIRST_NODE_ENDPOINTS_VERSION:
        return body
    return rewrite_tagged_address_array(response, "node_endpoints", body, advertise)
