"""What the orphan sweep deletes, and when a PUT is too old to commit (docs/reliability.md,
"Orphans"; docs/object-store.md, "Garbage no metadata names"). Pure: no I/O.

Two kinds of garbage no shard's metadata names:

- **Orphan objects**: a stream set or stream object PUT by the upload path, compaction or
  an offload job, whose writer died before its ObjectCommit. Deleted once no shard names
  it (committed, or garbage not yet collected) and its PUT is older than a grace. The
  race with a commit still coming is closed on the committing side: nothing commits an
  object whose PUT is older than `commit_age_limit(grace)` (half the grace); it uploads
  the data again instead. So by the time an unnamed object is past the grace, its commit
  either was written long before (and the sweep, reading every shard to its end after
  listing, sees it) or never will be.
- **S3-WAL objects** (`wal/...`) left behind: their writer deletes them once every append
  in them is answered by its owner (s3walgc.py); what a writer that died left is deleted
  once older than `s3wal_retention_s`, far above the longest notification.

An offload job's object (id with the top bit set) takes the longer `offload_grace_s`: a
Spark job may PUT long before the driver commits. Keys of neither layout are never
touched (the bucket may hold other things).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from proxy.handoff.objects import KEY_ROOT, parse_wal_object_key
from proxy.metadata.streams import OFFLOAD_ID_BIT
from proxy.objects.keys import parse_object_key
from proxy.objects.store import ObjectInfo

# A committing writer stops at this fraction of the grace: the rest covers the commit's
# own write (a Kafka transaction, seconds even through a broker restart) and clock skew
# between the writer and the store, which stamps LastModified.
COMMIT_FRACTION = 0.5
_WAL_PREFIX = KEY_ROOT + "/"
# An S3-WAL object of a writer still running is left to it this long (its releases: an
# owner's reference to a batch in it, fetched in ms normally, kept through owner outages)
LIVE_WRITER_RETENTION_S = 7 * 86400.0


def commit_age_limit(grace_s: float) -> float:
    """How old (seconds since its PUT started) an object may be when its commit is written."""
    return grace_s * COMMIT_FRACTION


def too_old_to_commit(put_started: float, now: float, grace_s: float) -> bool:
    """Whether an object whose PUT started at `put_started` must not be committed at `now`
    (same clock): the sweep could judge it an orphan before the commit is read."""
    return now - put_started > commit_age_limit(grace_s)


@dataclass(frozen=True, slots=True)
class SweepLimits:
    """Ages (seconds) past which unnamed keys go. Errors name the config key."""

    orphan_grace_s: float
    offload_grace_s: float
    s3wal_retention_s: float

    def __post_init__(self) -> None:
        for name in ("orphan_grace_s", "offload_grace_s", "s3wal_retention_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
                raise ValueError(f"tiering.{name}: {value!r} is not a positive number of seconds")


@dataclass(frozen=True, slots=True)
class SweepPlan:
    orphans: tuple[ObjectInfo, ...]  # upload path and compaction objects
    offload_orphans: tuple[ObjectInfo, ...]  # offload jobs' objects (deterministic keys)
    s3wal: tuple[ObjectInfo, ...]
    young: int  # unnamed keys not old enough yet
    named: int  # keys some shard names
    foreign: int  # keys of neither layout, or with no modification time: left alone

    @property
    def count(self) -> int:
        return len(self.orphans) + len(self.offload_orphans) + len(self.s3wal)


def plan_sweep(
    listed: Iterable[ObjectInfo],
    named: Callable[[int], bool],
    listed_at: float,
    limits: SweepLimits,
    live_writer: Callable[[str], bool] | None = None,
) -> SweepPlan:
    """Sort a listing taken from `listed_at` (seconds since the epoch, taken before the
    listing started, so every age is counted short) into what to delete and what stays.
    `named(object_id)`: whether some shard's metadata names the object. `live_writer(id)`:
    whether an S3-WAL writer still runs; its objects are its own to delete (an owner may
    hold a batch of one by reference, docs/wal.md) until LIVE_WRITER_RETENTION_S."""
    orphans: list[ObjectInfo] = []
    offload: list[ObjectInfo] = []
    s3wal: list[ObjectInfo] = []
    young = known = foreign = 0
    for info in listed:
        if info.last_modified is None:
            foreign += 1
            continue
        age = listed_at - info.last_modified
        if info.key.startswith(_WAL_PREFIX):
            try:
                writer, _ = parse_wal_object_key(info.key)
            except ValueError:
                foreign += 1
                continue
            if live_writer is not None and age < LIVE_WRITER_RETENTION_S and live_writer(writer):
                young += 1
            elif age >= limits.s3wal_retention_s:
                s3wal.append(info)
            else:
                young += 1
            continue
        try:
            object_id, _kind = parse_object_key(info.key)
        except ValueError:
            foreign += 1
            continue
        if named(object_id):
            known += 1
        elif object_id & OFFLOAD_ID_BIT:
            if age >= limits.offload_grace_s:
                offload.append(info)
            else:
                young += 1
        elif age >= limits.orphan_grace_s:
            orphans.append(info)
        else:
            young += 1
    return SweepPlan(tuple(orphans), tuple(offload), tuple(s3wal), young, known, foreign)


def still_old(first: ObjectInfo, again: ObjectInfo | None) -> bool:
    """Whether an offload orphan listed again just before its delete is the same PUT: a
    job run again writes the very same key, and that new object is not an orphan."""
    return (
        again is not None
        and again.last_modified is not None
        and first.last_modified is not None
        and again.last_modified <= first.last_modified
    )
