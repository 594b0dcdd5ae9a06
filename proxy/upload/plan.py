"""Upload planning: which objects a run of WAL entries becomes (docs/uploader.md).

`plan_upload(entries, limits, committed_end)` decides; `build_object(plan, object_id)`
lays one planned object out with `ObjectWriter`. Pure: no I/O, no asyncio.

The rules, in order:

1. Entries of a stream below the stream's committed end are skipped: they were uploaded
   and committed before a crash that came ahead of the WAL trim.
2. A stream with more than `stream_object_threshold` bytes gets STREAM objects of up to
   `max_object_bytes` each; its last piece joins the stream set objects when it holds at
   most `stream_object_threshold` bytes.
3. Everything else is packed, in stream id order, into STREAM_SET objects of at most
   `max_object_bytes`, splitting a stream's run between two objects at an entry boundary
   when it does not fit. Every object but the last is therefore full, whatever the number
   of streams: one upload of T bytes makes about T / max_object_bytes objects.
4. Objects are listed in commit order: stream objects first (each stream's in offset
   order), then stream set objects, so each stream's ranges continue one another.

Sizes are exact: a plan's `size` is the size `build_object` produces (blocks are cut at
batch boundaries exactly as `ObjectWriter.add_batches` cuts them). Only an entry larger
than `max_object_bytes` on its own makes an object larger than that.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from proxy.metadata.records import OffsetRange
from proxy.metadata.streams import OFFLOAD_ID_BIT, shard_of
from proxy.objects.format import (
    FORMAT_VERSION,
    READ_VERSIONS,
    U32_MAX,
    layout_bytes,
)
from proxy.objects.format_writer import DEFAULT_MAX_BLOCK_BYTES, BuiltObject, ObjectWriter
from proxy.objects.keys import ObjectKind, object_key
from proxy.records.batches import iter_batches
from proxy.wal.types import WalEntry

MiB = 1 << 20


@dataclass(frozen=True, slots=True)
class PlanLimits:
    """How big objects and blocks get. The defaults keep one object to one PutObject
    (S3Store uploads objects above 16 MiB in parts, each part a billed request)."""

    max_object_bytes: int = 16 * MiB
    # a stream with more than this in one upload gets objects of its own
    stream_object_threshold: int = 16 * MiB
    max_block_bytes: int = DEFAULT_MAX_BLOCK_BYTES
    # the object format version written (tiering.object_format_version): 1 while proxies
    # of the release before version 2 may still read the objects (docs/operations.md)
    format_version: int = FORMAT_VERSION

    def __post_init__(self) -> None:
        for key in ("max_object_bytes", "stream_object_threshold", "max_block_bytes"):
            value = getattr(self, key)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"upload plan config error at {key}: {value!r} is not positive")
        if self.max_block_bytes > U32_MAX:
            raise ValueError(f"upload plan config error at max_block_bytes: above {U32_MAX}")
        if self.format_version not in READ_VERSIONS or isinstance(self.format_version, bool):
            raise ValueError(
                f"upload plan config error at format_version: {self.format_version!r} is not "
                f"one of {READ_VERSIONS}"
            )


@dataclass(frozen=True, slots=True)
class Run:
    """A stream's consecutive entries in one object: offsets [start_offset, end_offset)."""

    stream_id: int
    entries: tuple[WalEntry, ...]
    start_offset: int
    end_offset: int
    data_bytes: int
    blocks: int


@dataclass(frozen=True, slots=True)
class ObjectPlan:
    kind: ObjectKind
    runs: tuple[Run, ...]  # sorted by stream id
    size: int  # the built object's size in bytes
    max_block_bytes: int  # blocks are cut as `add_batches` cuts them with this limit
    format_version: int = FORMAT_VERSION

    @property
    def data_bytes(self) -> int:
        return sum(run.data_bytes for run in self.runs)


@dataclass(frozen=True, slots=True)
class UploadPlan:
    objects: tuple[ObjectPlan, ...]  # in commit order
    wal_end: int | None  # WAL offset after the last entry planned (None: no entries)
    entries: int  # entries planned, skipped ones included
    skipped_entries: int  # below their stream's committed end
    skipped_bytes: int

    @property
    def data_bytes(self) -> int:
        return sum(plan.data_bytes for plan in self.objects)


