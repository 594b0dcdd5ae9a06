"""InitProducerId of a transactional producer: forwarded, then the markers of the
transaction it fenced caught up before the client has the answer (docs/tiering.md,
"Transactions": fencing).

When a producer with a transactional id initializes while an earlier producer of that id
has a transaction open, Kafka's coordinator bumps the epoch, aborts that transaction and
writes the ABORT marker (at the bumped epoch) into its log of every partition in it; it
answers this InitProducerId with success only once those markers are written
(CONCURRENT_TRANSACTIONS meanwhile: TransactionCoordinator.handleInitProducerId, state
Ongoing -> PrepareEpochFence). From then on Kafka refuses the fenced producer's next
send: its partitions hold the marker with the newer epoch (INVALID_PRODUCER_EPOCH, or
PRODUCER_FENCED from the coordinator's verification).

A tiered partition holds the marker once its owner's follower has read it from Kafka's
log, which may be after the fenced producer sent again: that send would be accepted
into the open transaction. So, as for AddPartitionsToTxn (txn.py): forward first, and
when Kafka answers success with an epoch past 0 (a producer id that may have had a
transaction; 0 is a new one), every tiered partition where that producer id has a
transaction open (or a batch waiting for its verification) is caught up by its owner
before the client is answered. The proxy does not know which partitions those are
(AddPartitionsToTxn may have come through any proxy of the fleet; the coordinator's
list is empty once the abort completed), but each owner does, from its sequencer:
`catch_up_producer` asks this proxy's partitions and every live member of the fleet.
Then a fenced producer's send finds the marker, and the owner answers as Kafka's leader
does (the producer has no transaction open: KIP-890 verification, which the coordinator
refuses with the fenced epoch).

A catch-up that fails (a member not answering within `catch_up.CATCH_UP_TIMEOUT_S`) is
logged and the client gets Kafka's answer all the same: nothing is lost or kept (the
marker still reaches each stream, by the follow or the catch-up of the next
AddPartitionsToTxn, and aborts whatever the fenced producer added meanwhile), only a
fenced producer's send in that window is accepted where Kafka refuses it. Answering a
retriable error instead would bump the epoch on every retry and keep producers from
starting while a member is away.

The cost: one round trip to each live member per InitProducerId with an epoch past 0 (a
producer starting, not a produce), and per owner one dictionary lookup per partition it
owns; a Fetch of Kafka's log only for partitions where that producer has a transaction
open.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

from proxy.apis.api22_init_producer_id import (
    read_init_producer_id_response,
    read_transactional_id,
)
from proxy.kafka.frames import FrameError
from proxy.metadata.topic_index import TopicIndex

log = logging.getLogger("tierproxy.transactions")

CatchUpProducer = Callable[[int], Awaitable[list[str]]]  # producer id -> what failed


@dataclass(slots=True, eq=False)
class InitProducerIdPlan:
    """The request goes upstream whole; once Kafka answered an epoch bump, the producer
    id's tiered partitions are caught up (`upstream_answered`), and `local` is done then.
    The answer is Kafka's, as it came."""

    upstream_frame: tuple[bytes | memoryview, ...]
    transactional_id: str
    catch_up_producer: CatchUpProducer
    local: asyncio.Future[None]
    passthrough_topics: tuple[str, ...] = ()

    def upstream_answered(self, api_version: int, upstream: memoryview) -> None:
        """Kafka's answer is here: catch up if it bumped an epoch."""
        try:
            answer = read_init_producer_id_response(upstream)
        except FrameError:  # passed on as Kafka gave it: the client judges it
            self.local.set_result(None)
            return
        if answer.error_code != 0 or answer.producer_epoch <= 0:
            self.local.set_result(None)
            return
        task = asyncio.ensure_future(self.catch_up_producer(answer.producer_id))
        task.add_done_callback(lambda t: self._caught_up(t, answer.producer_id))

    def _caught_up(self, task: asyncio.Future[list[str]], producer_id: int) -> None:
        if self.local.done():
            return
        if task.cancelled():
            self.local.cancel()
            return
        error = task.exception()
        failures = [f"{type(error).__name__}: {error}"] if error is not None else task.result()
        if failures:
            log.warning(
                "InitProducerId of %r (producer id %d) answered before its tiered partitions "
                "were caught up: %s",
                self.transactional_id,
                producer_id,
                "; ".join(failures),
            )
        self.local.set_result(None)

    def merge(self, api_version: int, upstream: memoryview | None, local: None) -> bytes:
        assert upstream is not None
        return bytes(upstream)

    def failed(self, error: BaseException) -> None:
        return None  # a bug (logged by the connection): Kafka's answer as it came


class FencingHost(Protocol):
    """What InitProducerId needs of the tiered service (service.py)."""

    @property
    def topics(self) -> TopicIndex: ...

    async def catch_up_producer(self, producer_id: int) -> list[str]:
        """Catch up every tiered partition where the producer has a transaction open."""
        ...


def plan_init_producer_id(
    tiering: FencingHost, frame: tuple[bytes | memoryview, ...], body: memoryview, api_version: int
) -> InitProducerIdPlan | None:
    """The plan for one InitProducerId (`frame`: the request as it came); None to forward
    it with nothing after (no tiered topic, or no transactional id: an idempotent
    producer has no transaction to fence). FrameError if it cannot be read."""
    if not tiering.topics.any():
        return None
    transactional_id = read_transactional_id(api_version, body)
    if transactional_id is None:
        return None
    local: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    return InitProducerIdPlan(frame, transactional_id, tiering.catch_up_producer, local)
