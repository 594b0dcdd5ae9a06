"""The Kafka adapter of the fleet's metadata (docs/metadata.md, "The Kafka adapter").

The pure modules judge records; this one moves them. A `ShardOwner` is a shard's one
writer: a transactional producer whose transactional.id is the shard's, so that starting
it fences the previous owner; it reads the partition to its end, waits for a last owner
that did not release the shard, claims a new epoch, and writes what the rules accept, one
transaction per write, until it is closed or releases the shard. Its reader, like every
proxy's, is a `ShardReader` (metareader.py). Who owns which shard is the consumer group's
answer, and the topic is created there (metagroup.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import logging
from collections.abc import Callable, Sequence

from aiokafka import AIOKafkaProducer
from aiokafka.errors import InvalidProducerEpoch, ProducerFenced

from proxy.clock import now_ms
from proxy.metadata.client_start import start_client
from proxy.metadata.codec import encode
from proxy.metadata.reader import ShardReader
from proxy.metadata.records import MetadataError, Record, ShardClaim, ShardRelease
from proxy.metadata.rules import Outcome, Verdict, refuse
from proxy.metadata.state import MetadataState
from proxy.metadata.streams import transactional_id

__all__ = ["ShardFenced", "ShardOwner", "ShardReader"]

log = logging.getLogger("tierproxy.metadata")


class ShardFenced(MetadataError):
    """This owner no longer writes its shard: Kafka fenced its producer (another owner
    started), a newer claim was read, it was closed, or a write failed midway. A write
    that raises this was not committed, unless it failed or was cancelled after its commit
    was sent; the next owner's read to the end settles that."""

    def __init__(self, shard: int, reason: str) -> None:
        super().__init__(f"shard {shard}: no longer its owner: {reason}")
        self.shard = shard
        self.reason = reason


def _retrieve_transaction_failure(producer: AIOKafkaProducer) -> None:
    # After a fatal error (fencing) aiokafka fails the transaction's future and each
    # pending batch's drain future, which nothing awaits unless a commit or a flush runs;
    # retrieve them so that asyncio does not log "Future exception was never retrieved".
    # These are aiokafka's internals: found by getattr, left alone if they are not there.
    manager = getattr(producer, "_txn_manager", None)
    futures = [manager.wait_for_transaction_end()] if manager is not None else []
    accumulator = getattr(producer, "_message_accumulator", None)
    for batches in getattr(accumulator, "_batches", {}).values():
        futures += [getattr(batch, "_drain_waiter", None) for batch in batches]
    for future in futures:
        if isinstance(future, asyncio.Future):
            _retrieve(future)


def _retrieve(future: asyncio.Future) -> None:
    if future.done() and not future.cancelled():
        future.exception()


