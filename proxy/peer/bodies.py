"""The peer protocol's message bodies, per message: their layout, encoding and decoding.
Pure: no asyncio, no sockets.

A frame (`peer/codec.py`: prefix, crc, version, type, correlation id) carries one body.
Bodies (string: u16 size + UTF-8; nullable string: i16 size, -1 for null)::

    append request   stream_id u64, acks i16, timeout_ms i32, payload kind u8, then
                     kind 1 (direct): records size u32, records
                     kind 2 (s3):     object_key string, start u64, end u64, crc u32
                     (the location's stream id is the request's)
                     then, optionally (an idempotent producer's batches): producer_id i64,
                     producer_epoch i16, first_sequence i32, last_sequence i32, hole i32
                     (-1: none; docs/sequencer.md, "Gaps the proxy made"), only to a
                     peer at protocol 2 or later (below)
                     then, optionally (a transactional Produce, after the sequences):
                     produce_version i16, transactional_id string, only to a peer at
                     protocol 6 or later (the owner verifies the transaction, KIP-890)
                     then, optionally (an s3 append's batch header, after both): the
                     batch's first 61 bytes, only to a peer at protocol 13 or later. The
                     trailers are told apart only by their order, so an append with a
                     header has both before it, each written as "none" when the append
                     has none: sequences all -1 (producer_id -1, no batch), transaction
                     produce_version -1 and an empty id; "none" is read only before a
                     header
    append response  error_code i16, base_offset i64, log_append_time_ms i64,
                     log_start_offset i64, error_message nullable string, then, only
                     when the owner took the batch by reference: flags u8 (1: referenced),
                     which a reader before protocol 13 refuses; an owner sets it only in
                     answer to a request with a header, which only a sender at 13 or
                     later sends (the level rules cover it)
    admin request    op string ("tier" | "untier" | "seal" | "unseal"), topic string,
                     topic_id 16 bytes
    admin response   error_code i16, message string
    fetch request    stream_id u64, offset i64 (>= 0), max_bytes i32 (>= 0),
                     max_wait_ms i32 (>= 0), then, optionally (the asker wants the last
                     stable offset): flags u8 (1), only to a peer at protocol 5 or later
    fetch response   error_code i16, high_watermark i64, log_start_offset i64,
                     records size u32, records (whole batches, one after another), then,
                     only when the request had the flags: last_stable_offset i64
    backfill request object_id u64, size i64 (> 0), stream_id u64, start_offset i64,
                     end_offset i64 (> start_offset)
    clean commit request
                     stream_id u64, clean_end i64 (>= -1), objects count u32 (> 0), then
                     per object: object_id u64, size i64 (> 0), start_offset i64,
                     end_offset i64 (> start_offset), replaces count u16 (> 0), then
                     that many object ids u64; answered by an admin response
                     (protocol level 8)
    trim request     stream_id u64, offset i64 (>= -1), timeout_ms i32 (>= 0)
    trim response    error_code i16, log_start_offset i64 (>= -1), message string
    ping request     (empty)
    ping response    name string (the proxy's fleet.name), version string
    catch-up request stream_id u64, timeout_ms i32 (>= 0); answered by an admin response
                     (protocol level 4)
    producer catch-up request
                     producer_id i64 (>= 0), timeout_ms i32 (>= 0); answered by an admin
                     response (protocol level 7)
    producers request
                     stream_id u64 (protocol level 9)
    producers response
                     error_code i16, producers count u32, then per producer:
                     producer_id i64, producer_epoch i32, last_sequence i32,
                     last_timestamp i64, coordinator_epoch i32,
                     current_txn_start_offset i64 (-1: none)
    shard read request
                     shard u32, offset i64 (>= 0), timeout_ms i32 (>= 0); answered by an
                     admin response (protocol level 11)
    held request     timeout_ms i32 (>= 0), locations count u32 (> 0), then per location:
                     stream_id u64, object_key string, start u64, end u64 (>= start),
                     crc u32 (protocol level 13)
    held response    error_code i16, released count u32, then that many indexes u32
                     into the request's locations, increasing (none with an error)

A new message is a new type, with a body of its own here and a protocol level in
`codec.py` ("Protocol levels"); an optional trailer goes only to peers known to read it.
"""

from __future__ import annotations

import struct
import uuid
from collections.abc import Callable, Sequence
from dataclasses import astuple

