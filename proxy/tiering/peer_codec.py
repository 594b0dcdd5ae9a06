"""The proxy-to-proxy ("peer") protocol: messages and frames. Pure: no asyncio, no sockets.

A proxy that receives a Produce for a tiered partition it does not own hands the
partition's batches to the owner (`AppendRequest`) and relays the owner's answer
(`AppendResponse`, which mirrors `ProduceResult`). In s3 mode the batches are already in an
S3-WAL object and only their `S3WalLocation` travels; in direct mode the batches travel
inline, as opaque bytes. `AdminRequest` carries `tierproxy topics tier/untier` to the proxy
that owns the topic's metadata shard. `proxy/server/peers.py` puts this on sockets.

Every message is one frame, big-endian::

    offset  size  field
    0       4     length          u32: bytes after the crc field (6 + body size)
    4       4     crc             u32: CRC-32C (Castagnoli) of those `length` bytes
    8       1     version         u8: 1
    9       1     type            u8: 1 append request, 2 append response,
                                      3 admin request, 4 admin response
    10      4     correlation id  u32: chosen by the requester, echoed by the answer
    14      n     body

Bodies (string: u16 size + UTF-8; nullable string: i16 size, -1 for null)::

    append request   stream_id u64, acks i16, timeout_ms i32, payload kind u8, then
                     kind 1 (direct): records size u32, records
                     kind 2 (s3):     object_key string, start u64, end u64, crc u32
                     (the location's stream id is the request's)
    append response  error_code i16, base_offset i64, log_append_time_ms i64,
                     log_start_offset i64, error_message nullable string
    admin request    op string ("tier" | "untier"), topic string, topic_id 16 bytes
    admin response   error_code i16, message string

Two error families: bytes that cannot be decoded raise `PeerProtocolError` (the adapter
closes that connection); a message that cannot be built (both or neither payload, a value
out of range) raises a plain `ValueError` (the caller's bug).
"""

from __future__ import annotations

import struct
import uuid
from collections import deque
from dataclasses import dataclass

from crc32c import crc32c

from proxy.tiering.partition_rules import ProduceResult
from proxy.wal.s3walobject import S3WalLocation

VERSION = 1
DEFAULT_MAX_FRAME_BYTES = 64 * 1024 * 1024

_PREFIX = struct.Struct(">II")  # length, crc
_HEAD = struct.Struct(">BBI")  # version, type, correlation id
PREFIX_SIZE = _PREFIX.size  # 8
HEADER_SIZE = PREFIX_SIZE + _HEAD.size  # 14: the smallest frame
MAX_LENGTH = 0xFFFF_FFFF

_APPEND = struct.Struct(">QhiB")  # stream_id, acks, timeout_ms, payload kind
_U32 = struct.Struct(">I")
_U16 = struct.Struct(">H")
_I16 = struct.Struct(">h")
_RANGE = struct.Struct(">QQI")  # start, end, crc
_RESULT = struct.Struct(">hqqq")  # error_code, base_offset, log_append_time_ms, log_start_offset

DIRECT = 1
S3 = 2
ACKS = (-1, 0, 1)
ADMIN_OPS = ("tier", "untier")

Buffer = bytes | bytearray | memoryview


class PeerProtocolError(ValueError):
    """Bytes from a peer that are not a valid frame; the connection must close."""


# -- messages ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AppendRequest:
    """Append these batches to `stream_id` on its owner: `records` inline (direct mode) or
    the `location` of an S3-WAL range (s3 mode), exactly one. Decoded records are a view
    of the received frame, not a copy."""

    correlation_id: int
    stream_id: int
    acks: int
    timeout_ms: int
    records: bytes | bytearray | memoryview | None = None
    location: S3WalLocation | None = None

    def __post_init__(self) -> None:
        _check_range("correlation_id", self.correlation_id, 0, 0xFFFF_FFFF)
        _check_range("stream_id", self.stream_id, 0, (1 << 64) - 1)
        if self.acks not in ACKS:
            raise ValueError(f"acks {self.acks}: must be -1, 0 or 1")
        _check_range("timeout_ms", self.timeout_ms, -(1 << 31), (1 << 31) - 1)
        if (self.records is None) == (self.location is None):
            raise ValueError("an append carries exactly one of records (direct) or location (s3)")
        if self.records is not None and len(self.records) > MAX_LENGTH - HEADER_SIZE:
            raise ValueError(f"{len(self.records)} bytes of records do not fit in a frame")
        if self.location is not None:
            loc = self.location
            if loc.stream_id != self.stream_id:
                raise ValueError(
                    f"location of stream {loc.stream_id} in an append to {self.stream_id}"
                )
            _check_range("location.start", loc.start, 0, (1 << 64) - 1)
            _check_range("location.end", loc.end, loc.start, (1 << 64) - 1)
            _check_range("location.crc", loc.crc, 0, 0xFFFF_FFFF)
            _check_string("location.object_key", loc.object_key, 0xFFFF)


