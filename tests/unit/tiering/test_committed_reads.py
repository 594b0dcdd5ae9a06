"""read_committed's run loop (proxy/tiered/committed.py): a run too short to hold the
marker of the first transaction is read again, longer; past the bound the first batch is
answered as it is, with a warning. Pure: the runs are built here."""

from __future__ import annotations

import asyncio
import logging

from proxy.records.transactions import ABORT
from proxy.tiered.committed import MAX_TRANSACTION_READ_BYTES, Run, read_committed
from tests.unit.tiering.test_read_committed_view import data, log, marker, offsets

BATCHES = log(data(8, transactional=True), data(), data(), marker(8, ABORT), data())


def runs_of(batches, end: int, last_stable: int | None, asked: list[int], cap: int | None = None):
    """A run of as many batches as `limit` bytes hold (the first whole), at most `cap`."""

    async def run(limit: int) -> Run:
        asked.append(limit)
        taken, size = [], 0
        for batch in batches[:cap]:
            if taken and size + len(batch) > limit:
                break
            taken.append(batch)
            size += len(batch)
        reached = len(taken) == len(batches)
        return Run(taken, end, last_stable, reached)

    return run


def test_a_longer_run_decides_the_first_transaction():
    asked: list[int] = []
    first = len(BATCHES[0])
    read = asyncio.run(read_committed(runs_of(BATCHES, 200, 200, asked), 1, 100, first))
    at = offsets(BATCHES)
    assert asked == [first, 1 << 20]
    assert (len(read.records), read.aborted, read.last_stable_offset) == (1, ((8, at[0]),), 200)


def test_past_the_bound_the_first_batch_is_answered_as_it_is(caplog):
    asked: list[int] = []
    run = runs_of(BATCHES, 200, 200, asked, cap=2)  # the marker never comes into a run
    with caplog.at_level(logging.WARNING, "tierproxy.reads"):
        read = asyncio.run(read_committed(run, 1, 100, 10))
    assert asked[-1] == MAX_TRANSACTION_READ_BYTES
    assert (len(read.records), read.aborted) == (1, ())
    assert "no marker in the next" in caplog.text


def test_an_open_transaction_at_the_lso_is_not_read_further():
    asked: list[int] = []
    read = asyncio.run(read_committed(runs_of(BATCHES, 200, 100, asked), 1, 100, 1 << 20))
    assert asked == [1 << 20]
    assert (read.records, read.last_stable_offset) == ([], 100)
