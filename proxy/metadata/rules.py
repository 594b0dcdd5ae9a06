"""The rules of one shard's metadata: which record counts, and what it changes
(docs/metadata.md, "Rules").

`judge(view, record)` decides, `enact(view, record)` applies an accepted record. Readers of
a shard's partition run them on every record in partition order, so every reader of the
same records reaches the same state; the shard's owner runs `judge` before it writes, so
what it writes is what every reader accepts. Pure: no I/O, no asyncio, no clock.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from itertools import pairwise
from typing import Any

from proxy.metadata.records import (
    ObjectCommit,
    ObjectDelete,
    OffsetRange,
    ProducerSnapshot,
    Record,
    ShardClaim,
    ShardRelease,
    StreamCutover,
    StreamTrim,
    StreamUntier,
)
from proxy.metadata.streams import StreamRange, TieredStream, shard_of, stream_id


class Outcome(Enum):
    ACCEPT = "accept"  # the record counts; for a writer: write it
    NO_OP = "no-op"  # it is so already; for a writer: there is nothing to write
    REFUSE = "refuse"  # the record does not count: readers ignore it and report why


@dataclass(frozen=True, slots=True)
class Verdict:
    outcome: Outcome
    reason: str = ""

    @property
    def accepted(self) -> bool:
        return self.outcome is Outcome.ACCEPT


ACCEPT = Verdict(Outcome.ACCEPT)


def refuse(reason: str) -> Verdict:
    return Verdict(Outcome.REFUSE, reason)


def no_op(reason: str) -> Verdict:
    return Verdict(Outcome.NO_OP, reason)


@dataclass(slots=True)
class KnownObject:
    """An object the shard's records name; `live` holds its ranges still in use, by stream.
    An object whose commit was refused is known too, with no range: it is garbage."""

    commit: ObjectCommit
    live: dict[int, StreamRange] = field(default_factory=dict)
    refused: str = ""


@dataclass(slots=True)
class ShardView:
    """What one generation of a shard's records says."""

    shard: int
    shard_count: int
    restoring: bool = False  # a checkpoint's generation, read before its CheckpointEnd
    epoch: int = 0
    owner: str = ""  # the last claim's, kept after a release
    released: bool = True  # by the owner of `epoch`, or never claimed (epoch 0)
    streams: dict[int, TieredStream] = field(default_factory=dict)
    incarnations: dict[int, int] = field(default_factory=dict)  # kept after an untier
    objects: dict[int, KnownObject] = field(default_factory=dict)
    deleted: set[int] = field(default_factory=set)
    snapshots: dict[int, ProducerSnapshot] = field(default_factory=dict)
    keys: set[bytes] = field(default_factory=set)  # every key of the generation read
    refused: list[str] = field(default_factory=list)  # kept while restoring only


def _owner_problem(view: ShardView, epoch: int) -> str | None:
    if epoch < view.epoch:
        return (
            f"stale owner epoch {epoch}: the shard is at epoch {view.epoch} "
            f"(owner {view.owner or 'unknown'}); its writer was fenced"
        )
    if view.released and epoch == view.epoch > 0:
        return (
            f"epoch {epoch} is over: its owner {view.owner} released the shard; "
            "a record needs a newer claim"
        )
    return None


def _elsewhere(view: ShardView, stream: int) -> str | None:
    home = shard_of(stream, view.shard_count)
    return (
        f"stream {stream} belongs to shard {home}, not {view.shard}" if home != view.shard else None
    )


def _stream(view: ShardView, stream: int, incarnation: int | None = None) -> TieredStream | str:
    elsewhere = _elsewhere(view, stream)
    if elsewhere:
        return elsewhere
    tiered = view.streams.get(stream)
    if tiered is None:
        return f"stream {stream} is not tiered"
    current = tiered.cutover.incarnation
    if incarnation is not None and incarnation != current:
        return f"incarnation {incarnation} of stream {stream} is over; it is at {current}"
    return tiered


def untier_refusal(tiered: TieredStream) -> str | None:
    """Why the stream cannot go back to passthrough: the proxy wrote offsets Kafka lacks."""
    c = tiered.cutover
    if tiered.end > c.cutover_offset:
        return (
            f"stream {c.stream_id} (topic id {c.topic_id} partition {c.partition}) holds "
            f"offsets [{c.cutover_offset}, {tiered.end}) written after its cutover: they exist "
            f"only in objects, Kafka's log ends at {c.cutover_offset}; untier would lose them"
        )
    return None


def _check_claim(view: ShardView, claim: ShardClaim) -> Verdict:
    if claim.epoch <= view.epoch:
        return refuse(
            f"claim of epoch {claim.epoch} by {claim.owner}: the shard is at epoch "
            f"{view.epoch} (owner {view.owner or 'unknown'}) already"
        )
    return ACCEPT


