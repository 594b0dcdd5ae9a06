"""Peer protocol level 13, pure: an s3 append's batch header travels as a trailer after
the sequences and transaction trailers (written as "none" when the append has neither), is
dropped for an owner below level 13 (whose frame is then byte for byte the one it always
read), the append response's `referenced` flag is a trailer written only when set, and the
held request and response round trip. Messages that cannot be built are ValueErrors,
frames that cannot be read PeerProtocolErrors.

There is no decoder of an older level here (the codec reads the newest level only); what
an older owner reads is checked as the bytes it is sent: `for_peer`'s frame is the frame
of a request that never had a header."""

from __future__ import annotations

import struct

import pytest
from crc32c import crc32c

from proxy.handoff.objects import S3WalLocation
from proxy.partition.rules import ProduceResult
from proxy.partition.sequence_holes import ProducerBatch
from proxy.peer.codec import (
    CONFIGS_PROTOCOL,
    PROTOCOL,
    REFERENCE_PROTOCOL,
    SEQUENCES_PROTOCOL,
    TXN_PROTOCOL,
    PeerProtocolError,
    decode_frame,
    encode_frame,
    for_peer,
    frame_size,
)
from proxy.peer.messages import AppendRequest, AppendResponse, HeldRequest, HeldResponse
from proxy.records.batches import HEADER_SIZE

LOCATION = S3WalLocation("wal/00ab/proxy-a/0000000000000007", 100, 4196, 42, 0xDEADBEEF)
BATCH = ProducerBatch(7, 3, 100, 104)
HEADER = bytes(range(61))
HEAD = 14  # the frame's prefix and head: the body starts here
# the sequences and transaction trailers written as "none"
NONES = struct.pack(">qhiii", -1, -1, -1, -1, -1) + struct.pack(">hH", -1, 0)


def reframe(body_and_head: bytes) -> bytes:
    """A frame of these bytes (version to the body's end) with its length and a good crc."""
    return struct.pack(">II", len(body_and_head), crc32c(body_and_head)) + body_and_head


def test_the_levels():
    assert REFERENCE_PROTOCOL == 13 == PROTOCOL - 1
    assert REFERENCE_PROTOCOL == CONFIGS_PROTOCOL + 1
    assert HEADER_SIZE == 61


@pytest.mark.parametrize(
    "fields",
    [
        {},
        {"batch": BATCH, "hole": 99},
        {"batch": BATCH, "transactional_id": "txn-ä", "produce_version": 11},
    ],
    ids=["no-batch", "sequences", "transaction"],
)
def test_an_append_with_a_header_round_trips(fields):
    request = AppendRequest(9, 42, -1, 30_000, location=LOCATION, header=HEADER, **fields)
    frame = encode_frame(request)
    assert frame_size(request) == len(frame)
    decoded = decode_frame(frame)
    assert decoded == request
    assert type(decoded.header) is bytes and decoded.header == HEADER  # a copy, not a view
    assert frame.endswith(HEADER)
    without = AppendRequest(9, 42, -1, 30_000, location=LOCATION, **fields)
    assert decode_frame(encode_frame(without)).header is None


def test_an_append_with_a_header_and_no_batch_writes_the_other_trailers_as_none():
    request = AppendRequest(9, 42, 1, 500, location=LOCATION, header=bytearray(HEADER))
    plain = encode_frame(AppendRequest(9, 42, 1, 500, location=LOCATION))
    frame = encode_frame(request)
    assert frame[HEAD:].startswith(plain[HEAD:])
    trailers = frame[len(plain) :]
    assert (
        trailers == struct.pack(">qhiii", -1, -1, -1, -1, -1) + struct.pack(">hH", -1, 0) + HEADER
    )
    # the header may be any buffer: a memoryview of a larger batch's first 61 bytes
    view = memoryview(HEADER + b"records...")[:61]
    assert encode_frame(AppendRequest(9, 42, 1, 500, location=LOCATION, header=view)) == frame