from proxy.apis.api61_describe_producers import DescribedProducer
from proxy.handoff.objects import S3WalLocation
from proxy.partition.sequence_holes import ProducerBatch
from proxy.peer.messages import (
    ACKS,
    ADMIN_OPS,
    AdminRequest,
    AdminResponse,
    AppendRequest,
    AppendResponse,
    BackfillRequest,
    Buffer,
    CatchUpRequest,
    CleanCommitRequest,
    CleanedObject,
    FetchRequest,
    FetchResponse,
    HeldRequest,
    HeldResponse,
    PeerMessage,
    PingRequest,
    PingResponse,
    ProducerCatchUpRequest,
    ProducersRequest,
    ProducersResponse,
    ShardReadRequest,
    TrimRequest,
    TrimResponse,
    buffer_size,
)
from proxy.records.batches import HEADER_SIZE as BATCH_HEADER_SIZE

_APPEND = struct.Struct(">QhiB")  # stream_id, acks, timeout_ms, payload kind
_U32 = struct.Struct(">I")
_U16 = struct.Struct(">H")
_I16 = struct.Struct(">h")
_RANGE = struct.Struct(">QQI")  # start, end, crc
_SEQUENCE = struct.Struct(">qhiii")  # producer id, epoch, first and last sequence, hole
_NO_SEQUENCE = (-1, -1, -1, -1, -1)  # "none", only before a header trailer
_NO_TRANSACTION = _I16.pack(-1) + _U16.pack(0)  # produce_version -1, empty id: "none", too
_RESULT = struct.Struct(">hqqq")  # error_code, base_offset, log_append_time_ms, log_start_offset
_FETCH = struct.Struct(">Qqii")  # stream_id, offset, max_bytes, max_wait_ms
_FETCHED = struct.Struct(">hqqI")  # error_code, high_watermark, log_start_offset, records size
_FLAGS = struct.Struct(">B")  # a fetch request's and an append response's trailer
_STABLE = 1  # its flag: answer the last stable offset
_REFERENCED = 1  # an append response's flag: taken by reference
_I64 = struct.Struct(">q")  # a fetch response's trailer: last_stable_offset
_BACKFILL = struct.Struct(">QqQqq")  # object_id, size, stream_id, start_offset, end_offset
_TRIM = struct.Struct(">Qqi")  # stream_id, offset, timeout_ms
_TRIMMED = struct.Struct(">hq")  # error_code, log_start_offset
_CATCH_UP = struct.Struct(">Qi")  # stream_id, timeout_ms
_PRODUCER_CATCH_UP = struct.Struct(">qi")  # producer_id, timeout_ms
_CLEAN = struct.Struct(">QqI")  # stream_id, clean_end, objects count
_CLEANED = struct.Struct(">QqqqH")  # object_id, size, start, end, replaces count
_U64 = struct.Struct(">Q")
_PRODUCERS = struct.Struct(">hI")  # error_code, producers count
_SHARD_READ = struct.Struct(">Iqi")  # shard, offset, timeout_ms
_HELD = struct.Struct(">iI")  # timeout_ms, locations count
_RELEASED = struct.Struct(">hI")  # error_code, released count
# producer id, epoch, last sequence, last timestamp, coordinator epoch, txn start offset
_PRODUCER = struct.Struct(">qiiqiq")

DIRECT = 1
S3 = 2

APPEND_REQUEST, APPEND_RESPONSE, ADMIN_REQUEST, ADMIN_RESPONSE = 1, 2, 3, 4
FETCH_REQUEST, FETCH_RESPONSE = 5, 6
BACKFILL_REQUEST = 7
TRIM_REQUEST, TRIM_RESPONSE = 8, 9
PING_REQUEST, PING_RESPONSE = 10, 11
CATCH_UP_REQUEST = 12
PRODUCER_CATCH_UP_REQUEST = 13
CLEAN_COMMIT_REQUEST = 14
PRODUCERS_REQUEST, PRODUCERS_RESPONSE = 15, 16
SHARD_READ_REQUEST = 17
HELD_REQUEST, HELD_RESPONSE = 18, 19


class PeerProtocolError(ValueError):
    """Bytes from a peer that are not a valid frame; the connection must close."""


# -- encoding ------------------------------------------------------------------------------


def _string(value: str) -> bytes:
    data = value.encode()
    return _U16.pack(len(data)) + data


def _nullable_string(value: str | None) -> bytes:
    if value is None:
        return _I16.pack(-1)
    data = value.encode()
    return _I16.pack(len(data)) + data