@dataclass(frozen=True, slots=True)
class UploadedObject:
    """An object in the store, ready to commit: what the commit callback receives. The
    owner writes one ObjectCommit per shard its ranges touch (`ranges_by_shard`)."""

    object_id: int
    kind: ObjectKind
    size: int
    ranges: tuple[OffsetRange, ...]  # sorted by stream id, one per stream
    # the uploader's clock past which this must not be committed (orphan_plan.py): the
    # orphan sweep may take it for an orphan from then on
    commit_by: float = field(default=float("inf"), compare=False)

    @property
    def key(self) -> str:
        return object_key(self.object_id, self.kind)

    def ranges_by_shard(self, shard_count: int) -> dict[int, tuple[OffsetRange, ...]]:
        shards: dict[int, list[OffsetRange]] = {}
        for r in self.ranges:
            shards.setdefault(shard_of(r.stream_id, shard_count), []).append(r)
        return {shard: tuple(ranges) for shard, ranges in sorted(shards.items())}


class ObjectIdAllocator:
    """Upload-path object ids: `writer << 32 | counter`, the top bit clear (ids with it set
    are the offload jobs'). `writer` (< 2**31) is drawn at random by each process, so two
    could draw the same one: objects are created exclusively (`ObjectStore.create`), and
    a create that meets an object under one of these ids calls `collided()`, which draws
    a new writer, and writes again under new ids (docs/object-store.md, "Exclusive
    creates"). Shared by the uploader and the compactor of one process."""

    COUNTER_BITS = 32
    WRITER_BITS = 63 - COUNTER_BITS

    def __init__(self, writer: int, first: int = 0, *, rng: random.Random | None = None) -> None:
        if not 0 <= writer < 1 << self.WRITER_BITS:
            raise ValueError(f"object id writer {writer} is not in [0, 2**31)")
        if not 0 <= first < 1 << self.COUNTER_BITS:
            raise ValueError(f"object id counter {first} is not in [0, 2**32)")
        self._rng = rng or random.Random()
        self.writer = writer
        self._next = first
        self.collisions = 0

    @classmethod
    def drawn(cls, rng: random.Random | None = None) -> ObjectIdAllocator:
        """An allocator with a writer drawn at random (a process's)."""
        rng = rng or random.Random()
        return cls(rng.getrandbits(cls.WRITER_BITS), rng=rng)

    def __call__(self) -> int:
        if self._next >= 1 << self.COUNTER_BITS:
            raise ValueError("object id counter exhausted: give the uploader a new writer id")
        self._next += 1
        return self.writer << self.COUNTER_BITS | (self._next - 1)

    def collided(self) -> None:
        """An id of this writer names another's object: another process drew the same
        writer. Draw a different one and count from 0 again."""
        old = self.writer
        while self.writer == old:
            self.writer = self._rng.getrandbits(self.WRITER_BITS)
        self._next = 0
        self.collisions += 1


def plan_upload(
    entries: Sequence[WalEntry],
    limits: PlanLimits | None = None,
    committed_end: Callable[[int], int | None] | None = None,
) -> UploadPlan:
    """The objects `entries` (in WAL order) become. `committed_end(stream)` is the offset
    the stream's committed data ends at (None: unknown); entries below it are skipped.
    Raises ValueError for entries a stream cannot hold: a batch that is not whole, a first
    batch whose base offset is not the entry's, offsets that do not follow on."""
    limits = limits or PlanLimits()
    ends: dict[int, int | None] = {}
    streams: dict[int, list[_Entry]] = {}
    skipped = skipped_bytes = 0
    for entry in entries:
        stream = entry.stream_id
        if stream not in ends:
            ends[stream] = committed_end(stream) if committed_end is not None else None
        end = ends[stream]
        if end is not None and entry.base_offset < end:
            skipped += 1
            skipped_bytes += len(entry.batch)
            continue
        scanned = _scan(entry)
        run = streams.setdefault(stream, [])
        if run and scanned.entry.base_offset != run[-1].end_offset:
            raise ValueError(
                f"stream {stream}: the entry at WAL offset {entry.position.start} starts at "
                f"offset {entry.base_offset}, the stream's previous entry ends at "
                f"{run[-1].end_offset}"
            )
        run.append(scanned)

    stream_objects: list[ObjectPlan] = []
    pool: dict[int, list[_Entry]] = {}
    for stream in sorted(streams):
        run = streams[stream]
        if sum(e.size for e in run) <= limits.stream_object_threshold:
            pool[stream] = run
            continue
        pieces = _pack(ObjectKind.STREAM, [(stream, run)], limits)
        if pieces[-1].data_bytes <= limits.stream_object_threshold:
            last = pieces.pop()
            pool[stream] = run[len(run) - len(last.runs[0].entries) :]
        stream_objects.extend(pieces)
    set_objects = _pack(ObjectKind.STREAM_SET, sorted(pool.items()), limits) if pool else []
    return UploadPlan(
        tuple(stream_objects + set_objects),
        entries[-1].position.end if entries else None,
        len(entries),
        skipped,
        skipped_bytes,
    )


