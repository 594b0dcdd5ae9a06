"""S3-WAL reads on the owner: one GET per object, shared (docs/wal.md, "S3-WAL mode").

A writer packs the batches of many partitions into one object, then tells each batch's
owner its location on its own; an owner hears of its locations in one object within a
few hundred ms of each other. S3 bills requests, not bytes read in the region, so
instead of a ranged GET per location the first read of an object GETs all of it (at most
a few MiB: the writer's `max_bytes`, or one larger append), reads of the same object
made while that GET runs wait for it, and the object stays in memory a short while for
the locations that arrive later. Each read still checks its own range (`check_range`:
length, CRC, batches), so a damaged or short object fails only the reads whose range is
bad. A whole-object GET needs no guess of which locations will come, so no read waits
for others to arrive; a span of the locations known after a short wait would read fewer
bytes, but every later location outside it would cost another GET.

Two parts, as in the block cache: `WalObjectCache`, recently read objects within a byte
bound and an age, oldest out first (pure: time is passed in); `S3WalReader`, the asyncio
side, which runs the GETs and lets every read of an object share the one in flight.

Memory. A read returns a slice of its object's buffer, not a copy, so it keeps the
whole object alive until the caller drops it (the sequencer copies a batch as it
assigns offsets); that memory is the caller's, not the cache's. GETs in flight are not
counted against the cache's bound.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections import OrderedDict
from collections.abc import Callable

from proxy.handoff.objects import S3WalLocation, check_range
from proxy.objects.store import ObjectStore

__all__ = ["S3WalReader", "WalObjectCache"]

MiB = 1024 * 1024
DEFAULT_CACHE_BYTES = 64 * MiB
DEFAULT_CACHE_AGE_S = 5.0


class WalObjectCache:
    """Whole S3-WAL objects, at most `max_bytes` of them and none read more than
    `max_age_s` ago; the oldest go first. Objects are never rewritten (no key is used
    twice), so what is cached cannot be stale. `now` must not go back."""

    def __init__(self, max_bytes: int, max_age_s: float) -> None:
        self.max_bytes = max_bytes
        self.max_age_s = max_age_s
        self.bytes = 0
        self.evictions = 0  # objects dropped for room (not for age)
        self._objects: OrderedDict[str, tuple[memoryview, float]] = OrderedDict()  # oldest first

    def __len__(self) -> int:
        return len(self._objects)

    def __contains__(self, key: str) -> bool:
        return key in self._objects

    def get(self, key: str, now: float) -> memoryview | None:
        self.expire(now)
        slot = self._objects.get(key)
        return None if slot is None else slot[0]

    def insert(self, key: str, data: memoryview, now: float) -> bool:
        """Keep object `key`, read at `now`, then drop the oldest down to `max_bytes`.
        False, keeping nothing, for an object larger than `max_bytes` or a cache that keeps
        nothing (`max_age_s` 0)."""
        self.expire(now)
        if key in self._objects:
            self._drop(key)
        if len(data) > self.max_bytes or self.max_age_s <= 0:
            return False
        self._objects[key] = (data, now)
        self.bytes += len(data)
        while self.bytes > self.max_bytes:  # the new object is the youngest: it goes last
            self._drop(next(iter(self._objects)))
            self.evictions += 1
        return True

    def expire(self, now: float) -> None:
        """Drop the objects read `max_age_s` or more before `now`."""
        while self._objects:
            key, (_, read_at) = next(iter(self._objects.items()))
            if now - read_at < self.max_age_s:
                return
            self._drop(key)

    def next_expiry(self) -> float | None:
        """When the oldest object expires; None when the cache is empty."""
        for _, read_at in self._objects.values():
            return read_at + self.max_age_s
        return None

    def _drop(self, key: str) -> None:
        data, _ = self._objects.pop(key)
        self.bytes -= len(data)


class S3WalReader:
    """Reads appends back on the owner, checked: one GET per object, shared by its reads
    (the module's doc). `cache_max_bytes` 0 or `cache_max_age_s` 0 keep nothing after a
    GET; concurrent reads of one object still share it. `clock` (seconds, never going
    back) ages cached objects.

    Counters, for tests and logs: `gets`, the GETs started; `hits`, the reads that started
    none (served from memory, or by a GET already running, whether it then succeeded or
    not); `bytes_fetched`, the bytes the GETs returned."""

    def __init__(
        self,
        store: ObjectStore,
        *,
        cache_max_bytes: int = DEFAULT_CACHE_BYTES,
        cache_max_age_s: float = DEFAULT_CACHE_AGE_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        for name, value in (
            ("cache_max_bytes", cache_max_bytes),
            ("cache_max_age_s", cache_max_age_s),
        ):
            if isinstance(value, bool) or not value >= 0:
                raise ValueError(f"S3-WAL reader {name}={value!r}: must be 0 or more")
        self.store = store
        self.cache = WalObjectCache(cache_max_bytes, cache_max_age_s)
        self.gets = 0
        self.hits = 0
        self.bytes_fetched = 0
        self._clock = clock
        self._fetches: dict[str, asyncio.Task[memoryview]] = {}
        self._timer: asyncio.TimerHandle | None = None

    async def read(self, location: S3WalLocation) -> memoryview:
        """The append's batches, verbatim (a read-only slice of the object's buffer;
        `batches.with_base_offset` gives a sequenced copy). S3WalCorruptError names the
        object and range when the bytes are short or damaged; store errors (ObjectNotFound,
        ObjectStoreError) pass through, to every read waiting for that GET."""
        key, start, end = location.object_key, location.start, location.end
        if start < 0 or end <= start:  # as before: the store refuses it or reads nothing
            return check_range(await self.store.get(key, start, end), location)
        data = self.cache.get(key, self._clock())
        if data is None:
            fetch = self._fetches.get(key)
            if fetch is None or fetch.done():  # a GET just ended: failed, or not cached
                fetch = self._start_get(key)
            else:
                self.hits += 1
            # shielded: a cancelled read leaves the GET running for the others
            data = await asyncio.shield(fetch)
        else:
            self.hits += 1
        return check_range(data[start:end], location)

    def _start_get(self, key: str) -> asyncio.Task[memoryview]:
        self.gets += 1
        fetch = asyncio.get_running_loop().create_task(self._get(key))
        fetch.add_done_callback(functools.partial(self._got, key))
        self._fetches[key] = fetch
        return fetch

    async def _get(self, key: str) -> memoryview:
        data = memoryview(await self.store.get(key)).cast("B")
        self.bytes_fetched += len(data)
        if self.cache.insert(key, data, self._clock()):
            self._schedule_expiry()
        return data

    def _schedule_expiry(self) -> None:
        """Drop expired objects when they expire, not at the next read: an owner whose
        S3-WAL traffic stops should not hold the last objects forever."""
        due = self.cache.next_expiry()
        if self._timer is None and due is not None:
            delay = max(0.0, due - self._clock())
            self._timer = asyncio.get_running_loop().call_later(delay, self._expire)

    def _expire(self) -> None:
        self._timer = None
        self.cache.expire(self._clock())
        self._schedule_expiry()

    def _got(self, key: str, fetch: asyncio.Task[memoryview]) -> None:
        if self._fetches.get(key) is fetch:
            del self._fetches[key]
        if not fetch.cancelled():
            fetch.exception()  # seen: its reads may all have been cancelled
