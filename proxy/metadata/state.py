"""The fleet's metadata, one shard at a time (docs/metadata.md).

The metadata topic is compacted and has one partition per shard. `MetadataState` is what
one partition says: `apply` every record from the beginning, in order (a new owner's "read
to the end"), then ask it where a stream ends, which object holds an offset, what is left
to offload. The shard's owner, the partition's only writer, asks the same rules before it
writes (`check_commit`, `check_cutover`, ...) and applies its own records as it writes
them. Now and then it rewrites the live state as a new generation (`checkpoint_records`)
and tombstones the old generation's keys, which is what lets compaction shrink the topic.

Pure: no I/O, no asyncio, no clock (times are passed in). The rules live in metarules.py,
the records in metarecords.py, their bytes in metacodec.py, stream ids in metastreams.py.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any
from uuid import UUID

from proxy.metadata.codec import Buffer, decode, decode_key, encode
from proxy.metadata.records import (
    CheckpointEnd,
    MetadataRecordError,
    ObjectCommit,
    ObjectDelete,
    OffsetRange,
    ProducerSnapshot,
    Record,
    RecordType,
    ShardClaim,
    ShardRelease,
    StreamCutover,
    StreamTrim,
    StreamUntier,
    TopicMode,
    TopicModeSet,
)
from proxy.metadata.rules import (
    ACCEPT,
    KnownObject,
    Outcome,
    ShardView,
    Verdict,
    enact,
    judge,
    no_op,
    refuse,
    untier_refusal,
)
from proxy.metadata.streams import StreamInfo, StreamRange, shard_of, stream_id, topic_shard


@dataclass(frozen=True, slots=True)
class Refusal:
    """A record readers ignored: where it is in the partition, and why."""

    offset: int
    reason: str


class MetadataState:
    """One shard's metadata, as the records of its partition say."""

    def __init__(self, shard: int = 0, shard_count: int = 1, *, kept_refusals: int = 100) -> None:
        if not 0 <= shard < shard_count:
            raise ValueError(f"shard {shard} is not one of {shard_count} shards")
        self.shard = shard
        self.shard_count = shard_count
        self.generation = 0
        self.next_offset = 0  # the partition offset after the last record applied
        self.refused_count = 0
        self.refusals: deque[Refusal] = deque(maxlen=kept_refusals)
        self._view = ShardView(shard, shard_count)
        self._pending: ShardView | None = None  # a checkpoint being read
        self._pending_generation = 0
        self._topics: dict[UUID, TopicModeSet] = {}
        self._retired: set[bytes] = set()  # keys of retired generations, not yet tombstoned

    # -- reading the partition -------------------------------------------------------------

    def apply(self, key: Buffer, value: Buffer | None, offset: int) -> Verdict:
        """Apply the record at `offset` of the partition. A record that does not count is
        ignored and reported (returned, counted, kept in `refusals`); nothing in the topic
        makes this raise."""
        if offset < self.next_offset:
            raise ValueError(
                f"shard {self.shard}: offset {offset} after {self.next_offset - 1}; "
                "records are applied once each, in partition order"
            )
        self.next_offset = offset + 1
        verdict = self._apply(bytes(key), None if value is None else bytes(value))
        if verdict.outcome is Outcome.REFUSE:
            self.refused_count += 1
            self.refusals.append(Refusal(offset, verdict.reason))
        return verdict

    def _apply(self, key: bytes, value: bytes | None) -> Verdict:
        try:
            head = decode_key(key)
        except MetadataRecordError as error:
            return refuse(error.what)
        if head.record_type is RecordType.TOPIC_MODE:
            assert head.topic_id is not None
            return self._apply_topic(head.topic_id, key, value)
        assert head.generation is not None
        view = self._view_for(head.generation)
        if view is None:
            if value is None:
                self._retired.discard(key)
                return no_op(f"tombstone of a key of retired generation {head.generation}")
            self._retired.add(key)
            return refuse(
                f"generation {head.generation} is retired or was abandoned; the shard is at "
                f"generation {self.generation}"
            )
        if value is None:
            verdict = refuse(
                f"tombstone for a key of live generation {head.generation}: keys are deleted "
                "only once their generation is retired"
            )
        else:
            view.keys.add(key)
            try:
                verdict = self._apply_record(view, decode(key, value))
            except MetadataRecordError as error:
                verdict = refuse(error.what)
        if view.restoring and verdict.outcome is Outcome.REFUSE:
            view.refused.append(verdict.reason)
        return verdict

    def _apply_topic(self, topic_id: UUID, key: bytes, value: bytes | None) -> Verdict:
        home = topic_shard(topic_id, self.shard_count)
        if home != self.shard:
            return refuse(f"topic id {topic_id} belongs to shard {home}, not {self.shard}")
        if value is None:
            self._topics.pop(topic_id, None)
            return ACCEPT
        try:
            record = decode(key, value)
        except MetadataRecordError as error:
            return refuse(error.what)
        assert isinstance(record, TopicModeSet)
        self._topics[topic_id] = record
        return ACCEPT

    def _view_for(self, generation: int) -> ShardView | None:
        """The view a record of `generation` is judged in; None for a retired generation."""
        if generation == self.generation:
            return self._view
        if generation < self.generation:
            return None
        if self._pending is None or generation > self._pending_generation:
            if self._pending is not None:  # a checkpoint that never ended: abandoned
                self._retired |= self._pending.keys
            self._pending = ShardView(self.shard, self.shard_count, restoring=True)
            self._pending_generation = generation
        elif generation < self._pending_generation:
            return None
        return self._pending

    def _apply_record(self, view: ShardView, record: Record) -> Verdict:
        if isinstance(record, CheckpointEnd):
            return self._end_checkpoint(view, record)
        verdict = judge(view, record)
        if verdict.accepted:
            enact(view, record)
        elif verdict.outcome is Outcome.REFUSE:
            number = getattr(record, "object_id", None)
            if isinstance(record, ProducerSnapshot):
                # the last snapshot record of a stream decides, as compaction keeps only it
                view.snapshots.pop(record.stream_id, None)
            elif isinstance(record, ObjectCommit) and number not in view.objects:
                if number not in view.deleted:  # its object was written: garbage to delete
                    view.objects[record.object_id] = KnownObject(record, refused=verdict.reason)
        return verdict

    def _end_checkpoint(self, view: ShardView, end: CheckpointEnd) -> Verdict:
        if view is self._view:
            return refuse(f"generation {end.generation} is current already")
        problem = None
        if end.epoch < self._view.epoch:
            problem = f"stale owner epoch {end.epoch}: the shard is at epoch {self._view.epoch}"
        elif view.refused:
            problem = f"it holds a refused record ({view.refused[0]})"
        else:
            problem = next((gap for t in view.streams.values() if (gap := t.tail_gap())), None)
        if problem:
            return refuse(f"checkpoint of generation {end.generation}: {problem}")
        self._retired |= self._view.keys
        view.restoring = False
        if end.epoch > view.epoch:
            view.epoch, view.released = end.epoch, False
        self._view, self.generation, self._pending = view, end.generation, None
        return ACCEPT

    # -- writing -----------------------------------------------------------------------------

    def check(self, record: Record) -> Verdict:
        """What `apply` would decide for `record` appended now. The owner writes a record
        only when this accepts it, and then applies it at once (it is the only writer)."""
        if isinstance(record, TopicModeSet):
            home = topic_shard(record.topic_id, self.shard_count)
            return ACCEPT if home == self.shard else refuse(f"topic belongs to shard {home}")
        if isinstance(record, CheckpointEnd):
            return refuse("a checkpoint is written whole, from checkpoint_records")
        if record.generation != self.generation:
            return refuse(
                f"written for generation {record.generation}; the shard is at {self.generation}"
            )
        return judge(self._view, record)

    def checkpoint_records(self, owner: str, epoch: int, now_ms: int) -> list[tuple[bytes, bytes]]:
        """The live state as the records of a new generation, ending with its CheckpointEnd:
        written in one transaction, then the owner tombstones `retired_keys()`."""
        view = self._view
        if epoch < max(view.epoch, 1):
            raise ValueError(f"epoch {epoch}: a checkpoint is written at the shard's epoch")
        generation = max(self.generation, self._pending_generation) + 1
        records: list[Record] = [ShardClaim(generation, epoch, owner, now_ms)]
        for number in sorted(view.streams):
            tiered = view.streams[number]
            records.append(
                replace(
                    tiered.cutover,
                    generation=generation,
                    epoch=epoch,
                    log_start_offset=tiered.log_start,
                    end_offset=tiered.end,
                )
            )
        for number in sorted(view.snapshots):
            records.append(replace(view.snapshots[number], generation=generation, epoch=epoch))
        for number in sorted(view.objects):
            known = view.objects[number]
            live = sorted(known.live.values(), key=lambda r: r.stream_id)
            ranges = tuple(OffsetRange(r.stream_id, r.start_offset, r.end_offset) for r in live)
            records.append(
                replace(
                    known.commit, generation=generation, epoch=epoch, ranges=ranges, replaces=()
                )
            )
        if view.released:  # kept: the next owner need not wait for anyone
            records.append(ShardRelease(generation, epoch, owner, now_ms))
        records.append(CheckpointEnd(generation, epoch, now_ms))
        return [encode(record) for record in records]

    def retired_keys(self) -> frozenset[bytes]:
        """Keys of retired generations no tombstone has been read for yet."""
        return frozenset(self._retired)

    # -- queries -------------------------------------------------------------------------------

    @property
    def epoch(self) -> int:
        return self._view.epoch

    @property
    def owner(self) -> str:
        """The owner named by the last claim ("" if none), kept after it released."""
        return self._view.owner

    @property
    def released(self) -> bool:
        """True when the owner of the current epoch released the shard (ShardRelease), or
        no one ever claimed it: the next owner claims at once. False while its last owner
        holds it, or died holding it."""
        return self._view.released

    def topic_mode(self, topic_id: UUID) -> TopicMode:
        """What was asked for the topic; PASSTHROUGH for a topic never named."""
        record = self._topics.get(topic_id)
        return TopicMode.PASSTHROUGH if record is None else record.mode

    def topic(self, topic_id: UUID) -> TopicModeSet | None:
        return self._topics.get(topic_id)

    def topic_ids(self) -> list[UUID]:
        return sorted(self._topics, key=str)

    def stream_ids(self) -> list[int]:
        return sorted(self._view.streams)

    def stream(self, stream: int) -> StreamInfo | None:
        tiered = self._view.streams.get(stream)
        return None if tiered is None else tiered.info()

    def cutover(self, stream: int) -> int | None:
        """The stream's cutover offset: the upstream log end when it was tiered."""
        tiered = self._view.streams.get(stream)
        return None if tiered is None else tiered.cutover.cutover_offset

    def stream_end(self, stream: int) -> int | None:
        """The next offset to be committed; None for a stream that is not tiered."""
        tiered = self._view.streams.get(stream)
        return None if tiered is None else tiered.end

    def committed_ranges(self, stream: int) -> tuple[StreamRange, ...]:
        """The stream's live ranges, in offset order."""
        tiered = self._view.streams.get(stream)
        return () if tiered is None else tuple(tiered.ranges)

    def objects_for(
        self, stream: int, offset: int, limit: int | None = None
    ) -> tuple[StreamRange, ...]:
        """The range holding `offset` and the stream's ranges after it (at most `limit`);
        empty when no object holds it (not tiered, below the cutover and not offloaded
        yet, trimmed, or not committed yet)."""
        tiered = self._view.streams.get(stream)
        at = -1 if tiered is None else tiered.holding(offset)
        if tiered is None or at < 0:
            return ()
        return tuple(tiered.ranges[at : None if limit is None else at + limit])

    def backfill_gaps(self, stream: int) -> list[tuple[int, int]]:
        """The [start, end) ranges from the log start to the cutover that no object holds
        yet: what the offload job still has to move from Kafka."""
        tiered = self._view.streams.get(stream)
        if tiered is None:
            return []
        gaps = []
        position, limit = tiered.log_start, tiered.cutover.cutover_offset
        for r in tiered.ranges:
            if r.start_offset >= limit:
                break
            if r.start_offset > position:
                gaps.append((position, r.start_offset))
            position = max(position, r.end_offset)
        if position < limit:
            gaps.append((position, limit))
        return gaps

    def producer_snapshot(self, stream: int) -> ProducerSnapshot | None:
        return self._view.snapshots.get(stream)

    def object_commit(self, object_id: int) -> ObjectCommit | None:
        """The commit of an object this shard knows (not deleted), as it was written."""
        known = self._view.objects.get(object_id)
        return None if known is None else known.commit

    def object_ranges(self, object_id: int) -> tuple[StreamRange, ...]:
        """The object's ranges still in use here, by stream id."""
        known = self._view.objects.get(object_id)
        return () if known is None else tuple(known.live[s] for s in sorted(known.live))

    def garbage_objects(self) -> list[ObjectCommit]:
        """Objects no range of this shard uses (replaced, trimmed, untiered, or their
        commit refused): to delete once no other shard uses them, then ObjectDelete."""
        objects = self._view.objects
        return [objects[n].commit for n in sorted(objects) if not objects[n].live]

    def next_incarnation(self, stream: int) -> int:
        """The incarnation a new cutover of the stream takes: 1, or one past the last."""
        tiered = self._view.streams.get(stream)
        if tiered is not None:
            return tiered.cutover.incarnation + 1
        return self._view.incarnations.get(stream, 0) + 1

    def untier_refusal(self, stream: int) -> str | None:
        """Why the stream cannot go back to passthrough; None when it can (or is not tiered)."""
        tiered = self._view.streams.get(stream)
        return None if tiered is None else untier_refusal(tiered)

    def image(self) -> dict[str, Any]:
        """Everything the state holds, as plain values: equal images, equal states."""
        v = self._view
        return {
            "generation": self.generation,
            "epoch": v.epoch,
            "owner": v.owner,
            "released": v.released,
            "topics": {str(t): self._topics[t] for t in self.topic_ids()},
            "streams": {
                s: (v.streams[s].info(), tuple(v.streams[s].ranges)) for s in sorted(v.streams)
            },
            "objects": {
                n: (o.commit.kind, o.commit.size, o.commit.committed_at_ms, self.object_ranges(n))
                for n, o in sorted(v.objects.items())
            },
            "snapshots": {
                s: (p.offset, p.taken_at_ms, p.state) for s, p in sorted(v.snapshots.items())
            },
            "deleted": sorted(v.deleted),
            "retired": sorted(self._retired),
        }


