"""Deleting objects no range uses any more, for the shards a proxy owns (docs/tiering.md,
"Compaction"), and what the compactor shares with it: reading an index, writing through
an owner without cancelling the write.

An object may span shards: the upload path commits one stream set object in every shard
its ranges belong to, and each shard's owner compacts its own part. So an object that
holds no range in a shard owned here (`garbage_objects`) leaves the store only once it
holds none in any shard its index names, as this proxy's readers of those shards see it,
and `grace_s` after this proxy first saw that, so that readers which planned a read from
it before the last commit that replaced it finish. Then the store delete, then this
shard's ObjectDelete: a crash in between leaves a record that lists garbage, never an
object nothing lists. The other shards' owners find it gone from the store and write
their own ObjectDelete.

A shard that does not know the object at all (its commit is still coming, or it was
deleted there, and then it is gone from the store) keeps it: the store is asked again
after `grace_s`. Unless the commit can never come: the uploader commits an object shard
by shard, and killed in between, the object is committed in some shards only; the
restarted uploader uploads that shard's part again in a new object. Once the shard's
streams end at or past the object's blocks of them, a commit of it there would not
continue them and would be refused: that shard does not use it, and never will.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable

from proxy.clock import now_ms
from proxy.metadata.records import ObjectCommit, ObjectDelete, OffsetRange, Record
from proxy.metadata.rules import Outcome, Verdict
from proxy.metadata.state import MetadataState
from proxy.metadata.store import ShardFenced, ShardOwner
from proxy.metadata.streams import shard_of
from proxy.objects.format import IndexEntry, ObjectFormatError
from proxy.objects.format_writer import BuiltObject
from proxy.objects.index_read import read_index
from proxy.objects.keys import ObjectKind
from proxy.objects.store import ObjectNotFound, ObjectStore, ObjectStoreError

log = logging.getLogger("tierproxy.compaction")

CATCH_UP_TIMEOUT_S = 10.0
KNOWN_OBJECTS = 100_000  # objects whose shards are remembered


async def write_through(owner: ShardOwner, records: list[Record]) -> list[Verdict]:
    """The owner's write, not cancelled with the caller: a write cancelled midway costs
    the owner its shard, and a clean stop would then not release it."""
    write = asyncio.ensure_future(owner.write(records))
    try:
        return await asyncio.shield(write)
    except asyncio.CancelledError:
        with contextlib.suppress(Exception):
            await write
        raise


NewObject = tuple[int, int, OffsetRange, tuple[int, ...]]  # id, size, its range, replaces


def new_object(obj: BuiltObject, r: OffsetRange, replaces: tuple[int, ...]) -> NewObject:
    return obj.footer.object_id, obj.size, r, replaces


def stream_commits(owner: ShardOwner, objects: list[NewObject], at_ms: int) -> list[Record]:
    """The ObjectCommits of new stream objects (compaction's, the log cleaner's, the clean
    job's), each holding one range and naming in `replaces` the objects whose ranges it
    takes over."""
    state = owner.state
    return [
        ObjectCommit(
            state.generation,
            object_id,
            ObjectKind.STREAM,
            size,
            owner.epoch,
            at_ms,
            (r,),
            replaces,
        )
        for object_id, size, r, replaces in objects
    ]


async def discard(store: ObjectStore, keys: list[str]) -> None:
    """Delete objects nothing names (best effort: a failure leaves them behind)."""
    if keys:
        try:
            await store.delete(keys)
        except ObjectStoreError as exc:
            log.warning("compaction: could not delete %s: %s", ", ".join(keys), exc)


class GarbageCollector:
    """State kept across ticks: when each object was first seen garbage everywhere, the
    shards each object's index names, and new objects whose commit failed."""

    def __init__(
        self,
        store: ObjectStore,
        shard_count: int,
        *,
        state_of: Callable[[int], MetadataState],
        read_to_end: Callable[[int], Awaitable[object]],
        grace_s: float,
        forget: Callable[[str], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        clock_ms: Callable[[], int] = now_ms,
    ) -> None:
        self.grace_s = grace_s
        self.deleted = 0  # ObjectDelete records written
        self._store, self._shard_count = store, shard_count
        self._state_of, self._read_to_end, self._forget = state_of, read_to_end, forget
        self._clock, self._clock_ms = clock, clock_ms
        self._since: dict[int, float] = {}  # object -> first seen garbage everywhere
        self._next_look: dict[int, float] = {}  # object -> when to ask the store again
        self._naming: OrderedDict[int, frozenset[int]] = OrderedDict()  # object -> shards
        self._blocks: dict[int, tuple[IndexEntry, ...]] = {}  # object -> its index
        self._unsure: dict[int, tuple[int, str, float]] = {}  # object -> shard, key, since

    def remember(self, number: int, index: tuple[IndexEntry, ...]) -> None:
        """The shards an object's index names (every index read passes here)."""
        self._naming[number] = frozenset(shard_of(e.stream_id, self._shard_count) for e in index)
        self._blocks[number] = index
        self._naming.move_to_end(number)
        while len(self._naming) > KNOWN_OBJECTS:
            forgotten, _ = self._naming.popitem(last=False)
            self._blocks.pop(forgotten, None)

    def unsure(self, shard: int, objects: list[tuple[int, str]]) -> None:
        """New objects whose commit failed with an outcome not known here: once the grace
        is over, those the shard's records do not name are deleted."""
        since = self._clock()
        for number, key in objects:
            self._unsure[number] = (shard, key, since)

    async def collect(self, shard: int, owner: ShardOwner) -> list[int]:
        """Delete what is due in one owned shard; the objects whose ObjectDelete was
        written."""
        now = self._clock()
        due: list[ObjectCommit] = []
        gone: list[ObjectCommit] = []
        for commit in owner.state.garbage_objects():
            number = commit.object_id
            if self._next_look.get(number, 0.0) > now:
                continue
            verdict = await self._garbage_everywhere(shard, commit)
            if verdict == "gone":
                gone.append(commit)
            elif verdict == "yes":
                if now - self._since.setdefault(number, now) >= self.grace_s:
                    due.append(commit)
            else:
                self._since.pop(number, None)
        if due:
            keys = [c.key for c in due]
            await self._store.delete(keys)
            if self._forget is not None:
                for key in keys:
                    self._forget(key)
        if not due and not gone:
            return []
        generation, epoch, at = owner.state.generation, owner.epoch, self._clock_ms()
        records: list[Record] = [
            ObjectDelete(generation, c.object_id, epoch, at) for c in due + gone
        ]
        try:
            verdicts = await write_through(owner, records)
        except ShardFenced as exc:
            # handed over meanwhile (a member joining or coming back after a restart):
            # the shard's next owner finds these objects gone from the store and writes
            # their deletes (`_garbage_everywhere`), as this one would on its next pass
            log.warning(
                "shard %d: %d objects deleted, their deletes not written: %s",
                *(shard, len(records), exc),
            )
            return []
        done = []
        for commit, verdict in zip(due + gone, verdicts, strict=True):
            number = commit.object_id
            for table in (self._since, self._next_look, self._naming, self._blocks):
                table.pop(number, None)
            if verdict.outcome is Outcome.REFUSE:
                log.warning("shard %d: delete of %s refused: %s", shard, commit.key, verdict.reason)
            else:
                done.append(number)
        self.deleted += len(done)
        return done

    async def _garbage_everywhere(self, shard: int, commit: ObjectCommit) -> str:
        """'yes' when no shard its index names uses the object, 'gone' when the store no
        longer has it, 'no' otherwise (used, not known everywhere yet, unreadable)."""
        number = commit.object_id
        try:
            if number not in self._naming:
                self.remember(number, await read_index(self._store, commit.key, commit.size))
            others = [self._state_of(k) for k in self._naming[number] if k != shard]
            if any(state.object_ranges(number) for state in others):
                return "no"
            if all(
                state.object_commit(number) is not None or self._never_committed(number, state)
                for state in others
            ):
                return "yes"
            self._next_look[number] = self._clock() + self.grace_s
            await self._store.size(commit.key)
            return "no"
        except ObjectNotFound:
            return "gone"
        except (ObjectStoreError, ObjectFormatError) as exc:
            self._next_look[number] = self._clock() + self.grace_s
            log.warning("compaction: cannot look at object %s: %s", commit.key, exc)
            return "no"

    def _never_committed(self, number: int, state: MetadataState) -> bool:
        """Whether a shard that does not know the object never will: each of its streams
        the object holds a block of ends at or past that block already."""
        for entry in self._blocks.get(number, ()):
            if shard_of(entry.stream_id, self._shard_count) == state.shard:
                end = state.stream_end(entry.stream_id)
                if end is None or end < entry.end_offset:
                    return False
        return number in self._blocks

    async def settle_unsure(self) -> None:
        """Delete the new objects of failed commits that the shard's records, read to the
        end, do not name: they were never committed."""
        now = self._clock()
        for number, (shard, key, since) in list(self._unsure.items()):
            if now - since < self.grace_s:
                continue
            try:
                async with asyncio.timeout(CATCH_UP_TIMEOUT_S):
                    await self._read_to_end(shard)
            except TimeoutError:
                continue
            if self._state_of(shard).object_commit(number) is None:
                await discard(self._store, [key])
            del self._unsure[number]
