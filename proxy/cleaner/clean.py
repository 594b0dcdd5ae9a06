"""One clean of a partition's log, Kafka's LogCleaner rules, batch by batch.

1. `index_dirty` builds the offset map from the dirty section (the ranges from the first
   dirty offset on): every keyed record of a data batch not aborted, key -> its offset.
   It stops at the last range indexed whole when the map is full.
2. `LogClean.clean_batch` rewrites every batch from the log start to where the map ends:

   - a record stays when no later offset of its key is in the map, and it has a value or
     is a tombstone whose batch has no delete horizon yet or one still in the future;
     a record with no key goes (Kafka refuses them on compacted topics);
   - transactions: see transactions.py (aborted batches go, markers later);
   - a batch that holds its producer's last data offset stays as an empty header when all
     its records go, so its producer's last sequence and epoch survive (Kafka's
     BatchRetention.RETAIN_EMPTY); a producer with no data batch keeps its last marker,
     whole (Kafka keeps its header only; the read side reads each marker's record);
   - a batch with all records kept and no horizon to set stays byte for byte; a batch
     keeping a tombstone or a marker that may go, and with no horizon, gets one:
     now + delete.retention.ms (KIP-534: Kafka 3.1+ keeps it in the batch too, not in the
     segment's modification time); any other batch is rewritten with the records kept.

Pure: no I/O, no asyncio, no clock (now is passed in).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from proxy.cleaner.batch_codec import Record, delete_horizon, empty_batch, read_records, rebuild
from proxy.cleaner.offset_map import OffsetMap
from proxy.cleaner.transactions import CleaningTransactions, LogScan, TransactionsSeen
from proxy.records.batches import BatchHeader, read_batch_header

Batches = Sequence[tuple[BatchHeader, memoryview]]


def index_dirty(ranges: Sequence[Batches], first_dirty: int, scan: LogScan, omap: OffsetMap) -> int:
    """Index `ranges` (the dirty section's, in order) into `omap`; how many were indexed
    whole (the clean goes up to the end of the last of them)."""
    done = 0
    for batches in ranges:
        for header, batch in batches:
            if header.is_control or header.base_offset in scan.aborted:
                continue
            for record in read_records(header, batch):
                offset = header.base_offset + record.offset_delta
                if record.key is not None and offset >= first_dirty:
                    if not omap.put(record.key, offset):
                        return done
        done += 1
    return done


@dataclass(slots=True)
class CleanStats:
    batches_read: int = 0
    batches_kept: int = 0
    records_read: int = 0
    records_kept: int = 0
    bytes_read: int = 0
    bytes_kept: int = 0


class LogClean:
    """The state of one clean: batches fed in offset order from the log start."""

    def __init__(
        self,
        omap: OffsetMap,
        map_end: int,
        scan: LogScan,
        *,
        now_ms: int,
        delete_retention_ms: int,
        seen: TransactionsSeen = ((), ()),
        kafka_below: bool = False,
    ) -> None:
        """`seen`: the transactions' state at the first batch fed, when that is not the
        log start's (split.transactions_at). `kafka_below`: part of the log below the
        cutover is in Kafka's log alone (a backfill gap), which this clean never reads:
        tombstones and markers stay past their horizon, as the records they delete or end
        may lie there (Kafka's log of a topic is one log: a tombstone goes only after
        every older record of its key did). They go at a clean after the migration."""
        self._map, self._map_end, self._scan = omap, map_end, scan
        self._txns = CleaningTransactions(scan.aborted, seen)
        self._now, self._retention = now_ms, delete_retention_ms
        self._final = not kafka_below  # tombstones and markers past their horizon go
        self.stats = CleanStats()

    def _producer_last(self, header: BatchHeader) -> bool:
        last = self._scan.producers.get(header.producer_id)
        if last is None or header.producer_id < 0:
            return False
        if last.last_data_offset is not None:
            return header.last_offset == last.last_data_offset
        return header.is_control and header.producer_epoch == last.epoch

    def clean_batch(self, header: BatchHeader, batch: memoryview) -> memoryview | bytes | None:
        """The batch as the clean leaves it: the same bytes, a rewrite, or None (gone)."""
        stats = self.stats
        stats.batches_read += 1
        stats.bytes_read += len(batch)
        horizon = delete_horizon(header)
        if header.is_control:
            may_go = self._txns.on_marker(header, batch)
            drop_records = may_go and horizon is not None and horizon <= self._now and self._final
        else:
            may_go = drop_records = self._txns.on_batch(header)
        keep_empty = self._producer_last(header)
        if drop_records and not keep_empty:
            return None
        if drop_records and header.is_control:
            # Kafka would keep an empty control batch; the marker is kept whole instead:
            # the read side decides transactions by each marker's record
            stats.batches_kept += 1
            stats.bytes_kept += len(batch)
            return batch
        records = [] if drop_records else read_records(header, batch)
        stats.records_read += header.record_count
        if header.is_control or not records:
            kept = records
        else:
            kept = [r for r in records if self._keep(header, r, horizon)]
        if not kept:
            if keep_empty:
                # an empty header an earlier clean left stays as it is
                out = batch if header.record_count == 0 else empty_batch(header)
                stats.batches_kept += 1
                stats.bytes_kept += len(out)
                return out
            return None
        tombstones = any(not r.has_value for r in kept)
        new_horizon = horizon is None and (tombstones or (header.is_control and may_go))
        stats.batches_kept += 1
        stats.records_kept += len(kept)
        if len(kept) == len(records) and not new_horizon:
            stats.bytes_kept += len(batch)
            return batch
        out = rebuild(header, kept, self._now + self._retention if new_horizon else horizon)
        stats.bytes_kept += len(out)
        return out

    def _keep(self, header: BatchHeader, record: Record, horizon: int | None) -> bool:
        offset = header.base_offset + record.offset_delta
        if offset >= self._map_end:
            return True
        if record.key is None:
            return False
        if offset < self._map.get(record.key):
            return False
        return record.has_value or horizon is None or self._now < horizon or not self._final


Piece = tuple[int, int, int, memoryview | bytes]  # base offset, next offset, records, bytes


def clean_group(run: LogClean, ranges: Sequence[Batches]) -> tuple[list[Piece], bool]:
    """The batches of a group of ranges (rewritten into one object) as the clean leaves
    them, and whether any changed. The group's last batch always stays, as an empty
    header when the clean dropped it: the new range then ends with a batch, as every
    range does (a rebuild of the partition's producer state from the objects takes holes
    inside ranges, not at their end), and an object holds at least one block. Kafka keeps
    no such batch; a reader skips it."""
    pieces: list[Piece] = []
    changed = False
    last: tuple[BatchHeader, memoryview, bool] | None = None  # and `changed` before it
    out: memoryview | bytes | None = None
    for batches in ranges:
        for header, batch in batches:
            out = run.clean_batch(header, batch)
            last = header, batch, changed
            if out is not batch:
                changed = True
            if out is not None:
                count = header.record_count if out is batch else read_batch_header(out).record_count
                pieces.append((header.base_offset, header.next_offset, count, out))
    if last is not None and out is None:
        header, batch, before = last
        empty = empty_batch(header)
        pieces.append((header.base_offset, header.next_offset, 0, empty))
        if empty == bytes(batch):  # the empty header an earlier clean left here: no change
            changed = before
    return pieces, changed


def blocks(
    pieces: Sequence[Piece], start: int, end: int, max_block_bytes: int
) -> list[tuple[int, int, int, bytes | memoryview]]:
    """The cleaned batches of [start, end) as object blocks (start, end, records, bytes)
    tiling the range: a block runs to the next one's first batch, the last to `end`, so
    holes the clean left stay inside blocks."""
    runs: list[list[Piece]] = []
    size = 0
    for piece in pieces:
        if runs and size + len(piece[3]) <= max_block_bytes:
            runs[-1].append(piece)
            size += len(piece[3])
        else:
            runs.append([piece])
            size = len(piece[3])
    out: list[tuple[int, int, int, bytes | memoryview]] = []
    for i, run in enumerate(runs):
        first = start if i == 0 else run[0][0]
        last = end if i == len(runs) - 1 else runs[i + 1][0][0]
        data = run[0][3] if len(run) == 1 else b"".join(p[3] for p in run)
        out.append((first, last, sum(p[2] for p in run), data))
    return out
