"""The proxy-to-proxy ("peer") protocol's frames. Pure: no asyncio, no sockets.

A proxy that receives a Produce for a tiered partition it does not own hands the
partition's batches to the owner (`AppendRequest`) and relays the owner's answer
(`AppendResponse`, which mirrors `ProduceResult`). In s3 mode the batches are already in an
S3-WAL object and only their `S3WalLocation` travels; in direct mode the batches travel
inline, as opaque bytes. `AdminRequest` carries `tierproxy topics tier/untier` to the proxy
that owns the topic's metadata shard. A proxy that serves a consumer the committed offsets
of a partition it does not own asks the owner for the tail not uploaded yet
(`FetchRequest`, answered by `FetchResponse`). The messages are `peer_messages.py` (their
classes import from here too); on sockets: `proxy/peer/server.py`, `peer_clients.py`.

Every message is one frame, big-endian::

    offset  size  field
    0       4     length          u32: bytes after the crc field (6 + body size)
    4       4     crc             u32: CRC-32C (Castagnoli) of those `length` bytes
    8       1     version         u8: 1
    9       1     type            u8: 1 append request, 2 append response,
                                      3 admin request, 4 admin response,
                                      5 fetch request, 6 fetch response,
                                      7 backfill request (answered by an admin response),
                                      8 trim request, 9 trim response,
                                      10 ping request, 11 ping response
    10      4     correlation id  u32: chosen by the requester, echoed by the answer
    14      n     body

Bodies (string: u16 size + UTF-8; nullable string: i16 size, -1 for null)::

    append request   stream_id u64, acks i16, timeout_ms i32, payload kind u8, then
                     kind 1 (direct): records size u32, records
                     kind 2 (s3):     object_key string, start u64, end u64, crc u32
                     (the location's stream id is the request's)
                     then, optionally (an idempotent producer's batches): producer_id i64,
                     producer_epoch i16, first_sequence i32, last_sequence i32, hole i32
                     (-1: none; docs/sequencer.md, "Gaps the proxy made"), only to a
                     peer at protocol 2 or later (below)
    append response  error_code i16, base_offset i64, log_append_time_ms i64,
                     log_start_offset i64, error_message nullable string
    admin request    op string ("tier" | "untier" | "seal" | "unseal"), topic string,
                     topic_id 16 bytes
    admin response   error_code i16, message string
    fetch request    stream_id u64, offset i64 (>= 0), max_bytes i32 (>= 0),
                     max_wait_ms i32 (>= 0)
    fetch response   error_code i16, high_watermark i64, log_start_offset i64,
                     records size u32, records (whole batches, one after another)
    backfill request object_id u64, size i64 (> 0), stream_id u64, start_offset i64,
                     end_offset i64 (> start_offset)
    trim request     stream_id u64, offset i64 (>= -1), timeout_ms i32 (>= 0)
    trim response    error_code i16, log_start_offset i64 (>= -1), message string
    ping request     (empty)
    ping response    name string (the proxy's fleet.name), version string

Every frame is version 1: a new message is a new type (and a new protocol level, below),
so the frames of the older messages stay readable both ways. A type this code does not
know is refused like any bad frame, so a peer sending fetches (or pings) to a proxy that
predates them loses that connection (and the calls waiting on it).

Two error families: bytes that cannot be decoded, including values a message does not
allow, raise `PeerProtocolError` (the adapter closes that connection); a message that
cannot be built raises a plain `ValueError` (the caller's bug).

Protocol levels. A proxy refuses any frame version but 1 and any byte after a message's
last field, so a frame an older proxy would refuse is sent to it only once it is known
to read it: every member's fleet heartbeat says the `PROTOCOL` its listener speaks
(`proxy/routing/fleet.py`, `peer_protocol`, 1 when absent), and `for_peer` drops what
the receiver's level lacks. 1: the first release. 2: the append request's sequences
trailer. 3: the ping (sent by offload jobs, not proxies: one older than 3 closes the
connection, which the job reports). A rolling upgrade therefore never breaks a hand-off
(docs/operations.md, "Upgrades").
"""

from __future__ import annotations

import dataclasses
import struct
import uuid
from collections import deque
from collections.abc import Sequence