@dataclass(frozen=True, slots=True)
class AppendResponse:
    """The owner's answer to an append: one partition's Produce answer."""

    correlation_id: int
    error_code: int
    base_offset: int = -1
    log_append_time_ms: int = -1
    log_start_offset: int = -1
    error_message: str | None = None

    def __post_init__(self) -> None:
        _check_range("correlation_id", self.correlation_id, 0, 0xFFFF_FFFF)
        _check_range("error_code", self.error_code, -(1 << 15), (1 << 15) - 1)
        for name in ("base_offset", "log_append_time_ms", "log_start_offset"):
            _check_range(name, getattr(self, name), -(1 << 63), (1 << 63) - 1)
        if self.error_message is not None:
            _check_string("error_message", self.error_message, 0x7FFF)

    @classmethod
    def from_result(cls, correlation_id: int, r: ProduceResult) -> AppendResponse:
        fields = (r.base_offset, r.log_append_time_ms, r.log_start_offset, r.error_message)
        return cls(correlation_id, r.error_code, *fields)

    def result(self) -> ProduceResult:
        fields = (self.base_offset, self.log_append_time_ms, self.log_start_offset)
        return ProduceResult(self.error_code, *fields, self.error_message)


@dataclass(frozen=True, slots=True)
class AdminRequest:
    """Tier or untier `topic` (by name and id), on the owner of its metadata shard."""

    correlation_id: int
    op: str
    topic: str
    topic_id: uuid.UUID

    def __post_init__(self) -> None:
        _check_range("correlation_id", self.correlation_id, 0, 0xFFFF_FFFF)
        if self.op not in ADMIN_OPS:
            raise ValueError(f"admin op {self.op!r}: must be one of {', '.join(ADMIN_OPS)}")
        _check_string("topic", self.topic, 0xFFFF)
        if not isinstance(self.topic_id, uuid.UUID):
            raise ValueError(f"topic_id {self.topic_id!r} is not a UUID")


@dataclass(frozen=True, slots=True)
class AdminResponse:
    correlation_id: int
    error_code: int
    message: str

    def __post_init__(self) -> None:
        _check_range("correlation_id", self.correlation_id, 0, 0xFFFF_FFFF)
        _check_range("error_code", self.error_code, -(1 << 15), (1 << 15) - 1)
        _check_string("message", self.message, 0xFFFF)


PeerMessage = AppendRequest | AppendResponse | AdminRequest | AdminResponse

APPEND_REQUEST, APPEND_RESPONSE, ADMIN_REQUEST, ADMIN_RESPONSE = 1, 2, 3, 4


def _check_range(name: str, value: int, low: int, high: int) -> None:
    if not isinstance(value, int) or not low <= value <= high:
        raise ValueError(f"{name} {value!r}: must be an integer in [{low}, {high}]")


def _check_string(name: str, value: str, max_bytes: int) -> None:
    if not isinstance(value, str):
        raise ValueError(f"{name} {value!r} is not a string")
    if len(value) > max_bytes // 4 and len(value.encode()) > max_bytes:
        raise ValueError(f"{name}: {len(value.encode())} UTF-8 bytes, at most {max_bytes}")


# -- encoding ------------------------------------------------------------------------------


def _string(value: str) -> bytes:
    data = value.encode()
    return _U16.pack(len(data)) + data


def _nullable_string(value: str | None) -> bytes:
    if value is None:
        return _I16.pack(-1)
    data = value.encode()
    return _I16.pack(len(data)) + data


def encode(message: PeerMessage, *, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> list[Buffer]:
    """The frame of `message` as pieces to write in order (`writelines`): direct-mode
    records are the last piece, as given, never copied into the frame. Raises ValueError
    when the frame would be larger than `max_frame_bytes`."""
    tail: Buffer = b""
    if isinstance(message, AppendRequest):
        kind = APPEND_REQUEST
        loc = message.location
        if loc is None:
            assert message.records is not None
            tail = message.records
            body = _APPEND.pack(message.stream_id, message.acks, message.timeout_ms, DIRECT)
            body += _U32.pack(len(tail))
        else:
            body = _APPEND.pack(message.stream_id, message.acks, message.timeout_ms, S3)
            body += _string(loc.object_key) + _RANGE.pack(loc.start, loc.end, loc.crc)
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
    else:
        raise TypeError(f"not a peer message: {message!r}")
    head = _HEAD.pack(VERSION, kind, message.correlation_id) + body
    size = PREFIX_SIZE + len(head) + len(tail)
    if size > max_frame_bytes:
        raise ValueError(
            f"a {type(message).__name__} frame of {size} bytes is over the limit {max_frame_bytes}"
        )
    crc = crc32c(tail, crc32c(head)) if tail else crc32c(head)
    prefix = _PREFIX.pack(size - PREFIX_SIZE, crc) + head
    return [prefix, tail] if tail else [prefix]


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
    if kind == DIRECT:
        (size,) = cur.fixed(_U32, "records size")
        records = cur.take(size, "records")
        return AppendRequest(cid, stream_id, acks, timeout_ms, records=records)
    if kind == S3:
        key = cur.string("location object key")
        start, end, crc = cur.fixed(_RANGE, "location range")
        if end < start:
            raise PeerProtocolError(f"location range [{start}, {end}) ends before it starts")
        location = S3WalLocation(key, start, end, stream_id, crc)
        return AppendRequest(cid, stream_id, acks, timeout_ms, location=location)
    raise PeerProtocolError(
        f"append request payload kind {kind}: neither records (1) nor location (2)"
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


_DECODERS = {
    APPEND_REQUEST: _append_request,
    APPEND_RESPONSE: _append_response,
    ADMIN_REQUEST: _admin_request,
    ADMIN_RESPONSE: _admin_response,
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
    message = decoder(cursor, cid)
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
        _check_range("max_frame_bytes", max_frame_bytes, HEADER_SIZE, PREFIX_SIZE + MAX_LENGTH)
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
