"""S3-WAL mode: a produce is acknowledged once the S3 object holding it is PUT
(docs/wal.md, "S3-WAL mode"; the layout and checks are in s3walobject.py, pure).

A proxy in the client's zone that does not own the partition makes the batch durable in
S3, without sending it across zones, then tells the owner where it is (`S3WalLocation`);
the owner reads it back (`S3WalReader`, s3walreader.py: one GET per object, shared by
the reads of its locations) and sequences it.

`S3WalWriter` group-commits across partitions: appends join the open object until its
batches reach `max_bytes`, `max_delay_s` has passed since its first append, or no append
came for `idle_s` (the clients wait for answers: a longer window only delays them); then
it is sealed and PUT, at most `max_puts_in_flight` at a time. The writer has no task of its own:
every change to its state is synchronous code on the event loop (an append, the
deadline's timer, a PUT's end), so the loop is the one owner and nothing needs a lock.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from proxy.errors import TierproxyError
from proxy.handoff.gc import S3WalReleases
from proxy.handoff.objects import (
    STREAM_ID_MAX,
    U32_MAX,
    Buffer,
    BuiltWalObject,
    S3WalCorruptError,
    S3WalLocation,
    WalObjectBuilder,
    check_writer_id,
    summarize_append,
)
from proxy.handoff.reader import S3WalReader
from proxy.metrics import Stages
from proxy.objects.store import ObjectStore, ObjectStoreError

__all__ = [
    "S3WalClosedError",
    "S3WalCorruptError",
    "S3WalError",
    "S3WalLocation",
    "S3WalMetrics",
    "S3WalPutError",
    "S3WalReader",
    "S3WalWriter",
]

log = logging.getLogger(__name__)
MiB = 1024 * 1024


class S3WalError(TierproxyError):
    """An append was not made durable: nothing was acknowledged, the producer may retry."""


class S3WalPutError(S3WalError):
    """The PUT of the object holding this append failed after the store's own retries.
    Every append of that object fails with it; `retryable` says whether a later append
    may succeed (the store's verdict); `__cause__` is the store's error."""

    def __init__(self, key: str, appends: int, cause: BaseException) -> None:
        self.key = key
        self.appends = appends
        self.retryable = isinstance(cause, ObjectStoreError) and cause.retryable
        reason = str(cause) or type(cause).__name__
        super().__init__(f"S3-WAL PUT of {key} ({appends} appends) failed: {reason}")


class S3WalClosedError(S3WalError):
    """The writer is closed (or closing) and takes no more appends."""


class S3WalMetrics:
    """Prometheus metrics of one writer, on a registry passed in (ProxyMetrics.registry)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = CollectorRegistry(auto_describe=True) if registry is None else registry
        r = self.registry
        self.puts = Counter("tierproxy_s3wal_puts", "S3-WAL object PUTs", ["outcome"], registry=r)
        self.bytes = Counter("tierproxy_s3wal_bytes", "S3-WAL object bytes PUT", registry=r)
        self.appends = Counter(
            "tierproxy_s3wal_appends", "S3-WAL appends by outcome", ["outcome"], registry=r
        )
        self.sealed = Counter(
            "tierproxy_s3wal_objects_sealed",
            "S3-WAL objects closed for PUT, by what closed them (size, time, idle, flush)",
            ["trigger"],
            registry=r,
        )
        self.object_batches = Histogram(
            "tierproxy_s3wal_object_batches",
            "Record batches per S3-WAL object",
            buckets=(1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000),
            registry=r,
        )
        latency = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
        self.put_seconds = Histogram(
            "tierproxy_s3wal_put_seconds",
            "S3-WAL PUT latency, the store's retries included",
            buckets=latency,
            registry=r,
        )
        self.append_seconds = Histogram(
            "tierproxy_s3wal_append_seconds",
            "From append to durable (or failed): what the producer waits",
            buckets=latency,
            registry=r,
        )
        self.deleted = Counter(
            "tierproxy_s3wal_objects_deleted",
            "S3-WAL objects their writer deleted once every append in them was released",
            registry=r,
        )
        self.pending_bytes = Gauge(
            "tierproxy_s3wal_pending_bytes", "Appended bytes not yet PUT", registry=r
        )

    def value(self, name: str, **labels: str) -> float:
        """A sample's current value (0 if absent), for tests and logs."""
        return self.registry.get_sample_value(name, labels) or 0.0


@dataclass(eq=False)
class _Object:
    """One object from its first append until its PUT ended."""

    builder: WalObjectBuilder
    futures: list[asyncio.Future[S3WalLocation]] = field(default_factory=list)
    timer: asyncio.TimerHandle | None = None
    built: BuiltWalObject | None = None
    done: asyncio.Event = field(default_factory=asyncio.Event)
    appended_at: list[float] = field(default_factory=list)  # loop.time(), if stages observed
    last_append: float = 0.0  # loop.time() of the latest append, for the idle seal
    idle_timer: asyncio.TimerHandle | None = None


class S3WalWriter:
    """Appends record batches to S3-WAL objects; `append` returns once they are PUT."""

    def __init__(
        self,
        store: ObjectStore,
        writer_id: str,
        *,
        max_delay_s: float = 0.25,
        idle_s: float = 0.0,
        max_bytes: int = 8 * MiB,
        max_puts_in_flight: int = 4,
        max_pending_bytes: int = 64 * MiB,
        validate: bool = True,
        first_sequence: int = 0,
        metrics: S3WalMetrics | None = None,
        wall_clock: Callable[[], float] = time.time,
        delete_delay_s: float = 1.0,
        stages: Stages | None = None,
    ) -> None:
        """`writer_id`: unique to this process (s3walobject.writer_id_for), never reused;
        `idle_s`: seal the open object once no append came for this long (0: never; only
        `max_delay_s`, `max_bytes` and `flush` seal);
        `max_pending_bytes`: appends wait while this much is appended and not yet PUT;
        `validate`: check each batch's CRC on append (a bad batch raises, goes nowhere);
        `wall_clock`: stamps objects (footer), for garbage collection by age;
        `delete_delay_s`: released objects are deleted in a batch this often;
        `stages`: where an append's time goes (s3wal_window: append to seal, per append;
        s3wal_put, per object; s3wal_append: append to durable, per append)."""
        for name, value in (
            ("max_delay_s", max_delay_s),
            ("max_bytes", max_bytes),
            ("max_puts_in_flight", max_puts_in_flight),
            ("max_pending_bytes", max_pending_bytes),
        ):
            if isinstance(value, bool) or not value > 0:
                raise ValueError(f"S3-WAL writer {name}={value!r}: must be positive")
        if not max_bytes <= max_pending_bytes <= U32_MAX:
            raise ValueError(
                f"S3-WAL writer max_pending_bytes={max_pending_bytes}: must be from max_bytes "
                f"({max_bytes}) to 2**32-1 (an append's largest size; a block's size is a u32)"
            )
        self.writer_id = check_writer_id(writer_id)
        self.store = store
        self.max_delay_s = max_delay_s
        if isinstance(idle_s, bool) or not idle_s >= 0:
            raise ValueError(f"S3-WAL writer idle_s={idle_s!r}: must be 0 or more")
        self.idle_s = idle_s
        self.max_bytes = max_bytes
        self.max_puts_in_flight = max_puts_in_flight
        self.max_pending_bytes = max_pending_bytes
        self.validate = validate
        self.metrics = metrics or S3WalMetrics()
        self.stages = stages
        self._wall_clock = wall_clock
        self._next_sequence = first_sequence
        self._open: _Object | None = None
        self._sealed: collections.deque[_Object] = collections.deque()  # waiting for a slot
        self._in_flight: set[_Object] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._pending_bytes = 0
        self._room = asyncio.Event()
        self._room.set()
        self._closing = False
        # what the owners answered; a released object is deleted (s3walgc.py)
        self.releases = S3WalReleases(
            store, delay_s=delete_delay_s, on_deleted=self.metrics.deleted.inc
        )

    def release(self, location: S3WalLocation) -> None:
        """The owner answered the notification of this append (or it failed): its
        object no longer needs to keep it."""
        self.releases.release(location.object_key)

    @property
    def pending_bytes(self) -> int:
        """Bytes appended and not yet PUT (or failed)."""
        return self._pending_bytes

    @property
    def puts_in_flight(self) -> int:
        return len(self._in_flight)

    @property
    def next_sequence(self) -> int:
        return self._next_sequence

    async def __aenter__(self) -> S3WalWriter:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def append(self, stream_id: int, records: Buffer) -> S3WalLocation:
        """Make a run of record batches (one Produce partition's `records`) durable in S3.

        Returns where they are once the object is PUT. Raises S3WalPutError if that PUT
        failed, S3WalClosedError if the writer closed first; a bad batch raises
        CorruptBatchError (a ValueError) at once. `records` is not copied: it must not
        change until this returns. A cancelled append may still be PUT, like any
        unacknowledged write; nothing refers to it."""
        if self._closing:
            raise S3WalClosedError(f"S3-WAL writer {self.writer_id} is closed")
        if not 0 <= stream_id <= STREAM_ID_MAX:
            raise ValueError(f"stream id {stream_id} is not in 0..2**63-1")
        summary = summarize_append(records, validate=self.validate)
        if summary.size > self.max_pending_bytes:
            raise ValueError(
                f"an S3-WAL append of {summary.size} bytes is over max_pending_bytes "
                f"({self.max_pending_bytes})"
            )
        loop = asyncio.get_running_loop()
        started = loop.time()
        while self._pending_bytes and self._pending_bytes + summary.size > self.max_pending_bytes:
            self._room.clear()
            await self._room.wait()
            if self._closing:
                raise S3WalClosedError(f"S3-WAL writer {self.writer_id} closed while waiting")
        obj = self._open
        if obj is not None and obj.builder.data_size + summary.size > self.max_bytes:
            self._seal("size")  # it would grow past max_bytes: this append starts the next
            obj = None
        if obj is None:
            obj = self._open_object(loop)
        obj.builder.add(stream_id, records, summary)
        future: asyncio.Future[S3WalLocation] = loop.create_future()
        obj.futures.append(future)
        if self.stages is not None:
            obj.appended_at.append(loop.time())
        if self.idle_s:
            obj.last_append = loop.time()
            if obj.idle_timer is None:
                obj.idle_timer = loop.call_later(self.idle_s, self._idle, obj)
        self._pending_bytes += summary.size
        self.metrics.pending_bytes.set(self._pending_bytes)
        if obj.builder.data_size >= self.max_bytes:
            self._seal("size")
        try:
            return await future
        finally:
            waited = loop.time() - started
            self.metrics.append_seconds.observe(waited)
            if self.stages is not None:
                self.stages.observe("s3wal_append", waited)

    async def flush(self) -> None:
        """Seal the open object now; return once every object sealed so far has ended
        (PUT or failed; the appends see which)."""
        if self._open is not None:
            self._seal("flush")
        waiting = [obj.done.wait() for obj in (*self._sealed, *self._in_flight)]
        if waiting:
            await asyncio.gather(*waiting)

    async def close(self) -> None:
        """Take no more appends, PUT what was appended, wait for every PUT to end."""
        self._closing = True
        self._room.set()  # waiters for room see the writer is closing
        await self.flush()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.releases.close()

    # -- state changes: synchronous, on the loop --------------------------------------------

    def _open_object(self, loop: asyncio.AbstractEventLoop) -> _Object:
        obj = _Object(WalObjectBuilder(self.writer_id, self._next_sequence))
        self._next_sequence += 1
        obj.timer = loop.call_later(self.max_delay_s, self._deadline, obj)
        self._open = obj
        return obj

    def _deadline(self, obj: _Object) -> None:
        if self._open is obj:
            self._seal("time")

    def _idle(self, obj: _Object) -> None:
        """The idle timer: one per object, moved on (not re-made per append) while
        appends keep coming."""
        obj.idle_timer = None
        if self._open is not obj:
            return
        loop = asyncio.get_running_loop()
        quiet = loop.time() - obj.last_append
        if quiet >= self.idle_s * 0.999:  # timers may fire a hair early
            self._seal("idle")
        else:
            obj.idle_timer = loop.call_later(self.idle_s - quiet, self._idle, obj)

    def _seal(self, trigger: str) -> None:
        obj = self._open
        assert obj is not None
        self._open = None
        if obj.timer is not None:
            obj.timer.cancel()
        if obj.idle_timer is not None:
            obj.idle_timer.cancel()
            obj.idle_timer = None
        obj.built = obj.builder.build(created_ms=int(self._wall_clock() * 1000))
        self.metrics.sealed.labels(trigger).inc()
        self.metrics.object_batches.observe(obj.builder.batches)
        if self.stages is not None:
            now = asyncio.get_running_loop().time()
            for appended in obj.appended_at:  # per append: what it waited for the seal
                self.stages.observe("s3wal_window", now - appended)
        self._sealed.append(obj)
        self._start_puts()

    def _start_puts(self) -> None:
        while self._sealed and len(self._in_flight) < self.max_puts_in_flight:
            obj = self._sealed.popleft()
            self._in_flight.add(obj)
            task = asyncio.get_running_loop().create_task(self._put(obj))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _put(self, obj: _Object) -> None:
        built = obj.built
        assert built is not None
        loop = asyncio.get_running_loop()
        started = loop.time()
        try:
            await self.store.put(built.key, built.pieces)
        except BaseException as exc:  # every waiter must hear of it, whatever it was
            if not isinstance(exc, ObjectStoreError | asyncio.CancelledError):
                log.exception("S3-WAL PUT of %s failed unexpectedly", built.key)
            self.metrics.puts.labels("failed").inc()
            self.metrics.appends.labels("failed").inc(len(obj.futures))
            for future in obj.futures:
                if not future.done():
                    error = S3WalPutError(built.key, len(obj.futures), exc)
                    error.__cause__ = exc
                    future.set_exception(error)
            if isinstance(exc, asyncio.CancelledError):
                raise
        else:
            self.metrics.puts.labels("ok").inc()
            self.metrics.bytes.inc(built.size)
            self.metrics.appends.labels("ok").inc(len(obj.futures))
            cancelled = 0  # appends no one waits for: no one will release them
            for future, location in zip(obj.futures, built.locations, strict=True):
                if not future.done():
                    future.set_result(location)
                else:
                    cancelled += 1
            self.releases.hold(built.key, len(obj.futures), cancelled)
        finally:
            took = loop.time() - started
            self.metrics.put_seconds.observe(took)
            if self.stages is not None:
                self.stages.observe("s3wal_put", took)
            self._in_flight.discard(obj)
            self._pending_bytes -= built.data_size
            self.metrics.pending_bytes.set(self._pending_bytes)
            self._room.set()
            obj.done.set()
            self._start_puts()