def build_object(plan: ObjectPlan, object_id: int) -> tuple[BuiltObject, UploadedObject]:
    """Lay out a planned object. A run of several entries is copied into one buffer (its
    entries are not adjacent in the WAL); a run of one entry is not copied."""
    if not 0 <= object_id < OFFLOAD_ID_BIT:
        raise ValueError(f"object id {object_id}: upload path ids are in [0, 2**63)")
    writer = ObjectWriter(object_id, plan.kind, version=plan.format_version)
    ranges = []
    for run in plan.runs:
        data = run.entries[0].batch if len(run.entries) == 1 else _join(run.entries)
        # the WAL entry CRC covered these bytes and the sequencer validated the batches
        writer.add_batches(
            run.stream_id, data, max_block_bytes=plan.max_block_bytes, validate=False
        )
        ranges.append(OffsetRange(run.stream_id, run.start_offset, run.end_offset))
    built = writer.build()
    if built.size != plan.size:
        raise AssertionError(f"{built.key}: planned {plan.size} bytes, built {built.size}")
    return built, UploadedObject(object_id, plan.kind, built.size, tuple(ranges))


# -- internals -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Entry:
    entry: WalEntry
    batch_sizes: tuple[int, ...]
    end_offset: int  # the offset after the entry's last batch

    @property
    def size(self) -> int:
        return len(self.entry.batch)


def _scan(entry: WalEntry) -> _Entry:
    sizes: list[int] = []
    end = entry.base_offset
    where = f"stream {entry.stream_id}: the entry at WAL offset {entry.position.start}"
    for header, _ in iter_batches(entry.batch):
        if not sizes and header.base_offset != entry.base_offset:
            raise ValueError(
                f"{where} says base offset {entry.base_offset}, its batch {header.base_offset}"
            )
        if header.base_offset < end:
            raise ValueError(f"{where}: batch offsets go back to {header.base_offset}")
        sizes.append(header.size)
        end = header.next_offset
    if not sizes:
        raise ValueError(f"{where} holds no record batch")
    return _Entry(entry, tuple(sizes), end)


@dataclass(slots=True)
class _RunCost:
    """A run being planned, with `add_batches`' block cutting simulated batch by batch."""

    stream_id: int
    entries: list[_Entry] = field(default_factory=list)
    data: int = 0
    blocks: int = 0
    block_bytes: int = 0  # bytes in the run's last block so far

    def grown_by(self, entry: _Entry, max_block: int, entry_size: int) -> tuple[int, int, int]:
        """(bytes the object grows by, blocks, bytes in the last block) if `entry` joins."""
        blocks, block_bytes = self.blocks, self.block_bytes
        for size in entry.batch_sizes:
            if block_bytes and block_bytes + size > max_block:
                blocks, block_bytes = blocks + 1, size
            else:
                blocks, block_bytes = max(blocks, 1), block_bytes + size
        return entry.size + (blocks - self.blocks) * entry_size, blocks, block_bytes

    def add(self, entry: _Entry, blocks: int, block_bytes: int) -> None:
        self.blocks, self.block_bytes = blocks, block_bytes
        self.data += entry.size
        self.entries.append(entry)

    def run(self) -> Run:
        start, end = self.entries[0].entry.base_offset, self.entries[-1].end_offset
        entries = tuple(e.entry for e in self.entries)
        return Run(self.stream_id, entries, start, end, self.data, self.blocks)


def _pack(
    kind: ObjectKind, streams: Sequence[tuple[int, list[_Entry]]], limits: PlanLimits
) -> list[ObjectPlan]:
    """Next fit: fill an object entry by entry, start the next one when an entry does not
    fit. A stream's run may so end in one object and go on in the next."""
    objects: list[ObjectPlan] = []
    runs: dict[int, _RunCost] = {}
    max_block, version = limits.max_block_bytes, limits.format_version
    fixed, entry_size = layout_bytes(version)
    size = fixed

    def close() -> None:
        plans = tuple(runs[stream].run() for stream in sorted(runs))
        objects.append(ObjectPlan(kind, plans, size, max_block, version))

    for stream, entries in streams:
        for entry in entries:
            run = runs.get(stream) or _RunCost(stream)
            cost, blocks, block_bytes = run.grown_by(entry, max_block, entry_size)
            if runs and size + cost > limits.max_object_bytes:
                close()
                runs, size = {}, fixed
                run = _RunCost(stream)
                cost, blocks, block_bytes = run.grown_by(entry, max_block, entry_size)
            run.add(entry, blocks, block_bytes)
            runs[stream] = run
            size += cost
    if runs:
        close()
    return objects


def _join(entries: Sequence[WalEntry]) -> bytearray:
    buffer = bytearray(sum(len(e.batch) for e in entries))
    position = 0
    for e in entries:
        buffer[position : position + len(e.batch)] = e.batch
        position += len(e.batch)
    return buffer
