"""Produce (api key 0), v3-v13 responses: KIP-951 node endpoints from v10.

When a partition's leader moved, a v10+ answer names the new leader in the top-level
tagged field `node_endpoints`, so the client can skip a Metadata round trip. That field
is rewritten in place; an answer without it (the usual case) is returned as it came.
"""

from __future__ import annotations

from proxy.kafka.codec import load_response_types
from proxy.kafka.rewrite import node_endpoints_rewriter

API_KEY = 0
FIRST_NODE_ENDPOINTS_VERSION = 10
RESPONSES = load_response_types(API_KEY)
rewrite_response = node_endpoints_rewriter(API_KEY, FIRST_NODE_ENDPOINTS_VERSION, RESPONSES)
