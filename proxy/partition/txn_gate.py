"""The owner's side of KIP-890 partition verification (docs/tiering.md, "Transactions":
verification): which batches wait for the coordinator, and in what order they go on.

A transactional batch of a producer with no transaction open in the partition is
verified with the coordinator before it is sequenced (`Verify`, given by the caller: the
tiered service's verifier, proxy/markers/verifier.py). A producer's batches must still
reach the sequencer in the order they came (its sequence numbers), so while one of its
batches waits for a verification, its later batches wait behind it (`in_turn`); other
producers' batches do not wait. "No transaction open" is the sequencer's state, pending
appends included, or a marker of the producer queued and not yet sequenced (it will
end the open transaction before the batch is sequenced).

Kafka's verification guard (UnifiedLog, the ABA case): a marker of the producer queued
while its verification was in flight may end the very transaction the coordinator just
vouched for; the batch would then open a transaction no marker ends. Kafka refuses such
a batch with INVALID_TXN_STATE at the append; so does `in_turn`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from kio.schema.errors import ErrorCode

from proxy.partition.rules import ProduceResult
from proxy.records.batches import CorruptBatchError, read_batch_header, validate_header

# (producer id, producer epoch) -> None once verified, else the answer to give
Verify = Callable[[int, int], Awaitable[ProduceResult | None]]
Enqueue = Callable[[], Awaitable[ProduceResult | None]]

NOT_ONGOING_MESSAGE = "Record was not part of an ongoing transaction"


@dataclass(frozen=True, slots=True)
class Producer:
    """Whose records these are, from their first batch's header."""

    producer_id: int
    producer_epoch: int
    transactional: bool


def producer_of(
    records: bytes | bytearray | memoryview, *, header_only: bool = False
) -> Producer | None:
    """The producer of `records` (first batch header only; no CRC check); None without a
    producer id or when the header cannot be read (the sequencer refuses those).
    `header_only`: `records` is one batch's header, its bytes elsewhere."""
    try:
        header = validate_header(records) if header_only else read_batch_header(records)
    except (CorruptBatchError, ValueError, IndexError):
        return None
    if header.producer_id < 0:
        return None
    return Producer(header.producer_id, header.producer_epoch, header.is_transactional)


@dataclass(slots=True, eq=False)
class _Watch:
    ended: bool = False  # a marker of the producer was queued meanwhile


class VerificationGate:
    """Per producer id: the last call waiting its turn, the markers queued and not yet
    sequenced, the verifications in flight. Entries live only while something waits."""

    def __init__(self) -> None:
        self._tails: dict[int, asyncio.Future[None]] = {}
        self._markers: dict[int, int] = {}
        self._watches: dict[int, list[_Watch]] = {}

    @property
    def waiting(self) -> bool:
        """Some producer's batch is waiting for a verification (or behind one)."""
        return bool(self._tails)

    def waits_for(self, producer_id: int) -> bool:
        """A batch of the producer is waiting for its verification (or behind one)."""
        return producer_id in self._tails

    def marker_queued(self, producer_id: int) -> None:
        self._markers[producer_id] = self._markers.get(producer_id, 0) + 1
        for watch in self._watches.get(producer_id, ()):
            watch.ended = True

    def marker_sequenced(self, producer_id: int) -> None:
        left = self._markers.get(producer_id, 0) - 1
        if left > 0:
            self._markers[producer_id] = left
        else:
            self._markers.pop(producer_id, None)

    def needs_verification(self, producer_id: int, open_here: bool) -> bool:
        """No transaction of the producer open here (`open_here`: the sequencer's view),
        or one that a marker queued will end first."""
        return not open_here or producer_id in self._markers

    def must_wait(self, producer: Producer, verify: Verify | None, open_here: bool) -> bool:
        """Whether the batch goes through `in_turn` rather than straight to the queue."""
        if producer.producer_id in self._tails:
            return True
        return (
            verify is not None
            and producer.transactional
            and self.needs_verification(producer.producer_id, open_here)
        )

    async def in_turn(
        self,
        producer: Producer,
        verify: Verify | None,
        open_here: Callable[[int], bool],
        enqueue: Enqueue,
    ) -> ProduceResult | None:
        """After the producer's earlier waiting batches are queued: verify if still
        needed, then `enqueue`. The refusal to answer, or what `enqueue` returned."""
        pid = producer.producer_id
        previous = self._tails.get(pid)
        mine: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._tails[pid] = mine
        try:
            if previous is not None:
                await asyncio.wait([previous])
            if (
                verify is not None
                and producer.transactional
                and self.needs_verification(pid, open_here(pid))
            ):
                refused = await self._verify(producer, verify)
                if refused is not None:
                    return refused
            return await enqueue()
        finally:
            mine.set_result(None)
            if self._tails.get(pid) is mine:
                del self._tails[pid]

    async def _verify(self, producer: Producer, verify: Verify) -> ProduceResult | None:
        pid = producer.producer_id
        watch = _Watch()
        self._watches.setdefault(pid, []).append(watch)
        try:
            refused = await verify(pid, producer.producer_epoch)
        finally:
            watches = self._watches[pid]
            watches.remove(watch)
            if not watches:
                del self._watches[pid]
        if refused is None and watch.ended:
            return ProduceResult(
                ErrorCode.invalid_txn_state.value, error_message=NOT_ONGOING_MESSAGE
            )
        return refused
