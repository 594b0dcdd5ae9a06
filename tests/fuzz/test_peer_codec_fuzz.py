"""Garbage in, PeerProtocolError out: the peer frame parser never raises anything else,
whatever the bytes (random, or valid frames flipped, cut, spliced or with extreme lengths).

Frames are checked with a correct CRC too (`reframe`), so the body decoders themselves are
fuzzed and not only the CRC check in front of them.
"""

from __future__ import annotations

import random
import struct
import uuid

from crc32c import crc32c
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.handoff.objects import S3WalLocation
from proxy.peer.codec import (
    AdminRequest,
    AdminResponse,
    AppendRequest,
    AppendResponse,
    PeerFrameReader,
    PeerProtocolError,
    encode_frame,
    read_frame,
)

FUZZ = settings(
    max_examples=1000,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
MAX_FRAME = 4096


def check_stream(buf: bytes, chunk: int = 0) -> None:
    """Everything the reader returns re-encodes to the bytes it came from; anything else
    ends in a PeerProtocolError or a wait for more bytes."""
    reader = PeerFrameReader(max_frame_bytes=MAX_FRAME)
    decoded = []
    pieces = [buf[i : i + chunk] for i in range(0, len(buf), chunk)] if chunk else [buf]
    try:
        for piece in pieces:
            reader.feed(piece)
            decoded.extend(reader.messages())
    except PeerProtocolError as exc:
        assert str(exc)
    consumed = sum(len(encode_frame(m)) for m in decoded)
    assert b"".join(encode_frame(m) for m in decoded) == buf[:consumed]
    try:
        message, size = read_frame(buf, MAX_FRAME)
    except PeerProtocolError:
        return
    if message is None:
        assert size > len(buf)
    else:
        assert encode_frame(message) == buf[:size]


def reframe(body: bytes) -> bytes:
    return struct.pack(">II", len(body), crc32c(body)) + body


def valid_messages(rng: random.Random) -> list:
    stream_id = rng.randrange(1 << 64)
    location = S3WalLocation("wal/k", 3, 3 + rng.randrange(100), stream_id, rng.randrange(1 << 32))
    return [
        AppendRequest(
            rng.randrange(1 << 32),
            stream_id,
            rng.choice([-1, 0, 1]),
            1000,
            records=rng.randbytes(rng.randrange(60)),
        ),  # fmt: skip
        AppendRequest(1, stream_id, -1, 1000, location=location),
        AppendResponse(2, rng.randrange(-5, 100), rng.randrange(1 << 40), error_message="err"),
        AppendResponse(3, 0),
        AdminRequest(
            4, rng.choice(["tier", "untier"]), "topic-é", uuid.UUID(int=rng.getrandbits(128))
        ),
        AdminResponse(5, 0, "done"),
    ]


def mutate(rng: random.Random, buf: bytearray) -> None:
    for _ in range(rng.randrange(1, 5)):
        where = rng.randrange(len(buf) + 1)
        match rng.randrange(5):
            case 0 if buf:  # flip a bit
                buf[min(where, len(buf) - 1)] ^= 1 << rng.randrange(8)
            case 1:  # insert garbage
                buf[where:where] = rng.randbytes(rng.randrange(1, 20))
            case 2:  # remove a run
                del buf[where : where + rng.randrange(1, 20)]
            case 3:  # an extreme 2- or 4-byte value, as a length or size field would hold
                width = rng.choice([2, 4])
                buf[where : where + width] = (
                    rng.choice([b"\xff", b"\x00", b"\x7f", b"\x80"]) * width
                )
            case _:  # cut the tail
                del buf[where:]


@FUZZ
@given(buf=st.binary(max_size=600), chunk=st.integers(0, 50))
def test_random_bytes(buf, chunk):
    check_stream(buf, chunk)


@FUZZ
@given(body=st.binary(max_size=300), chunk=st.integers(0, 50))
def test_random_bodies_with_a_good_crc(body, chunk):
    check_stream(reframe(bytes([1, body[0] % 6]) + body[1:] if body else b""), chunk)


@FUZZ
@given(seed=st.integers(min_value=0, max_value=2**32), chunk=st.integers(0, 50))
def test_mutated_frames(seed, chunk):
    rng = random.Random(seed)
    messages = valid_messages(rng)
    buf = bytearray(b"".join(encode_frame(m) for m in rng.sample(messages, rng.randrange(1, 4))))
    mutate(rng, buf)
    check_stream(bytes(buf), chunk)


@FUZZ
@given(seed=st.integers(min_value=0, max_value=2**32))
def test_mutated_bodies_with_a_good_crc(seed):
    rng = random.Random(seed)
    body = bytearray(encode_frame(rng.choice(valid_messages(rng)))[8:])
    mutate(rng, body)
    check_stream(reframe(bytes(body)))
