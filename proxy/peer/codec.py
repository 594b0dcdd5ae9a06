"""The proxy-to-proxy ("peer") protocol's frames: framing, checking and splitting a byte
stream into messages. Pure: no asyncio, no sockets.

A proxy that receives a Produce for a tiered partition it does not own hands the
partition's batches to the owner (`AppendRequest`) and relays the owner's answer
(`AppendResponse`, which mirrors `ProduceResult`). In s3 mode the batches are already in an
S3-WAL object and only their `S3WalLocation` travels; in direct mode the batches travel
inline, as opaque bytes. `AdminRequest` carries `tierproxy topics tier/untier` to the proxy
that owns the topic's metadata shard. A proxy that serves a consumer the committed offsets
of a partition it does not own asks the owner for the tail not uploaded yet
(`FetchRequest`, answered by `FetchResponse`). The messages are `peer/messages.py`, their
bodies `peer/bodies.py`; on sockets:
`peer/server.py`, `peer/clients.py`.

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
                                      10 ping request, 11 ping response,
                                      12 catch-up request, 13 producer catch-up
                                      request, 14 clean commit request (all three
                                      answered by an admin response),
                                      15 producers request, 16 producers response,
                                      17 shard read request (answered by an admin
                                      response),
                                      18 held request, 19 held response
    10      4     correlation id  u32: chosen by the requester, echoed by the answer
    14      n     body

The bodies, field by field, are `peer/bodies.py`.

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
connection, which the job reports). 4: the catch-up request (sent only to an owner at 4
or later; AddPartitionsToTxn answers a retriable error meanwhile). 5: the fetch request's
flags (ask for the last stable offset) and the fetch response's last stable offset, which
answers only a request that asked. 6: the append request's transaction trailer (the
transactional id and Produce version a transactional batch came with: the owner verifies
it with the coordinator, KIP-890; an owner before 6 gets the append without it and does
not verify). 7: the producer catch-up request (sent only to a member at 7 or later:
InitProducerId is answered without an older member's partitions caught up, as before).
8: the clean commit request (sent by `tierproxy clean`, not proxies, except a proxy
handing it on to the shard's owner: an owner older than 8 closes the connection, which
the job reports as a commit not made).
9: the producers request (DescribeProducers on a tiered partition; sent only to an owner at
9 or later: a partition whose owner is older is answered NOT_LEADER_OR_FOLLOWER).
10: the admin ops `deleted` (a tiered topic deleted through the proxy) and `look` (look at
Kafka's tiered topics now: a produce waits for a partition added to one), sent only to an
owner at 10 or later: the owner's own look at Kafka finds them a few seconds later. A
release at 10 also reads the metadata's TopicModeSet version 2 (a tiered topic's Kafka
cluster), written only while every live member is at 10 or later.
11: the shard read request (a DeleteRecords on a tiered partition is answered once every
live member has read the owner's StreamTrim; a member older than 11 is not asked, and
serves below the new log start until its reader applies the trim, as before).
12: the admin op `configs` (a tiered topic's configs, or with no topic every topic's,
changed through another proxy: read them again before the next produce), sent only to a
member at 12 or later; an older member reads them again within a minute, as before.
13: the append request's header trailer (an s3 append's 61-byte batch header: the owner
may order the batch from it, write a reference entry and answer at once, before it has
the bytes; docs/wal.md, "The owner answering from the notification"), the append
response's referenced flag (set only in answer to a request with a header, so only a
sender at 13 or later gets it) and the held request and response (which referenced S3-WAL
objects the owner still needs; sent only to an owner at 13 or later). An owner before 13
gets the append without its header and answers it from the bytes, as before.
14: no new frame: a release at 14 rebuilds a partition from the producer snapshot a trim
writes (version 3, or at a log start inside a batch: docs/sequencer.md, "Producer state
below the log start"), written only while every live member is at 14 or later (an older
one taking the shard over would fail to rebuild the partition from it).
A rolling upgrade therefore never breaks a hand-off
(docs/operations.md, "Upgrades").
"""

from __future__ import annotations

import dataclasses
import struct
from collections.abc import Sequence

from crc32c import crc32c

from proxy.kafka.frames import FedChunks
from proxy.peer.bodies import PeerProtocolError, decode_body, encode_body
from proxy.peer.messages import (
    MAX_RECORDS_BYTES,
    AppendRequest,
    Buffer,
    PeerMessage,
    buffer_size,
    check_range,
)

__all__ = [
    "DEFAULT_MAX_FRAME_BYTES",
    "CATCH_UP_PROTOCOL",
    "CLEAN_COMMIT_PROTOCOL",
    "CONFIGS_PROTOCOL",
    "PRODUCERS_PROTOCOL",
    "PRODUCER_CATCH_UP_PROTOCOL",
    "HEADER_SIZE",
    "PROTOCOL",
    "REFERENCE_PROTOCOL",
    "SEQUENCES_PROTOCOL",
    "SHARD_READ_PROTOCOL",
    "STABLE_PROTOCOL",
    "TOPIC_OPS_PROTOCOL",
    "TRIM_SNAPSHOT_PROTOCOL",
    "TXN_PROTOCOL",
    "PeerFrameReader",
    "PeerProtocolError",
    "decode_frame",
    "encode",
    "encode_frame",
    "for_peer",
    "frame_size",
    "read_frame",
]

