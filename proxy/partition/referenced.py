"""The owner's WAL with batches taken by reference (docs/wal.md, "The owner answering
from the notification").

In S3-notify mode a batch reaches its owner as a location in an S3-WAL object, PUT by the
proxy in the client's zone, which holds it until the owner releases it. The owner orders
the batch from its 61-byte header and writes a *reference entry* (the header with its
offsets, and the encoded location) to its WAL: that entry, durable, is what the answer
waits for, a few hundred bytes instead of the whole batch, and no GET before it. The
bytes follow: `ReferencingLog` GETs them (`S3WalReader`, one GET per object shared by its
locations) as soon as the reference is submitted, checks them against the header, gives
them to the partition for the log cache (`on_fetched`), and appends them to a second log,
the *fetched log* (a `Log` of its own, another directory), with the same reference. Once
that entry is durable, or the reference entry is trimmed (uploaded), the location is
*released*: the sender may delete its object (`held`, the sender's question).

Everything else sees one log: `read` gives a reference entry with its bytes (from memory
while the fetched entry is being written, then from the fetched log, else a GET: the
object is held until released), so the uploader and the reads need no change. `replay`
gives reference entries as they are (the header only, `WalEntry.reference` set): a
rebuild needs the headers only, and leaves their bytes to `read`. `trim_to` trims the
fetched log behind the references trimmed.

Why a second log rather than the bytes as a later entry of the same one: the reference
entry holds the batch's place in its stream's order; a bytes entry written later would
sit after entries of higher offsets, which the rebuild, the uploader and the trim all
read in WAL order. The fetched log is only ever read by position, so its order is free.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass

from proxy.handoff.objects import (
    S3WalCorruptError,
    S3WalLocation,
    decode_location,
    encode_location,
)
from proxy.handoff.reader import S3WalReader
from proxy.objects.store import ObjectNotFound
from proxy.records.batches import (
    HEADER_SIZE,
    read_batch_header,
    set_base_offset,
    validate_header,
)
from proxy.wal.fs import Buffer
from proxy.wal.port import Log
from proxy.wal.segments import Segment
from proxy.wal.types import WalEntry, WalError, WalOffsetOutOfRange, WalPosition, WalStats

__all__ = ["OnFetched", "ReferencingLog", "ReferenceError"]

log = logging.getLogger(__name__)

OnFetched = Callable[[int, bytes, memoryview], None]  # stream, reference, batch (offsets set)
# A location a sender was told is released while unknown here is never taken by reference
# for this long after (far above a hand-off's time on the way: its request's timeout)
DISCLAIMED_S = 3600.0
# at most this many remembered (~200 bytes each); past it they are forgotten at once and no
# batch is taken by reference for DISCLAIMED_S (by bytes, whose GET finds a deleted object
# missing and answers an error, the way every hand-off went before references)
MAX_DISCLAIMED = 100_000
RETRY_FIRST_S = 0.2
RETRY_MAX_S = 5.0


class ReferenceError(WalError):
    """A batch taken by reference cannot be read back: its object is gone or its bytes do
    not match the header the owner ordered it by."""


@dataclass(slots=True, eq=False)
class _Ref:
    stream: int
    base_offset: int
    header: bytes  # the batch's first HEADER_SIZE bytes, offsets assigned
    location: S3WalLocation
    reference: bytes  # `location` encoded, as the WAL entry holds it
    write: asyncio.Future[WalPosition] | None = None  # the reference entry's write
    position: WalPosition | None = None  # where it is, once written
    # the checked bytes (offsets assigned), until the fetched log holds them: set by the
    # fetch as soon as it has them, before it writes them to the fetched log
    ready: asyncio.Future[memoryview] | None = None
    task: asyncio.Task[None] | None = None  # the fetch under way
    durable: bool = False  # the fetched log holds the bytes
    # while its bytes are being written to the fetched log: where they will be at the
    # earliest (the fetched log's durable end when submitted), so no trim passes them
    fetched_floor: int | None = None
    local: bool = False  # submitted by this process (its partition waits for the bytes)


class ReferencingLog:
    """A `Log` (proxy/wal/port.py) over the owner's WAL whose entries may hold a batch by
    reference; see the module docstring. Open with `open`."""

    def __init__(
        self,
        wal: Log,
        fetched: Log,
        reader: S3WalReader,
        *,
        on_fetched: OnFetched | None = None,
        room_bytes: int = 512 * 1024 * 1024,
        fetches_at_once: int = 8,
    ) -> None:
        self._wal, self._fetched, self._reader = wal, fetched, reader
        self.on_fetched = on_fetched
        # entries no reader uses (a disowned stream's: PartitionSet.stale): read as they
        # are, their bytes not fetched
        self.skip: Callable[[WalEntry], bool] | None = None
        # the bytes of the references not trimmed yet: new batches are taken by reference
        # while they stay below `room_bytes` (`has_room`; else by bytes, which the WAL's
        # capacity holds back)
        self.room_bytes = room_bytes
        self.referenced_bytes = 0
        self._fetching = asyncio.Semaphore(fetches_at_once)
        self._writes: dict[asyncio.Future[WalPosition], bytes] = {}  # for `withdraw`
        self._refs: dict[bytes, _Ref] = {}  # by reference: not trimmed yet
        self._fetched_at: dict[bytes, WalPosition] = {}  # where the fetched log has them
        self._changed = asyncio.Event()  # a reference released
        # locations of hand-offs being handled now (`expect`), and those a sender was told
        # were released while unknown here, with when (`disclaimed`)
        self._expected: dict[bytes, int] = {}
        self._disclaimed: dict[bytes, float] = {}
        self._by_bytes_until = 0.0  # time.monotonic(): `MAX_DISCLAIMED` passed, references off
        # for /metrics (plain ints, read from its thread): fetches that failed and were
        # tried again, and batches whose bytes can never be had (ReferenceError)
        self.fetch_retries = 0
        self.unreadable = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False

    @classmethod
    async def open(
        cls,
        wal: Log,
        fetched: Log,
        reader: S3WalReader,
        *,
        on_fetched: OnFetched | None = None,
        room_bytes: int = 512 * 1024 * 1024,
    ) -> ReferencingLog:
        """Both logs open; what the fetched log holds is indexed, and every reference entry
        of the WAL is known (a sender asking about it is told to keep its object) and its
        fetch started if the fetched log lacks it (at most `fetches_at_once` at a time)."""
        self = cls(wal, fetched, reader, on_fetched=on_fetched, room_bytes=room_bytes)
        try:
            async for entry in fetched.replay():
                if entry.reference is not None:
                    self._fetched_at[bytes(entry.reference)] = entry.position
            async for entry in wal.replay():
                if entry.reference is not None:
                    ref = self._known(entry)
                    if ref.reference in self._fetched_at:
                        ref.durable = True
                    else:
                        self._fetch(ref)
        except BaseException:
            await self._stop_fetches()
            raise
        return self

    def has_room(self) -> bool:
        """Whether a new batch may be taken by reference (`room_bytes`; not while the
        disclaimed locations overflowed: `MAX_DISCLAIMED`)."""
        return self.referenced_bytes < self.room_bytes and not self.references_off

    @property
    def references_off(self) -> bool:
        """No batch is taken by reference now: `MAX_DISCLAIMED` was passed within the
        last DISCLAIMED_S."""
        return bool(self._by_bytes_until) and time.monotonic() < self._by_bytes_until

    # -- what the partitions write ---------------------------------------------------------

    def submit(
        self, stream_id: int, base_offset: int, batch: Buffer, reference: Buffer | None = None
    ) -> asyncio.Future[WalPosition]:
        """`Log.submit`; with a `reference`, `batch` is the header of the batch it locates
        (offsets assigned), and its bytes are fetched at once."""
        if reference is None:
            return self._wal.submit(stream_id, base_offset, batch)
        key = bytes(reference)
        header = bytes(batch)
        if len(header) != HEADER_SIZE:
            raise ValueError(f"a reference entry holds a {HEADER_SIZE}-byte header")
        location = decode_location(key)
        write = self._wal.submit(stream_id, base_offset, batch, reference)
        ref = _Ref(stream_id, base_offset, header, location, key, write, local=True)
        self._add(ref)
        self._writes[write] = key
        write.add_done_callback(lambda done: self._written(ref, done))
        self._fetch(ref)
        return write

    async def append(
        self, stream_id: int, base_offset: int, batch: Buffer, reference: Buffer | None = None
    ) -> WalPosition:
        return await self.submit(stream_id, base_offset, batch, reference)

    def withdraw(self, write: asyncio.Future[WalPosition]) -> bool:
        """`Log.withdraw`; a reference entry withdrawn was never written: forgotten."""
        if not self._wal.withdraw(write):
            return False
        key = self._writes.pop(write, None)
        if key is not None:
            self._forget(key)
        return True

    def _written(self, ref: _Ref, write: asyncio.Future[WalPosition]) -> None:
        """The reference entry's write ended: where it is, if it was written. A failed one
        stays unreleased (the WAL is broken: its content is settled by the next open)."""
        self._writes.pop(write, None)
        if not write.cancelled() and write.exception() is None:
            ref.position = write.result()

    # -- what the sender asks -----------------------------------------------------------

    def expect(self, reference: bytes) -> bool:
        """A hand-off with this location is being handled here: until `unexpect`, a
        sender asking about it is told to keep it. False (nothing noted): a sender was
        told it was released (its hand-off lost, asked about before it arrived), so it
        must not be taken by reference now: its object may be gone."""
        if reference in self._disclaimed:
            return False
        self._expected[reference] = self._expected.get(reference, 0) + 1
        return True

    def unexpect(self, reference: bytes) -> None:
        """The hand-off is answered (its reference entry, if any, is known by then)."""
        count = self._expected.pop(reference, 0) - 1
        if count > 0:
            self._expected[reference] = count
        self._signal()

    def _released(self, key: bytes, now: float) -> bool:
        """Whether the sender may delete the object: its bytes are durable here (the
        fetched log), or its reference entry is trimmed (uploaded) or was never written
        here (then it is disclaimed: taken by reference from now on, never)."""
        if key in self._expected:
            return False
        ref = self._refs.get(key)
        if ref is None:
            if key not in self._disclaimed and len(self._disclaimed) >= MAX_DISCLAIMED:
                log.warning(
                    "%d locations released while unknown here within %.0f s: forgotten, and "
                    "no batch taken by reference for as long",
                    len(self._disclaimed),
                    DISCLAIMED_S,
                )
                self._disclaimed.clear()
                self._by_bytes_until = time.monotonic() + DISCLAIMED_S
            self._disclaimed.setdefault(key, now)
            return True
        return ref.durable

    async def held(self, locations: Sequence[S3WalLocation], timeout_ms: int) -> tuple[int, ...]:
        """The indexes of `locations` released (`_released`), waiting up to `timeout_ms`
        for all of them to be."""
        keys = [encode_location(location) for location in locations]
        loop = asyncio.get_running_loop()
        now = loop.time()
        expired = []
        for key, at in self._disclaimed.items():  # oldest first: only the expired read
            if now - at < DISCLAIMED_S:
                break
            expired.append(key)
        for key in expired:
            del self._disclaimed[key]

        def done() -> tuple[int, ...]:
            now = loop.time()
            return tuple(i for i, key in enumerate(keys) if self._released(key, now))

        # the indexes not seen released, checked from the first on each wake and only up
        # to the first still held (the references are fetched about in order): a wake
        # costs little however many are asked. A released one stays released (an unknown
        # one is disclaimed, never expected again), and `done` settles the answer.
        pending = collections.deque(range(len(keys)))

        def settled() -> bool:
            now = loop.time()
            while pending and self._released(keys[pending[0]], now):
                pending.popleft()
            return not pending

        deadline = loop.time() + max(timeout_ms, 0) / 1000
        while not settled() and not self._closed:
            left = deadline - loop.time()
            if left <= 0:
                break
            changed = self._changed
            try:
                await asyncio.wait_for(changed.wait(), left)
            except TimeoutError:
                break
        return done()

    # -- what the readers see ---------------------------------------------------------------

    async def read(self, from_offset: int, max_bytes: int = 1 << 20) -> list[WalEntry]:
        """`Log.read`, a reference entry with its batch's bytes (`reference` None), and
        about `max_bytes` of those bytes (at least one entry). A reference entry trimmed
        meanwhile is WalOffsetOutOfRange, as a read below the trim point."""
        entries = await self._wal.read(from_offset, max_bytes)
        found: list[WalEntry] = []
        size = 0
        for entry in entries:
            # a reference entry's batch size is in its header: counted before its bytes
            # are fetched, so a read fetches no more than it returns
            batch_size = len(entry.batch)
            if entry.reference is not None:
                batch_size = validate_header(entry.batch).size
            if found and size + batch_size > max_bytes:
                break
            if entry.reference is not None and not (self.skip is not None and self.skip(entry)):
                entry = await self._resolve(entry)
            found.append(entry)
            size += batch_size
        return found

    def replay(self, max_bytes: int = 8 << 20) -> AsyncIterator[WalEntry]:
        """`Log.replay`, reference entries as they are: the header only, `reference` set
        (a rebuild reads headers; `read` gives the bytes)."""
        return self._wal.replay(max_bytes)

    async def _resolve(self, entry: WalEntry) -> WalEntry:
        assert entry.reference is not None
        if entry.position.end <= self._wal.trimmed_to:  # uploaded: the objects hold it
            raise WalOffsetOutOfRange(f"WAL entry {entry.position} was trimmed meanwhile")
        ref = self._known(entry)
        data: memoryview | None = None
        if (where := self._fetched_at.get(ref.reference)) is not None:
            found = await self._fetched.read(where.start, where.size)
            if found and found[0].position == where:
                data = found[0].batch
        if data is None:
            data = await asyncio.shield(self._fetch(ref))
        return WalEntry(entry.position, entry.stream_id, entry.base_offset, data)

    def _known(self, entry: WalEntry) -> _Ref:
        """The entry's reference, registered if it was not (a replay after a restart)."""
        assert entry.reference is not None
        key = bytes(entry.reference)
        ref = self._refs.get(key)
        if ref is None:
            header = bytes(entry.batch)
            location = decode_location(key)
            ref = _Ref(
                entry.stream_id, entry.base_offset, header, location, key, None, entry.position
            )
            self._add(ref)
        return ref

    def _add(self, ref: _Ref) -> None:
        self._refs[ref.reference] = ref
        self.referenced_bytes += ref.location.size

    # -- fetching the bytes ---------------------------------------------------------------

    def _fetch(self, ref: _Ref) -> asyncio.Future[memoryview]:
        """The checked bytes of `ref`, its fetch started if none runs (again after one
        that failed)."""
        ready = ref.ready
        if ready is None or (ready.done() and (ready.cancelled() or ready.exception())):
            ready = ref.ready = asyncio.get_running_loop().create_future()
        if ref.task is None:
            task = asyncio.get_running_loop().create_task(self._fetch_bytes(ref, ready))
            self._tasks.add(task)
            task.add_done_callback(lambda done: self._fetch_ended(ref, ready, done))
            ref.task = task
        return ready

    def _fetch_ended(
        self, ref: _Ref, ready: asyncio.Future[memoryview], task: asyncio.Task[None]
    ) -> None:
        """Whatever ended the fetch (even a cancel before its first step), its readers
        are answered: trimmed meanwhile, as a read below the trim point; else why."""
        self._tasks.discard(task)
        if ref.task is task:
            ref.task = None
        if not task.cancelled():
            task.exception()  # retrieved (its readers have it through `ready`)
        if not ready.done():
            if ref.reference not in self._refs:
                ready.set_exception(WalOffsetOutOfRange(f"stream {ref.stream}: trimmed"))
            else:
                ready.set_exception(ReferenceError(f"stream {ref.stream}: its fetch stopped"))

    async def _fetch_bytes(self, ref: _Ref, ready: asyncio.Future[memoryview]) -> None:
        """GET the bytes (again after a failure, backing off), check them against the
        header, give them to `ready` and on (`on_fetched`), then make them durable in the
        fetched log. `ready` gets a ReferenceError if they cannot be had (gone, or not the
        batch ordered: nothing brings those back)."""
        try:
            async with self._fetching:
                data = await self._get(ref)
            if not ready.done():
                ready.set_result(data)
            if ref.reference not in self._refs:  # trimmed or withdrawn meanwhile
                return
            if ref.local and self.on_fetched is not None:
                try:
                    self.on_fetched(ref.stream, ref.reference, data)
                except Exception:  # the log cache's; the fetch goes on
                    log.exception("stream %d: the fetched batch not taken", ref.stream)
            ref.fetched_floor = self._fetched.durable_end
            try:
                position = await self._fetched.submit(
                    ref.stream, ref.base_offset, data, ref.reference
                )
            except Exception as exc:  # the fetched log broken: its object stays held
                log.error("stream %d: the fetched log failed: %r", ref.stream, exc)
                return
            finally:
                ref.fetched_floor = None
            if ref.reference in self._refs:
                self._fetched_at[ref.reference] = position
                ref.durable = True
                ref.ready = None  # the fetched log serves it from now on
                self._signal()
        except ReferenceError as exc:
            if not ready.done():
                ready.set_exception(exc)

    async def _get(self, ref: _Ref) -> memoryview:
        delay = RETRY_FIRST_S
        while True:
            try:
                found = await self._reader.read(ref.location)
            except (ObjectNotFound, S3WalCorruptError) as exc:  # nothing brings it back
                self.unreadable += 1
                log.error(
                    "stream %d: the batch at offset %d, taken by reference, cannot be read: %r",
                    *(ref.stream, ref.base_offset, exc),
                )
                raise ReferenceError(f"stream {ref.stream} at {ref.base_offset}: {exc}") from exc
            except Exception as exc:  # the store away: the object is held for us
                self.fetch_retries += 1
                log.warning(
                    "stream %d: fetching the batch at offset %d taken by reference: %r; "
                    "again in %.1f s",
                    *(ref.stream, ref.base_offset, exc, delay),
                )
                await asyncio.sleep(delay)
                delay = min(delay * 2, RETRY_MAX_S)
                continue
            return _checked(found, ref)

    # -- trimming ----------------------------------------------------------------------

    async def trim_to(self, offset: int) -> None:
        """`Log.trim_to`; the references below `offset` are released, and the fetched log
        is trimmed below what the others still need."""
        await self._wal.trim_to(offset)
        trimmed = [
            key
            for key, ref in self._refs.items()
            if ref.position is not None and ref.position.end <= offset
        ]
        for key in trimmed:
            self._forget(key)
        if trimmed:
            self._signal()
        # not past the bytes of a reference still needed: written (`_fetched_at`), or being
        # written (durable maybe, not noted yet: their floor)
        needed = [self._fetched_at[key].start for key in self._refs if key in self._fetched_at]
        needed += [r.fetched_floor for r in self._refs.values() if r.fetched_floor is not None]
        point = min(needed, default=self._fetched.durable_end)
        for key in [k for k, p in self._fetched_at.items() if p.end <= point]:
            del self._fetched_at[key]
        if point > self._fetched.trimmed_to:
            await self._fetched.trim_to(point)

    def _forget(self, key: bytes) -> None:
        ref = self._refs.pop(key, None)
        if ref is None:
            return
        self.referenced_bytes -= ref.location.size
        if ref.task is not None:
            ref.task.cancel()

    def _signal(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    # -- the rest of `Log` is the WAL's ---------------------------------------------------

    @property
    def log_start(self) -> int:
        return self._wal.log_start

    @property
    def trimmed_to(self) -> int:
        return self._wal.trimmed_to

    @property
    def durable_end(self) -> int:
        return self._wal.durable_end

    @property
    def segments(self) -> tuple[Segment, ...]:
        return self._wal.segments

    @property
    def broken(self) -> BaseException | None:
        return self._wal.broken

    @property
    def stats(self) -> WalStats:
        return self._wal.stats

    @property
    def references(self) -> int:
        """Reference entries not trimmed yet."""
        return len(self._refs)

    @property
    def fetched_bytes(self) -> int:
        """Bytes the fetched log holds (not trimmed yet)."""
        return self._fetched.stats.retained_bytes

    @property
    def disclaimed(self) -> int:
        """Locations a sender was told were released while unknown here, remembered."""
        return len(self._disclaimed)

    def next_full(self) -> asyncio.Future[None]:
        return self._wal.next_full()

    async def close(self) -> None:
        """Stop fetching; close both logs. What is not fetched yet is fetched again on
        the next open (the senders keep their objects until it is)."""
        self._closed = True
        self._signal()
        await self._stop_fetches()
        await self._wal.close()
        await self._fetched.close()

    async def _stop_fetches(self) -> None:
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def _checked(found: memoryview, ref: _Ref) -> memoryview:
    """The fetched bytes as the reference entry's header says them: one batch, whose
    header is the one ordered (but its base offset), given that base offset."""
    try:
        header = read_batch_header(found)
    except ValueError as exc:
        raise ReferenceError(f"stream {ref.stream} at {ref.base_offset}: {exc}") from exc
    if header.size != len(found) or bytes(found[8:HEADER_SIZE]) != ref.header[8:]:
        raise ReferenceError(
            f"stream {ref.stream} at {ref.base_offset}: the bytes at {ref.location.object_key} "
            f"[{ref.location.start}, {ref.location.end}) are not the batch ordered"
        )
    out = bytearray(found)
    set_base_offset(out, 0, ref.base_offset)
    return memoryview(out)
