"""Kafka's batches against the objects' batches, per partition: the verification report.

A copy is verified batch by batch: the same base and last offsets, the same record count
and the same CRC-32C (the CRC covers everything after the base offset, records included,
so equal CRCs of batches whose CRCs were checked mean equal bytes for every field a
consumer sees). The objects may hold more than Kafka still does (retention); over the
range compared every Kafka batch must be in the objects and nothing else may be. A run
of consecutive batches only one side holds is one mismatch, at its first offset.

Pure: no I/O, no asyncio; the verify job runs it inside Spark tasks.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import NamedTuple

from proxy.records.batches import read_batch_header

MAX_LISTED = 20  # mismatches named per partition; all of them are counted


class BatchSummary(NamedTuple):
    base_offset: int
    last_offset: int
    record_count: int
    crc: int
    size: int


def summarize(batch: memoryview | bytes) -> BatchSummary:
    """The summary of one whole batch, from its header (the caller checked its CRC)."""
    h = read_batch_header(batch)
    return BatchSummary(h.base_offset, h.last_offset, h.record_count, h.crc, h.size)


@dataclass(frozen=True, slots=True)
class Mismatch:
    offset: int
    what: str


@dataclass(frozen=True)
class PartitionReport:
    topic: str
    partition: int
    start: int  # the range compared: [start, end)
    end: int
    kafka_batches: int = 0
    kafka_records: int = 0
    kafka_bytes: int = 0
    object_batches: int = 0
    object_records: int = 0
    mismatch_count: int = 0
    mismatches: tuple[Mismatch, ...] = ()  # the first MAX_LISTED
    error: str | None = None  # a side could not be read at all (it says where)

    @property
    def ok(self) -> bool:
        return self.mismatch_count == 0 and self.error is None


def compare(
    topic: str,
    partition: int,
    start: int,
    end: int,
    kafka: Sequence[BatchSummary],
    objects: Sequence[BatchSummary],
    problems: Iterable[Mismatch] = (),
) -> PartitionReport:
    """Both sides over [start, end), as batches overlapping it; `problems` are mismatches
    found while reading the objects (a corrupt batch, a missing object)."""
    kafka = [b for b in kafka if b.last_offset >= start and b.base_offset < end]
    objects = [b for b in objects if b.last_offset >= start and b.base_offset < end]
    found = list(problems)
    only_kafka: list[BatchSummary] = []  # the run of batches missing from the objects
    only_objects: list[BatchSummary] = []
    k = o = 0
    while k < len(kafka) or o < len(objects):
        ours = kafka[k] if k < len(kafka) else None
        theirs = objects[o] if o < len(objects) else None
        if theirs is None or (ours is not None and ours.base_offset < theirs.base_offset):
            assert ours is not None
            _flush(only_objects, "in the objects, not in Kafka", found)
            only_kafka.append(ours)
            k += 1
            continue
        _flush(only_kafka, "in Kafka, not in the objects", found)
        if ours is None or theirs.base_offset < ours.base_offset:
            only_objects.append(theirs)
            o += 1
            continue
        _flush(only_objects, "in the objects, not in Kafka", found)
        if ours != theirs:
            what = f"Kafka has {_describe(ours)}, the objects {_describe(theirs)}"
            found.append(Mismatch(ours.base_offset, what))
        k += 1
        o += 1
    _flush(only_kafka, "in Kafka, not in the objects", found)
    _flush(only_objects, "in the objects, not in Kafka", found)
    found.sort(key=lambda m: m.offset)
    return PartitionReport(
        topic,
        partition,
        start,
        end,
        kafka_batches=len(kafka),
        kafka_records=sum(b.record_count for b in kafka),
        kafka_bytes=sum(b.size for b in kafka),
        object_batches=len(objects),
        object_records=sum(b.record_count for b in objects),
        mismatch_count=len(found),
        mismatches=tuple(found[:MAX_LISTED]),
    )


def _flush(run: list[BatchSummary], where: str, found: list[Mismatch]) -> None:
    """One mismatch for a run of consecutive batches only one side holds (a range no
    object holds reads as one line, not one per batch)."""
    if len(run) == 1:
        found.append(Mismatch(run[0].base_offset, f"{_describe(run[0])} is {where}"))
    elif run:
        records = sum(b.record_count for b in run)
        found.append(
            Mismatch(
                run[0].base_offset,
                f"batches [{run[0].base_offset}, {run[-1].last_offset}] ({len(run)} batches, "
                f"{records} records) are {where}",
            )
        )
    run.clear()


def _describe(b: BatchSummary) -> str:
    return (
        f"batch [{b.base_offset}, {b.last_offset}] ({b.record_count} records, "
        f"CRC {b.crc:#010x}, {b.size} bytes)"
    )


@dataclass(frozen=True)
class VerifyReport:
    topic: str
    partitions: tuple[PartitionReport, ...]
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return all(p.ok for p in self.partitions)

    def to_json(self) -> str:
        document = {"topic": self.topic, "ok": self.ok, "seconds": round(self.seconds, 3)}
        document["partitions"] = [asdict(p) | {"ok": p.ok} for p in self.partitions]
        return json.dumps(document, indent=2)

    def line(self) -> str:
        """The summary: what was compared, how long it took, the verdict."""
        mib = sum(p.kafka_bytes for p in self.partitions) / (1 << 20)
        batches = sum(p.kafka_batches for p in self.partitions)
        records = sum(p.kafka_records for p in self.partitions)
        verdict = "OK" if self.ok else "FAILED"
        if self.ok and not any(p.end > p.start for p in self.partitions):
            return (
                f"verified {self.topic}: nothing was compared: Kafka holds no offsets below "
                "the cutover of any tiered partition (its copy dropped by retention or "
                "deleted?), so there is no second copy to check the objects against"
            )
        rate = mib / self.seconds if self.seconds > 0 else 0.0
        return (
            f"verified {self.topic}: {mib:.1f} MiB, {batches} batches, {records} records "
            f"in {self.seconds:.1f} s ({rate:.1f} MiB/s): {verdict}"
        )

    def table(self) -> str:
        """A table a person signs off: one line per partition, then every mismatch."""
        rows = [("partition", "range", "kafka batches", "records", "bytes", "objects", "verdict")]
        for p in self.partitions:
            verdict = "OK" if p.ok else ("ERROR" if p.error else f"{p.mismatch_count} MISMATCH")
            if p.ok and p.end <= p.start:
                verdict = "NOTHING TO COMPARE"
            rows.append(
                (
                    str(p.partition),
                    f"[{p.start}, {p.end})",
                    str(p.kafka_batches),
                    str(p.kafka_records),
                    str(p.kafka_bytes),
                    f"{p.object_batches} / {p.object_records}",
                    verdict,
                )
            )
        widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
        lines = [f"verification of {self.topic}: {'OK' if self.ok else 'FAILED'}"]
        lines += [
            "  ".join(cell.rjust(w) for cell, w in zip(row, widths, strict=True)) for row in rows
        ]
        for p in self.partitions:
            if p.error:
                lines.append(f"{self.topic}-{p.partition}: {p.error}")
            for m in p.mismatches:
                lines.append(f"{self.topic}-{p.partition} offset {m.offset}: {m.what}")
            if p.mismatch_count > len(p.mismatches):
                lines.append(
                    f"{self.topic}-{p.partition}: {p.mismatch_count - len(p.mismatches)} more"
                )
        return "\n".join(lines)