def check_claim(state: MetadataState, claim: ShardClaim) -> Verdict:
    """A claim counts when its epoch is newer than the shard's."""
    return state.check(claim)


def check_release(state: MetadataState, release: ShardRelease) -> Verdict:
    """A release counts at the current epoch, by its owner; a second one is a NO_OP."""
    return state.check(release)


def check_cutover(state: MetadataState, cutover: StreamCutover) -> Verdict:
    return state.check(cutover)


def check_untier(state: MetadataState, untier: StreamUntier) -> Verdict:
    """Refused, with the reason, once the stream holds offsets that only objects hold."""
    return state.check(untier)


def check_trim(state: MetadataState, trim: StreamTrim) -> Verdict:
    return state.check(trim)


def check_commit(state: MetadataState, commit: ObjectCommit) -> Verdict:
    """ACCEPT: write it. NO_OP: this very object is committed already. REFUSE: a gap, an
    overlap, a stale epoch, a stream not tiered here, ... (the reason says which)."""
    return state.check(commit)


def check_delete(state: MetadataState, delete: ObjectDelete) -> Verdict:
    return state.check(delete)


def check_snapshot(state: MetadataState, snapshot: ProducerSnapshot) -> Verdict:
    return state.check(snapshot)


def topic_untier_refusal(
    states: Sequence[MetadataState], topic_id: UUID, partition_count: int
) -> str | None:
    """Why a topic cannot go back to passthrough, given every shard's state (indexed by
    shard): the reasons of its partitions that hold offsets only objects hold."""
    reasons = []
    for partition in range(partition_count):
        stream = stream_id(topic_id, partition)
        state = states[shard_of(stream, len(states))]
        if (state.shard, state.shard_count) != (shard_of(stream, len(states)), len(states)):
            raise ValueError(
                f"states must be every shard's, in shard order; got shard {state.shard}"
            )
        reason = state.untier_refusal(stream)
        if reason:
            reasons.append(reason)
    return "; ".join(reasons) or None
