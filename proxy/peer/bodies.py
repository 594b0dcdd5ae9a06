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
    append response  error_code i16, base_offset i64, log_append_time_ms i64,
                     log_start_offset i64, error_message nullable string
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

_APPEND = struct.Struct(">QhiB")  # stream_id, acks, timeout_ms, payload kind
_U32 = struct.Struct(">I")
_U16 = struct.Struct(">H")
_I16 = struct.Struct(">h")
_RANGE = struct.Struct(">QQI")  # start, end, crc
_SEQUENCE = struct.Struct(">qhiii")  # producer id, epoch, first and last sequence, hole
_RESULT = struct.Struct(">hqqq")  # error_code, base_offset, log_append_time_ms, log_start_offset
_FETCH = struct.Struct(">Qqii")  # stream_id, offset, max_bytes, max_wait_ms
_FETCHED = struct.Struct(">hqqI")  # error_code, high_watermark, log_start_offset, records size
_FLAGS = struct.Struct(">B")  # a fetch request's trailer
_STABLE = 1  # its flag: answer the last stable offset
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
        b = message.batch
        if b is not None:  # after the records, which are the tail pieces (never copied)
            trailer = _SEQUENCE.pack(
                b.producer_id, b.producer_epoch, b.first_sequence, b.last_sequence, message.hole
            )
            if message.transactional_id is not None:
                trailer += _I16.pack(message.produce_version) + _string(message.transactional_id)
            if tail:
                tail = (*tail, trailer)
            else:
                body += trailer
    elif isinstance(message, AppendResponse):
        kind = APPEND_RESPONSE
        r = message
        body = _RESULT.pack(r.error_code, r.base_offset, r.log_append_time_ms, r.log_start_offset)
        body += _nullable_string(r.error_message)
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
    else:
        raise TypeError(f"not a peer message: {message!r}")
    return kind, body, tail


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
    if cur.pos < cur.end:
        pid, epoch, first, last, hole = cur.fixed(_SEQUENCE, "append request sequences")
        batch = ProducerBatch(pid, epoch, first, last)
    if cur.pos < cur.end:
        (produce_version,) = cur.fixed(_I16, "append request produce version")
        if produce_version < 0:
            raise PeerProtocolError(f"append request produce version {produce_version}")
        transactional_id = cur.string("append request transactional id")
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
    )


def _append_response(cur: _Cursor, cid: int) -> AppendResponse:
    error_code, base_offset, append_time, log_start = cur.fixed(_RESULT, "append response")
    message = cur.nullable_string("error message")
    return AppendResponse(cid, error_code, base_offset, append_time, log_start, message)


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
    stable = False
    if cur.pos < cur.end:
        (flags,) = cur.fixed(_FLAGS, "fetch request flags")
        if flags != _STABLE:
            raise PeerProtocolError(f"fetch request flags {flags:#04x}")
        stable = True
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