def test_an_append_with_sequences_and_a_header_writes_only_the_transaction_as_none():
    request = AppendRequest(9, 42, 1, 500, location=LOCATION, batch=BATCH, hole=-1, header=HEADER)
    without = encode_frame(AppendRequest(9, 42, 1, 500, location=LOCATION, batch=BATCH))
    frame = encode_frame(request)
    assert frame[HEAD:].startswith(without[HEAD:])
    assert frame[len(without) :] == struct.pack(">hH", -1, 0) + HEADER


@pytest.mark.parametrize("level", [1, SEQUENCES_PROTOCOL, TXN_PROTOCOL - 1, TXN_PROTOCOL, 12])
def test_an_append_to_an_owner_below_13_loses_its_header_and_is_the_frame_it_always_read(level):
    fields = {"batch": BATCH, "hole": 99, "transactional_id": "t", "produce_version": 11}
    request = AppendRequest(9, 42, -1, 500, location=LOCATION, header=HEADER, **fields)
    old = for_peer(request, level)
    assert old.header is None
    assert encode_frame(old) == encode_frame(as_built_at(level, request))
    plain = AppendRequest(1, 42, -1, 500, location=LOCATION, header=HEADER)
    assert encode_frame(for_peer(plain, level)) == encode_frame(
        AppendRequest(1, 42, -1, 500, location=LOCATION)
    )


def as_built_at(level: int, request: AppendRequest) -> AppendRequest:
    """The request as the release at `level` built it, field by field: no header, and
    without what `level` predates."""
    batch = request.batch if level >= SEQUENCES_PROTOCOL else None
    txn = level >= TXN_PROTOCOL
    return AppendRequest(
        request.correlation_id,
        request.stream_id,
        request.acks,
        request.timeout_ms,
        location=request.location,
        batch=batch,
        hole=request.hole if batch else -1,
        transactional_id=request.transactional_id if txn else None,
        produce_version=request.produce_version if txn else -1,
    )


def test_an_append_to_an_owner_at_13_keeps_its_header():
    request = AppendRequest(9, 42, -1, 500, location=LOCATION, header=HEADER)
    for level in (REFERENCE_PROTOCOL, PROTOCOL + 1):
        assert for_peer(request, level) is request
    with_batch = AppendRequest(9, 42, -1, 500, location=LOCATION, batch=BATCH, header=HEADER)
    assert for_peer(with_batch, REFERENCE_PROTOCOL) is with_batch


@pytest.mark.parametrize("size", [0, 60, 62, 4096])
def test_a_header_not_61_bytes_is_refused(size):
    with pytest.raises(ValueError, match=f"a batch header of {size} bytes: must be 61"):
        AppendRequest(9, 42, -1, 500, location=LOCATION, header=b"h" * size)


def test_a_header_with_records_or_not_a_buffer_is_refused():
    with pytest.raises(ValueError, match="header only with its location"):
        AppendRequest(9, 42, -1, 500, records=HEADER + b"rest", header=HEADER)
    with pytest.raises(ValueError, match="not a buffer"):
        AppendRequest(9, 42, -1, 500, location=LOCATION, header="h" * 61)  # type: ignore[arg-type]


def test_the_referenced_flag_round_trips_and_is_written_only_when_set():
    plain = AppendResponse(3, 0, 1000, 1_700_000_000_000, 0)
    referenced = AppendResponse(3, 0, 1000, 1_700_000_000_000, 0, referenced=True)
    old_layout = struct.pack(">hqqqh", 0, 1000, 1_700_000_000_000, 0, -1)
    assert encode_frame(plain)[HEAD:] == old_layout  # what an owner below 13 always wrote
    assert encode_frame(referenced)[HEAD:] == old_layout + b"\x01"
    assert decode_frame(encode_frame(referenced)) == referenced
    assert decode_frame(encode_frame(plain)).referenced is False
    with_message = AppendResponse(3, 0, error_message="fine", referenced=True)
    assert decode_frame(encode_frame(with_message)) == with_message