from crc32c import crc32c

from proxy.handoff.objects import S3WalLocation
from proxy.partition.sequence_holes import ProducerBatch
from proxy.peer.messages import (
    ACKS,
    ADMIN_OPS,
    MAX_RECORDS_BYTES,
    AdminRequest,
    AdminResponse,
    AppendRequest,
    AppendResponse,
    BackfillRequest,
    Buffer,
    FetchRequest,
    FetchResponse,
    PeerMessage,
    PingRequest,
    PingResponse,
    TrimRequest,
    TrimResponse,
    buffer_size,
    check_range,
)

VERSION = 1
PROTOCOL = 3  # the level this code reads and writes (docstring: "Protocol levels")
SEQUENCES_PROTOCOL = 2  # the first level that reads the append request's sequences
DEFAULT_MAX_FRAME_BYTES = 64 * 1024 * 1024

_PREFIX = struct.Struct(">II")  # length, crc
_HEAD = struct.Struct(">BBI")  # version, type, correlation id
PREFIX_SIZE = _PREFIX.size  # 8
HEADER_SIZE = PREFIX_SIZE + _HEAD.size  # 14: the smallest frame
MAX_LENGTH = 0xFFFF_FFFF
assert MAX_RECORDS_BYTES == MAX_LENGTH - HEADER_SIZE

_APPEND = struct.Struct(">QhiB")  # stream_id, acks, timeout_ms, payload kind
_U32 = struct.Struct(">I")
_U16 = struct.Struct(">H")
_I16 = struct.Struct(">h")
_RANGE = struct.Struct(">QQI")  # start, end, crc
_SEQUENCE = struct.Struct(">qhiii")  # producer id, epoch, first and last sequence, hole
_RESULT = struct.Struct(">hqqq")  # error_code, base_offset, log_append_time_ms, log_start_offset
_FETCH = struct.Struct(">Qqii")  # stream_id, offset, max_bytes, max_wait_ms
_FETCHED = struct.Struct(">hqqI")  # error_code, high_watermark, log_start_offset, records size
_BACKFILL = struct.Struct(">QqQqq")  # object_id, size, stream_id, start_offset, end_offset
_TRIM = struct.Struct(">Qqi")  # stream_id, offset, timeout_ms
_TRIMMED = struct.Struct(">hq")  # error_code, log_start_offset

DIRECT = 1
S3 = 2

APPEND_REQUEST, APPEND_RESPONSE, ADMIN_REQUEST, ADMIN_RESPONSE = 1, 2, 3, 4
FETCH_REQUEST, FETCH_RESPONSE = 5, 6
BACKFILL_REQUEST = 7
TRIM_REQUEST, TRIM_RESPONSE = 8, 9
PING_REQUEST, PING_RESPONSE = 10, 11


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


def _parts(message: PeerMessage) -> tuple[bytes, Sequence[Buffer]]:
    """The frame after its prefix: the head (version to the body's fixed fields) and the
    records pieces that follow it, as given."""
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
            if tail:
                tail = (*tail, trailer)
            else:
                body += trailer
    elif isinstance(message, AppendResponse):
        kind = APPEND_RESPONSE
        m = message
        body = _RESULT.pack(m.error_code, m.base_offset, m.log_append_time_ms, m.log_start_offset)
        body += _nullable_string(m.error_message)
    elif isinstance(message, AdminRequest):
        kind = ADMIN_REQUEST
        body = _string(message.op) + _string(message.topic) + message.topic_id.bytes
    elif isinstance(message, AdminResponse):
        kind = ADMIN_RESPONSE
        body = _I16.pack(message.error_code) + _string(message.message)
    elif isinstance(message, FetchRequest):
        kind = FETCH_REQUEST
        m = message
        body = _FETCH.pack(m.stream_id, m.offset, m.max_bytes, m.max_wait_ms)
    elif isinstance(message, FetchResponse):
        kind = FETCH_RESPONSE
        m = message
        tail = m.records
        body = _FETCHED.pack(m.error_code, m.high_watermark, m.log_start_offset, m.records_size)
    elif isinstance(message, BackfillRequest):
        kind = BACKFILL_REQUEST
        m = message
        body = _BACKFILL.pack(m.object_id, m.size, m.stream_id, m.start_offset, m.end_offset)
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
    else:
        raise TypeError(f"not a peer message: {message!r}")
    return _HEAD.pack(VERSION, kind, message.correlation_id) + body, tail


