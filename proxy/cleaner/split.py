"""One clean cut into parts computed apart, for a job that cleans a large log in parallel
(offload_jobs/clean.py, docs/offload.md "Cleaning a compacted topic"). Each part is
computed from one committed range or one group of ranges; these rules join them so that
the result is the clean `index_dirty` and `LogClean` make of the whole log at once (the
proxy's runner, proxy/upkeep/log_cleaner.py):

- `scan_entries`: the batches of one range that `scan_log` and the transactions' state
  depend on (every control and transactional batch, each producer's last batch and last
  data batch), data batches as headers alone. Those of every range, in offset order,
  give `scan_log` the answer the whole log gives; they are few next to the log (a
  log's transactions are what bounds them).
- `range_map`: one range's part of the offset map (key digest -> latest offset, the
  digests `offset_map.digest` makes); parts join by keeping each digest's largest
  offset (`merge_maps`), so the map has no entry limit but the memory of whoever holds it.
- `transactions_at`: the transactions' state (`CleaningTransactions.seen`) at each
  group's first offset, so a group cleaned alone carries on from the groups before it:
  a marker whose transaction's batches are in an earlier group stays.

Pure: no I/O, no asyncio.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from proxy.cleaner.clean import Batches, index_dirty
from proxy.cleaner.offset_map import OffsetMap
from proxy.cleaner.plan import Segment
from proxy.cleaner.transactions import CleaningTransactions, LogScan, TransactionsSeen
from proxy.records.batches import BatchHeader

ScanEntry = tuple[BatchHeader, bytes]  # a batch's header; a control batch's bytes too


def scan_entries(batches: Batches) -> list[ScanEntry]:
    """The batches of one range (in offset order) that the scan needs, in offset order."""
    needed: set[int] = set()
    last: dict[int, int] = {}  # producer -> index of its last batch here
    last_data: dict[int, int] = {}
    for i, (header, _) in enumerate(batches):
        if header.is_control or header.is_transactional:
            needed.add(i)
        if header.producer_id >= 0:
            last[header.producer_id] = i
            if not header.is_control:
                last_data[header.producer_id] = i
    needed.update(last.values(), last_data.values())
    out = []
    for i in sorted(needed):
        header, batch = batches[i]
        out.append((header, bytes(batch) if header.is_control else b""))
    return out


def segment_of(start: int, end: int, batches: Batches) -> Segment:
    """A range as the cleaner's plan sees it, from its batches (the runner's rule)."""
    return Segment(
        start,
        end,
        sum(len(b) for _, b in batches),
        max((h.max_timestamp for h, _ in batches), default=-1),
    )


def range_map(batches: Batches, first_dirty: int, aborted: set[int]) -> dict[bytes, int]:
    """One range's offset map: each key's latest offset in it from `first_dirty` on,
    aborted batches (their base offsets) left out, as `index_dirty` indexes it."""
    omap = OffsetMap(1 << 62)
    index_dirty([batches], first_dirty, LogScan(aborted=aborted), omap)
    return omap.digests()


def merge_maps(parts: Iterable[dict[bytes, int]]) -> dict[bytes, int]:
    """Ranges' maps joined: each digest's largest offset."""
    out: dict[bytes, int] = {}
    for part in parts:
        for d, offset in part.items():
            if offset > out.get(d, -1):
                out[d] = offset
    return out


def transactions_at(
    entries: Iterable[ScanEntry], aborted: set[int], starts: Sequence[int]
) -> list[TransactionsSeen]:
    """The transactions' state at each of `starts` (ascending first offsets of groups):
    what a clean fed every batch before it would hold."""
    txns = CleaningTransactions(aborted)
    out: list[TransactionsSeen] = []
    pending = iter(entries)
    entry = next(pending, None)
    for start in starts:
        while entry is not None and entry[0].base_offset < start:
            header, batch = entry
            if header.is_control:
                txns.on_marker(header, memoryview(batch))
            else:
                txns.on_batch(header)
            entry = next(pending, None)
        out.append(txns.seen())
    return out