def test_referenced_travels_from_and_to_a_produce_result():
    result = ProduceResult(0, 1000, -1, 0, None, referenced=True)
    response = AppendResponse.from_result(3, result)
    assert response.referenced is True
    assert decode_frame(encode_frame(response)).result() == result
    assert AppendResponse.from_result(3, ProduceResult(0, 5)).result() == ProduceResult(0, 5)


def test_an_error_may_be_referenced_and_referenced_is_a_bool():
    """A reference entry whose write failed: its fate unknown, the sender keeps the
    object and asks later."""
    failed = AppendResponse(3, 56, error_message="the WAL write failed", referenced=True)
    assert decode_frame(encode_frame(failed)) == failed
    with pytest.raises(ValueError, match="not a bool"):
        AppendResponse(3, 0, referenced=1)  # type: ignore[arg-type]


def test_bad_referenced_trailers_are_refused():
    head = encode_frame(AppendResponse(3, 0, 1000, 5, 0))[8:]
    with pytest.raises(PeerProtocolError, match="append response flags 0x02"):
        decode_frame(reframe(head + b"\x02"))
    with pytest.raises(PeerProtocolError, match="trailing bytes"):
        decode_frame(reframe(head + b"\x01\x01"))
    errored = encode_frame(AppendResponse(3, 56))[8:]
    assert decode_frame(reframe(errored + b"\x01")).referenced  # a write whose fate is unknown


def test_none_trailers_are_read_only_before_a_header():
    plain = encode_frame(AppendRequest(9, 42, 1, 500, location=LOCATION))[8:]
    with pytest.raises(PeerProtocolError, match="as none, with no header after"):
        decode_frame(reframe(plain + NONES))
    with pytest.raises(PeerProtocolError, match="as none, with no header after"):
        decode_frame(reframe(plain + NONES[:22]))
    sequences = encode_frame(AppendRequest(9, 42, 1, 500, location=LOCATION, batch=BATCH))[8:]
    with pytest.raises(PeerProtocolError, match="as none, with no header after"):
        decode_frame(reframe(sequences + NONES[22:]))
    # a producer id of -1 with any other field set is neither a batch nor "none"
    half = struct.pack(">qhiii", -1, 0, -1, -1, -1) + NONES[22:] + HEADER
    with pytest.raises(PeerProtocolError, match="producer_id"):
        decode_frame(reframe(plain + half))
    # a produce version of -1 names no transactional id
    named = NONES[:22] + struct.pack(">hH", -1, 1) + b"t" + HEADER
    with pytest.raises(PeerProtocolError, match="produce version -1"):
        decode_frame(reframe(plain + named))


def test_a_cut_or_overlong_header_is_refused():
    frame = encode_frame(AppendRequest(9, 42, 1, 500, location=LOCATION, header=HEADER))[8:]
    with pytest.raises(PeerProtocolError, match="truncated append request batch header: 60"):
        decode_frame(reframe(frame[:-1]))
    with pytest.raises(PeerProtocolError, match="1 trailing bytes"):
        decode_frame(reframe(frame + b"x"))


def test_a_header_on_a_direct_append_is_refused_on_the_wire():
    direct = encode_frame(AppendRequest(9, 42, 1, 500, records=b"abc"))[8:]
    with pytest.raises(PeerProtocolError, match="header only with its location"):
        decode_frame(reframe(direct + NONES + HEADER))


LOCATIONS = (
    LOCATION,
    S3WalLocation("wal/0001/proxy-b/ü", 0, 0, 0, 0),
    S3WalLocation("k", (1 << 64) - 2, (1 << 64) - 1, (1 << 64) - 1, 0xFFFF_FFFF),
)