def _check_release(view: ShardView, release: ShardRelease) -> Verdict:
    what = f"release of epoch {release.epoch} by {release.owner}"
    if release.epoch < view.epoch:
        return refuse(f"{what}: {_owner_problem(view, release.epoch)}")
    if release.epoch != view.epoch or release.owner != view.owner:
        return refuse(
            f"{what}: the shard is at epoch {view.epoch} (owner {view.owner or 'unknown'}); "
            "only the owner of the current epoch releases it"
        )
    if view.released:
        return no_op(f"{what}: released already")
    return ACCEPT


def _check_cutover(view: ShardView, cutover: StreamCutover) -> Verdict:
    s = cutover.stream_id
    problem = _owner_problem(view, cutover.epoch) or _elsewhere(view, s)
    if problem is None and s != stream_id(cutover.topic_id, cutover.partition):
        problem = (
            f"stream id {s} is not topic id {cutover.topic_id} partition {cutover.partition}'s"
        )
    if problem:
        return refuse(problem)
    tiered = view.streams.get(s)
    if tiered is not None:
        c = tiered.cutover
        if (c.topic_id, c.partition) != (cutover.topic_id, cutover.partition):
            return refuse(
                f"stream id {s} collides: already tiered for topic id {c.topic_id} "
                f"partition {c.partition}"
            )
        return refuse(f"stream {s} is tiered already, since offset {c.cutover_offset}")
    last = view.incarnations.get(s, 0)
    if cutover.incarnation <= last:
        return refuse(f"incarnation {cutover.incarnation} of stream {s} is not after {last}")
    if not view.restoring and cutover.end_offset != cutover.cutover_offset:
        return refuse(
            f"stream {s}: a cutover starts the stream at its cutover offset "
            f"{cutover.cutover_offset}, not {cutover.end_offset}"
        )
    return ACCEPT


def _check_untier(view: ShardView, untier: StreamUntier) -> Verdict:
    """An untier only when Kafka holds all the stream's data; the untier of a topic
    deleted in Kafka whatever the stream holds (nothing of it is to be read again)."""
    tiered = _stream(view, untier.stream_id, untier.incarnation)
    problem = tiered if isinstance(tiered, str) else _owner_problem(view, untier.epoch)
    if problem is None and not isinstance(tiered, str) and untier.topic_deleted_ms is None:
        problem = untier_refusal(tiered)
    return refuse(problem) if problem else ACCEPT


def _check_trim(view: ShardView, trim: StreamTrim) -> Verdict:
    tiered = _stream(view, trim.stream_id, trim.incarnation)
    if isinstance(tiered, str):
        return refuse(tiered)
    problem = _owner_problem(view, trim.epoch)
    if problem:
        return refuse(problem)
    if trim.log_start_offset == tiered.log_start:
        return no_op(f"stream {trim.stream_id} starts at {tiered.log_start} already")
    if not tiered.log_start < trim.log_start_offset <= tiered.end:
        return refuse(
            f"stream {trim.stream_id}: log start {trim.log_start_offset} is not in "
            f"({tiered.log_start}, {tiered.end}]: a log start only moves up, to the end at most"
        )
    return ACCEPT


def _range_problem(view: ShardView, r: OffsetRange, replaces: tuple[int, ...]) -> str | None:
    tiered = _stream(view, r.stream_id)
    if isinstance(tiered, str):
        return tiered
    a, b = r.start_offset, r.end_offset
    cutover, log_start, end = tiered.cutover.cutover_offset, tiered.log_start, tiered.end
    where = f"stream {r.stream_id} [{a}, {b})"
    olds = tiered.overlapping(a, b)
    for old in olds:
        if view.restoring or old.object_id not in replaces:
            return (
                f"{where} overlaps [{old.start_offset}, {old.end_offset}) of object {old.object_id}"
            )
    if olds:
        if (
            olds[0].start_offset != a
            or olds[-1].end_offset != b
            or any(x.end_offset != y.start_offset for x, y in pairwise(olds))
        ):
            return f"{where} does not cover exactly the ranges it replaces"
        return None
    if view.restoring:  # a checkpoint restores live ranges: above the log start, up to the end
        return f"{where} is not in ({log_start}, {end}]" if b <= log_start or b > end else None
    if a == end:
        return None  # the tail continues
    if a > end:
        return f"{where} leaves a gap after the stream's end {end}"
    if b <= cutover:
        return f"{where} starts below the log start {log_start}" if a < log_start else None
    return f"{where} neither continues the stream's end {end} nor lies below its cutover {cutover}"


def _same_object(one: ObjectCommit, other: ObjectCommit) -> bool:
    return (one.kind, one.size, one.ranges, one.replaces) == (
        other.kind,
        other.size,
        other.ranges,
        other.replaces,
    )


