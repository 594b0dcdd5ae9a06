"""A tiered partition's batch on its way to the owner of its stream, another proxy
(docs/tiering.md, "In the proxy"): the sender's side (`ToOwner`) and the owner's
(`AtOwner`).

`notify: s3` PUTs the batch to an S3-WAL object and sends its location, `notify: direct`
sends the bytes; the owner's answer is the client's. An unreachable owner answers
NOT_LEADER_OR_FOLLOWER (retriable). A stream's batches reach its partition in the order
they came (a producer's sequence numbers must arrive in order), on both sides, however
the S3 PUTs and GETs between them interleave.

Across an owner change too. A batch is handed to the owner the sender knew when it came;
if the stream's owner changes while an earlier batch is still on its way to the old one,
the next batch would reach the new owner before the old one's answer is known: its
refusal (NOT_LEADER_OR_FOLLOWER, a drop in `SequenceHoles`) would come too late for the
hole the next batch carries, so the new owner would see a gap no drop explains and answer
OUT_OF_ORDER_SEQUENCE_NUMBER, or, for a producer it does not know, take the later batch
first. Kafka's old leader refuses both and the client resends them in order. So a hand-off
to another owner than an earlier one of the stream still unanswered waits for that answer
(recorded in `holes` first), holding the stream's later hand-offs behind it; and a batch
for a stream just taken over here waits the same way before it reaches the partition
(`here_after_handoffs`).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from kio.schema.errors import ErrorCode

from proxy.handoff.objects import S3WalLocation, encode_location
from proxy.handoff.writer import S3WalReader, S3WalWriter
from proxy.metadata.state import MetadataState
from proxy.metadata.topic_index import TieredTopic
from proxy.metrics import Stages
from proxy.partition.owner import TieredPartition
from proxy.partition.partition_set import PartitionSet
from proxy.partition.produce_rules import ProduceRules
from proxy.partition.referenced import ReferencingLog
from proxy.partition.rules import ProduceResult
from proxy.partition.sequence_holes import ProducerBatch, SequenceHoles
from proxy.partition.txn_gate import Verify
from proxy.peer.clients import Address, PeerClients, PeerUnavailable
from proxy.peer.codec import REFERENCE_PROTOCOL, for_peer, frame_size
from proxy.peer.messages import AppendRequest, AppendResponse, HeldRequest
from proxy.records.batches import (
    HEADER_SIZE,
    CorruptBatchError,
    read_batch_header,
    validate_header,
)
from proxy.tiered.in_order import InOrder

log = logging.getLogger("tierproxy.tiering")

ACKS0_RELEASE_DELAY_S = 30.0  # an acks=0 batch's S3-WAL location is released this late


@dataclass(frozen=True, slots=True)
class Part:
    """One partition of a Produce request for a tiered topic, on its way to the owner."""

    topic: TieredTopic
    partition: int
    stream: int
    batch: ProducerBatch | None  # whose batches (sequence_holes.py); None for acks=0
    records: memoryview
    acks: int
    timeout_ms: int
    rules: ProduceRules | None = None  # the topic's produce checks (produce_rules.py)
    # a transactional Produce's, for the owner's verification (KIP-890); None: not one
    transactional_id: str | None = None
    produce_version: int = -1


def not_owner(message: str) -> ProduceResult:
    return ProduceResult(ErrorCode.not_leader_or_follower, error_message=message)


def start_failed(error: BaseException) -> str:
    """Why a stream owned here is not served: its start failed (`PartitionSet.not_rebuilt`,
    tried again by the cutover loop)."""
    return f"its start on this owner failed ({error!r}); it is tried again"


class SenderHost(Protocol):
    """What the sender's side needs of the tiered service."""

    @property
    def holes(self) -> SequenceHoles: ...

    @property
    def peers(self) -> PeerClients: ...

    @property
    def s3wal(self) -> S3WalWriter | None: ...

    @property
    def stages(self) -> Stages: ...

    def state(self, stream: int) -> MetadataState: ...

    def owner_address(self, stream: int) -> tuple[str, int] | None: ...

    def peer_protocol(self, member: str) -> int: ...

    def count_peer_bytes(self, address: tuple[str, int], direction: str, size: int) -> None: ...

    @property
    def sends_headers(self) -> bool: ...

    def heard_protocol(self, member: str) -> int | None: ...

    def peer_address(self, member: str) -> tuple[str, int] | None: ...


