"""AddPartitionsToTxn naming tiered partitions: forwarded, then the markers caught up
(docs/tiering.md, "Transactions").

The request goes to Kafka's transaction coordinator as it came: Kafka stays the
coordinator, and writes each transaction's markers into its own log of every partition,
where the owner's marker follower finds them (proxy/markers/). The ordering rule: with
transactions v1 a producer keeps its epoch and sequence numbers across transactions, so
the marker of its transaction 1 must be in the stream before the first batch of its
transaction 2. Kafka answers AddPartitionsToTxn for transaction 2 only once transaction
1's markers are written (CONCURRENT_TRANSACTIONS meanwhile), and a producer sends a
partition's records only after that answer. So once Kafka answers success for a tiered
partition, its owner catches up (reads Kafka's log of it up to the high watermark as of
now and appends every marker found) and only then is the client answered. Forward first,
catch up after, never concurrently: a catch-up before Kafka's answer could miss the
marker being written.

A catch-up that fails (the owner unreachable, Kafka not answering, past
`catch_up.CATCH_UP_TIMEOUT_S`) answers those partitions CONCURRENT_TRANSACTIONS, which every
client retries; Kafka answers the retry success again (the partition is in the
transaction already) and the catch-up is tried again.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

from kio.schema.errors import ErrorCode

from proxy.apis.api24_add_partitions_to_txn import (
    AddPartitionsView,
    Key,
    answer_with_errors,
    read_add_partitions_to_txn_request,
    read_add_partitions_to_txn_response,
)
from proxy.kafka.frames import FrameError
from proxy.metadata.topic_index import TopicIndex
from proxy.tiered.outcome import pass_outcome

log = logging.getLogger("tierproxy.transactions")

RETRY_ERROR = ErrorCode.concurrent_transactions.value  # retriable for every client

# the tiered partitions whose catch-up succeeded are not named; those that failed are
CatchUp = Callable[[list[Key]], Awaitable[frozenset[Key]]]


@dataclass(slots=True, eq=False)
class AddPartitionsPlan:
    """The request goes upstream whole; once Kafka answered, the tiered partitions it
    answered success are caught up (`upstream_answered`), and `local` is done with those
    whose catch-up failed."""

    upstream_frame: tuple[bytes | memoryview, ...]
    tiered: frozenset[Key]
    catch_up: CatchUp
    local: asyncio.Future[frozenset[Key]]
    passthrough_topics: tuple[str, ...] = ()

    def upstream_answered(self, api_version: int, upstream: memoryview) -> None:
        """Kafka's answer is here: start the catch-up of the tiered partitions it added."""
        try:
            codes = read_add_partitions_to_txn_response(api_version, upstream).codes()
        except FrameError:  # passed on as Kafka gave it (merge): the client judges it
            self.local.set_result(frozenset())
            return
        added = [key for key in sorted(self.tiered) if codes.get(key) == 0]
        if not added:
            self.local.set_result(frozenset())
            return
        task = asyncio.ensure_future(self.catch_up(added))
        task.add_done_callback(lambda t: pass_outcome(t, self.local))

    def merge(self, api_version: int, upstream: memoryview | None, local: frozenset[Key]) -> bytes:
        assert upstream is not None
        if not local:
            return bytes(upstream)
        answer = read_add_partitions_to_txn_response(api_version, upstream)
        return answer_with_errors(answer, local, RETRY_ERROR)

    def failed(self, error: BaseException) -> frozenset[Key]:
        return self.tiered  # a bug: the client retries, nothing is lost


class TxnHost(Protocol):
    """What AddPartitionsToTxn needs of the tiered service (service.py)."""

    @property
    def topics(self) -> TopicIndex: ...

    def is_tiered(self, topic: str | uuid.UUID, partition: int) -> bool: ...

    async def catch_up(self, keys: list[Key]) -> frozenset[Key]:
        """Catch these tiered partitions up at their owners; those that failed."""
        ...


def plan_add_partitions_to_txn(
    tiering: TxnHost, frame: tuple[bytes | memoryview, ...], body: memoryview, api_version: int
) -> AddPartitionsPlan | None:
    """The plan for one AddPartitionsToTxn (`frame`: the request as it came); None to
    forward it as it came with nothing after (it names no tiered topic). FrameError if
    it cannot be read."""
    if not tiering.topics.any():
        return None
    view: AddPartitionsView = read_add_partitions_to_txn_request(api_version, body)
    tiered = frozenset(key for key in view.keys() if tiering.is_tiered(*key))
    if not tiered:
        return None
    local: asyncio.Future[frozenset[Key]] = asyncio.get_running_loop().create_future()
    return AddPartitionsPlan(frame, tiered, tiering.catch_up, local)