def encode_body(message: PeerMessage) -> tuple[int, bytes, Sequence[Buffer]]:
    """(the message's type, its body up to the records, the records pieces that follow
    it, as given: never copied)."""
    tail: Sequence[Buffer] = ()
    if isinstance(message, AppendRequest):
        kind = APPEND_REQUEST
        loc = message.location
        if loc is None:
            assert message.records is not None
            tail = (message.records,) if message.records else ()
            body = _APPEND.pack(message.stream_id, message.acks, message.timeout_ms, DIRECT)
            body += _U32.pack(buffer_size(message.records))
        else:
            body = _APPEND.pack(message.stream_id, message.acks, message.timeout_ms, S3)
            body += _string(loc.object_key) + _RANGE.pack(loc.start, loc.end, loc.crc)
        if trailer := _append_trailers(message):  # after the records, the tail (never copied)
            if tail:
                tail = (*tail, trailer)
            else:
                body += trailer
    elif isinstance(message, AppendResponse):
        kind = APPEND_RESPONSE
        r = message
        body = _RESULT.pack(r.error_code, r.base_offset, r.log_append_time_ms, r.log_start_offset)
        body += _nullable_string(r.error_message)
        if r.referenced:
            body += _FLAGS.pack(_REFERENCED)
    elif isinstance(message, AdminRequest):
        kind = ADMIN_REQUEST
        body = _string(message.op) + _string(message.topic) + message.topic_id.bytes
    elif isinstance(message, AdminResponse):
        kind = ADMIN_RESPONSE
        body = _I16.pack(message.error_code) + _string(message.message)
    elif isinstance(message, FetchRequest):
        kind = FETCH_REQUEST
        f = message
        body = _FETCH.pack(f.stream_id, f.offset, f.max_bytes, f.max_wait_ms)
        if f.stable:
            body += _FLAGS.pack(_STABLE)
    elif isinstance(message, FetchResponse):
        kind = FETCH_RESPONSE
        a = message
        tail = a.records
        body = _FETCHED.pack(a.error_code, a.high_watermark, a.log_start_offset, a.records_size)
        if a.last_stable_offset is not None:  # after the records (never copied)
            trailer = _I64.pack(a.last_stable_offset)
            if tail:
                tail = (*tail, trailer)
            else:
                body += trailer
    elif isinstance(message, BackfillRequest):
        kind = BACKFILL_REQUEST
        bf = message
        body = _BACKFILL.pack(bf.object_id, bf.size, bf.stream_id, bf.start_offset, bf.end_offset)
    elif isinstance(message, CleanCommitRequest):
        kind = CLEAN_COMMIT_REQUEST
        c = message
        parts = [_CLEAN.pack(c.stream_id, c.clean_end, len(c.objects))]
        for o in c.objects:
            parts.append(
                _CLEANED.pack(o.object_id, o.size, o.start_offset, o.end_offset, len(o.replaces))
            )
            parts.extend(_U64.pack(number) for number in o.replaces)
        body = b"".join(parts)
    elif isinstance(message, TrimRequest):
        kind = TRIM_REQUEST
        body = _TRIM.pack(message.stream_id, message.offset, message.timeout_ms)
    elif isinstance(message, TrimResponse):
        kind = TRIM_RESPONSE
        body = _TRIMMED.pack(message.error_code, message.log_start_offset)
        body += _string(message.message)
    elif isinstance(message, PingRequest):
        kind = PING_REQUEST
        body = b""
    elif isinstance(message, PingResponse):
        kind = PING_RESPONSE
        body = _string(message.name) + _string(message.version)
    elif isinstance(message, CatchUpRequest):
        kind = CATCH_UP_REQUEST
        body = _CATCH_UP.pack(message.stream_id, message.timeout_ms)
    elif isinstance(message, ProducerCatchUpRequest):
        kind = PRODUCER_CATCH_UP_REQUEST
        body = _PRODUCER_CATCH_UP.pack(message.producer_id, message.timeout_ms)
    elif isinstance(message, ProducersRequest):
        kind = PRODUCERS_REQUEST
        body = _U64.pack(message.stream_id)
    elif isinstance(message, ProducersResponse):
        kind = PRODUCERS_RESPONSE
        parts = [_PRODUCERS.pack(message.error_code, len(message.producers))]
        parts.extend(_PRODUCER.pack(*astuple(p)) for p in message.producers)
        body = b"".join(parts)
    elif isinstance(message, ShardReadRequest):
        kind = SHARD_READ_REQUEST
        body = _SHARD_READ.pack(message.shard, message.offset, message.timeout_ms)
    elif isinstance(message, HeldRequest):
        kind = HELD_REQUEST
        parts = [_HELD.pack(message.timeout_ms, len(message.locations))]
        for loc in message.locations:
            parts.append(_U64.pack(loc.stream_id) + _string(loc.object_key))
            parts.append(_RANGE.pack(loc.start, loc.end, loc.crc))
        body = b"".join(parts)
    elif isinstance(message, HeldResponse):
        kind = HELD_RESPONSE
        parts = [_RELEASED.pack(message.error_code, len(message.released))]
        parts.extend(_U32.pack(index) for index in message.released)
        body = b"".join(parts)
    else:
        raise TypeError(f"not a peer message: {message!r}")
    return kind, body, tail


