"""One module per Kafka API the proxy reads or answers, registered in one table.

Each `apiNN_name.py` opens with the versions it serves. Every API not listed here is
forwarded as an opaque frame.

`RESPONSE_REWRITERS`: api key -> rewriter(api_version, body, advertise) -> new body, for
the responses that name brokers, so that no upstream address ever reaches a client.
A rewriter returns the very memoryview it was given when nothing had to change.
"""

from __future__ import annotations

from proxy.apis import (
    api00_produce,
    api01_fetch,
    api03_metadata,
    api10_find_coordinator,
    api60_describe_cluster,
)
from proxy.kafka.rewrite import Advertise, Rewriter

RESPONSE_REWRITERS: dict[int, Rewriter] = {
    api00_produce.API_KEY: api00_produce.rewrite_response,
    api01_fetch.API_KEY: api01_fetch.rewrite_response,
    api03_metadata.API_KEY: api03_metadata.rewrite_response,
    api10_find_coordinator.API_KEY: api10_find_coordinator.rewrite_response,
    api60_describe_cluster.API_KEY: api60_describe_cluster.rewrite_response,
}

# The first versions whose responses may carry KIP-951 node endpoints. Both are
# rewritten (see api00_produce, api01_fetch), so no cap is needed to hide addresses.
# CAPPED_VERSIONS is for a proxy that wants Fetch answers passed through without the
# walk to their tagged fields (about 1 us per partition): clients then rediscover a
# moved leader by Metadata, as before KIP-951. Capping Produce at 9 costs more: v11+
# carry KIP-890 (TRANSACTION_ABORTABLE, transactions v2), so cap Fetch alone if any.
NODE_ENDPOINTS_SINCE = {
    api00_produce.API_KEY: api00_produce.FIRST_NODE_ENDPOINTS_VERSION,
    api01_fetch.API_KEY: api01_fetch.FIRST_NODE_ENDPOINTS_VERSION,
}
CAPPED_VERSIONS = {api_key: version - 1 for api_key, version in NODE_ENDPOINTS_SINCE.items()}


def max_version_without_node_endpoints(api_key: int) -> int | None:
    """The highest version of this API whose responses name no broker, if it has a limit."""
    return CAPPED_VERSIONS.get(api_key)


__all__ = [
    "CAPPED_VERSIONS",
    "NODE_ENDPOINTS_SINCE",
    "RESPONSE_REWRITERS",
    "Advertise",
    "Rewriter",
    "max_version_without_node_endpoints",
]
