"""Compaction planning: which committed ranges of one shard are rewritten, into what
(docs/tiering.md, "Compaction").

The upload path writes many small stream set objects, each holding a little of many
streams. Compaction rewrites the ranges small stream set objects hold in one shard into
stream objects, one stream each, a stream's consecutive ranges merged; each new object is
committed with `replaces` naming the objects whose ranges it takes over
(docs/metadata.md, "replacement"). A plan takes over *every* live range of this shard in
the objects it replaces, so each ends with no range here (`garbage_objects`), and the
shard's object count drops.

The metadata rules judge each shard alone: an object spanning shards has one commit per
shard, and a shard's commit may replace that object's ranges of this shard only. So a
shard's owner compacts its own part; the object is deleted from the store once it holds
no range in any shard that names it (the compactor's job, not this module's).

Rules, in order:

1. **Sources**: stream set objects holding a range of this shard whose object is below
   `small_object_bytes`, oldest commit first, up to `max_pass_bytes`; none when fewer than
   `min_objects` qualify.
2. Per stream, its ranges in offset order are cut into runs of consecutive ranges
   (each starting where the previous ends) that are each a source's range, or a *small*
   stream object's (below `small_object_bytes`). Any other range ends a run.
3. A run's source ranges, consecutive, become new objects of at most
   `stream_object_bytes` (a single range larger than that gets one of its own).
4. A new object takes in a neighbouring small stream object of the run when that one is
   no larger than what the new object holds so far and both fit `stream_object_bytes`.
   A stream object is so rewritten only when at least as many new bytes join it, which
   bounds how often a byte is rewritten (about log2 of the target size over the upload
   size) for a stream that gets a little data at every pass.
5. A plan that would not leave the shard with fewer objects is not made.

Pure: no I/O, no asyncio.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields

from proxy.metadata.state import MetadataState
from proxy.metadata.streams import StreamRange
from proxy.objects.format import FORMAT_VERSION, READ_VERSIONS, IndexEntry
from proxy.objects.format_writer import ObjectWriter
from proxy.objects.index_read import stream_blocks
from proxy.objects.keys import ObjectKind

MiB = 1 << 20


@dataclass(frozen=True, slots=True)
class CompactionSettings:
    """What a pass may rewrite. Errors name the field."""

    small_object_bytes: int = 32 * MiB  # objects below this are rewritten
    stream_object_bytes: int = 64 * MiB  # the stream objects written are at most this
    min_objects: int = 8  # fewer small stream set objects in the shard: nothing to do
    trigger_objects: int = 1000  # a shard with this many objects is compacted at once
    max_pass_bytes: int = 1024 * MiB  # source objects' bytes one pass takes at most
    max_block_bytes: int = 1 * MiB  # adjacent small blocks are joined up to this
    format_version: int = FORMAT_VERSION  # of the objects written (docs/operations.md)

    def __post_init__(self) -> None:
        for spec in fields(self):
            value = getattr(self, spec.name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"compaction setting {spec.name}: {value!r} is not positive")
        if self.format_version not in READ_VERSIONS:
            raise ValueError(
                f"compaction setting format_version: {self.format_version} is not one of "
                f"{READ_VERSIONS}"
            )
        if self.min_objects < 2:
            raise ValueError(f"compaction setting min_objects: {self.min_objects} is below 2")
        if self.stream_object_bytes < self.small_object_bytes:
            raise ValueError(
                f"compaction setting stream_object_bytes: {self.stream_object_bytes} is below "
                f"small_object_bytes ({self.small_object_bytes})"
            )


@dataclass(frozen=True, slots=True)
class NewObject:
    """A stream object to write: the stream's consecutive `sources`, copied in order."""

    stream_id: int
    sources: tuple[StreamRange, ...]
    data_bytes: int

    @property
    def start_offset(self) -> int:
        return self.sources[0].start_offset

    @property
    def end_offset(self) -> int:
        return self.sources[-1].end_offset

    @property
    def replaces(self) -> tuple[int, ...]:
        """The objects whose ranges it takes over: its commit's `replaces`."""
        return tuple(sorted({r.object_id for r in self.sources}))


@dataclass(frozen=True, slots=True)
class CompactionPlan:
    """New objects for one shard, committed together; afterwards every object in
    `replaces` holds no range of the shard."""

    shard: int
    objects: tuple[NewObject, ...]
    replaces: tuple[int, ...]

    @property
    def data_bytes(self) -> int:
        return sum(o.data_bytes for o in self.objects)


def live_objects(state: MetadataState) -> dict[int, StreamRange]:
    """Each object holding a live range of the shard, with one of its ranges (which
    carries the object's kind and size)."""
    found: dict[int, StreamRange] = {}
    for stream in state.stream_ids():
        for r in state.committed_ranges(stream):
            found.setdefault(r.object_id, r)
    return found


