"""One module per Kafka API the proxy reads or answers, registered in one table.

Each `apiNN_name.py` opens with the versions it serves. Every API not listed here is
forwarded as an opaque frame.

`HANDLING`: api key -> `ApiHandling`, what the proxy does with that API beyond
forwarding it (`proxy.kafka.versions.APIS` is the other table: the versions each API
has in Kafka's schemas):

- `rewrite(api_version, body, advertise) -> new body`, for the responses that name
  brokers, so that no upstream address ever reaches a client. A rewriter returns the
  very memoryview it was given when nothing had to change. `node_endpoints_since`: the
  first version whose responses name brokers (KIP-951); older answers pass through.
- `tiered`: how a connection of a proxy that tiers topics handles a request naming a
  tiered topic (the planners are `proxy.tiered.planners`, one per API listed here).
- `walks_large_answers`: a large answer to rewrite is walked as it streams
  (`fetch_stream.py`), never held whole.

A client connection looks its request's API up once (a dict lookup) and dispatches on
the entry; `RESPONSE_REWRITERS` and `NODE_ENDPOINTS_SINCE` are views of the same table.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from proxy.apis import (
    api00_produce,
    api01_fetch,
    api02_list_offsets,
    api03_metadata,
    api10_find_coordinator,
    api20_delete_topics,
    api21_delete_records,
    api22_init_producer_id,
    api23_offset_for_leader_epoch,
    api24_add_partitions_to_txn,
    api33_alter_configs,
    api44_incremental_alter_configs,
    api60_describe_cluster,
    api61_describe_producers,
)
from proxy.kafka.rewrite import Advertise, Rewriter


class Tiered(enum.Enum):
    """How a request naming a tiered topic is handled by a proxy that tiers topics."""

    # The tiered partitions are answered here; the rest, if any, goes upstream as a
    # smaller request, and the two answers are merged in the request's order.
    SPLIT = "split"
    # Forwarded whole; once Kafka answered, the tiered partitions it concerns are caught
    # up (their transaction markers) before the client has the answer, as it came.
    AFTER_UPSTREAM = "after_upstream"


@dataclass(frozen=True, slots=True)
class ApiHandling:
    key: int
    name: str
    rewrite: Rewriter | None = None  # the answer names brokers
    node_endpoints_since: int | None = None  # answers name brokers from this version
    tiered: Tiered | None = None  # None: forwarded whole, tiered topic or not
    walks_large_answers: bool = False

    def rewrites(self, api_version: int) -> bool:
        """Whether an answer of this version is rewritten (read whole or walked) rather
        than passed through as it comes."""
        if self.rewrite is None:
            return False
        since = self.node_endpoints_since
        return since is None or api_version >= since


HANDLING: dict[int, ApiHandling] = {
    api.key: api
    for api in (
        ApiHandling(
            api00_produce.API_KEY,
            "Produce",
            api00_produce.rewrite_response,
            api00_produce.FIRST_NODE_ENDPOINTS_VERSION,
            Tiered.SPLIT,
        ),
        ApiHandling(
            api01_fetch.API_KEY,
            "Fetch",
            api01_fetch.rewrite_response,
            api01_fetch.FIRST_NODE_ENDPOINTS_VERSION,
            Tiered.SPLIT,
            walks_large_answers=True,
        ),
        ApiHandling(api02_list_offsets.API_KEY, "ListOffsets", tiered=Tiered.SPLIT),
        ApiHandling(api03_metadata.API_KEY, "Metadata", api03_metadata.rewrite_response),
        ApiHandling(
            api10_find_coordinator.API_KEY,
            "FindCoordinator",
            api10_find_coordinator.rewrite_response,
        ),
        # Forwarded whole; a tiered topic Kafka deleted is dropped from the fleet before
        # the client is answered (tiered/topic_deletes.py)
        ApiHandling(api20_delete_topics.API_KEY, "DeleteTopics", tiered=Tiered.AFTER_UPSTREAM),
        ApiHandling(api21_delete_records.API_KEY, "DeleteRecords", tiered=Tiered.SPLIT),
        # No topic named: a transactional producer's epoch bump may have fenced a
        # transaction open in tiered partitions (tiered/fencing.py)
        ApiHandling(api22_init_producer_id.API_KEY, "InitProducerId", tiered=Tiered.AFTER_UPSTREAM),
        # Answered from the tiered partitions' own epochs; the request still goes
        # upstream whole (the broker's answer is rewritten for those partitions).
        ApiHandling(
            api23_offset_for_leader_epoch.API_KEY, "OffsetForLeaderEpoch", tiered=Tiered.SPLIT
        ),
        ApiHandling(
            api24_add_partitions_to_txn.API_KEY,
            "AddPartitionsToTxn",
            tiered=Tiered.AFTER_UPSTREAM,
        ),
        # Forwarded whole; a tiered topic whose configs Kafka changed has them read again
        # by every proxy before the client is answered (tiered/config_changes.py)
        ApiHandling(api33_alter_configs.API_KEY, "AlterConfigs", tiered=Tiered.AFTER_UPSTREAM),
        ApiHandling(
            api44_incremental_alter_configs.API_KEY,
            "IncrementalAlterConfigs",
            tiered=Tiered.AFTER_UPSTREAM,
        ),
        ApiHandling(
            api60_describe_cluster.API_KEY,
            "DescribeCluster",
            api60_describe_cluster.rewrite_response,
        ),
        # A tiered partition's producers are its owner's, not Kafka's (tiered/producers.py)
        ApiHandling(api61_describe_producers.API_KEY, "DescribeProducers", tiered=Tiered.SPLIT),
    )
}

RESPONSE_REWRITERS: dict[int, Rewriter] = {
    key: api.rewrite for key, api in HANDLING.items() if api.rewrite is not None
}
TIERED_API_KEYS = frozenset(key for key, api in HANDLING.items() if api.tiered is not None)

# The first versions whose responses may carry KIP-951 node endpoints. Both are
# rewritten (see api00_produce, api01_fetch), so no cap is needed to hide addresses.
# CAPPED_VERSIONS is for a proxy that wants Fetch answers passed through without the
# walk to their tagged fields (about 1 us per partition): clients then rediscover a
# moved leader by Metadata, as before KIP-951. Capping Produce at 9 costs more: v11+
# carry KIP-890 (TRANSACTION_ABORTABLE, transactions v2), so cap Fetch alone if any.
NODE_ENDPOINTS_SINCE: dict[int, int] = {
    key: api.node_endpoints_since
    for key, api in HANDLING.items()
    if api.node_endpoints_since is not None
}
CAPPED_VERSIONS: dict[int, int] = {
    api_key: version - 1 for api_key, version in NODE_ENDPOINTS_SINCE.items()
}


def max_version_without_node_endpoints(api_key: int) -> int | None:
    """The highest version of this API whose responses name no broker, if it has a limit."""
    return CAPPED_VERSIONS.get(api_key)


__all__ = [
    "HANDLING",
    "CAPPED_VERSIONS",
    "NODE_ENDPOINTS_SINCE",
    "RESPONSE_REWRITERS",
    "TIERED_API_KEYS",
    "Advertise",
    "ApiHandling",
    "Rewriter",
    "Tiered",
    "max_version_without_node_endpoints",
]
