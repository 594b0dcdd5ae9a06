"""Planning an offload: which offset ranges become which stream objects (docs/offload.md).

The driver cuts each partition's backfill gaps into tasks (`plan_tasks`, at segment
boundaries when the source is segment files). A task cuts its batches into objects of
about `target_bytes` at batch boundaries (`cut_objects`) and builds each as a stream
object (`build_stream_object`) whose id is `offload_object_id(stream, start, end)`: the
same range gives the same key on every run, so a task that runs again finds its own
object (`object_write.py` never replaces it) and never leaves two copies of a range.

Pure: no I/O, no asyncio; runs inside Spark tasks.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

from offload_jobs.sources import SourceBatch
from proxy.metadata.streams import offload_object_id
from proxy.objects.format import (
    DEFAULT_MAX_BLOCK_BYTES,
    FORMAT_VERSION,
    BuiltObject,
    ObjectWriter,
)
from proxy.objects.keys import ObjectKind
from proxy.records.batches import CorruptBatchError, read_batch_header, validate_batch

TARGET_OBJECT_BYTES = 64 * 1024 * 1024


class MissingOffsets(ValueError):
    """The source does not hold offsets a range needs (deleted by retention since the
    cutover, or a copy of the log older than the cutover)."""


@dataclass(frozen=True, slots=True)
class OffloadTask:
    """Offsets [start_offset, end_offset) of one partition, read and written by one task."""

    partition: int
    stream_id: int
    start_offset: int
    end_offset: int


@dataclass(frozen=True, slots=True)
class ObjectPlan:
    """One stream object: offsets [start_offset, end_offset) from `batches`."""

    stream_id: int
    start_offset: int
    end_offset: int
    batches: tuple[SourceBatch, ...]

    @property
    def object_id(self) -> int:
        return offload_object_id(self.stream_id, self.start_offset, self.end_offset)

    @property
    def size(self) -> int:
        return sum(len(b.data) for b in self.batches)

    @property
    def record_count(self) -> int:
        return sum(read_batch_header(b.data).record_count for b in self.batches)


def plan_tasks(
    partition: int,
    stream: int,
    gaps: Iterable[tuple[int, int]],
    segment_bases: Sequence[int] = (),
) -> list[OffloadTask]:
    """One task per gap, cut again where a segment starts (a segment is read by one task;
    its base offset is a batch boundary)."""
    tasks = []
    for start, end in gaps:
        if not 0 <= start < end:
            raise ValueError(f"partition {partition}: gap [{start}, {end}) is empty or negative")
        cuts = [base for base in segment_bases if start < base < end]
        for a, b in zip([start, *cuts], [*cuts, end], strict=True):
            tasks.append(OffloadTask(partition, stream, a, b))
    return tasks


def cut_objects(
    stream: int,
    start: int,
    end: int,
    batches: Iterable[SourceBatch],
    *,
    target_bytes: int = TARGET_OBJECT_BYTES,
    where: str = "",
    require_start: bool = True,
    require_end: bool = True,
) -> Iterator[ObjectPlan]:
    """The objects holding [start, end) of `stream`, each about `target_bytes` (a batch is
    never split; a larger one gets an object of its own), cut where a batch starts.

    `batches` are those holding an offset in [start, end), in offset order. The first
    object starts at `start` and the last ends at `end`, whatever batch boundary is nearby:
    Kafka's log start may fall inside a batch, a batch may run past a range that is
    committed already (the object holds it whole; its commit names [start, end) only), and
    compaction may have removed the offsets around a boundary. Raises MissingOffsets when
    the first batch starts after `start` (`require_start`) or the last ends before `end`
    (`require_end`): the caller says when offsets there cannot have been compacted away.
    `where` names the source in errors."""
    if target_bytes < 1:
        raise ValueError(f"target_bytes {target_bytes}: must be positive")
    pending: list[SourceBatch] = []
    pending_bytes, object_start, next_offset = 0, start, start
    for batch in batches:
        if batch.last_offset < next_offset or batch.base_offset >= end:
            raise ValueError(
                f"{where}: batch [{batch.base_offset}, {batch.last_offset}] is out of order "
                f"or outside [{start}, {end}) (next offset {next_offset})"
            )
        first = not pending and object_start == start
        if first and require_start and batch.base_offset > start:
            raise MissingOffsets(
                f"{where}: offsets [{start}, {batch.base_offset}) of stream {stream} are not in "
                "the source"
            )
        if pending and pending_bytes + len(batch.data) > target_bytes:
            yield ObjectPlan(stream, object_start, batch.base_offset, tuple(pending))
            pending, pending_bytes, object_start = [], 0, batch.base_offset
        pending.append(batch)
        pending_bytes += len(batch.data)
        next_offset = batch.last_offset + 1
    if not pending or (require_end and next_offset < end):
        raise MissingOffsets(
            f"{where}: offsets [{next_offset}, {end}) of stream {stream} are not in the source"
        )
    yield ObjectPlan(stream, object_start, end, tuple(pending))


def build_stream_object(
    plan: ObjectPlan,
    *,
    max_block_bytes: int = DEFAULT_MAX_BLOCK_BYTES,
    version: int = FORMAT_VERSION,
) -> BuiltObject:
    """The stream object of a plan: its batches stored verbatim (each checked: magic,
    length, CRC-32C) in blocks of at most `max_block_bytes` (a larger batch gets a block of
    its own). The blocks cover the plan's whole range: the first starts at the range's
    start or its first batch's base offset, whichever is lower, the last ends at the
    range's end or past its last batch, whichever is higher; offsets compaction removed
    stay inside blocks, so a read of one finds the next batch. One copy: a block's
    batches are joined into one buffer. `version`: the object format version written
    (tiering.object_format_version)."""
    writer = ObjectWriter(plan.object_id, ObjectKind.STREAM, version=version)
    block: list[SourceBatch] = []
    block_bytes, block_start, records = 0, min(plan.start_offset, plan.batches[0].base_offset), 0

    def add(end_offset: int) -> None:
        data = b"".join(b.data for b in block)
        writer.add_block(plan.stream_id, data, block_start, end_offset, records)

    for batch in plan.batches:
        try:
            header = validate_batch(batch.data)
        except CorruptBatchError as exc:
            where = f"stream {plan.stream_id}: the batch at offset {batch.base_offset}"
            raise ValueError(f"{where}: {exc.what}") from None
        if block and block_bytes + len(batch.data) > max_block_bytes:
            add(batch.base_offset)
            block, block_bytes, block_start, records = [], 0, batch.base_offset, 0
        block.append(batch)
        block_bytes += len(batch.data)
        records += header.record_count
    add(max(plan.end_offset, plan.batches[-1].last_offset + 1))
    return writer.build()