def _check_commit(view: ShardView, commit: ObjectCommit) -> Verdict:
    problem = _owner_problem(view, commit.epoch)
    if problem:
        return refuse(problem)
    number = commit.object_id
    known = view.objects.get(number)
    if number in view.deleted:
        return refuse(f"object {number} was deleted; an object id is committed once")
    if known is not None:
        if known.refused:
            return refuse(f"object {number} was refused before ({known.refused})")
        if _same_object(known.commit, commit):
            return no_op(f"object {number} is committed already")
        return refuse(f"object {number} is committed already, with other ranges")
    if not commit.ranges and not view.restoring:
        return refuse(f"object {number}: a commit names at least one range")
    if commit.replaces and view.restoring:
        return refuse(f"object {number}: a checkpoint's commits replace nothing")
    for r in commit.ranges:
        problem = _range_problem(view, r, commit.replaces)
        if problem:
            return refuse(f"object {number}: {problem}")
    taken: set[int] = set()
    for r in commit.ranges:
        olds = view.streams[r.stream_id].overlapping(r.start_offset, r.end_offset)
        taken.update(old.object_id for old in olds)
    for replaced in commit.replaces:
        if replaced not in taken:
            return refuse(f"object {number} replaces object {replaced} but none of its ranges")
    return ACCEPT


def _check_delete(view: ShardView, delete: ObjectDelete) -> Verdict:
    problem = _owner_problem(view, delete.epoch)
    if problem:
        return refuse(problem)
    if delete.object_id in view.deleted:
        return no_op(f"object {delete.object_id} is deleted already")
    known = view.objects.get(delete.object_id)
    if known is None:
        return refuse(f"object {delete.object_id} is not known")
    if known.live:
        held = ", ".join(
            f"stream {r.stream_id} [{r.start_offset}, {r.end_offset})" for r in known.live.values()
        )
        return refuse(f"object {delete.object_id} still holds {held}")
    return ACCEPT


def _check_snapshot(view: ShardView, snapshot: ProducerSnapshot) -> Verdict:
    tiered = _stream(view, snapshot.stream_id)
    problem = tiered if isinstance(tiered, str) else _owner_problem(view, snapshot.epoch)
    if problem is None and not isinstance(tiered, str):
        if not tiered.log_start <= snapshot.offset <= tiered.end:
            problem = (
                f"snapshot of stream {snapshot.stream_id} at offset {snapshot.offset} is "
                f"outside [{tiered.log_start}, {tiered.end}]"
            )
    return refuse(problem) if problem else ACCEPT


_CHECKS: dict[type, Any] = {
    ShardClaim: _check_claim,
    ShardRelease: _check_release,
    StreamCutover: _check_cutover,
    StreamUntier: _check_untier,
    StreamTrim: _check_trim,
    ObjectCommit: _check_commit,
    ObjectDelete: _check_delete,
    ProducerSnapshot: _check_snapshot,
}
# what a checkpoint may hold: the state, not the steps that led to it
_RESTORABLE = (ShardClaim, StreamCutover, ObjectCommit, ProducerSnapshot, ShardRelease)


def judge(view: ShardView, record: Record) -> Verdict:
    """Whether the record counts, appended to the records `view` was built from."""
    if view.restoring and not isinstance(record, _RESTORABLE):
        return refuse(f"a checkpoint holds no {type(record).__name__} records")
    return _CHECKS[type(record)](view, record)


def _drop(view: ShardView, tiered: TieredStream, olds: list[StreamRange]) -> None:
    for old in olds:
        tiered.remove(old)
        view.objects[old.object_id].live.pop(old.stream_id, None)


def enact(view: ShardView, record: Record) -> None:
    """Apply a record `judge` accepted."""
    epoch = getattr(record, "epoch", 0)
    if epoch > view.epoch:  # a new writer, which has released nothing yet
        view.epoch, view.released = epoch, False
    if isinstance(record, ShardClaim):
        view.owner = record.owner
    elif isinstance(record, ShardRelease):
        view.released = True
    elif isinstance(record, StreamCutover):
        view.streams[record.stream_id] = TieredStream(
            record, record.log_start_offset, record.end_offset
        )
        view.incarnations[record.stream_id] = record.incarnation
    elif isinstance(record, StreamUntier):
        tiered = view.streams.pop(record.stream_id)
        _drop(view, tiered, list(tiered.ranges))
        view.snapshots.pop(record.stream_id, None)
    elif isinstance(record, StreamTrim):
        tiered = view.streams[record.stream_id]
        tiered.log_start = record.log_start_offset
        _drop(view, tiered, [r for r in tiered.ranges if r.end_offset <= tiered.log_start])
        snapshot = view.snapshots.get(record.stream_id)
        if snapshot is not None and snapshot.offset < tiered.log_start:
            del view.snapshots[record.stream_id]
    elif isinstance(record, ObjectCommit):
        known = KnownObject(record)
        for r in record.ranges:
            tiered = view.streams[r.stream_id]
            _drop(view, tiered, tiered.overlapping(r.start_offset, r.end_offset))
            new = StreamRange(
                r.stream_id,
                r.start_offset,
                r.end_offset,
                record.object_id,
                record.kind,
                record.size,
            )
            tiered.insert(new)
            known.live[r.stream_id] = new
            tiered.end = max(tiered.end, r.end_offset)
        view.objects[record.object_id] = known
    elif isinstance(record, ObjectDelete):
        del view.objects[record.object_id]
        view.deleted.add(record.object_id)
    elif isinstance(record, ProducerSnapshot):
        view.snapshots[record.stream_id] = record
