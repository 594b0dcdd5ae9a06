"""read_committed Fetch on the owner of a tiered partition (proxy/tiered/reads.py with
committed.py): the tail in the log cache holds transactional batches of interleaved
producers and their markers; the answer never passes the partition's last stable offset,
names the aborted transactions, and decides a transaction below the LSO by its marker
past it. Pure: the partition is a stand-in with its offsets, the cache a real LogCache."""

from __future__ import annotations

from types import SimpleNamespace

from test_rebuild_log_start import CUTOVER, STREAM

from proxy.reads.logcache import LogCache
from proxy.records.batches import read_batch_header, with_base_offset
from proxy.records.transactions import ABORT, COMMIT
from proxy.tiered.reads import READ_COMMITTED, READ_UNCOMMITTED
from tests.unit.tiering.test_read_committed_view import data, marker
from tests.unit.tiering.test_reads_below_log_start import migrated, reads_of


def owner_with(*batches: bytes, last_stable: int | None = None):
    """A partition owned here whose tail (from the cutover) is `batches`."""
    cache = LogCache(1 << 20)
    offset = CUTOVER
    for batch in batches:
        placed = with_base_offset(batch, offset)
        head = read_batch_header(placed)
        cache.append(STREAM, head.base_offset, head.last_offset, placed)
        offset = head.next_offset
    stable = offset if last_stable is None else last_stable
    owned = SimpleNamespace(
        high_watermark=offset, log_start_offset=0, last_stable_offset=stable, unfilled_from=None
    )
    reads = reads_of(migrated(), {STREAM: owned})
    reads.log_cache = cache
    reads.service.bandwidth = None
    reads.service.log = None
    return reads, owned


async def fetch(reads, offset: int, isolation: int, max_bytes: int = 1 << 20):
    part = SimpleNamespace(topic="t", partition=0, fetch_offset=offset)
    return await reads._read_one(part, max_bytes, "reader", isolation)


def bases(result) -> list[int]:
    return [read_batch_header(piece).base_offset for piece in result.records]


async def test_interleaved_transactions_on_the_owner():
    # data batches of two records, markers of one: 7 at 1000 and 1007, aborted at 1009;
    # 8 at 1002, committed at 1006; 9 opens at 1010 (the LSO)
    seven, eight, nine = (data(p, transactional=True) for p in (7, 8, 9))
    reads, owned = owner_with(
        seven, eight, data(), marker(8, COMMIT), seven, marker(7, ABORT), nine, data()
    )
    owned.last_stable_offset = CUTOVER + 10
    whole = await fetch(reads, CUTOVER, READ_UNCOMMITTED)
    assert len(whole.records) == 8
    answer = await fetch(reads, CUTOVER, READ_COMMITTED)
    assert answer.last_stable_offset == owned.last_stable_offset
    assert answer.high_watermark == owned.high_watermark
    assert max(bases(answer)) < owned.last_stable_offset
    assert len(answer.records) == 6  # up to 9's first batch
    assert answer.aborted_transactions == ((7, CUTOVER),)


async def test_a_transaction_below_the_lso_is_decided_by_its_marker_past_it():
    # 7 opens at 1000, 9 at 1002 (still open: the LSO), 7 aborts at 1004, past the LSO
    seven, nine = data(7, transactional=True), data(9, transactional=True)
    reads, owned = owner_with(seven, nine, marker(7, ABORT))
    owned.last_stable_offset = CUTOVER + 2
    answer = await fetch(reads, CUTOVER, READ_COMMITTED)
    assert bases(answer) == [CUTOVER]
    assert (answer.aborted_transactions, answer.last_stable_offset) == (((7, CUTOVER),), 1002)
    # from the open transaction on: nothing, the LSO
    at_lso = await fetch(reads, CUTOVER + 2, READ_COMMITTED)
    assert (at_lso.records, at_lso.last_stable_offset) == ((), CUTOVER + 2)


async def test_the_first_transaction_is_decided_past_max_bytes():
    seven = data(7, transactional=True)
    reads, owned = owner_with(seven, data(), data(), marker(7, COMMIT), data())
    answer = await fetch(reads, CUTOVER, READ_COMMITTED, max_bytes=len(seven))
    assert (bases(answer), answer.aborted_transactions) == ([CUTOVER], ())
    assert answer.last_stable_offset == owned.high_watermark