def test_a_held_request_round_trips_byte_by_byte():
    request = HeldRequest(7, 2500, LOCATIONS)
    frame = encode_frame(request)
    assert frame[9] == 18  # its type
    assert frame_size(request) == len(frame)
    key = LOCATION.object_key.encode()
    first = struct.pack(">QH", 42, len(key)) + key + struct.pack(">QQI", 100, 4196, 0xDEADBEEF)
    assert frame[HEAD:].startswith(struct.pack(">iI", 2500, 3) + first)
    assert decode_frame(frame) == request


@pytest.mark.parametrize(
    "response",
    [HeldResponse(7, ()), HeldResponse(7, (0, 2)), HeldResponse(7, (), 35)],
    ids=["none", "some", "error"],
)
def test_a_held_response_round_trips(response):
    frame = encode_frame(response)
    assert frame[9] == 19
    count = len(response.released)
    body = struct.pack(">hI", response.error_code, count) + b"".join(
        struct.pack(">I", i) for i in response.released
    )
    assert frame[HEAD:] == body
    assert decode_frame(frame) == response


@pytest.mark.parametrize(
    ("args", "match"),
    [
        ((7, 100, ()), "locations count 0"),
        ((7, 100, [LOCATION]), "must be a tuple"),
        ((7, -1, (LOCATION,)), "timeout_ms -1"),
        ((7, 100, ("wal/k",)), "not an S3WalLocation"),
        ((7, 100, (S3WalLocation("k", 5, 4, 1, 0),)), "location.end 4"),
        ((7, 100, (S3WalLocation("k", 0, 4, -1, 0),)), "location.stream_id -1"),
        ((7, 100, (S3WalLocation("k", 0, 4, 1, 1 << 32),)), "location.crc"),
        ((7, 100, (S3WalLocation("k" * 0x10000, 0, 4, 1, 0),)), "location.object_key"),
        ((1 << 32, 100, (LOCATION,)), "correlation_id"),
    ],
)
def test_a_held_request_that_cannot_be_built(args, match):
    with pytest.raises(ValueError, match=match):
        HeldRequest(*args)


@pytest.mark.parametrize(
    ("args", "match"),
    [
        ((7, (2, 1)), "indexes must increase"),
        ((7, (1, 1)), "indexes must increase"),
        ((7, (-1,)), "released index -1"),
        ((7, (1 << 32,)), "released index"),
        ((7, [0]), "must be a tuple"),
        ((7, (0,), 35), "releases nothing"),
        ((7, (), 1 << 15), "error_code"),
    ],
)
def test_a_held_response_that_cannot_be_built(args, match):
    with pytest.raises(ValueError, match=match):
        HeldResponse(*args)


def test_held_frames_that_cannot_be_read():
    request = encode_frame(HeldRequest(7, 100, (LOCATION,)))[8:]
    forged = request[:10] + struct.pack(">I", 1 << 30) + request[14:]  # the count, forged
    with pytest.raises(PeerProtocolError, match="truncated held request: 1073741824 locations"):
        decode_frame(reframe(forged))
    with pytest.raises(PeerProtocolError, match="truncated held location range"):
        decode_frame(reframe(request[:-1]))
    empty = request[:6] + struct.pack(">iI", 100, 0)
    with pytest.raises(PeerProtocolError, match="locations count 0"):
        decode_frame(reframe(empty))
    backwards = request[:-20] + struct.pack(">QQI", 9, 8, 0)
    with pytest.raises(PeerProtocolError, match="ends before it starts"):
        decode_frame(reframe(backwards))
    response = encode_frame(HeldResponse(7, (1, 3)))[8:]
    with pytest.raises(PeerProtocolError, match="truncated held response: 2 indexes in 7"):
        decode_frame(reframe(response[:-1]))
    swapped = response[:12] + struct.pack(">II", 3, 1)
    with pytest.raises(PeerProtocolError, match="indexes must increase"):
        decode_frame(reframe(swapped))