def _append_trailers(message: AppendRequest) -> bytes:
    """The optional trailers of an append request, in their order: the sequences, the
    transaction, the batch header. Told apart only by that order, so those before a header
    are written as "none" when the append has none."""
    b, header = message.batch, message.header
    if b is None and header is None:
        return b""
    if b is None:
        sequences = _SEQUENCE.pack(*_NO_SEQUENCE)
    else:
        seqs = (b.first_sequence, b.last_sequence, message.hole)
        sequences = _SEQUENCE.pack(b.producer_id, b.producer_epoch, *seqs)
    if message.transactional_id is not None:
        txn = _I16.pack(message.produce_version) + _string(message.transactional_id)
    else:
        txn = b"" if header is None else _NO_TRANSACTION
    return sequences + txn + (b"" if header is None else bytes(header))


# -- decoding ------------------------------------------------------------------------------


class _Cursor:
    """Reads a body field by field; running short names the field that was cut."""

    __slots__ = ("view", "pos", "end")

    def __init__(self, view: memoryview, pos: int, end: int) -> None:
        self.view, self.pos, self.end = view, pos, end

    def fixed(self, fmt: struct.Struct, what: str) -> tuple:
        if self.end - self.pos < fmt.size:
            raise PeerProtocolError(f"truncated {what}: {self.end - self.pos} of {fmt.size} bytes")
        values = fmt.unpack_from(self.view, self.pos)
        self.pos += fmt.size
        return values

    def take(self, size: int, what: str) -> memoryview:
        if self.end - self.pos < size:
            raise PeerProtocolError(f"truncated {what}: {self.end - self.pos} of {size} bytes")
        self.pos += size
        return self.view[self.pos - size : self.pos]

    def string(self, what: str) -> str:
        (size,) = self.fixed(_U16, f"{what} size")
        return self._utf8(size, what)

    def nullable_string(self, what: str) -> str | None:
        (size,) = self.fixed(_I16, f"{what} size")
        if size < 0:
            if size == -1:
                return None
            raise PeerProtocolError(f"{what} size {size}")
        return self._utf8(size, what)

    def _utf8(self, size: int, what: str) -> str:
        try:
            return str(self.take(size, what), "utf-8")
        except UnicodeDecodeError as exc:
            raise PeerProtocolError(f"{what} is not UTF-8: {exc.reason}") from None


def _append_request(cur: _Cursor, cid: int) -> AppendRequest:
    stream_id, acks, timeout_ms, kind = cur.fixed(_APPEND, "append request header")
    if acks not in ACKS:
        raise PeerProtocolError(f"append request acks {acks}")
    records = location = None
    if kind == DIRECT:
        (size,) = cur.fixed(_U32, "records size")
        records = cur.take(size, "records")
    elif kind == S3:
        key = cur.string("location object key")
        start, end, crc = cur.fixed(_RANGE, "location range")
        if end < start:
            raise PeerProtocolError(f"location range [{start}, {end}) ends before it starts")
        location = S3WalLocation(key, start, end, stream_id, crc)
    else:
        raise PeerProtocolError(
            f"append request payload kind {kind}: neither records (1) nor location (2)"
        )
    batch, hole = None, -1
    transactional_id, produce_version = None, -1
    header = None
    nones = False  # a trailer read as "none": only before a header
    if cur.pos < cur.end:
        sequences = cur.fixed(_SEQUENCE, "append request sequences")
        if sequences == _NO_SEQUENCE:
            nones = True
        else:
            pid, epoch, first, last, hole = sequences
            batch = ProducerBatch(pid, epoch, first, last)
    if cur.pos < cur.end:
        (produce_version,) = cur.fixed(_I16, "append request produce version")
        transactional_id = cur.string("append request transactional id")
        if (produce_version, transactional_id) == (-1, ""):
            nones, transactional_id = True, None
        elif produce_version < 0:
            raise PeerProtocolError(f"append request produce version {produce_version}")
    if cur.pos < cur.end:
        header = bytes(cur.take(BATCH_HEADER_SIZE, "append request batch header"))
    elif nones:
        raise PeerProtocolError("append request trailers written as none, with no header after")
    return AppendRequest(
        cid,
        stream_id,
        acks,
        timeout_ms,
        records,
        location,
        batch=batch,
        hole=hole,
        transactional_id=transactional_id,
        produce_version=produce_version,
        header=header,
    )