def object_stats(state: MetadataState) -> tuple[int, float]:
    """(objects holding a live range of the shard, their average size in bytes)."""
    sizes = [r.object_size for r in live_objects(state).values()]
    return len(sizes), (sum(sizes) / len(sizes) if sizes else 0.0)


def pick_sources(state: MetadataState, settings: CompactionSettings) -> list[int]:
    """Rule 1: the stream set objects a pass takes, oldest commit first."""
    small = []
    for number, r in live_objects(state).items():
        if r.object_kind is ObjectKind.STREAM_SET and r.object_size < settings.small_object_bytes:
            commit = state.object_commit(number)
            small.append((commit.committed_at_ms if commit else 0, number, r.object_size))
    small.sort()
    chosen: list[int] = []
    total = 0
    for _, number, size in small:
        if chosen and total + size > settings.max_pass_bytes:
            break
        chosen.append(number)
        total += size
    return chosen if len(chosen) >= settings.min_objects else []


def plan_compaction(
    state: MetadataState,
    settings: CompactionSettings,
    sources: Sequence[int],
    range_bytes: Callable[[StreamRange], int],
) -> CompactionPlan | None:
    """Rules 2-5 for the chosen `sources`. `range_bytes(r)` is the data bytes a source's
    range holds (from the object's index); a small stream object counts its size."""
    chosen = set(sources)
    objects: list[NewObject] = []
    replaced: set[int] = set(chosen)
    for stream in state.stream_ids():
        run: list[tuple[StreamRange, bool, int]] = []  # range, from a source, bytes
        for r in state.committed_ranges(stream):
            source = r.object_id in chosen
            small = (
                r.object_kind is ObjectKind.STREAM and r.object_size < settings.small_object_bytes
            )
            if run and (not (source or small) or r.start_offset != run[-1][0].end_offset):
                objects += _plan_run(stream, run, settings, replaced)
                run = []
            if source or small:
                run.append((r, source, range_bytes(r) if source else r.object_size))
        objects += _plan_run(stream, run, settings, replaced)
    if not objects or len(objects) >= len(replaced):
        return None
    return CompactionPlan(state.shard, tuple(objects), tuple(sorted(replaced)))


def _plan_run(
    stream: int,
    run: list[tuple[StreamRange, bool, int]],
    settings: CompactionSettings,
    replaced: set[int],
) -> list[NewObject]:
    target = settings.stream_object_bytes
    chunks: list[list[int]] = []  # indexes into run, consecutive
    for i, (_, source, size) in enumerate(run):
        if not source:
            continue
        last = chunks[-1] if chunks else None
        if last and last[-1] == i - 1 and sum(run[j][2] for j in last) + size <= target:
            last.append(i)
        else:
            chunks.append([i])
    taken = {i for chunk in chunks for i in chunk}
    planned = []
    for chunk in chunks:
        size = sum(run[j][2] for j in chunk)
        for step in (-1, 1):  # rule 4: take in small stream objects on either side
            i = chunk[0] - 1 if step < 0 else chunk[-1] + 1
            while 0 <= i < len(run) and i not in taken:
                neighbour = run[i][2]
                if neighbour > size or size + neighbour > target:
                    break
                taken.add(i)
                if step < 0:
                    chunk.insert(0, i)
                else:
                    chunk.append(i)
                replaced.add(run[i][0].object_id)
                size += neighbour
                i += step
        planned.append(NewObject(stream, tuple(run[j][0] for j in chunk), size))
    return planned


def blocks_for(index: Sequence[IndexEntry], r: StreamRange) -> tuple[IndexEntry, ...]:
    """The object's blocks holding exactly the range `r` of its stream; ValueError when
    they do not tile it (a range is always a stream's whole span in its object)."""
    return stream_blocks(index, r.stream_id, r.start_offset, r.end_offset, r.object_key)


def add_blocks(
    writer: ObjectWriter,
    stream: int,
    blocks: Sequence[tuple[int, int, int, memoryview]],
    max_block_bytes: int,
) -> None:
    """Add a stream's consecutive blocks (start, end, record count, bytes) to `writer`,
    joining adjacent ones up to `max_block_bytes`: a block is whole record batches, so
    blocks side by side are one block of those batches. The bytes are copied as they
    are; no batch is parsed."""
    pending: list[tuple[int, int, int, memoryview]] = []
    size = 0

    def flush() -> None:
        if pending:
            data = pending[0][3] if len(pending) == 1 else b"".join(p[3] for p in pending)
            count = sum(p[2] for p in pending)
            writer.add_block(stream, data, pending[0][0], pending[-1][1], count)
            pending.clear()

    for block in blocks:
        if pending and size + len(block[3]) > max_block_bytes:
            flush()
            size = 0
        pending.append(block)
        size += len(block[3])
    flush()
