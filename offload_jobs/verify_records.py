"""Kafka's copy of a compacted partition against the objects', record by record.

Two copies of a compacted log are not the same bytes for long: Kafka's cleaner cleans
Kafka's copy below the cutover, the proxy's cleaner the objects (docs/tiering.md,
"Compacted topics"), each on its own schedule, and a clean rewrites batches. What both
must still agree on is what a consumer of a compacted topic relies on:

1. **The latest value of every key** (read_committed: a transaction's records count once
   its COMMIT marker is read, an aborted one's never, an open one's not yet): the same
   offset and the same record (timestamp, key, value, headers) on both sides. A key whose
   latest record is a tombstone counts as absent, as it is once a cleaner dropped it.
2. **Every record both copies hold at the same offset is the same record.**

A record only one side holds is one the other side's cleaner removed: an older value of
its key, a tombstone past its horizon, an aborted record. It cannot be a key's latest
(rule 1 would find that), so it is not a mismatch. The range compared ends at the
cutover, but the objects' cleaner also saw the stream past it: a key written again past
the cutover may have lost its last value below it in the objects and not in Kafka, so
the objects' side is read on to the stream's end for its keys only, and rule 1 leaves
such keys out (rule 2 still compares the records both copies hold).

Memory per partition and side: one entry per key (its 16-byte digest, the offset and a
64-bit digest of its latest record) and 16 bytes per record (offset, digest) for rule 2.

Per-record work, on a Spark executor: the verify job's, never the proxy's. Pure: no I/O,
no asyncio.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Iterable
from dataclasses import dataclass, field

from offload_jobs.verify_compare import MAX_LISTED, Mismatch, PartitionReport
from proxy.cleaner.batch_codec import read_records
from proxy.cleaner.offset_map import digest as key_digest
from proxy.records.batches import read_batch_header
from proxy.records.transactions import ABORT, marker_type

Latest = tuple[int, int]  # the offset of a key's latest record, the record's digest


def record_digest(timestamp: int, tail: memoryview | bytes) -> int:
    """A 64-bit digest of what a consumer reads of a record: its timestamp and its bytes
    from the key on (key, value, headers)."""
    h = hashlib.blake2b(timestamp.to_bytes(8, "big", signed=True), digest_size=8)
    h.update(tail)
    return int.from_bytes(h.digest(), "big")


@dataclass(slots=True)
class SideSummary:
    """One copy of a partition over [start, end), read in offset order."""

    start: int
    end: int
    latest: dict[bytes, Latest | None] = field(default_factory=dict)  # None: a tombstone
    offsets: array = field(default_factory=lambda: array("q"))
    digests: array = field(default_factory=lambda: array("Q"))
    batches: int = 0
    records: int = 0
    size: int = 0  # of the batches read
    # digests of the keys with a record at `end` or past it: their older records below
    # `end` may be gone from one copy (its cleaner saw the later one), so rule 1 skips them
    later_keys: set[bytes] = field(default_factory=set)
    # producer id -> the (key digest, offset, digest or None) of its open transaction
    _open: dict[int, list[tuple[bytes, int, int | None]]] = field(default_factory=dict)

    def add(self, batch: memoryview | bytes) -> None:
        """One batch (its CRC checked by the reader), in offset order."""
        view = memoryview(batch)
        header = read_batch_header(view)
        if header.last_offset < self.start:
            return
        if header.base_offset >= self.end:
            if not header.is_control:
                self.later_keys.update(
                    key_digest(r.key) for r in read_records(header, view) if r.key is not None
                )
            return
        self.batches += 1
        self.size += header.size
        if header.is_control:
            pending = self._open.pop(header.producer_id, [])
            if marker_type(view) != ABORT:
                for key, offset, value in pending:
                    self._put(key, offset, value)
            return
        for record in read_records(header, view):
            offset = header.base_offset + record.offset_delta
            if offset >= self.end and record.key is not None:
                self.later_keys.add(key_digest(record.key))
            if not self.start <= offset < self.end:
                continue
            self.records += 1
            value = record_digest(record.timestamp, record.tail)
            self.offsets.append(offset)
            self.digests.append(value)
            if record.key is None:
                continue  # Kafka refuses them on a compacted topic; not a key's value
            entry = (key_digest(record.key), offset, value if record.has_value else None)
            if header.is_transactional:
                self._open.setdefault(header.producer_id, []).append(entry)
            else:
                self._put(*entry)

    def _put(self, key: bytes, offset: int, value: int | None) -> None:
        self.latest[key] = None if value is None else (offset, value)

    def live(self) -> dict[bytes, Latest]:
        """Key digest -> its latest record, tombstones left out (read_committed: open
        transactions are not counted)."""
        return {k: v for k, v in self.latest.items() if v is not None}


def compare_compacted(
    topic: str,
    partition: int,
    kafka: SideSummary,
    objects: SideSummary,
    problems: Iterable[Mismatch] = (),
) -> PartitionReport:
    """Rules 1 and 2 of the module's docstring, both sides read whole; `problems` are
    mismatches found while reading the objects (a corrupt batch, a missing object)."""
    found = list(problems)
    found += _same_records(kafka, objects)
    theirs, ours = kafka.live(), objects.live()
    for key in (theirs.keys() | ours.keys()) - kafka.later_keys - objects.later_keys:
        k, o = theirs.get(key), ours.get(key)
        if k != o and not (k is not None and o is not None and k[0] == o[0]):  # rule 2's
            found.append(Mismatch(_first(k, o), _latest_differs(k, o)))
    found.sort(key=lambda m: m.offset)
    return PartitionReport(
        topic,
        partition,
        kafka.start,
        kafka.end,
        kafka_batches=kafka.batches,
        kafka_records=kafka.records,
        kafka_bytes=kafka.size,
        object_batches=objects.batches,
        object_records=objects.records,
        mismatch_count=len(found),
        mismatches=tuple(found[:MAX_LISTED]),
    )


def _same_records(kafka: SideSummary, objects: SideSummary) -> list[Mismatch]:
    """Rule 2: a merge of both sides' records by offset (each side's in offset order)."""
    out: list[Mismatch] = []
    k, n = 0, len(kafka.offsets)
    for offset, value in zip(objects.offsets, objects.digests, strict=True):
        while k < n and kafka.offsets[k] < offset:
            k += 1
        if k < n and kafka.offsets[k] == offset and kafka.digests[k] != value:
            out.append(
                Mismatch(offset, "the record at this offset differs between Kafka and the objects")
            )
    return out


def _first(k: Latest | None, o: Latest | None) -> int:
    return min(x[0] for x in (k, o) if x is not None)


def _latest_differs(k: Latest | None, o: Latest | None) -> str:
    def side(x: Latest | None) -> str:
        return "no live value (none, or a tombstone)" if x is None else f"offset {x[0]}"

    return f"a key's latest record: Kafka has {side(k)}, the objects {side(o)}"
