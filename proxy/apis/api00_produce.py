"""Produce (api key 0), v3-v13 responses: KIP-951 node endpoints from v10.

When a partition's leader moved, a v10+ answer names the new leader in the top-level
tagged field `node_endpoints`, so the client can skip a Metadata round trip. That field
is rewritten in place; an answer without it (the usual case) is returned as it came.
"""

from __future__ import annotations

from proxy.protocol.codec import load_response_types, response_type
from proxy.protocol.rewrite import Advertise, rewrite_tagged_address_array

API_KEY = 0
FIRST_NODE_ENDPOINTS_VERSION = 10
RESPONSES = load_response_types(API_KEY)


def rewrite_response(
    api_version: int, body: memoryview, advertise: Advertise
) -> bytes | memoryview:
    response = response_type(RESPONSES, API_KEY, api_version)
    if api_version < FIRST_NODE_ENDPOINTS_VERSION:
        return body
    return rewrite_tagged_address_array(response, "node_endpoints", body, advertise)