class ToOwner:
    def __init__(self, service: SenderHost) -> None:
        self._service = service
        # per stream, the hand-offs in the order they came: each written after the last
        self._sends = InOrder()
        # per stream, the hand-offs made and not answered yet: (owner, the call); a call's
        # answer is in `holes` before anything waiting on it wakes (`_handed`)
        self._unanswered: dict[int, list[tuple[Address, asyncio.Future[Any]]]] = {}
        # S3-WAL locations an owner may hold by reference, released when it says so
        self.held = HeldLocations(service)

    def busy(self, stream: int) -> bool:
        """Whether a hand-off of `stream` is under way (waiting, or not answered yet)."""
        return self._sends.busy(stream) or stream in self._unanswered

    async def here_after_handoffs(
        self,
        stream: int,
        batch: ProducerBatch | None,
        timeout_ms: int,
        produce: Callable[[], Awaitable[ProduceResult | None]],
    ) -> ProduceResult | None:
        """`produce` (the stream's partition here) once every earlier hand-off of the
        stream is answered: the stream was taken over here while batches were on their
        way to its old owner. Started in this turn, so later calls stay behind it. Not
        answered within the request's `timeout_ms`: NOT_LEADER_OR_FOLLOWER, a drop."""
        turn = self._sends.take(stream)
        try:
            await turn.ready()
            if not await self._answered_elsewhere(stream, None, timeout_ms):
                self._service.holes.dropped(stream, batch)  # before the next one goes
                return not_owner(f"stream {stream}: its hand-offs to the old owner unanswered")
            call = asyncio.ensure_future(produce())
            await asyncio.sleep(0)  # its first step queues the batch, before the next's
        finally:
            turn.end()
        return await call

    async def _answered_elsewhere(
        self, stream: int, address: Address | None, timeout_ms: int
    ) -> bool:
        """Until every unanswered hand-off of `stream` to an owner other than `address`
        (None: any owner) is answered, at most `timeout_ms` (the waiting request's own);
        False if that ran out. Never cancels them."""
        pending = self._unanswered.get(stream)
        if pending is None:
            return True
        waiting = [call for owner, call in pending if owner != address and not call.done()]
        if not waiting:
            return True
        _, left = await asyncio.wait(waiting, timeout=max(timeout_ms, 0) / 1000)
        return not left

    def _handed(
        self,
        stream: int,
        address: Address,
        batch: ProducerBatch | None,
        call: asyncio.Future[ProduceResult | None],
        release: Callable[[], None] | None,
        held: Callable[[], None] | None = None,
    ) -> None:
        """`call` (a hand-off of `batch`) is unanswered until it ends; then its S3-WAL
        location is released (`release`) and its answer recorded in `holes` (no answer: a
        drop) before anything waiting on it wakes: a callback of the call, added first, so
        it runs whatever becomes of `send`, and before the waiters' own. `held`: the
        hand-off carried the batch's header, so the owner may have taken it by reference:
        answered `referenced`, or not answered, the location goes to `held` instead (kept
        until the owner says it no longer needs it)."""
        entry = (address, call)
        self._unanswered.setdefault(stream, []).append(entry)
        holes = self._service.holes

        def answered(call: asyncio.Future[ProduceResult | None]) -> None:
            try:
                failed = call.cancelled() or call.exception() is not None
                result = None if failed else call.result()
                if held is not None and (result is None or result.referenced):
                    held()  # the owner's WAL may need the object: asked before deleting
                elif release is not None:
                    release()  # answered: the owner read it first; failed: nothing acked
                if result is not None:
                    holes.observe(stream, batch, result.error_code)  # the caller's record too
                else:
                    holes.dropped(stream, batch)  # none for acks=0 (no batch): a no-op
            finally:
                pending = self._unanswered.get(stream)
                if pending is not None:
                    pending.remove(entry)
                    if not pending:
                        del self._unanswered[stream]

        call.add_done_callback(answered)

    async def send(self, part: Part) -> ProduceResult | None:
        """The owner's answer to `part` (None for acks=0)."""
        service = self._service
        topic, partition, stream, batch = part.topic, part.partition, part.stream, part.batch
        records, acks, timeout_ms = part.records, part.acks, part.timeout_ms
        address = service.owner_address(stream)
        if address is None:
            return not_owner(f"{topic.name}-{partition}: no live owner right now")
        owner = service.state(stream).owner  # with `address`: whom the hand-off goes to
        protocol = service.peer_protocol(owner)
        # A stream's batches reach the owner in the order they came (producer sequence
        # numbers): each call is made after the previous one's, which PeerClients writes
        # first, whichever S3-WAL PUT ends first.
        turn = self._sends.take(stream)
        location: S3WalLocation | None = None  # released once the owner answered: s3walgc.py
        inline: memoryview | None = None  # or the records themselves (notify: direct)
        s3wal, holes = service.s3wal, service.holes
        call: asyncio.Future[ProduceResult | None] | None = None
        header: bytes | None = None  # for an owner that may take it by reference
        try:
            if s3wal is not None:
                location = await s3wal.append(stream, records)
                if protocol >= REFERENCE_PROTOCOL and service.sends_headers:
                    header = _header_to_send(part)
            else:
                inline = records
            await turn.ready()
            if not await self._answered_elsewhere(stream, address, timeout_ms):
                # an earlier batch still on its way to the old owner: its fate unknown
                holes.dropped(stream, batch)  # before the stream's next hand-off goes
                return not_owner(f"{topic.name}-{partition}: waiting on the last owner")
            called = time.perf_counter()
            call = asyncio.ensure_future(
                service.peers.append(
                    address,
                    stream,
                    acks,
                    timeout_ms,
                    records=inline,
                    location=location,
                    batch=batch,
                    hole=lambda: holes.hole_before(stream, batch),
                    on_lost=lambda: holes.dropped(stream, batch),
                    peer_protocol=protocol,
                    transactional_id=part.transactional_id,
                    produce_version=part.produce_version,
                    header=header,
                    member=owner,  # the header only to a connection known to reach it
                )
            )
            release = held = None
            if location is not None and s3wal is not None:
                release = functools.partial(_release_location, s3wal, location, acks)
                if header is not None:
                    held = functools.partial(self.held.add, owner, location)
            self._handed(stream, address, batch, call, release, held)  # the next one sees it
            await asyncio.sleep(0)  # its first step queues the request, before the next's
        except CorruptBatchError as exc:  # the S3-WAL writer checks each batch's CRC
            return ProduceResult(
                ErrorCode.corrupt_message, error_message=str(exc)
            )  # the owner's answer
        except Exception as exc:  # the S3-WAL PUT failed, or the batch is invalid
            log.warning("produce to %s-%d failed: %r", topic.name, partition, exc)
            holes.dropped(stream, batch)  # before the next hand-off of the stream goes
            return ProduceResult(
                ErrorCode.kafka_storage_error, error_message=f"could not hand the batch over: {exc}"
            )
        finally:
            turn.end()
            if call is None and location is not None and s3wal is not None:
                s3wal.release(location)  # never handed over (a call made releases it itself)
        txn = part.transactional_id if batch is not None else None
        request = for_peer(
            AppendRequest(
                0,
                stream,
                acks,
                timeout_ms,
                records=inline,
                location=location,
                batch=batch,
                transactional_id=txn,
                produce_version=part.produce_version if txn is not None else -1,
                header=header,
            ),
            protocol,
        )
        service.count_peer_bytes(address, "to_owner", frame_size(request))
        try:
            result = await call
            service.stages.since("notify", called)  # to the owner and back: its whole work
        except (PeerUnavailable, TimeoutError, OSError) as exc:
            return not_owner(f"{topic.name}-{partition}: owner at {address}: {exc}")
        if result is not None:
            service.count_peer_bytes(
                address, "from_owner", frame_size(AppendResponse.from_result(0, result))
            )
        return result


