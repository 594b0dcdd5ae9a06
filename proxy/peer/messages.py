"""The proxy-to-proxy ("peer") protocol's messages and the values each may hold. Pure.

Their frames, byte by byte, are `peer/codec.py` and `peer/bodies.py`.
A message that cannot be built (both or neither append payloads, a value out of range)
raises a plain `ValueError`: the caller's bug. Every field's range fits its wire type, so
any message that can be built can be framed (within the frame size limit).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from proxy.apis.api61_describe_producers import DescribedProducer
from proxy.handoff.objects import S3WalLocation
from proxy.partition.rules import ProduceResult
from proxy.partition.sequence_holes import ProducerBatch
from proxy.records.batches import HEADER_SIZE as BATCH_HEADER_SIZE

ACKS = (-1, 0, 1)
ADMIN_OPS = ("tier", "untier", "seal", "unseal", "deleted", "look", "configs")
# Records travel in one frame, whose u32 length counts them and the frame's 14-byte head
# (codec.HEADER_SIZE).
MAX_RECORDS_BYTES = 0xFFFF_FFFF - 14

U32_MAX = 0xFFFF_FFFF
I32_MAX = (1 << 31) - 1
I64_MAX = (1 << 63) - 1

Buffer = bytes | bytearray | memoryview


@dataclass(frozen=True, slots=True)
class AppendRequest:
    """Append these batches to `stream_id` on its owner: `records` inline (direct mode) or
    the `location` of an S3-WAL range (s3 mode), exactly one. Decoded records are a view
    of the received frame, not a copy; a decoded `header` is a copy, 61 bytes an owner
    keeps in its log cache long after the frame is gone."""

    correlation_id: int
    stream_id: int
    acks: int
    timeout_ms: int
    records: bytes | bytearray | memoryview | None = None
    location: S3WalLocation | None = None
    # whose batches and which sequences (the owner records them as dropped if it cannot
    # append them, even unread), and the newest sequence of that producer the sender
    # dropped before them, -1 if none: docs/sequencer.md, "Gaps the proxy made"
    batch: ProducerBatch | None = None
    hole: int = -1
    # a transactional Produce's transactional id and the client's Produce version: the
    # owner verifies the transaction with the coordinator (KIP-890, docs/tiering.md,
    # "Transactions"); only with `batch` (a transactional batch has a producer id)
    transactional_id: str | None = None
    produce_version: int = -1
    # the first batch's 61-byte v2 header, only with `location` (s3 mode): the owner may
    # order the batch from it and answer `referenced` before it has the bytes (docs/wal.md,
    # "The owner answering from the notification"); sent only to an owner at
    # `codec.REFERENCE_PROTOCOL` or later
    header: bytes | bytearray | memoryview | None = None

    def __post_init__(self) -> None:
        check_range("correlation_id", self.correlation_id, 0, U32_MAX)
        check_range("stream_id", self.stream_id, 0, (1 << 64) - 1)
        if self.transactional_id is not None:
            if self.batch is None:
                raise ValueError("an append names a transactional id only with its batch")
            check_string("transactional_id", self.transactional_id, 0xFFFF)
            check_range("produce_version", self.produce_version, 0, (1 << 15) - 1)
        elif self.produce_version != -1:
            raise ValueError("an append names a produce version only with a transactional id")
        if self.batch is not None:
            b = self.batch
            check_range("batch.producer_id", b.producer_id, 0, I64_MAX)
            check_range("batch.producer_epoch", b.producer_epoch, -(1 << 15), (1 << 15) - 1)
            check_range("batch.first_sequence", b.first_sequence, 0, I32_MAX)
            check_range("batch.last_sequence", b.last_sequence, 0, I32_MAX)
        check_range("hole", self.hole, -1, I32_MAX)
        if self.batch is None and self.hole != -1:
            raise ValueError("an append names a hole only with its batch")
        if self.acks not in ACKS:
            raise ValueError(f"acks {self.acks}: must be -1, 0 or 1")
        check_range("timeout_ms", self.timeout_ms, -(1 << 31), I32_MAX)
        if (self.records is None) == (self.location is None):
            raise ValueError("an append carries exactly one of records (direct) or location (s3)")
        if self.records is not None and buffer_size(self.records) > MAX_RECORDS_BYTES:
            raise ValueError(f"{buffer_size(self.records)} bytes of records do not fit in a frame")
        if self.location is not None:
            if self.location.stream_id != self.stream_id:
                raise ValueError(
                    f"location of stream {self.location.stream_id} in an append to {self.stream_id}"
                )
            check_location("location", self.location)
        if self.header is not None:
            if self.location is None:
                raise ValueError("an append carries a batch header only with its location (s3)")
            if not isinstance(self.header, Buffer):
                raise ValueError(f"header of type {type(self.header).__name__}: not a buffer")
            if (size := buffer_size(self.header)) != BATCH_HEADER_SIZE:
                raise ValueError(f"a batch header of {size} bytes: must be {BATCH_HEADER_SIZE}")


@dataclass(frozen=True, slots=True)
class AppendResponse:
    """The owner's answer to an append: one partition's Produce answer. `referenced`: the
    owner took the batch by reference (its order durable, its bytes still only in the
    S3-WAL object), so the sender keeps that object until a `HeldResponse` releases it.
    An error may be referenced too: the owner wrote a reference entry whose fate is
    unknown (its WAL failed), settled when that WAL is opened again. Only in answer to a
    request that carried a `header`: a sender sends one only to an owner at
    `codec.REFERENCE_PROTOCOL` or later and reads the flag itself, so an older sender,
    whose decoder refuses it, never gets one (the level rules cover it: `bodies.py`)."""

    correlation_id: int
    error_code: int
    base_offset: int = -1
    log_append_time_ms: int = -1
    log_start_offset: int = -1
    error_message: str | None = None
    referenced: bool = False

    def __post_init__(self) -> None:
        check_range("correlation_id", self.correlation_id, 0, U32_MAX)
        check_range("error_code", self.error_code, -(1 << 15), (1 << 15) - 1)
        for name in ("base_offset", "log_append_time_ms", "log_start_offset"):
            check_range(name, getattr(self, name), -(1 << 63), I64_MAX)
        if self.error_message is not None:
            check_string("error_message", self.error_message, 0x7FFF)
        if not isinstance(self.referenced, bool):
            raise ValueError(f"referenced {self.referenced!r} is not a bool")

    @classmethod
    def from_result(cls, correlation_id: int, r: ProduceResult) -> AppendResponse:
        fields = (r.base_offset, r.log_append_time_ms, r.log_start_offset, r.error_message)
        return cls(correlation_id, r.error_code, *fields, r.referenced)

    def result(self) -> ProduceResult:
        fields = (self.base_offset, self.log_append_time_ms, self.log_start_offset)
        return ProduceResult(self.error_code, *fields, self.error_message, self.referenced)


@dataclass(frozen=True, slots=True)
class AdminRequest:
    """Tier or untier `topic` (by name and id), on the owner of its metadata shard; or,
    from that owner to the owners of the topic's streams before an untier, seal (close
    the topic's partitions owned there, refused if any holds writes past its cutover) or
    unseal them."""

    correlation_id: int
    op: str
    topic: str
    topic_id: uuid.UUID

    def __post_init__(self) -> None:
        check_range("correlation_id", self.correlation_id, 0, U32_MAX)
        if self.op not in ADMIN_OPS:
            raise ValueError(f"admin op {self.op!r}: must be one of {', '.join(ADMIN_OPS)}")
        check_string("topic", self.topic, 0xFFFF)
        if not isinstance(self.topic_id, uuid.UUID):
            raise ValueError(f"topic_id {self.topic_id!r} is not a UUID")


@dataclass(frozen=True, slots=True)
class AdminResponse:
    correlation_id: int
    error_code: int
    message: str

    def __post_init__(self) -> None:
        check_range("correlation_id", self.correlation_id, 0, U32_MAX)
        check_range("error_code", self.error_code, -(1 << 15), (1 << 15) - 1)
        check_string("message", self.message, 0xFFFF)


@dataclass(frozen=True, slots=True)
class FetchRequest:
    """Read `stream_id` from `offset` on, on its owner: the tail its log cache holds and
    the objects do not yet. `max_bytes` bounds the answer as Fetch's partition_max_bytes
    does (the batch holding `offset` comes whole); `max_wait_ms` is the long poll, how long
    the owner may wait for data past `offset`. `stable` asks the owner for its last
    stable offset too (read_committed: docs/tiering.md, "Transactions: the read side"),
    sent only to an owner at `codec.STABLE_PROTOCOL` or later."""

    correlation_id: int
    stream_id: int
    offset: int
    max_bytes: int
    max_wait_ms: int
    stable: bool = False

    def __post_init__(self) -> None:
        check_range("correlation_id", self.correlation_id, 0, U32_MAX)
        check_range("stream_id", self.stream_id, 0, (1 << 64) - 1)
        check_range("offset", self.offset, 0, I64_MAX)
        check_range("max_bytes", self.max_bytes, 0, I32_MAX)
        check_range("max_wait_ms", self.max_wait_ms, 0, I32_MAX)


class FetchResult(Protocol):
    """What an owner's fetch handler returns: a `FetchResponse`, or any answer with these
    fields (such as `apis.fetch_split.TieredFetchResult`)."""

    @property
    def error_code(self) -> int: ...

    @property
    def high_watermark(self) -> int: ...

    @property
    def log_start_offset(self) -> int: ...

    @property
    def last_stable_offset(self) -> int: ...

    @property
    def records(self) -> Sequence[Buffer]: ...


@dataclass(frozen=True, slots=True)
class FetchResponse:
    """The owner's answer to a fetch: whole batches from the requested offset on, written
    one after another, and the partition's offsets (-1: unknown). `records` are kept as
    the pieces given (a tuple, empty pieces left out) and framed without a copy; a decoded
    answer holds at most one piece, a view of the received frame. `last_stable_offset`
    answers a request that asked for it (`FetchRequest.stable`), None otherwise: the
    records are then still all of the tail (read_uncommitted), so the asker can decide
    transactions its committed objects hold with the markers the tail holds."""

    correlation_id: int
    error_code: int
    high_watermark: int = -1
    log_start_offset: int = -1
    records: Sequence[Buffer] = ()
    last_stable_offset: int | None = None

    def __post_init__(self) -> None:
        check_range("correlation_id", self.correlation_id, 0, U32_MAX)
        check_range("error_code", self.error_code, -(1 << 15), (1 << 15) - 1)
        check_range("high_watermark", self.high_watermark, -(1 << 63), I64_MAX)
        check_range("log_start_offset", self.log_start_offset, -(1 << 63), I64_MAX)
        if self.last_stable_offset is not None:
            check_range("last_stable_offset", self.last_stable_offset, -(1 << 63), I64_MAX)
        if isinstance(self.records, Buffer) or not isinstance(self.records, Sequence):
            raise ValueError(f"records {type(self.records).__name__}: must be a sequence of pieces")
        for piece in self.records:
            if not isinstance(piece, Buffer):
                raise ValueError(f"a records piece of type {type(piece).__name__}: not a buffer")
        pieces = tuple(piece for piece in self.records if buffer_size(piece))
        object.__setattr__(self, "records", pieces)  # frozen: set once, here
        if self.records_size > MAX_RECORDS_BYTES:
            raise ValueError(f"{self.records_size} bytes of records do not fit in a frame")

    @property
    def records_size(self) -> int:
        return sum(map(buffer_size, self.records))

    @classmethod
    def from_result(
        cls, correlation_id: int, r: FetchResult, *, stable: bool = False
    ) -> FetchResponse:
        """The answer of `r`; with its last stable offset when the request asked (`stable`)."""
        fields = (r.error_code, r.high_watermark, r.log_start_offset, r.records)
        return cls(correlation_id, *fields, r.last_stable_offset if stable else None)


@dataclass(frozen=True, slots=True)
class BackfillRequest:
    """Commit an offload job's stream object (docs/offload.md): it holds offsets
    [start_offset, end_offset) of `stream_id`, below the stream's cutover. Sent to any
    proxy, which hands it to the owner of the stream's metadata shard; that owner checks it
    with the metadata rules and writes it. Answered by an `AdminResponse`."""

    correlation_id: int
    object_id: int
    size: int
    stream_id: int
    start_offset: int
    end_offset: int

    def __post_init__(self) -> None:
        check_range("correlation_id", self.correlation_id, 0, U32_MAX)
        check_range("object_id", self.object_id, 0, (1 << 64) - 1)
        check_range("size", self.size, 1, I64_MAX)
        check_range("stream_id", self.stream_id, 0, (1 << 64) - 1)
        check_range("start_offset", self.start_offset, 0, I64_MAX - 1)
        check_range("end_offset", self.end_offset, self.start_offset + 1, I64_MAX)


@dataclass(frozen=True, slots=True)
class CleanedObject:
    """One object a clean job wrote: it holds [start_offset, end_offset) of the request's
    stream and takes over the ranges of the objects in `replaces`."""

    object_id: int
    size: int
    start_offset: int
    end_offset: int
    replaces: tuple[int, ...]

    def __post_init__(self) -> None:
        check_range("object_id", self.object_id, 0, (1 << 64) - 1)
        check_range("size", self.size, 1, I64_MAX)
        check_range("start_offset", self.start_offset, 0, I64_MAX - 1)
        check_range("end_offset", self.end_offset, self.start_offset + 1, I64_MAX)
        check_range("replaces count", len(self.replaces), 1, 0xFFFF)
        for number in self.replaces:
            check_range("replaces", number, 0, (1 << 64) - 1)


@dataclass(frozen=True, slots=True)
class CleanCommitRequest:
    """Commit the objects `tierproxy clean` wrote for `stream_id` (docs/offload.md,
    "Cleaning a compacted topic"), as the proxy's own log cleaner commits its own: by the
    owner of the stream's metadata shard, under the lock its cleaner and compactor share,
    each object naming in `replaces` the objects whose ranges it takes over. `clean_end`:
    where the job's clean ended, the owner's cleaner checkpoint once all commit (-1:
    none). Answered by an `AdminResponse`."""

    correlation_id: int
    stream_id: int
    clean_end: int
    objects: tuple[CleanedObject, ...]

    def __post_init__(self) -> None:
        check_range("correlation_id", self.correlation_id, 0, U32_MAX)
        check_range("stream_id", self.stream_id, 0, (1 << 64) - 1)
        check_range("clean_end", self.clean_end, -1, I64_MAX)
        check_range("objects count", len(self.objects), 1, U32_MAX)


@dataclass(frozen=True, slots=True)
class TrimRequest:
    """DeleteRecords on a tiered partition: move `stream_id`'s log start up to `offset`
    (-1: its high watermark). Sent to any proxy, which hands it to the owner of the
    stream's metadata shard; that owner uploads what the trim needs committed first (for
    at most `timeout_ms`) and writes the StreamTrim."""

    correlation_id: int
    stream_id: int
    offset: int
    timeout_ms: int

    def __post_init__(self) -> None:
        check_range("correlation_id", self.correlation_id, 0, U32_MAX)
        check_range("stream_id", self.stream_id, 0, (1 << 64) - 1)
        check_range("offset", self.offset, -1, I64_MAX)
        check_range("timeout_ms", self.timeout_ms, 0, I32_MAX)


@dataclass(frozen=True, slots=True)
class TrimResponse:
    """The answer to a TrimRequest: Kafka's error code, the stream's log start after it
    (-1 with an error), and a message saying why."""

    correlation_id: int
    error_code: int
    log_start_offset: int
    message: str

    def __post_init__(self) -> None:
        check_range("correlation_id", self.correlation_id, 0, U32_MAX)
        check_range("error_code", self.error_code, -(1 << 15), (1 << 15) - 1)
        check_range("log_start_offset", self.log_start_offset, -1, I64_MAX)
        check_string("message", self.message, 0xFFFF)


@dataclass(frozen=True, slots=True)
class PingRequest:
    """Is a proxy's peer listener there, and which proxy is it? Carries nothing; answered
    by a `PingResponse`. Offload jobs send it before any work (offload_jobs/preflight.py)."""

    correlation_id: int

    def __post_init__(self) -> None:
        check_range("correlation_id", self.correlation_id, 0, U32_MAX)


@dataclass(frozen=True, slots=True)
class PingResponse:
    """The answer to a ping: the proxy's name in its fleet (fleet.name) and its version
    (`proxy.__version__`)."""

    correlation_id: int
    name: str
    version: str

    def __post_init__(self) -> None:
        check_range("correlation_id", self.correlation_id, 0, U32_MAX)
        check_string("name", self.name, 0xFFFF)
        check_string("version", self.version, 0xFFFF)


@dataclass(frozen=True, slots=True)
class CatchUpRequest:
    """Before AddPartitionsToTxn is answered (docs/tiering.md, "Transactions"): the owner
    of `stream_id` reads Kafka's log of its partition up to the high watermark as of now
    and appends every transaction marker found, within `timeout_ms`. Answered by an
    `AdminResponse`: error code 0 once done."""

    correlation_id: int
    stream_id: int
    timeout_ms: int

    def __post_init__(self) -> None:
        check_range("correlation_id", self.correlation_id, 0, U32_MAX)
        check_range("stream_id", self.stream_id, 0, (1 << 64) - 1)
        check_range("timeout_ms", self.timeout_ms, 0, I32_MAX)


@dataclass(frozen=True, slots=True)
class ProducerCatchUpRequest:
    """Before InitProducerId is answered (docs/tiering.md, "Transactions": fencing): the
    proxy catches up every tiered partition it owns where `producer_id` has a
    transaction open or a batch waiting for its verification, as a `CatchUpRequest`
    does one stream, within `timeout_ms`. Answered by an `AdminResponse`: error code 0
    once done (also when no partition concerned it)."""

    correlation_id: int
    producer_id: int
    timeout_ms: int

    def __post_init__(self) -> None:
        check_range("correlation_id", self.correlation_id, 0, U32_MAX)
        check_range("producer_id", self.producer_id, 0, I64_MAX)
        check_range("timeout_ms", self.timeout_ms, 0, I32_MAX)


@dataclass(frozen=True, slots=True)
class ShardReadRequest:
    """Before a DeleteRecords on a tiered partition is answered (docs/tiering.md,
    "DeleteRecords"): the asked proxy's reader of metadata shard `shard` reads until
    every record below `offset` is applied (the StreamTrim the owner just wrote), within
    `timeout_ms`, so that proxy serves nothing below the new log start once the client
    has its answer, as every replica of Kafka has moved its log start when Kafka answers.
    Answered by an `AdminResponse`: error code 0 once read. Sent only to a member at
    `codec.SHARD_READ_PROTOCOL` or later."""

    correlation_id: int
    shard: int
    offset: int
    timeout_ms: int

    def __post_init__(self) -> None:
        check_range("correlation_id", self.correlation_id, 0, U32_MAX)
        check_range("shard", self.shard, 0, U32_MAX)
        check_range("offset", self.offset, 0, I64_MAX)
        check_range("timeout_ms", self.timeout_ms, 0, I32_MAX)


@dataclass(frozen=True, slots=True)
class ProducersRequest:
    """DescribeProducers on a tiered partition: the owner of `stream_id` answers its
    producers as Kafka's leader would (`ProducersResponse`). Sent only to an owner at
    `codec.PRODUCERS_PROTOCOL` or later."""

    correlation_id: int
    stream_id: int

    def __post_init__(self) -> None:
        check_range("correlation_id", self.correlation_id, 0, U32_MAX)
        check_range("stream_id", self.stream_id, 0, (1 << 64) - 1)


@dataclass(frozen=True, slots=True)
class ProducersResponse:
    """The answer to a ProducersRequest: Kafka's error code (NOT_LEADER_OR_FOLLOWER: the
    stream is not served here) and the producers, none with an error."""

    correlation_id: int
    error_code: int
    producers: tuple[DescribedProducer, ...] = ()

    def __post_init__(self) -> None:
        check_range("correlation_id", self.correlation_id, 0, U32_MAX)
        check_range("error_code", self.error_code, -(1 << 15), (1 << 15) - 1)
        check_range("producers count", len(self.producers), 0, U32_MAX)
        for p in self.producers:
            check_range("producer_id", p.producer_id, 0, I64_MAX)
            check_range("producer_epoch", p.producer_epoch, -1, I32_MAX)
            check_range("last_sequence", p.last_sequence, -1, I32_MAX)
            check_range("last_timestamp", p.last_timestamp, -(1 << 63), I64_MAX)
            check_range("coordinator_epoch", p.coordinator_epoch, -(1 << 31), I32_MAX)
            check_range("current_txn_start_offset", p.current_txn_start_offset, -1, I64_MAX)


@dataclass(frozen=True, slots=True)
class HeldRequest:
    """Which of these S3-WAL `locations`, whose appends the asked owner answered
    `referenced`, does it still need? It waits up to `timeout_ms` for them to be
    released (their bytes durable in its own WAL) and answers by a `HeldResponse`. Sent
    by the proxy that wrote the objects, which deletes none while its owner holds only a
    reference to it (docs/wal.md, "The owner answering from the notification"), only to
    an owner at `codec.REFERENCE_PROTOCOL` or later."""

    correlation_id: int
    timeout_ms: int
    locations: tuple[S3WalLocation, ...]

    def __post_init__(self) -> None:
        check_range("correlation_id", self.correlation_id, 0, U32_MAX)
        check_range("timeout_ms", self.timeout_ms, 0, I32_MAX)
        if not isinstance(self.locations, tuple):
            raise ValueError(f"locations {type(self.locations).__name__}: must be a tuple")
        check_range("locations count", len(self.locations), 1, U32_MAX)
        for loc in self.locations:
            if not isinstance(loc, S3WalLocation):
                raise ValueError(f"a location of type {type(loc).__name__}: not an S3WalLocation")
            check_range("location.stream_id", loc.stream_id, 0, (1 << 64) - 1)
            check_location("location", loc)


@dataclass(frozen=True, slots=True)
class HeldResponse:
    """The answer to a HeldRequest: the indexes, in increasing order, of the request's
    locations the owner no longer needs (the sender may delete them once no other owner
    holds them). A location not named is still needed, or not known: the sender asks
    again later. With an error code (UNSUPPORTED_VERSION: the owner serves no held
    requests) nothing is released."""

    correlation_id: int
    released: tuple[int, ...]
    error_code: int = 0

    def __post_init__(self) -> None:
        check_range("correlation_id", self.correlation_id, 0, U32_MAX)
        check_range("error_code", self.error_code, -(1 << 15), (1 << 15) - 1)
        if not isinstance(self.released, tuple):
            raise ValueError(f"released {type(self.released).__name__}: must be a tuple")
        if self.released and self.error_code != 0:
            raise ValueError(f"an answer with error code {self.error_code} releases nothing")
        check_range("released count", len(self.released), 0, U32_MAX)
        previous = -1
        for index in self.released:
            check_range("released index", index, 0, U32_MAX - 1)
            if index <= previous:  # one encoding per answer, no repeats
                raise ValueError(f"released {self.released}: indexes must increase")
            previous = index


PeerMessage = (
    AppendRequest
    | AppendResponse
    | AdminRequest
    | AdminResponse
    | FetchRequest
    | FetchResponse
    | BackfillRequest
    | CleanCommitRequest
    | TrimRequest
    | TrimResponse
    | PingRequest
    | PingResponse
    | CatchUpRequest
    | ProducerCatchUpRequest
    | ProducersRequest
    | ProducersResponse
    | ShardReadRequest
    | HeldRequest
    | HeldResponse
)


def buffer_size(piece: Buffer) -> int:
    """Its size in bytes (a memoryview's len counts items, not bytes)."""
    return piece.nbytes if isinstance(piece, memoryview) else len(piece)


def check_range(name: str, value: int, low: int, high: int) -> None:
    if not isinstance(value, int) or not low <= value <= high:
        raise ValueError(f"{name} {value!r}: must be an integer in [{low}, {high}]")


def check_location(name: str, loc: S3WalLocation) -> None:
    """The range, crc and key of `loc` fit their wire types (its stream id is the caller's
    to check: an append's is the request's own)."""
    check_range(f"{name}.start", loc.start, 0, (1 << 64) - 1)
    check_range(f"{name}.end", loc.end, loc.start, (1 << 64) - 1)
    check_range(f"{name}.crc", loc.crc, 0, U32_MAX)
    check_string(f"{name}.object_key", loc.object_key, 0xFFFF)


def check_string(name: str, value: str, max_bytes: int) -> None:
    if not isinstance(value, str):
        raise ValueError(f"{name} {value!r} is not a string")
    if len(value) > max_bytes // 4 and len(value.encode()) > max_bytes:
        raise ValueError(f"{name}: {len(value.encode())} UTF-8 bytes, at most {max_bytes}")