def for_peer(request: AppendRequest, peer_protocol: int) -> AppendRequest:
    """`request` as a peer at `peer_protocol` can read it: without the sequences trailer
    for one older than `SEQUENCES_PROTOCOL` (it would refuse the frame, and drop the
    connection with every call on it). That owner then judges a sequence gap by its own
    record of drops only, as it always did."""
    if request.batch is None or peer_protocol >= SEQUENCES_PROTOCOL:
        return request
    return dataclasses.replace(request, batch=None, hole=-1)


def frame_size(message: PeerMessage) -> int:
    """How many bytes `message` takes on the wire (byte counts), without framing it."""
    head, tail = _parts(message)
    return PREFIX_SIZE + len(head) + sum(map(buffer_size, tail))


def encode(message: PeerMessage, *, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> list[Buffer]:
    """The frame of `message` as pieces to write in order (`writelines`): records (direct
    appends, fetch answers) are the last pieces, as given, never copied into the frame.
    Raises ValueError when the frame would be larger than `max_frame_bytes`."""
    head, tail = _parts(message)
    size = PREFIX_SIZE + len(head) + sum(map(buffer_size, tail))
    if size > max_frame_bytes:
        raise ValueError(
            f"a {type(message).__name__} frame of {size} bytes is over the limit {max_frame_bytes}"
        )
    crc = crc32c(head)
    for piece in tail:
        crc = crc32c(piece, crc)
    return [_PREFIX.pack(size - PREFIX_SIZE, crc) + head, *tail]


def encode_frame(message: PeerMessage, *, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> bytes:
    """The whole frame as one bytes object (tests and tools; the adapter writes pieces)."""
    return b"".join(encode(message, max_frame_bytes=max_frame_bytes))


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
    if cur.pos < cur.end:
        pid, epoch, first, last, hole = cur.fixed(_SEQUENCE, "append request sequences")
        batch = ProducerBatch(pid, epoch, first, last)
    return AppendRequest(
        cid, stream_id, acks, timeout_ms, records, location, batch=batch, hole=hole
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
    return FetchRequest(cid, stream_id, offset, max_bytes, max_wait_ms)


def _fetch_response(cur: _Cursor, cid: int) -> FetchResponse:
    error_code, high_watermark, log_start, size = cur.fixed(_FETCHED, "fetch response")
    records = cur.take(size, "records")
    return FetchResponse(cid, error_code, high_watermark, log_start, (records,))


def _backfill_request(cur: _Cursor, cid: int) -> BackfillRequest:
    return BackfillRequest(cid, *cur.fixed(_BACKFILL, "backfill request"))


def _trim_request(cur: _Cursor, cid: int) -> TrimRequest:
    return TrimRequest(cid, *cur.fixed(_TRIM, "trim request"))


def _trim_response(cur: _Cursor, cid: int) -> TrimResponse:
    error_code, log_start_offset = cur.fixed(_TRIMMED, "trim response")
    return TrimResponse(cid, error_code, log_start_offset, cur.string("trim response message"))


def _ping_request(cur: _Cursor, cid: int) -> PingRequest:
    return PingRequest(cid)


def _ping_response(cur: _Cursor, cid: int) -> PingResponse:
    return PingResponse(cid, cur.string("ping response name"), cur.string("ping response version"))


_DECODERS = {
    APPEND_REQUEST: _append_request,
    APPEND_RESPONSE: _append_response,
    ADMIN_REQUEST: _admin_request,
    ADMIN_RESPONSE: _admin_response,
    FETCH_REQUEST: _fetch_request,
    FETCH_RESPONSE: _fetch_response,
    BACKFILL_REQUEST: _backfill_request,
    TRIM_REQUEST: _trim_request,
    TRIM_RESPONSE: _trim_response,
    PING_REQUEST: _ping_request,
    PING_RESPONSE: _ping_response,
}


def read_frame(
    buf: Buffer, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES
) -> tuple[PeerMessage | None, int]:
    """The message framed at the start of `buf` and how many bytes it took, or (None, n)
    when nothing can be decided before `buf` holds n bytes. A length out of bounds is refused
    as soon as its 4 bytes are there, before any body is waited for. Records in the
    message are a view of `buf`."""
    view = memoryview(buf).cast("B")
    if len(view) < _U32.size:
        return None, _U32.size
    (length,) = _U32.unpack_from(view, 0)
    size = PREFIX_SIZE + length
    if length < _HEAD.size:
        raise PeerProtocolError(f"frame length {length} is below the minimum {_HEAD.size}")
    if size > max_frame_bytes:
        raise PeerProtocolError(f"frame of {size} bytes is over the limit {max_frame_bytes}")
    if len(view) < size:
        return None, size
    (crc,) = _U32.unpack_from(view, 4)
    actual = crc32c(view[PREFIX_SIZE:size])
    if actual != crc:
        raise PeerProtocolError(f"bad crc: frame says {crc:#010x}, its bytes give {actual:#010x}")
    version, kind, cid = _HEAD.unpack_from(view, PREFIX_SIZE)
    if version != VERSION:
        raise PeerProtocolError(f"unsupported version {version}")
    decoder = _DECODERS.get(kind)
    if decoder is None:
        raise PeerProtocolError(f"unknown message type {kind}")
    cursor = _Cursor(view, HEADER_SIZE, size)
    try:
        message = decoder(cursor, cid)
    except PeerProtocolError:
        raise
    except ValueError as exc:  # a value the message does not allow, such as offset -1
        raise PeerProtocolError(f"message type {kind}: {exc}") from None
    if cursor.pos != size:
        raise PeerProtocolError(
            f"{size - cursor.pos} trailing bytes after a {type(message).__name__}"
        )
    return message, size


def decode_frame(frame: Buffer, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> PeerMessage:
    """Exactly one whole frame, nothing before or after it."""
    message, size = read_frame(frame, max_frame_bytes)
    if message is None:
        raise PeerProtocolError(f"truncated frame: {len(frame)} of {size} bytes")
    if size != len(frame):
        raise PeerProtocolError(f"{len(frame) - size} bytes after the frame")
    return message


class PeerFrameReader:
    """Splits a byte stream into messages, h11 style: `feed()` bytes as they arrive, then
    `next_message()` until it returns None. Chunks are held unjoined until a frame is
    whole, so frames inside one chunk are decoded in place and a large frame arriving in
    many chunks is joined once. After a PeerProtocolError the reader stays failed."""

    def __init__(self, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> None:
        check_range("max_frame_bytes", max_frame_bytes, HEADER_SIZE, PREFIX_SIZE + MAX_LENGTH)
        self.max_frame_bytes = max_frame_bytes
        self._chunks: deque[memoryview] = deque()
        self._buffered = 0
        self._needed = _U32.size  # bytes that must be buffered before a read can progress
        self._error: PeerProtocolError | None = None

    @property
    def buffered(self) -> int:
        """Bytes received and not yet returned as messages."""
        return self._buffered

    def feed(self, data: Buffer) -> None:
        if not data:
            return
        if not isinstance(data, bytes):
            # Messages are views of what was fed: a buffer the caller reuses must be copied.
            data = bytes(data)
        self._chunks.append(memoryview(data))
        self._buffered += len(data)

    def next_message(self) -> PeerMessage | None:
        if self._error is not None:
            raise self._error
        if self._buffered < self._needed:
            return None
        if len(self._chunks) > 1:
            joined = memoryview(b"".join(self._chunks))
            self._chunks.clear()
            self._chunks.append(joined)
        head = self._chunks[0]
        try:
            message, size = read_frame(head, self.max_frame_bytes)
        except PeerProtocolError as exc:
            self._error = exc
            raise
        if message is None:
            self._needed = size
            return None
        self._needed = _U32.size
        self._buffered -= size
        if size == len(head):
            self._chunks.popleft()
        else:
            self._chunks[0] = head[size:]
        return message

    def messages(self) -> list[PeerMessage]:
        """Every whole message buffered now."""
        out = []
        while (message := self.next_message()) is not None:
            out.append(message)
        return out
