"""Fetch (api key 1), v4-v18 responses: KIP-951 node endpoints from v16.

As for Produce, a v16+ answer may name a partition's new leader in the top-level tagged
field `node_endpoints`. That section comes after all the partitions, so finding it means
walking the answer: per partition a few fixed fields and one jump over its records, no
per-record work and no copy. An answer without node endpoints is returned as it came.
"""

from __future__ import annotations

from proxy.protocol.codec import load_response_types
from proxy.protocol.rewrite import node_endpoints_rewriter

API_KEY = 1
FIRST_NODE_ENDPOINTS_VERSION = 16
RESPONSES = load_response_types(API_KEY)
rewrite_response = node_endpoints_rewriter(API_KEY, FIRST_NODE_ENDPOINTS_VERSION, RESPONSES)