class ShardOwner:
    """The one writer of shard `shard`, named `name` in its claim.

    `start` becomes the owner: the producer's InitProducerId fences the previous owner
    (Kafka bumps the epoch of the transactional.id and aborts its open transaction), the
    reader reads the partition to its end, and, once the last owner released the shard or
    is this very member, a ShardClaim of a new epoch is written and read back. A last owner
    that did not release it may hold records it acknowledged in its own WAL only, so the
    start waits for it (`held_by`), for ever or for `unclean_takeover_after_s`. `write`
    then checks records with the rules and writes the accepted ones in one transaction.
    Writes run one at a time; `close` waits for the one in flight; `release` writes a
    ShardRelease and closes."""

    def __init__(
        self,
        kafka_settings: dict,
        topic: str,
        shard: int,
        shard_count: int,
        name: str,
        *,
        clock: Callable[[], int] = now_ms,
        transaction_timeout_ms: int = 60000,
        unclean_takeover_after_s: float | None = None,
        hold_recheck_s: float = 0.5,
    ) -> None:
        self.topic = topic
        self.shard = shard
        self.name = name
        self.epoch = 0  # the epoch of this owner's claim
        # the last claim's owner when this one claimed ("": none): another member's name
        # means this member's own records of the shard's streams are from before it
        self.previous_owner = ""
        self.reader = ShardReader(
            kafka_settings, topic, shard, shard_count, on_record=self._observed
        )
        self._kafka = kafka_settings
        self._clock = clock
        self._transaction_timeout_ms = transaction_timeout_ms
        self._unclean_takeover_after_s = unclean_takeover_after_s
        self._hold_recheck_s = hold_recheck_s
        self._held_by: str | None = None
        self._producer: AIOKafkaProducer | None = None
        self._lock = asyncio.Lock()
        self._lost: str | None = "not started"
        self._lost_event = asyncio.Event()
        self._awaited: dict[int, Verdict | None] = {}  # offsets written, verdicts read back
        self._written_to = 0  # the offset after this owner's last committed record
        self._abort_on_close = False
        self._closing: asyncio.Future[None] | None = None
        self.stage = "not started"  # what `start` does now, for a log line if it is slow

    @property
    def state(self) -> MetadataState:
        return self.reader.state

    @property
    def owning(self) -> bool:
        return self._lost is None

    @property
    def held_by(self) -> str | None:
        """While `start` waits: the member it waits for (the last owner, which did not
        release the shard). None otherwise."""
        return self._held_by

    async def lost(self) -> str:
        """Wait until this owner stops being the owner; returns why."""
        await self._lost_event.wait()
        assert self._lost is not None
        return self._lost

    async def start(self) -> None:
        """Fence the previous owner, read to the end, wait for a last owner that did not
        release the shard, and claim. Raises ShardFenced if the claim is refused or the
        owner is closed first. A cancelled start leaves the owner to `close`; one cancelled
        while it claims finishes the claim first and then raises CancelledError with the
        owner owning, so that its caller can `release` what it claimed."""
        async with self._lock:
            self._producer = AIOKafkaProducer(
                **self._kafka,
                transactional_id=transactional_id(self.shard, self.topic),
                enable_idempotence=True,
                acks="all",
                linger_ms=0,
                transaction_timeout_ms=self._transaction_timeout_ms,
            )
            # InitProducerId: the previous owner is fenced
            self.stage = "fencing the last owner: InitProducerId"
            await start_client(self._producer)
            self.stage = "starting its reader"
            await self.reader.start()
        loop = asyncio.get_running_loop()
        waiting_since: float | None = None
        while True:
            async with self._lock:  # close() runs between two looks, never during one
                if self._closing is not None:
                    raise ShardFenced(self.shard, "closed before it claimed")
                self.stage = "reading the shard to its end"
                await self.reader.read_to_end()  # everything the previous owner committed
                holder = self._holder()
                if holder is not None and waiting_since is None:
                    waiting_since = loop.time()
                    self._warn_held(holder)
                limit = self._unclean_takeover_after_s
                if holder is not None and limit is not None:
                    assert waiting_since is not None
                    if loop.time() - waiting_since >= limit:
                        log.warning(
                            "%s takes metadata shard %d over from %s uncleanly after %.1f s: "
                            "what %s acknowledged and did not upload is lost",
                            *(self.name, self.shard, holder, limit, holder),
                        )
                        holder = None
                self._held_by = holder
                if holder is None:
                    self.stage = "writing its claim"
                    await self._claim()
                    self.stage = "owning"
                    return
            await self._pause()

    def _holder(self) -> str | None:
        """The member this owner must wait for: the last claim's owner, when it did not
        release the shard and is another member."""
        state = self.state
        if state.released or state.owner in ("", self.name):
            return None
        return state.owner

    def _warn_held(self, holder: str) -> None:
        log.warning(
            "%s waits for %s to come back before it claims metadata shard %d: %s owned it "
            "and did not release it, so its WAL may hold records it acknowledged and did not "
            "upload. Restart that proxy with fleet.name %s and its WAL directory, or set "
            "tiering.unclean_takeover_after_s to take the shard over and lose those records",
            *(self.name, holder, self.shard, holder, holder),
        )

    async def _pause(self) -> None:
        """Wait `hold_recheck_s`, or less if the owner is closed. A cancellation that
        aiokafka swallowed in a start or stop still ends the wait here."""
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            raise asyncio.CancelledError
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self._hold_recheck_s):
                await self._lost_event.wait()

    async def _claim(self) -> None:
        state = self.state
        claim = ShardClaim(state.generation, state.epoch + 1, self.name, self._clock())
        self.epoch, self._lost, self.previous_owner = claim.epoch, None, state.owner
        # A claim cut short by a cancellation (a revoke) may still be committed, and the
        # shard would then wait for this member, which would not know it had claimed it.
        # So the claim runs to its end, and the cancellation is raised after it, with
        # this owner owning: its caller releases it (or closes it, and the shard is dirty).
        writing = asyncio.ensure_future(self._commit([encode(claim)]))
        cancelled = False
        while True:
            try:
                [verdict] = await asyncio.shield(writing)
                break
            except asyncio.CancelledError:
                if writing.done():
                    raise
                cancelled = True
        if not verdict.accepted:
            self._lose(f"its claim of epoch {claim.epoch} was refused: {verdict.reason}")
            raise ShardFenced(self.shard, self._lost or "")
        log.info("%s owns metadata shard %d at epoch %d", self.name, self.shard, self.epoch)
        if cancelled:
            raise asyncio.CancelledError

    async def write(self, records: Sequence[Record]) -> list[Verdict]:
        """Check each record against the state (and the accepted records before it), write
        the accepted ones in one transaction, and return each record's verdict once the
        transaction is committed and read back: the verdict every reader reaches."""
        async with self._lock:
            self._check_owning()
            await self.reader.read_to(self._written_to)  # a read-back cut short by a cancel
            for record in records:
                epoch = getattr(record, "epoch", self.epoch)
                if isinstance(record, ShardClaim | ShardRelease) or epoch != self.epoch:
                    raise ValueError(
                        f"{type(record).__name__} of epoch {epoch}: shard {self.shard}'s "
                        f"owner writes at its epoch {self.epoch}, claims only at start and "
                        "releases with release()"
                    )
            verdicts = self._judge(records)
            accepted = [encode(r) for r, v in zip(records, verdicts, strict=True) if v.accepted]
            if not accepted:
                return verdicts
            read_back = iter(await self._commit(accepted))
            return [next(read_back) if v.accepted else v for v in verdicts]

    async def checkpoint(self) -> int:
        """Rewrite the live state as the next generation (one transaction), then tombstone
        the retired generations' keys (another). Returns the generation now current."""
        async with self._lock:
            self._check_owning()
            await self.reader.read_to(self._written_to)
            records = self.state.checkpoint_records(self.name, self.epoch, self._clock())
            verdicts = await self._commit(records)
            if not verdicts[-1].accepted:
                raise RuntimeError(f"shard {self.shard}: checkpoint refused: {verdicts[-1].reason}")
            retired = sorted(self.state.retired_keys())
            if retired:
                await self._commit([(key, None) for key in retired])
            return self.state.generation

    async def release(self) -> None:
        """Give the shard up cleanly: write a ShardRelease in a transaction of its own,
        read it back, and close. The next owner then claims at once. Call it only once
        everything this owner acknowledged for the shard's streams is in committed objects.
        Raises ShardFenced, and closes all the same, when it is no longer the owner."""
        try:
            async with self._lock:
                self._check_owning()
                await self.reader.read_to(self._written_to)
                state = self.state
                record = ShardRelease(state.generation, self.epoch, self.name, self._clock())
                verdict = state.check(record)
                if verdict.accepted:
                    [verdict] = await self._commit([encode(record)])
                if verdict.outcome is Outcome.REFUSE:
                    self._lose(f"its release was refused: {verdict.reason}")
                    raise ShardFenced(self.shard, self._lost or "")
                self._lost = "released"
                self._lost_event.set()
                log.info(
                    "%s released metadata shard %d at epoch %d", self.name, self.shard, self.epoch
                )
        finally:
            await self.close()

    async def close(self) -> None:
        """Stop being the owner: wait for a write in flight, then stop the clients. Safe to
        call twice, or from a task being cancelled (the closing goes on regardless)."""
        if self._closing is None:
            self._closing = asyncio.ensure_future(self._close())
        await asyncio.shield(self._closing)

    async def _close(self) -> None:
        async with self._lock:  # a write in flight ends first
            self._lose("closed")
            self._held_by = None
        if self._producer is not None:
            if self._abort_on_close:  # a write was cancelled before its commit
                try:
                    async with asyncio.timeout(5):
                        await self._producer.abort_transaction()
                except Exception as exc:  # best effort: the next owner's start aborts it too
                    log.warning("shard %d: could not abort a transaction: %r", self.shard, exc)
            _retrieve_transaction_failure(self._producer)
            await self._producer.stop()
        await self.reader.close()

    def _check_owning(self) -> None:
        if self._lost is None and self.state.epoch > self.epoch:  # its reader saw a claim
            self._lose(f"claimed at epoch {self.state.epoch} by {self.state.owner}")
        if self._lost is not None:
            raise ShardFenced(self.shard, self._lost)

    def _lose(self, reason: str) -> None:
        if self._lost is None:
            self._lost = reason
            log.warning("%s lost metadata shard %d: %s", self.name, self.shard, reason)
        self._lost_event.set()

    def _judge(self, records: Sequence[Record]) -> list[Verdict]:
        """Each record's verdict against the state after the accepted records before it.
        Several records are judged on a copy, where the accepted ones are applied."""
        state = self.state
        if len(records) == 1:
            return [state.check(records[0])]
        scratch = copy.deepcopy(state)
        verdicts = []
        for record in records:
            verdict = scratch.check(record)
            if verdict.accepted:
                scratch.apply(*encode(record), scratch.next_offset)
            verdicts.append(verdict)
        return verdicts

    async def _commit(self, pairs: Sequence[tuple[bytes, bytes | None]]) -> list[Verdict]:
        """Write (key, value) pairs in one transaction; their verdicts as read back."""
        producer = self._producer
        assert producer is not None
        phase = "begin"
        try:
            await producer.begin_transaction()
            phase = "send"
            futures = []
            for key, value in pairs:
                future = await producer.send(self.reader.topic, value, key, partition=self.shard)
                future.add_done_callback(_retrieve)  # a failed send fails the others too
                futures.append(future)
            results = await asyncio.gather(*futures, return_exceptions=True)
            failure = next((r for r in results if isinstance(r, BaseException)), None)
            if failure is not None:
                raise failure
            offsets = [r.offset for r in results]
            self._awaited = dict.fromkeys(offsets)
            phase = "commit"
            await producer.commit_transaction()
            self._written_to = offsets[-1] + 1
        except asyncio.CancelledError:
            self._abort_on_close = phase == "send"
            self._lose(f"a write was cancelled ({phase} of its transaction)")
            raise
        except (ProducerFenced, InvalidProducerEpoch) as exc:
            self._lose(
                f"Kafka fenced its producer ({type(exc).__name__}): another one started with "
                f"transactional.id {transactional_id(self.shard, self.topic)}, "
                "or its transaction timed out"
            )
            raise ShardFenced(self.shard, self._lost or "") from exc
        except Exception as exc:
            self._lose(f"its transaction failed at {phase}: {exc!r}")
            raise ShardFenced(self.shard, self._lost or "") from exc
        await self.reader.read_to(self._written_to)
        missing = refuse("not read back")
        verdicts = [self._awaited.get(offset) or missing for offset in offsets]
        self._awaited = {}
        if self.state.epoch > self.epoch:  # a claim of a newer epoch was read
            self._lose(f"claimed at epoch {self.state.epoch} by {self.state.owner}")
            if any(v.outcome is Outcome.REFUSE for v in verdicts):
                raise ShardFenced(self.shard, f"{self._lost}; this write was refused")
        return verdicts

    def _observed(self, offset: int, verdict: Verdict) -> None:
        if offset in self._awaited:
            self._awaited[offset] = verdict