VERSION = 1
PROTOCOL = 14  # the level this code reads and writes (docstring: "Protocol levels")
SEQUENCES_PROTOCOL = 2  # the first level that reads the append request's sequences
CATCH_UP_PROTOCOL = 4  # the first level that reads the catch-up request
STABLE_PROTOCOL = 5  # the first level that reads a fetch request's flags (last stable offset)
TXN_PROTOCOL = 6  # the first level that reads the append request's transaction trailer
PRODUCER_CATCH_UP_PROTOCOL = 7  # the first level that reads the producer catch-up request
CLEAN_COMMIT_PROTOCOL = 8  # the first level that reads the clean commit request
PRODUCERS_PROTOCOL = 9  # the first level that reads the producers request
TOPIC_OPS_PROTOCOL = 10  # the first that reads admin ops deleted, look; TopicModeSet v2
SHARD_READ_PROTOCOL = 11  # the first level that reads the shard read request
CONFIGS_PROTOCOL = 12  # the first level that reads the admin op configs
REFERENCE_PROTOCOL = 13  # the first that reads an append's header, referenced, held
TRIM_SNAPSHOT_PROTOCOL = 14  # the first whose rebuild reads a trim's producer snapshot
DEFAULT_MAX_FRAME_BYTES = 64 * 1024 * 1024

_PREFIX = struct.Struct(">II")  # length, crc
_HEAD = struct.Struct(">BBI")  # version, type, correlation id
PREFIX_SIZE = _PREFIX.size  # 8
HEADER_SIZE = PREFIX_SIZE + _HEAD.size  # 14: the smallest frame
MAX_LENGTH = 0xFFFF_FFFF
_LENGTH = struct.Struct(">I")  # the prefix's first field, read before the rest arrives
assert MAX_RECORDS_BYTES == MAX_LENGTH - HEADER_SIZE


def _parts(message: PeerMessage) -> tuple[bytes, Sequence[Buffer]]:
    """The frame after its prefix: the head (version to the body's fixed fields) and the
    records pieces that follow it, as given."""
    kind, body, tail = encode_body(message)
    return _HEAD.pack(VERSION, kind, message.correlation_id) + body, tail


# -- encoding ------------------------------------------------------------------------------


def for_peer(request: AppendRequest, peer_protocol: int) -> AppendRequest:
    """`request` as a peer at `peer_protocol` can read it: without the sequences trailer
    for one older than `SEQUENCES_PROTOCOL` (it would refuse the frame, and drop the
    connection with every call on it). That owner then judges a sequence gap by its own
    record of drops only, as it always did. Without the transaction trailer for one
    older than `TXN_PROTOCOL`: that owner does not verify transactions (KIP-890).
    Without the batch header for one older than `REFERENCE_PROTOCOL`: that owner reads
    the bytes before it answers, and never answers `referenced`."""
    if request.header is not None and peer_protocol < REFERENCE_PROTOCOL:
        request = dataclasses.replace(request, header=None)
    if request.batch is None or peer_protocol >= TXN_PROTOCOL:
        return request
    if peer_protocol >= SEQUENCES_PROTOCOL:
        if request.transactional_id is None:
            return request
        return dataclasses.replace(request, transactional_id=None, produce_version=-1)
    return dataclasses.replace(
        request, batch=None, hole=-1, transactional_id=None, produce_version=-1
    )


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


def read_frame(
    buf: Buffer, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES
) -> tuple[PeerMessage | None, int]:
    """The message framed at the start of `buf` and how many bytes it took, or (None, n)
    when nothing can be decided before `buf` holds n bytes. A length out of bounds is refused
    as soon as its 4 bytes are there, before any body is waited for. Records in the
    message are a view of `buf`."""
    view = memoryview(buf).cast("B")
    if len(view) < _LENGTH.size:
        return None, _LENGTH.size
    (length,) = _LENGTH.unpack_from(view, 0)
    size = PREFIX_SIZE + length
    if length < _HEAD.size:
        raise PeerProtocolError(f"frame length {length} is below the minimum {_HEAD.size}")
    if size > max_frame_bytes:
        raise PeerProtocolError(f"frame of {size} bytes is over the limit {max_frame_bytes}")
    if len(view) < size:
        return None, size
    (crc,) = _LENGTH.unpack_from(view, 4)
    actual = crc32c(view[PREFIX_SIZE:size])
    if actual != crc:
        raise PeerProtocolError(f"bad crc: frame says {crc:#010x}, its bytes give {actual:#010x}")
    version, kind, cid = _HEAD.unpack_from(view, PREFIX_SIZE)
    if version != VERSION:
        raise PeerProtocolError(f"unsupported version {version}")
    return decode_body(view, HEADER_SIZE, size, kind, cid), size


def decode_frame(frame: Buffer, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> PeerMessage:
    """Exactly one whole frame, nothing before or after it."""
    message, size = read_frame(frame, max_frame_bytes)
    if message is None:
        raise PeerProtocolError(f"truncated frame: {len(frame)} of {size} bytes")
    if size != len(frame):
        raise PeerProtocolError(f"{len(frame) - size} bytes after the frame")
    return message


class PeerFrameReader(FedChunks):
    """Splits a byte stream into messages, h11 style: `feed()` bytes as they arrive, then
    `next_message()` until it returns None. Chunks are held unjoined until a frame is
    whole, so frames inside one chunk are decoded in place and a large frame arriving in
    many chunks is joined once. After a PeerProtocolError the reader stays failed."""

    def __init__(self, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> None:
        check_range("max_frame_bytes", max_frame_bytes, HEADER_SIZE, PREFIX_SIZE + MAX_LENGTH)
        super().__init__()
        self.max_frame_bytes = max_frame_bytes
        self._needed = _LENGTH.size  # bytes that must be buffered before a read can progress
        self._error: PeerProtocolError | None = None

    @property
    def buffered(self) -> int:
        """Bytes received and not yet returned as messages."""
        return self._buffered

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
        self._needed = _LENGTH.size
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