def _flag(cur: _Cursor, value: int, what: str) -> bool:
    """An optional trailing flags byte: absent (an older peer) is False, `value` is True,
    any other byte is refused (a flag this side does not know)."""
    if cur.pos >= cur.end:
        return False
    (flags,) = cur.fixed(_FLAGS, what)
    if flags != value:
        raise PeerProtocolError(f"{what} {flags:#04x}")
    return True


def _append_response(cur: _Cursor, cid: int) -> AppendResponse:
    error_code, base_offset, append_time, log_start = cur.fixed(_RESULT, "append response")
    message = cur.nullable_string("error message")
    referenced = _flag(cur, _REFERENCED, "append response flags")
    fields = (base_offset, append_time, log_start, message, referenced)
    return AppendResponse(cid, error_code, *fields)


def _admin_request(cur: _Cursor, cid: int) -> AdminRequest:
    op = cur.string("admin op")
    if op not in ADMIN_OPS:
        raise PeerProtocolError(f"admin op {op!r}")
    topic = cur.string("topic")
    topic_id = uuid.UUID(bytes=bytes(cur.take(16, "topic id")))
    return AdminRequest(cid, op, topic, topic_id)


def _admin_response(cur: _Cursor, cid: int) -> AdminResponse:
    (error_code,) = cur.fixed(_I16, "admin response error code")
    return AdminResponse(cid, error_code, cur.string("admin response message"))


def _fetch_request(cur: _Cursor, cid: int) -> FetchRequest:
    stream_id, offset, max_bytes, max_wait_ms = cur.fixed(_FETCH, "fetch request")
    stable = _flag(cur, _STABLE, "fetch request flags")
    return FetchRequest(cid, stream_id, offset, max_bytes, max_wait_ms, stable)


def _fetch_response(cur: _Cursor, cid: int) -> FetchResponse:
    error_code, high_watermark, log_start, size = cur.fixed(_FETCHED, "fetch response")
    records = cur.take(size, "records")
    last_stable = None
    if cur.pos < cur.end:
        (last_stable,) = cur.fixed(_I64, "fetch response last stable offset")
    return FetchResponse(cid, error_code, high_watermark, log_start, (records,), last_stable)


def _backfill_request(cur: _Cursor, cid: int) -> BackfillRequest:
    return BackfillRequest(cid, *cur.fixed(_BACKFILL, "backfill request"))


def _clean_commit_request(cur: _Cursor, cid: int) -> CleanCommitRequest:
    stream_id, clean_end, count = cur.fixed(_CLEAN, "clean commit request")
    objects = []
    for _ in range(count):
        object_id, size, start, end, n = cur.fixed(_CLEANED, "cleaned object")
        replaces = tuple(cur.fixed(_U64, "replaced object id")[0] for _ in range(n))
        objects.append(CleanedObject(object_id, size, start, end, replaces))
    return CleanCommitRequest(cid, stream_id, clean_end, tuple(objects))


def _trim_request(cur: _Cursor, cid: int) -> TrimRequest:
    return TrimRequest(cid, *cur.fixed(_TRIM, "trim request"))


def _trim_response(cur: _Cursor, cid: int) -> TrimResponse:
    error_code, log_start_offset = cur.fixed(_TRIMMED, "trim response")
    return TrimResponse(cid, error_code, log_start_offset, cur.string("trim response message"))


def _ping_request(cur: _Cursor, cid: int) -> PingRequest:
    return PingRequest(cid)


def _ping_response(cur: _Cursor, cid: int) -> PingResponse:
    return PingResponse(cid, cur.string("ping response name"), cur.string("ping response version"))


def _catch_up_request(cur: _Cursor, cid: int) -> CatchUpRequest:
    return CatchUpRequest(cid, *cur.fixed(_CATCH_UP, "catch-up request"))


