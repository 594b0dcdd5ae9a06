"""Transactions as the cleaner sees them (Kafka's CleanedTransactionMetadata).

Kafka knows its aborted transactions from its transaction index; the cleaner here reads
them off the log itself (`scan_log`, batch headers and each marker's key only): a
producer's transactional batches up to its next marker belong to one transaction, aborted
when that marker is ABORT. A transactional batch with no marker in the log read is open:
nothing from its offset on may be cleaned (Kafka's cleanable end stops at the last stable
offset).

While cleaning, `CleaningTransactions` says which batches go, per Kafka's rules:

- a data batch of an aborted transaction goes;
- an ABORT marker stays while this clean saw batches of its transaction (they go in this
  clean; the marker tells readers of older copies), else it may go;
- a COMMIT marker may go when this clean saw no batch of its transaction;
- a marker that may go is first kept with a delete horizon (now + delete.retention.ms)
  and removed by a clean past that horizon, so a consumer reading slowly still sees it.

Pure: no I/O, no asyncio.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from proxy.records.batches import BatchHeader
from proxy.records.transactions import ABORT, COMMIT, ControlRecordError, marker_type


@dataclass(frozen=True, slots=True)
class ProducerLast:
    """A producer's last batch in the log (Kafka's lastRecordsOfActiveProducers): the last
    offset of its last data batch (None when it has none), and its epoch."""

    last_data_offset: int | None
    epoch: int


@dataclass(slots=True)
class LogScan:
    """What one header pass over a partition's log tells the cleaner."""

    aborted: set[int] = field(default_factory=set)  # base offsets of aborted data batches
    open_from: int | None = None  # first offset of a transaction with no marker read
    producers: dict[int, ProducerLast] = field(default_factory=dict)


def scan_log(batches: Iterable[tuple[BatchHeader, memoryview]]) -> LogScan:
    """The aborted batches, the first open transaction and each producer's last batch."""
    scan = LogScan()
    pending: dict[int, list[int]] = {}  # producer -> its open transaction's batches
    data_last: dict[int, int] = {}
    epochs: dict[int, int] = {}
    for header, batch in batches:
        pid = header.producer_id
        if pid >= 0:
            epochs[pid] = header.producer_epoch
        if header.is_control:
            if header.record_count == 0:
                continue  # an empty control batch a clean left
            try:
                kind = marker_type(batch)
            except (ControlRecordError, IndexError):
                continue  # not a transaction marker (none is expected in a data topic)
            members = pending.pop(pid, [])
            if kind == ABORT:
                scan.aborted.update(members)
            continue
        if pid >= 0:
            data_last[pid] = header.last_offset
        if header.is_transactional:
            pending.setdefault(pid, []).append(header.base_offset)
    firsts = [members[0] for members in pending.values() if members]
    scan.open_from = min(firsts) if firsts else None
    scan.producers = {pid: ProducerLast(data_last.get(pid), epochs[pid]) for pid in epochs}
    return scan


TransactionsSeen = tuple[tuple[int, ...], tuple[int, ...]]


class CleaningTransactions:
    """The transaction state of one clean, fed every batch in offset order."""

    def __init__(self, aborted: set[int], seen: TransactionsSeen = ((), ())) -> None:
        self._aborted = aborted
        # `seen`: the state after the batches before this clean's first one (a clean cut
        # into groups, proxy/cleaner/split.py)
        self._committed_seen = set(seen[0])  # producers with a committed batch read
        self._aborted_seen = set(seen[1])  # producers with an aborted batch read

    def seen(self) -> TransactionsSeen:
        """The state so far: (producers with a committed batch read, with an aborted one)."""
        return tuple(sorted(self._committed_seen)), tuple(sorted(self._aborted_seen))

    def on_batch(self, header: BatchHeader) -> bool:
        """A data batch read: True when it may go (its transaction was aborted)."""
        if not header.is_transactional:
            return False
        if header.base_offset in self._aborted:
            self._aborted_seen.add(header.producer_id)
            return True
        self._committed_seen.add(header.producer_id)
        return False

    def on_marker(self, header: BatchHeader, batch: memoryview) -> bool:
        """A control batch read: True when the marker may go (after its horizon)."""
        if header.record_count == 0:
            return True  # an empty control batch a clean left: nothing to keep
        try:
            kind = marker_type(batch)
        except (ControlRecordError, IndexError):
            return False
        pid = header.producer_id
        if kind == ABORT:
            if pid in self._aborted_seen:
                self._aborted_seen.discard(pid)
                return False
            return True
        if kind == COMMIT:
            if pid in self._committed_seen:
                self._committed_seen.discard(pid)
                return False
            return True
        return False
