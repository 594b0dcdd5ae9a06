"""The S3 write-ahead log's objects: keys, and what recovery keeps (docs/wal.md,
"S3 durability mode"). Pure: no I/O, no asyncio.

The owner's WAL in `wal.mode: s3` is a logical log like the local one (WAL offsets are
byte positions that only grow), cut into objects instead of segment files. One object
holds one group commit: a contiguous run [start, end) of entries framed as in
`proxy.wal.entry` (per-entry CRC), under

    walog/<proxy name>/<start, 20 digits>

not under `wal/`, which holds the notify path's S3-WAL objects and which the orphan sweep
deletes by age; the sweep leaves keys of neither of its layouts alone (orphan_plan.py).

Why recovery can tell the log from leftovers by the listing alone: the writer has at most
one PUT in flight and stops at the first failed one, so no object is ever PUT after one
that is missing. Gaps come only from trims: a trim deletes objects wholly below the trim
point, and a batched delete interrupted halfway may leave any of those behind. Every such
leftover lies below the last trim point, and everything above it is one contiguous run
(nothing above is ever deleted). So the log is the listing's last contiguous run; objects
before its last gap are leftovers of a trim and may go. A failed PUT leaves nothing (a PUT
is all or nothing) or a whole object at the very end, which was never acknowledged and is
replayed like an entry a failed fsync left on a local disk.

Late PUTs (docs/wal.md): objects are created exclusively and the newest is never trimmed,
so the log's end never goes back and a late PUT of a killed process lands at the key
the log writes next (the log's tail, replayed, unacknowledged) or, very late, at a key
whose object the restarted log has trimmed since: below the log, where it leaves a gap or
overlaps the next object, a leftover too, never replayed.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from proxy.objects.store import ObjectInfo
from proxy.wal.entry import classify_stop, read_entries
from proxy.wal.segments import Segment
from proxy.wal.types import WalCorruptError, WalEntry, WalPosition

KEY_ROOT = "walog"
_START_DIGITS = 20
_NAME_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")
_KEY_TAIL = re.compile(r"\d{20}")


def log_prefix(proxy_name: str) -> str:
    """The key prefix (ending in `/`) of this proxy's objects. The name must be stable
    across restarts: a proxy started again on another machine finds its log by it."""
    if not proxy_name:
        raise ValueError("the S3 WAL needs the proxy's name (fleet.name): it is empty")
    safe = _NAME_UNSAFE.sub("_", proxy_name)
    if safe.startswith("."):  # object keys may not have a segment starting with '.'
        safe = "_" + safe
    return f"{KEY_ROOT}/{safe}/"


def object_key(prefix: str, start: int) -> str:
    if start < 0:
        raise ValueError(f"WAL offset {start} is negative")
    return f"{prefix}{start:0{_START_DIGITS}d}"


def parse_object_start(prefix: str, key: str) -> int | None:
    """The start offset `key` names, or None if it is not one of this log's keys."""
    if not key.startswith(prefix):
        return None
    tail = key[len(prefix) :]
    return int(tail) if _KEY_TAIL.fullmatch(tail) else None


@dataclass(frozen=True, slots=True)
class RecoveryPlan:
    """What a listing says: the log's objects in order, and the leftovers to delete. Each
    object is a `Segment` whose `path` is its key: the uploader treats both logs alike."""

    objects: tuple[Segment, ...]
    leftovers: tuple[Segment, ...]  # below the log's last gap: a trim's unfinished work
    foreign: tuple[str, ...]  # keys under the prefix that are not the log's: left alone

    @property
    def start(self) -> int:
        return self.objects[0].base if self.objects else 0

    @property
    def end(self) -> int:
        return self.objects[-1].end if self.objects else 0


def plan_recovery(prefix: str, listed: Iterable[ObjectInfo]) -> RecoveryPlan:
    """Split a listing of `prefix` into the log (its last contiguous run: each object
    starting where the one before ends) and leftovers (before its last gap or overlap).
    Empty objects are never written, so one is damage: WalCorruptError naming it."""
    objects: list[Segment] = []
    foreign: list[str] = []
    for info in listed:
        start = parse_object_start(prefix, info.key)
        if start is None:
            foreign.append(info.key)
            continue
        if info.size <= 0:
            raise WalCorruptError(f"S3 WAL object {info.key} is empty; the WAL never writes one")
        objects.append(Segment(info.key, start, info.size))
    objects.sort(key=lambda o: o.base)
    first = 0
    for i in range(1, len(objects)):
        if objects[i].base != objects[i - 1].end:  # a trim's leftover, or a late PUT's
            first = i
    return RecoveryPlan(tuple(objects[first:]), tuple(objects[:first]), tuple(foreign))


def decode_object(obj: Segment, data: bytes | memoryview) -> list[WalEntry]:
    """The entries of one object read back, each at its WAL position. Every byte must be a
    whole, valid entry: a PUT is all or nothing, so anything else is damage, reported
    with the key and the byte position."""
    if len(data) != obj.size:
        raise WalCorruptError(
            f"S3 WAL object {obj.path} holds {len(data)} bytes; the listing said {obj.size}"
        )
    decoded, valid = read_entries(data)
    if valid != len(data):
        stop = classify_stop(data, valid)
        raise WalCorruptError(
            f"S3 WAL object {obj.path}: {stop.value} entry at byte {valid} "
            f"(WAL offset {obj.base + valid}); entries before it are whole"
        )
    return [
        WalEntry(
            WalPosition(obj.base + e.offset, obj.base + e.offset + e.size),
            e.stream_id,
            e.base_offset,
            e.batch,
            e.reference,
        )
        for e in decoded
    ]