def _header_to_send(part: Part) -> bytes | None:
    """The header the owner may order the batch by (docs/wal.md, "The owner answering
    from the notification"): for one batch, not transactional, with acks, on a topic
    whose timestamps the owner does not stamp; None otherwise (the owner reads it)."""
    if part.acks == 0 or part.transactional_id is not None:
        return None
    if part.rules is None or part.rules.log_append_time:
        return None
    records = part.records
    try:
        header = read_batch_header(records)
    except CorruptBatchError:
        return None
    if header.size != len(records) or header.is_transactional:
        return None
    return bytes(records[:HEADER_SIZE])


class HeldLocations:
    """S3-WAL locations their owner may still need (it answered `referenced`, or did not
    answer a hand-off that carried the header): per owner, asked about together with
    `PeerClients.held` until it releases them, then released to the writer for deletion.
    A proxy that stops leaves what it held to the orphan sweep (`s3wal_retention_s`).
    An owner heard from at a level below REFERENCE_PROTOCOL (rolled back) holds none:
    its WAL cannot hold references. One not heard from is not asked until it is."""

    ASK_WAIT_MS = 1000  # how long the owner may wait for them to be released, per ask
    MAX_ASKED = 1000  # locations per ask
    RETRY_FIRST_S = 1.0  # after an owner did not answer, doubling up to RETRY_MAX_S
    RETRY_MAX_S = 30.0

    def __init__(self, service: SenderHost) -> None:
        self._service = service
        # per owner, by its name: asked wherever the fleet says it is now (a member back
        # at another address still holds them), and only if the proxy there is that
        # member (`PeerClients.held`): another one given its old address knows none
        self._held: dict[str, list[S3WalLocation]] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._closed = False
        self.count = 0  # locations held, an int /metrics reads from its own thread

    def __len__(self) -> int:
        return self.count

    def add(self, member: str, location: S3WalLocation) -> None:
        if self._closed:  # stopping: left to the orphan sweep
            return
        self._held.setdefault(member, []).append(location)
        self.count += 1
        if member not in self._tasks:
            task = asyncio.get_running_loop().create_task(self._ask(member))
            self._tasks[member] = task

    async def _ask(self, member: str) -> None:
        service = self._service
        delay = self.RETRY_FIRST_S
        try:
            while held := self._held.get(member):
                level = service.heard_protocol(member)
                address = service.peer_address(member)
                if level is not None and level < REFERENCE_PROTOCOL:
                    released: Sequence[int] = range(len(held))  # it holds no reference
                    asked = list(held)
                elif level is None or address is None:  # not heard from, not live: later
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, self.RETRY_MAX_S)
                    continue
                else:
                    asked = held[: self.MAX_ASKED]
                    try:  # only if the proxy at `address` is `member` (PeerClients.held)
                        released = await service.peers.held(
                            address, asked, self.ASK_WAIT_MS, peer_protocol=level, member=member
                        )
                    except Exception as exc:  # away, refused, another there: asked later
                        log.debug("owner %s at %s: held request failed: %r", member, address, exc)
                        await asyncio.sleep(delay)
                        delay = min(delay * 2, self.RETRY_MAX_S)
                        continue
                    delay = self.RETRY_FIRST_S
                gone = {id(asked[i]) for i in released}
                kept = [loc for loc in held if id(loc) not in gone]
                self.count -= len(held) - len(kept)
                self._held[member] = kept
                s3wal = service.s3wal
                for i in released:
                    if s3wal is not None:
                        s3wal.release(asked[i])
        finally:
            self._tasks.pop(member, None)
            if not self._held.get(member):
                self._held.pop(member, None)

    async def close(self) -> None:
        """Stop asking; what is held is left to the orphan sweep."""
        self._closed = True
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._held.clear()
        self.count = 0


