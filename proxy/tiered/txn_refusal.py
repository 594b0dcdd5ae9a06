"""AddPartitionsToTxn naming a tiered partition: answered by the proxy, never forwarded
(docs/tiering.md, "Transactions").

Transactions on tiered topics are not supported yet. Were the request forwarded, Kafka's
transaction coordinator would add the tiered partition to the transaction, and at its
end (commit, abort, or the transaction timeout) write a marker into Kafka's own log of
that partition, past the cutover, where no record of the partition's may go. So a request
naming any partition of a tiered topic is answered here as Kafka answers one it does not
attempt: the tiered partitions REFUSAL_ERROR, every other OPERATION_NOT_ATTEMPTED, and
nothing goes upstream. The client's transaction becomes abortable; after aborting it, the
producer goes on with transactions on passthrough topics. The Produce refusal
(tiered_produce.py) stays, for a client that skips this request.

Each transactional id's first refusal is logged at WARNING, naming the topics; its next
ones are not (a client retrying in a loop would flood the log).
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from dataclasses import dataclass

from kio.schema.errors import ErrorCode

from proxy.apis.api24_add_partitions_to_txn import (
    AddPartitionsView,
    Key,
    read_add_partitions_to_txn_request,
    refused_answer,
    refused_partitions,
)

log = logging.getLogger("tierproxy.transactions")

# Why this code: docs/tiering.md, "Transactions" (each client tried with each candidate).
REFUSAL_ERROR = ErrorCode.topic_authorization_failed.value
WARNED_IDS = 10_000  # transactional ids remembered as warned; the oldest are forgotten


class TxnRefusals:
    """The transactional ids already warned about, at most WARNED_IDS of them."""

    def __init__(self, limit: int = WARNED_IDS) -> None:
        self.count = 0  # requests refused
        self._warned: OrderedDict[str, None] = OrderedDict()
        self._limit = limit

    def note(self, transactional_id: str, keys: list[Key], client: str) -> None:
        self.count += 1
        if transactional_id in self._warned:
            return
        self._warned[transactional_id] = None
        if len(self._warned) > self._limit:
            self._warned.popitem(last=False)
        topics = sorted({topic for topic, _ in keys})
        log.warning(
            "refused AddPartitionsToTxn of transactional id %r from client %s: tiered topic%s"
            " %s (transactions on tiered topics are not supported yet; the producer must"
            " abort the transaction; logged once per transactional id)",
            transactional_id,
            client,
            "s" if len(topics) > 1 else "",
            ", ".join(topics),
            extra={"client": client, "reason": "transactional_tiered"},
        )


@dataclass(slots=True, eq=False)
class AddPartitionsPlan:
    """A request answered here whole: nothing goes upstream."""

    view: AddPartitionsView
    local: asyncio.Future[frozenset[Key]]  # the refused partitions, already known
    upstream_frame: None = None
    passthrough_topics: tuple[str, ...] = ()

    def merge(self, api_version: int, upstream: memoryview | None, local: frozenset) -> bytes:
        return refused_answer(self.view, local, REFUSAL_ERROR)

    def failed(self, error: BaseException) -> frozenset[Key]:
        return frozenset(self.view.keys())  # refuse all: nothing was added anywhere


def plan_add_partitions_to_txn(
    tiering, body: memoryview, api_version: int, client: str
) -> AddPartitionsPlan | None:
    """The plan for one AddPartitionsToTxn; None to forward it as it came (it names no
    tiered topic). FrameError if it cannot be read."""
    if not tiering.topics.any():
        return None
    view = read_add_partitions_to_txn_request(api_version, body)
    refused = refused_partitions(view, tiering.is_tiered)
    if not refused:
        return None
    for transactional_id, keys in refused.items():
        tiering.txn_refusals.note(transactional_id, keys, client)
    local: asyncio.Future[frozenset[Key]] = asyncio.get_running_loop().create_future()
    local.set_result(frozenset(key for keys in refused.values() for key in keys))
    return AddPartitionsPlan(view, local)
