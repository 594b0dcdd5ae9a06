"""read_committed answers of tiered partitions (docs/tiering.md, "Transactions: the read
side"): how far to read so that every transaction answered is decided.

A tiered partition's transactions are decided by their markers (control batches) in the
stream: the objects hold the older ones, the owner's log cache the tail (the marker
follower appends each marker Kafka's coordinator writes). Kafka knows a decision from its
transaction index; the proxy from the marker itself, so the run of batches read from the
fetch offset must reach the marker of the first transaction answered. `read_committed`
reads a run (`ReadRun`: objects, then the tail), asks `records.transactions.
committed_answer` what to answer, and reads a longer run while the first batch belongs to
a transaction decided (below the last stable offset) whose marker lies past the run, up
to MAX_TRANSACTION_READ_BYTES. Past that bound (a transaction interleaved with more than
that much data) the first transaction is answered as it is, with a warning: a consumer
kept waiting for ever would be worse, and Kafka's transaction timeout makes it rare.

A transaction open at the last stable offset is never answered: the answer stops before
it, as Kafka's does, and the consumer asks again once its marker is in the stream.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from proxy.records.batches import read_batch_header
from proxy.records.transactions import committed_answer

log = logging.getLogger("tierproxy.reads")

# a read_committed answer reads this far for the marker of a transaction it starts with
MAX_TRANSACTION_READ_BYTES = 64 << 20


@dataclass(frozen=True, slots=True)
class Run:
    """Batches read from the fetch offset on, and what is known of the partition."""

    batches: Sequence[memoryview]
    end: int  # the high watermark to answer
    last_stable: int | None  # the owner's LSO; None when no owner answered
    exhausted: bool  # the batches reach `end`: no marker lies past them
    tail: bool = False  # some come from the tail (the log cache, here or the owner's)


@dataclass(frozen=True, slots=True)
class CommittedRead:
    records: Sequence[memoryview]
    aborted: tuple[tuple[int, int], ...]
    last_stable_offset: int
    end: int
    tail: bool = False


ReadRun = Callable[[int], Awaitable[Run]]  # a run of up to this many bytes (first batch whole)


async def read_committed(
    read_run: ReadRun, stream: int, offset: int, max_bytes: int
) -> CommittedRead:
    """The read_committed answer from `offset`, within `max_bytes` (the first batch whole)."""
    limit = max_bytes
    while True:
        run = await read_run(limit)
        answer = committed_answer(
            run.batches,
            offset,
            max_bytes,
            last_stable=run.last_stable,
            end=run.end,
            exhausted=run.exhausted,
        )
        if not answer.read_more or limit >= MAX_TRANSACTION_READ_BYTES:
            break
        limit = min(max(2 * limit, 1 << 20), MAX_TRANSACTION_READ_BYTES)
    if not answer.read_more:
        records = run.batches[: answer.count]
        fields = (answer.aborted, answer.last_stable_offset, run.end, run.tail)
        return CommittedRead(records, *fields)
    log.warning(
        "stream %d: the transaction at offset %d has no marker in the next %d bytes: its "
        "first batch is answered to read_committed as it is",
        stream,
        offset,
        limit,
    )
    first = run.batches[:1]
    last_stable = max(answer.last_stable_offset, read_batch_header(first[0]).next_offset)
    return CommittedRead(first, (), min(last_stable, run.end), run.end, run.tail)