def _release_location(s3wal: S3WalWriter, location: S3WalLocation, acks: int) -> None:
    """acks=0 gets no answer (the call returns once the request is written): its
    batch is released later, when the owner has long read it; nothing was promised."""
    if acks == 0:
        loop = asyncio.get_running_loop()
        loop.call_later(ACKS0_RELEASE_DELAY_S, s3wal.release, location)
    else:
        s3wal.release(location)


class OwnerHost(Protocol):
    """What the owner's side needs of the tiered service."""

    @property
    def name(self) -> str: ...

    @property
    def holes(self) -> SequenceHoles: ...

    @property
    def partitions(self) -> PartitionSet | None: ...

    @property
    def s3wal_reader(self) -> S3WalReader | None: ...

    @property
    def stages(self) -> Stages: ...

    def state(self, stream: int) -> MetadataState: ...

    async def produce_rules(self, topic: str | uuid.UUID) -> ProduceRules | None: ...

    async def partition_here(self, stream: int) -> TieredPartition | None: ...

    def not_served(self, stream: int) -> str | None: ...

    def verifier_for(
        self, stream: int, transactional_id: str | None, produce_version: int
    ) -> Verify | None: ...

    @property
    def takes_references(self) -> bool:
        """New batches handed over by location are taken by reference (docs/wal.md)."""
        ...

    @property
    def referencing(self) -> ReferencingLog | None:
        """The WAL as the partitions see it, references and all (partition/referenced.py)."""
        ...