def _producer_catch_up_request(cur: _Cursor, cid: int) -> ProducerCatchUpRequest:
    return ProducerCatchUpRequest(cid, *cur.fixed(_PRODUCER_CATCH_UP, "producer catch-up request"))


def _producers_request(cur: _Cursor, cid: int) -> ProducersRequest:
    return ProducersRequest(cid, cur.fixed(_U64, "producers request")[0])


def _shard_read_request(cur: _Cursor, cid: int) -> ShardReadRequest:
    return ShardReadRequest(cid, *cur.fixed(_SHARD_READ, "shard read request"))


def _held_request(cur: _Cursor, cid: int) -> HeldRequest:
    timeout_ms, count = cur.fixed(_HELD, "held request")
    smallest = _U64.size + _U16.size + _RANGE.size
    if count > (cur.end - cur.pos) // smallest:  # checked before anything is built
        left = cur.end - cur.pos
        raise PeerProtocolError(f"truncated held request: {count} locations in {left} bytes")
    locations = []
    for _ in range(count):
        (stream_id,) = cur.fixed(_U64, "held location stream id")
        key = cur.string("held location object key")
        start, end, crc = cur.fixed(_RANGE, "held location range")
        if end < start:
            raise PeerProtocolError(f"location range [{start}, {end}) ends before it starts")
        locations.append(S3WalLocation(key, start, end, stream_id, crc))
    return HeldRequest(cid, timeout_ms, tuple(locations))


def _held_response(cur: _Cursor, cid: int) -> HeldResponse:
    error_code, count = cur.fixed(_RELEASED, "held response")
    if count > (cur.end - cur.pos) // _U32.size:  # checked before anything is built
        left = cur.end - cur.pos
        raise PeerProtocolError(f"truncated held response: {count} indexes in {left} bytes")
    released = tuple(cur.fixed(_U32, "released index")[0] for _ in range(count))
    return HeldResponse(cid, released, error_code)


def _producers_response(cur: _Cursor, cid: int) -> ProducersResponse:
    error_code, count = cur.fixed(_PRODUCERS, "producers response")
    if count > (cur.end - cur.pos) // _PRODUCER.size:  # checked before anything is built
        left = cur.end - cur.pos
        raise PeerProtocolError(f"truncated producers response: {count} producers in {left} bytes")
    producers = tuple(
        DescribedProducer(*cur.fixed(_PRODUCER, "described producer")) for _ in range(count)
    )
    return ProducersResponse(cid, error_code, producers)


DECODERS: dict[int, Callable[[_Cursor, int], PeerMessage]] = {
    APPEND_REQUEST: _append_request,
    APPEND_RESPONSE: _append_response,
    ADMIN_REQUEST: _admin_request,
    ADMIN_RESPONSE: _admin_response,
    FETCH_REQUEST: _fetch_request,
    FETCH_RESPONSE: _fetch_response,
    BACKFILL_REQUEST: _backfill_request,
    CLEAN_COMMIT_REQUEST: _clean_commit_request,
    TRIM_REQUEST: _trim_request,
    TRIM_RESPONSE: _trim_response,
    PING_REQUEST: _ping_request,
    PING_RESPONSE: _ping_response,
    CATCH_UP_REQUEST: _catch_up_request,
    PRODUCER_CATCH_UP_REQUEST: _producer_catch_up_request,
    PRODUCERS_REQUEST: _producers_request,
    PRODUCERS_RESPONSE: _producers_response,
    SHARD_READ_REQUEST: _shard_read_request,
    HELD_REQUEST: _held_request,
    HELD_RESPONSE: _held_response,
}


def decode_body(view: memoryview, start: int, end: int, kind: int, cid: int) -> PeerMessage:
    """The message of type `kind` whose body is `view[start:end]`, filling it exactly;
    records in it are views of `view`. PeerProtocolError if it cannot be decoded, or holds
    a value its message does not allow."""
    decoder = DECODERS.get(kind)
    if decoder is None:
        raise PeerProtocolError(f"unknown message type {kind}")
    cursor = _Cursor(view, start, end)
    try:
        message = decoder(cursor, cid)
    except PeerProtocolError:
        raise
    except ValueError as exc:  # a value the message does not allow, such as offset -1
        raise PeerProtocolError(f"message type {kind}: {exc}") from None
    if cursor.pos != end:
        raise PeerProtocolError(
            f"{end - cursor.pos} trailing bytes after a {type(message).__name__}"
        )
    return message
