"""A Fetch v16+ answer streamed through while its trailing tagged fields are found.

From v16 (KIP-951) a Fetch answer may name the new leaders of partitions that moved, in
the top-level tagged field `node_endpoints`: after every partition, records included. So
the answer is walked as it streams, and only that trailing section is held back and its
addresses rewritten (`rewrite_tail`). The walk reads the structure (counts, lengths,
tagged-field headers: a few bytes per partition) and jumps over everything else, records
above all, which pass through a buffer at a time, never read.

`walk_fetch_answer` is a pure pull parser (no I/O): it yields n > 0 to be sent the next n
bytes, -n to have the next n bytes passed on unread, and returns where the top-level
tagged fields begin; the connection drives it (`streams.pass_fetch_through`).

The answer's size went to the client before its first byte, so the rewritten section must
keep the length Kafka gave it. A shorter one is made up: by 1-4 bytes, its field count is
written as a longer varint (continuation bytes of zeros: the same number to every varint
reader, Kafka's, librdkafka's, Go's); by more, with a tagged field of PADDING_TAG, far
above the tags Kafka's schemas use (readers skip a tag they do not know, as the protocol
requires). A longer one, where the proxy's host names are longer than the
brokers', cannot fit: the endpoints are left out, and the client finds the new leader by
Metadata, as it does before KIP-951. Node endpoints come with NOT_LEADER_OR_FOLLOWER and
FENCED_LEADER_EPOCH, whose partitions carry no records, so such answers are small: one
that fits in the connection's buffer is read whole and rewritten at its own length instead
(connection.py), and only a large answer with an endpoint among its records can lose it.
"""

from __future__ import annotations

from collections.abc import Generator

from proxy.apis.api01_fetch import API_KEY, RESPONSES
from proxy.apis.fetch_split import answer_layout
from proxy.kafka.codec import response_type
from proxy.kafka.frames import FrameError
from proxy.kafka.rewrite import Advertise, encode_tagged_fields, rewrite_tagged_fields

PADDING_TAG = 10_000  # a tagged field of zeros that only keeps a section's length
_SESSION_HEAD = 4 + 2 + 4  # throttle_time_ms, error_code, session_id
_ABORTED = 8 + 8  # producer_id, first_offset
_UVARINT_BYTES = 5

Walk = Generator[int, bytes, None]


def walk_fetch_answer(api_version: int) -> Walk:
    """The walk of a flexible (v12+) Fetch answer from the end of the correlation id: the
    response header's tagged fields, then the body up to its top-level tagged fields."""
    layout = answer_layout(api_version)
    if not layout.flexible:
        raise ValueError(f"Fetch v{api_version} answers are not flexible")
    yield from _tags()  # response header v1
    yield -_SESSION_HEAD
    for _ in range((yield from _count())):
        if layout.topic_id:
            yield -16
        else:
            size = (yield from _uvarint()) - 1
            if size > 0:
                yield -size
        for _ in range((yield from _count())):
            yield -layout.answer_head.size
            for _ in range((yield from _count())):
                yield -_ABORTED
                yield from _tags()
            if layout.preferred_read_replica:
                yield -4
            size = (yield from _uvarint()) - 1  # records, compact nullable bytes
            if size > 0:
                yield -size
            yield from _tags()
        yield from _tags()


def _uvarint() -> Generator[int, bytes, int]:
    value = 0
    for shift in range(0, 7 * _UVARINT_BYTES, 7):
        (byte,) = yield 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value
    raise FrameError(f"a varint longer than {_UVARINT_BYTES} bytes")


def _count() -> Generator[int, bytes, int]:
    """A compact array's length; a null array (0) has no item."""
    return max((yield from _uvarint()) - 1, 0)


def _tags() -> Generator[int, bytes, None]:
    for _ in range((yield from _uvarint())):
        yield from _uvarint()  # the tag
        size = yield from _uvarint()
        if size:
            yield -size


def rewrite_tail(api_version: int, tail: memoryview, advertise: Advertise) -> bytes | memoryview:
    """The top-level tagged fields of a Fetch v16+ answer with the node endpoints'
    addresses rewritten, as long as `tail` was (see the module docstring); `tail` itself
    when nothing changed. FrameError if it is malformed."""
    response = response_type(RESPONSES, API_KEY, api_version)
    fields = rewrite_tagged_fields(response, "node_endpoints", tail, advertise)
    if fields is None:
        return tail
    fitted = _fit(fields, len(tail))
    if fitted is None:  # the proxy's addresses are longer: leave the endpoints out
        tag = response.__dataclass_fields__["node_endpoints"].metadata["tag"]
        fitted = _fit([(each, value) for each, value in fields if each != tag], len(tail))
    if fitted is None:
        raise FrameError(f"top-level tagged fields of {len(tail)} bytes cannot be rewritten")
    return fitted


def _fit(fields: list[tuple[int, bytes | memoryview]], length: int) -> bytes | None:
    """The section of `fields`, `length` bytes long; None if longer. A few bytes short
    are made up by writing the field count in a longer varint (continuation bytes of
    zeros, read as the same number), more by a padding field."""
    pieces = encode_tagged_fields(fields)
    extra = length - sum(len(piece) for piece in pieces)
    if extra < 0:
        return None
    count = pieces[0]
    if extra <= _UVARINT_BYTES - len(count):
        return _wide_uvarint(len(fields), len(count) + extra) + b"".join(pieces[1:])
    for size in range(extra):
        padded = b"".join(encode_tagged_fields([*fields, (PADDING_TAG, bytes(size))]))
        if len(padded) == length:
            return padded
    return None


def _wide_uvarint(value: int, width: int) -> bytes:
    """`value` as an unsigned varint of exactly `width` bytes (at most 5)."""
    out = bytearray()
    for _ in range(width - 1):
        out.append(0x80 | (value & 0x7F))
        value >>= 7
    if value > 0x7F:
        raise ValueError(f"{value} does not fit a varint of {width} bytes")
    out.append(value)
    return bytes(out)
