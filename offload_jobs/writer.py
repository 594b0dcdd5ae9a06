"""Planning an offload: which offset ranges become which stream objects (docs/offload.md).

The driver cuts each partition's backfill gaps into tasks (`plan_tasks`, at segment
boundaries when the source is segment files). A task cuts its batches into objects of
about `target_bytes` at batch boundaries (`cut_objects`) and builds each as a stream
object (`build_stream_object`) whose id is `offload_object_id(stream, start, end)`: the
same range gives the same key on every run, so a task that runs again overwrites its own
object and never leaves two copies of a range.

Pure: no I/O, no asyncio; runs inside Spark tasks.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

from offload_jobs.sources import SourceBatch
from proxy.tiering.batches import read_batch_header
from proxy.tiering.metastreams import offload_object_id
from proxy.tiering.objectformat import DEFAULT_MAX_BLOCK_BYTES, BuiltObject, ObjectWriter
from proxy.tiering.objectkeys import ObjectKind

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
) -> Iterator[ObjectPlan]:
    """The objects holding [start, end) of `stream`, each about `target_bytes` (a batch is
    never split; a larger one gets an object of its own), cut where a batch starts.

    `batches` are those holding an offset in [start, end), in offset order. The first
    object starts at `start` and the last ends at `end`, whatever batch boundary is nearby:
    Kafka's log start may fall inside a batch, and a batch may run past a range that is
    committed already (the object holds it whole; its commit names [start, end) only).
    Raises MissingOffsets when the batches leave the start or the end of the range out;
    `where` names the source in that message."""
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
        if not pending and object_start == start and batch.base_offset > start:
            raise MissingOffsets(
                f"{where}: offsets [{start}, {batch.base_offset}) of stream {stream} are not in "
                "the source (deleted by retention, or compacted away)"
            )
        if pending and pending_bytes + len(batch.data) > target_bytes:
            yield ObjectPlan(stream, object_start, batch.base_offset, tuple(pending))
            pending, pending_bytes, object_start = [], 0, batch.base_offset
        pending.append(batch)
        pending_bytes += len(batch.data)
        next_offset = batch.last_offset + 1
    if next_offset < end:
        raise MissingOffsets(
            f"{where}: offsets [{next_offset}, {end}) of stream {stream} are not in the source"
        )
    yield ObjectPlan(stream, object_start, end, tuple(pending))


def build_stream_object(
    plan: ObjectPlan, *, max_block_bytes: int = DEFAULT_MAX_BLOCK_BYTES
) -> BuiltObject:
    """The stream object of a plan, batches stored verbatim and checked (magic, CRC).
    One copy: the batches are joined into one buffer, blocks are views of it."""
    writer = ObjectWriter(plan.object_id, ObjectKind.STREAM)
    first = plan.batches[0].base_offset
    records = b"".join(b.data for b in plan.batches)
    writer.add_batches(
        plan.stream_id,
        records,
        # a range starting inside the first batch is held by a block starting at the batch
        start_offset=plan.start_offset if first >= plan.start_offset else None,
        max_block_bytes=max_block_bytes,
    )
    return writer.build()