class AtOwner:
    def __init__(self, service: OwnerHost) -> None:
        self._service = service
        # per stream, the arrivals in the order they came: each queued after the last
        self._arrivals = InOrder()

    async def append(self, request: AppendRequest) -> ProduceResult:
        """A peer's batch for a stream owned here. The S3 reads run concurrently, but the
        batches are queued to the partition in the order the requests arrived (a producer's
        sequence numbers must arrive in order)."""
        service = self._service
        partitions, reader, holes = service.partitions, service.s3wal_reader, service.holes
        assert partitions is not None and reader is not None
        stream = request.stream_id
        batch = request.batch if request.acks != 0 else None
        if batch is not None and request.hole >= 0:  # what the sender dropped before it
            pid, epoch, seq = batch.producer_id, batch.producer_epoch, request.hole
            hole = ProducerBatch(pid, epoch, seq, seq)
            holes.dropped(stream, hole)
        wal = service.referencing
        expected: bytes | None = None  # noted as being handled here (`ReferencingLog.expect`)
        if request.header is not None and request.location is not None and wal is not None:
            expected = encode_location(request.location)
            if not wal.expect(expected):  # told its sender it was released: maybe gone
                holes.dropped(stream, batch)
                return not_owner(f"stream {stream}: its location was released before it came")
        handed: list[bool] = []  # the call keeps it noted until it ends (`_append`)
        try:
            return await self._append(request, batch, expected, handed)
        finally:
            if expected is not None and wal is not None and not handed:
                wal.unexpect(expected)

    async def _append(
        self,
        request: AppendRequest,
        batch: ProducerBatch | None,
        expected: bytes | None,
        handed: list[bool],
    ) -> ProduceResult:
        service = self._service
        partitions, reader, holes = service.partitions, service.s3wal_reader, service.holes
        assert partitions is not None and reader is not None
        stream = request.stream_id
        turn = self._arrivals.take(stream)
        stages = service.stages
        arrived = time.perf_counter()
        reference: bytes | None = None
        try:
            records = request.records
            rules = await self._stream_rules(stream)  # before the order is kept: may wait
            if records is None and expected and self._by_reference(request, rules):
                assert request.header is not None
                records, reference = request.header, expected  # the bytes follow
            elif records is None:
                assert request.location is not None
                records = await reader.read(request.location)
                stages.since("owner_read", arrived)  # the GET, or its shared or cached bytes
            if turn.behind:
                waited = time.perf_counter()
                await turn.ready()
                stages.since("owner_order", waited)  # behind the stream's earlier arrivals
            if await service.partition_here(stream) is None:
                holes.dropped(stream, batch)
                why = service.not_served(stream) or f"not owned by {service.name}"
                return not_owner(f"stream {stream}: {why}")
            if rules is None:
                holes.dropped(stream, batch)  # retriable and not appended, as above
                return ProduceResult(
                    ErrorCode.kafka_storage_error, error_message=f"stream {stream}: no topic config"
                )
            append_time = rules.log_append_time
            verify = service.verifier_for(stream, request.transactional_id, request.produce_version)
            call = asyncio.ensure_future(
                partitions.produce(
                    stream, records, request.acks, append_time, verify, reference=reference
                )
            )
            wal = service.referencing
            if reference is not None and wal is not None:
                # noted as being handled until the partition has answered it, even if this
                # handler is cancelled meanwhile (the request, queued, is still written):
                # a sender asking about it before then is told to keep its object
                call.add_done_callback(lambda _: wal.unexpect(reference))
                handed.append(True)
            await asyncio.sleep(0)  # its first step queues the batch, before the next's
        except BaseException:  # the S3-WAL read failed: a storage error, the batch not appended
            holes.dropped(stream, batch)  # before the stream's next arrival goes on
            raise
        finally:
            turn.end()
        result = await (call if reference is None else asyncio.shield(call))
        stages.since("owner_append", arrived)  # arrival to durable here (read included)
        if result is not None:
            holes.observe(stream, batch, result.error_code)
        return result if result is not None else ProduceResult(0)

    def _by_reference(self, request: AppendRequest, rules: ProduceRules | None) -> bool:
        """Whether to take the batch by reference, from its header, without reading it
        first (docs/wal.md, "The owner answering from the notification"); else read it and
        append its bytes, as for a batch the owner must rewrite (LogAppendTime), one whose
        transaction is verified with the coordinator, acks=0, or when this owner does not
        take references (`tiering.owner_takes_references`)."""
        header, location, wal = request.header, request.location, self._service.referencing
        if header is None or location is None or request.acks == 0 or wal is None:
            return False
        if not self._service.takes_references or rules is None or rules.log_append_time:
            return False
        if not wal.has_room():  # the bytes not uploaded yet: by bytes, held back by the WAL
            return False
        if request.transactional_id is not None:
            return False
        try:
            checked = validate_header(header)
        except CorruptBatchError:
            return False  # the bytes path refuses it as the sequencer does
        return not checked.is_transactional and checked.size == location.size

    async def held(self, request: HeldRequest) -> tuple[int, ...]:
        """A sender's question: which of these locations, answered `referenced`, it may
        delete now (waiting up to the request's timeout for the others)."""
        wal = self._service.referencing
        if wal is None:  # no WAL here takes references: none is held
            return tuple(range(len(request.locations)))
        return await wal.held(request.locations, request.timeout_ms)

    async def _stream_rules(self, stream: int) -> ProduceRules | None:
        """The produce rules of a stream's topic, at its owner (LogAppendTime)."""
        info = self._service.state(stream).stream(stream)
        return None if info is None else await self._service.produce_rules(info.topic_id)
