"""The peer protocol codec: each message round trips, the frame layout is as documented,
records are framed without a copy and decode as a view of the received bytes, every kind of
bad frame is refused with a PeerProtocolError naming what is wrong, and a message that
cannot be built is a plain ValueError."""

from __future__ import annotations

import array
import hashlib
import struct
import uuid

import pytest
from crc32c import crc32c

from proxy.apis.api61_describe_producers import DescribedProducer
from proxy.handoff.objects import S3WalLocation
from proxy.partition.rules import ProduceResult
from proxy.partition.sequence_holes import ProducerBatch
from proxy.peer.codec import (
    HEADER_SIZE,
    PeerFrameReader,
    PeerProtocolError,
    decode_frame,
    encode,
    encode_frame,
    frame_size,
    read_frame,
)
from proxy.peer.messages import (
    AdminRequest,
    AdminResponse,
    AppendRequest,
    AppendResponse,
    BackfillRequest,
    CatchUpRequest,
    CleanCommitRequest,
    CleanedObject,
    FetchRequest,
    FetchResponse,
    PingRequest,
    PingResponse,
    ProducerCatchUpRequest,
    ProducersRequest,
    ProducersResponse,
    ShardReadRequest,
    TrimRequest,
    TrimResponse,
)

TOPIC_ID = uuid.UUID("5f0c6a57-1c1e-4b7a-9d0e-1f2a3b4c5d6e")
LOCATION = S3WalLocation("wal/00ab/proxy-a/0000000000000007", 100, 4196, 42, 0xDEADBEEF)

MESSAGES = [
    AppendRequest(1, 42, -1, 30_000, records=b"\x00" * 61 + b"batch"),
    AppendRequest(2, 42, 1, 0, location=LOCATION),
    AppendRequest(0xFFFF_FFFF, (1 << 64) - 1, 0, -1, records=b""),
    AppendResponse(3, 0, 1000, 1_700_000_000_000, 0),
    AppendResponse(4, 56, error_message="WAL fenced: fsync failed ✗"),
    AppendResponse(5, 6, error_message=""),
    AdminRequest(6, "tier", "orders", TOPIC_ID),
    AdminRequest(7, "untier", "ünïcode.topic", TOPIC_ID),
    AdminResponse(8, 0, "tiered"),
    AdminResponse(9, -1, ""),
    FetchRequest(10, 42, 0, 1 << 20, 500),
    FetchRequest(0xFFFF_FFFF, (1 << 64) - 1, (1 << 63) - 1, (1 << 31) - 1, (1 << 31) - 1),
    FetchResponse(11, 0, 1003, 1000, (b"\x00" * 61 + b"batch",)),
    FetchResponse(12, 1, 7, 0),
    FetchResponse(13, -1, -(1 << 63), (1 << 63) - 1),
    BackfillRequest(14, (1 << 64) - 1, 4096, 42, 0, 1000),
    CleanCommitRequest(23, 42, 900, (CleanedObject(1 << 63 | 7, 4096, 0, 500, (3, 4)),)),
    CleanCommitRequest(
        0xFFFF_FFFF,
        (1 << 64) - 1,
        -1,
        (CleanedObject(9, 1, 0, 1, ((1 << 64) - 1,)), CleanedObject(10, 2, 1, 2, (5,))),
    ),
    TrimRequest(15, 42, -1, 30_000),
    TrimRequest(16, (1 << 64) - 1, (1 << 63) - 1, 0),
    TrimResponse(17, 0, 1200, "stream 42: log start 1200"),
    TrimResponse(18, 1, -1, "offset 9 is past the high watermark 5"),
    PingRequest(19),
    PingResponse(20, "proxy-a", "0.1.0"),
    PingResponse(0xFFFF_FFFF, "", ""),
    CatchUpRequest(21, 42, 5000),
    CatchUpRequest(0xFFFF_FFFF, (1 << 64) - 1, (1 << 31) - 1),
    ProducerCatchUpRequest(22, 1001, 5000),
    ProducerCatchUpRequest(0xFFFF_FFFF, (1 << 63) - 1, (1 << 31) - 1),
    ProducersRequest(24, 42),
    ProducersRequest(0xFFFF_FFFF, (1 << 64) - 1),
    ShardReadRequest(25, 1, 4242, 30_000),
    ShardReadRequest(0xFFFF_FFFF, 0xFFFF_FFFF, (1 << 63) - 1, (1 << 31) - 1),
    ProducersResponse(25, 0, (DescribedProducer(1001, 0, 41, 1_700_000_000_000, -1, -1),)),
    ProducersResponse(
        26,
        0,
        (
            DescribedProducer(
                (1 << 63) - 1, (1 << 31) - 1, (1 << 31) - 1, -(1 << 63), -(1 << 31), 7
            ),
            DescribedProducer(0, -1, -1, (1 << 63) - 1, (1 << 31) - 1, (1 << 63) - 1),
        ),
    ),
    ProducersResponse(27, 6),
]
# with the optional trailers of protocol 5 (a cut trailer leaves an older, valid frame)
WITH_TRAILERS = [
    FetchRequest(21, 42, 0, 1 << 20, 500, stable=True),
    FetchResponse(22, 0, 1003, 1000, (b"\x00" * 61 + b"batch",), last_stable_offset=1001),
    FetchResponse(23, 0, 7, 0, last_stable_offset=-1),
]
# sha256 of the frames of MESSAGES less the pings, as main wrote them before pings existed
OLDER_FRAMES_SHA256 = "9227ed6d919e1799422a67f1fbab029a04c5215a3f7e152125744cef51b9c3cf"


def reframe(body: bytes) -> bytes:
    """`body` (version onwards) with a correct length and crc in front."""
    return struct.pack(">II", len(body), crc32c(body)) + body


@pytest.mark.parametrize("message", MESSAGES + WITH_TRAILERS, ids=lambda m: type(m).__name__)
def test_each_message_round_trips(message):
    frame = encode_frame(message)
    assert decode_frame(frame) == message
    assert read_frame(frame + b"next") == (message, len(frame))


def test_frame_layout_is_length_crc_version_type_correlation_id_body():
    frame = encode_frame(AdminResponse(0x01020304, 3, "ok"))
    length, crc = struct.unpack_from(">II", frame)
    assert length == len(frame) - 8
    assert crc == crc32c(frame[8:])
    assert frame[8:14] == b"\x01\x04\x01\x02\x03\x04"  # version 1, type 4, correlation id
    assert frame[14:] == b"\x00\x03\x00\x02ok"  # error code i16, message u16 + UTF-8


def test_null_and_empty_error_messages_differ_on_the_wire():
    null = encode_frame(AppendResponse(1, 0))
    empty = encode_frame(AppendResponse(1, 0, error_message=""))
    assert null[-2:] == b"\xff\xff" and empty[-2:] == b"\x00\x00"
    assert decode_frame(null).error_message is None
    assert decode_frame(empty).error_message == ""


def test_direct_records_are_written_as_given_and_decoded_as_a_view_of_the_buffer():
    records = memoryview(bytearray(b"R" * 1000))
    pieces = encode(AppendRequest(1, 7, -1, 1000, records=records))
    assert pieces[-1] is records  # not copied into the frame
    buf = bytearray(b"".join(pieces))
    decoded = decode_frame(buf)
    assert isinstance(decoded.records, memoryview)
    assert decoded.records.obj is buf
    buf[-1:] = b"X"  # the view sees the buffer it was read from
    assert bytes(decoded.records[-1:]) == b"X"


def test_fetch_frames_are_laid_out_as_documented():
    request = encode_frame(FetchRequest(0x01020304, 42, 7, 1024, 500))
    assert request[8:14] == b"\x01\x05\x01\x02\x03\x04"  # version 1, type 5, correlation id
    assert request[14:] == struct.pack(">Qqii", 42, 7, 1024, 500)
    response = encode_frame(FetchResponse(9, 0, 12, 3, (b"ab", b"cde")))
    length, crc = struct.unpack_from(">II", response)
    assert (length, crc) == (len(response) - 8, crc32c(response[8:]))
    assert response[8:14] == b"\x01\x06\x00\x00\x00\x09"
    assert response[14:] == struct.pack(">hqqI", 0, 12, 3, 5) + b"abcde"


def test_fetch_records_are_written_as_given_and_decoded_as_one_view_of_the_frame():
    pieces = [memoryview(bytearray(b"A" * 300)), b"B" * 200, bytearray(b"C" * 100)]
    written = encode(FetchResponse(1, 0, 3, 0, pieces))
    assert len(written) == 4
    assert all(out is given for out, given in zip(written[1:], pieces, strict=True))
    buf = bytearray(b"".join(written))
    [view] = decode_frame(buf).records
    assert isinstance(view, memoryview)
    assert view.obj is buf
    assert bytes(view) == b"A" * 300 + b"B" * 200 + b"C" * 100
    buf[-1:] = b"X"  # the view sees the buffer it was read from
    assert bytes(view[-1:]) == b"X"


@pytest.mark.parametrize(
    "records", [(), [], [b""], (memoryview(b""), bytearray())], ids=["()", "[]", "b''", "views"]
)
def test_a_fetch_answer_without_records_has_no_pieces(records):
    response = FetchResponse(1, 0, 5, 5, records)
    assert response.records == ()
    written = encode(response)
    assert len(written) == 1
    assert written[0][-4:] == b"\x00\x00\x00\x00"  # records size 0
    assert decode_frame(written[0]) == response


def test_records_are_counted_in_bytes_not_items():
    ints = memoryview(array.array("I", [1, 2, 3]))  # len 3, 12 bytes
    response = FetchResponse(1, 0, records=[ints])
    assert response.records_size == 12
    frame = encode_frame(response)
    assert frame_size(response) == len(frame) == HEADER_SIZE + 22 + 12
    assert bytes(decode_frame(frame).records[0]) == ints.tobytes()
    append = encode_frame(AppendRequest(1, 7, -1, 10, records=ints))
    assert bytes(decode_frame(append).records) == ints.tobytes()


@pytest.mark.parametrize("message", MESSAGES + WITH_TRAILERS, ids=lambda m: type(m).__name__)
def test_frame_size_is_the_size_of_the_frame(message):
    assert frame_size(message) == len(encode_frame(message))


def test_location_round_trips_with_the_request_stream_id():
    decoded = decode_frame(encode_frame(AppendRequest(9, 42, -1, 100, location=LOCATION)))
    assert decoded.location == LOCATION
    assert decoded.records is None


def test_append_response_mirrors_produce_result():
    result = ProduceResult(0, base_offset=5, log_append_time_ms=-1, log_start_offset=2)
    response = AppendResponse.from_result(17, result)
    assert response == AppendResponse(17, 0, 5, -1, 2, None)
    assert decode_frame(encode_frame(response)).result() == result


@pytest.mark.parametrize(
    "kwargs, error",
    [
        ({}, "exactly one of records"),
        ({"records": b"x", "location": LOCATION}, "exactly one of records"),
        ({"records": b"x", "acks": 2}, "acks 2"),
        ({"records": b"x", "stream_id": -1}, "stream_id"),
        ({"records": b"x", "timeout_ms": 1 << 31}, "timeout_ms"),
        ({"location": S3WalLocation("k", 0, 1, 43, 0)}, "location of stream 43"),
        ({"location": S3WalLocation("k", 5, 4, 42, 0)}, "location.end"),
    ],
)
def test_an_append_that_cannot_be_built_is_a_value_error(kwargs, error):
    args = {"correlation_id": 1, "stream_id": 42, "acks": -1, "timeout_ms": 10, **kwargs}
    with pytest.raises(ValueError, match=error) as info:
        AppendRequest(**args)
    assert not isinstance(info.value, PeerProtocolError)


def test_other_misuse_is_a_value_error():
    with pytest.raises(ValueError, match="admin op 'delete'"):
        AdminRequest(1, "delete", "t", TOPIC_ID)
    with pytest.raises(ValueError, match="correlation_id"):
        AdminResponse(-1, 0, "")
    with pytest.raises(ValueError, match="error_message"):
        AppendResponse(1, 56, error_message="x" * 40_000)
    with pytest.raises(ValueError, match="over the limit 100"):
        encode(AppendRequest(1, 1, -1, 10, records=b"x" * 100), max_frame_bytes=100)
    with pytest.raises(ValueError, match="FetchResponse frame of 136 bytes is over the limit 100"):
        encode(FetchResponse(1, 0, records=[b"x" * 50, b"y" * 50]), max_frame_bytes=100)


@pytest.mark.parametrize(
    "cls, args, error",
    [
        (FetchRequest, (1 << 32, 42, 0, 1, 1), "correlation_id"),
        (FetchRequest, (1, -1, 0, 1, 1), "stream_id -1"),
        (FetchRequest, (1, 1 << 64, 0, 1, 1), "stream_id"),
        (FetchRequest, (1, 42, -1, 1, 1), "offset -1"),
        (FetchRequest, (1, 42, 1 << 63, 1, 1), "offset"),
        (FetchRequest, (1, 42, 0, -1, 1), "max_bytes -1"),
        (FetchRequest, (1, 42, 0, 1 << 31, 1), "max_bytes"),
        (FetchRequest, (1, 42, 0, 1.5, 1), "max_bytes 1.5"),
        (FetchRequest, (1, 42, 0, 1, -1), "max_wait_ms -1"),
        (FetchRequest, (1, 42, 0, 1, 1 << 31), "max_wait_ms"),
        (FetchResponse, (1, 1 << 15), "error_code"),
        (FetchResponse, (1, 0, 1 << 63), "high_watermark"),
        (FetchResponse, (1, 0, 0, -(1 << 63) - 1), "log_start_offset"),
        (FetchResponse, (1, 0, 0, 0, b"batch"), "bytes: must be a sequence of pieces"),
        (FetchResponse, (1, 0, 0, 0, None), "NoneType: must be a sequence of pieces"),
        (FetchResponse, (1, 0, 0, 0, ["batch"]), "piece of type str"),
        (FetchResponse, (1, 0, 0, 0, [b"ok", 7]), "piece of type int"),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_a_fetch_that_cannot_be_built_is_a_value_error(cls, args, error):
    with pytest.raises(ValueError, match=error) as info:
        cls(*args)
    assert not isinstance(info.value, PeerProtocolError)


def test_bad_crc_is_refused():
    frame = bytearray(encode_frame(MESSAGES[0]))
    frame[-1] ^= 0x01
    with pytest.raises(PeerProtocolError, match="bad crc"):
        decode_frame(frame)


@pytest.mark.parametrize("kind", [0, 20, 255])
def test_unknown_type_and_version_are_refused(kind):
    body = bytearray(encode_frame(MESSAGES[8])[8:])
    body[1] = kind
    with pytest.raises(PeerProtocolError, match=f"unknown message type {kind}"):
        decode_frame(reframe(bytes(body)))
    body[0], body[1] = 2, 4
    with pytest.raises(PeerProtocolError, match="unsupported version 2"):
        decode_frame(reframe(bytes(body)))


@pytest.mark.parametrize("message", MESSAGES, ids=lambda m: type(m).__name__)
def test_every_truncated_body_names_the_cut_field(message):
    body = encode_frame(message)[8:]
    for cut in range(6, len(body)):
        with pytest.raises(PeerProtocolError, match="truncated"):
            decode_frame(reframe(body[:cut]))


def test_trailing_bytes_in_a_body_are_refused():
    with pytest.raises(PeerProtocolError, match="2 trailing bytes after a AdminResponse"):
        decode_frame(reframe(encode_frame(MESSAGES[8])[8:] + b"!!"))


def test_an_incomplete_frame_asks_for_the_bytes_it_needs():
    frame = encode_frame(MESSAGES[0])
    assert read_frame(b"") == (None, 4)
    assert read_frame(frame[:3]) == (None, 4)
    assert read_frame(frame[:4]) == (None, len(frame))
    assert read_frame(frame[:-1]) == (None, len(frame))
    with pytest.raises(PeerProtocolError, match=f"truncated frame: 20 of {len(frame)} bytes"):
        decode_frame(frame[:20])


def test_an_oversized_or_undersized_length_is_refused_from_its_four_bytes():
    with pytest.raises(PeerProtocolError, match="frame of 1032 bytes is over the limit 1024"):
        read_frame(struct.pack(">I", 1024), max_frame_bytes=1024)
    with pytest.raises(PeerProtocolError, match="below the minimum 6"):
        read_frame(struct.pack(">I", 5))


@pytest.mark.parametrize(
    "body, error",
    [
        (struct.pack(">BBIQhiB", 1, 1, 1, 42, -1, 10, 0), "payload kind 0: neither records"),
        (struct.pack(">BBIQhiB", 1, 1, 1, 42, -1, 10, 3), "payload kind 3"),
        (struct.pack(">BBIQhiBI", 1, 1, 1, 42, 5, 10, 1, 0), "acks 5"),
        (
            struct.pack(">BBIQhiBH", 1, 1, 1, 42, -1, 10, 2, 1)
            + b"k"
            + struct.pack(">QQI", 9, 8, 0),
            "ends before it starts",
        ),
        (struct.pack(">BBIH", 1, 3, 1, 6) + b"delete", "admin op 'delete'"),
        (struct.pack(">BBIH", 1, 3, 1, 2) + b"\xff\xfe", "admin op is not UTF-8"),
        (struct.pack(">BBIhqqqh", 1, 2, 1, 0, 0, 0, 0, -2), "error message size -2"),
        (struct.pack(">BBIhH", 1, 4, 1, 0, 3) + b"\x00", "truncated admin response message"),
        (struct.pack(">BBIQqii", 1, 5, 1, 42, -1, 1, 1), "message type 5: offset -1"),
        (struct.pack(">BBIQqii", 1, 5, 1, 42, 0, -1, 1), "message type 5: max_bytes -1"),
        (struct.pack(">BBIQqii", 1, 5, 1, 42, 0, 1, -5), "message type 5: max_wait_ms -5"),
        (struct.pack(">BBIQqi", 1, 5, 1, 42, 0, 1), "truncated fetch request: 20 of 24"),
        (struct.pack(">BBIhqqI", 1, 6, 1, 0, 0, 0, 3) + b"ab", "truncated records: 2 of 3"),
        (struct.pack(">BBIhqqI", 1, 6, 1, 0, 0, 0, 1) + b"ab", "truncated fetch response last"),
        (struct.pack(">BBIhqqIq", 1, 6, 1, 0, 0, 0, 0, 5) + b"!", "1 trailing bytes after a Fetch"),
        (struct.pack(">BBIQqiiBB", 1, 5, 1, 42, 0, 1, 0, 1, 0), "1 trailing bytes after a Fetch"),
    ],
)
def test_bad_bodies_are_refused_with_the_reason(body, error):
    with pytest.raises(PeerProtocolError, match=error):
        decode_frame(reframe(body))


def test_reader_splits_a_stream_and_decodes_frames_in_one_chunk_in_place():
    stream = b"".join(encode_frame(m) for m in MESSAGES)
    reader = PeerFrameReader()
    reader.feed(stream)
    decoded = reader.messages()
    assert decoded == MESSAGES
    assert decoded[0].records.obj is stream
    assert reader.buffered == 0
    assert reader.next_message() is None


def test_reader_joins_a_frame_fed_in_pieces_once_it_is_whole():
    frame = encode_frame(AppendRequest(1, 1, -1, 10, records=b"z" * 5000))
    reader = PeerFrameReader()
    for start in range(0, len(frame), 700):
        assert reader.messages() == []
        reader.feed(bytearray(frame[start : start + 700]))  # a reused buffer is copied
    [message] = reader.messages()
    assert bytes(message.records) == b"z" * 5000


def test_reader_stays_failed_after_a_bad_frame():
    reader = PeerFrameReader(max_frame_bytes=64)
    reader.feed(encode_frame(MESSAGES[8]) + struct.pack(">I", 1000))
    assert reader.next_message() == MESSAGES[8]
    with pytest.raises(PeerProtocolError, match="over the limit 64"):
        reader.next_message()
    reader.feed(encode_frame(MESSAGES[8]))
    with pytest.raises(PeerProtocolError, match="over the limit 64"):
        reader.next_message()


def test_reader_limit_must_hold_a_frame_header():
    with pytest.raises(ValueError, match="max_frame_bytes"):
        PeerFrameReader(max_frame_bytes=HEADER_SIZE - 1)


def test_backfill_request_layout_and_bad_ranges():
    frame = encode_frame(BackfillRequest(3, 1 << 63 | 5, 4096, 42, 10, 20))
    assert frame[8:10] == bytes([1, 7])
    assert frame[14:] == struct.pack(">QqQqq", 1 << 63 | 5, 4096, 42, 10, 20)
    empty = reframe(struct.pack(">BBIQqQqq", 1, 7, 3, 5, 4096, 42, 20, 20))
    with pytest.raises(PeerProtocolError, match="message type 7: end_offset 20"):
        decode_frame(empty)
    with pytest.raises(ValueError, match="size 0"):
        BackfillRequest(3, 5, 0, 42, 10, 20)


def test_clean_commit_request_layout_and_bad_values():
    request = CleanCommitRequest(3, 42, 20, (CleanedObject(1 << 63 | 5, 4096, 10, 20, (7, 8)),))
    frame = encode_frame(request)
    assert frame[8:10] == bytes([1, 14])
    body = struct.pack(">QqI", 42, 20, 1) + struct.pack(">QqqqH", 1 << 63 | 5, 4096, 10, 20, 2)
    assert frame[14:] == body + struct.pack(">QQ", 7, 8)
    cut = reframe(struct.pack(">BBI", 1, 14, 3) + body + struct.pack(">Q", 7))
    with pytest.raises(PeerProtocolError, match="truncated replaced object id"):
        decode_frame(cut)
    none = reframe(struct.pack(">BBIQqI", 1, 14, 3, 42, 20, 0))
    with pytest.raises(PeerProtocolError, match="message type 14: objects count 0"):
        decode_frame(none)
    with pytest.raises(ValueError, match="replaces count 0"):
        CleanedObject(5, 4096, 10, 20, ())


def test_trim_request_layout_and_bad_offsets():
    frame = encode_frame(TrimRequest(3, 42, 1000, 500))
    assert frame[8:10] == bytes([1, 8])
    assert frame[14:] == struct.pack(">Qqi", 42, 1000, 500)
    below = reframe(struct.pack(">BBIQqi", 1, 8, 3, 42, -2, 500))
    with pytest.raises(PeerProtocolError, match="message type 8: offset -2"):
        decode_frame(below)
    negative_wait = reframe(struct.pack(">BBIQqi", 1, 8, 3, 42, 0, -1))
    with pytest.raises(PeerProtocolError, match="timeout_ms -1"):
        decode_frame(negative_wait)
    with pytest.raises(ValueError, match="log_start_offset -2"):
        TrimResponse(3, 0, -2, "")


def test_ping_layout():
    request = encode_frame(PingRequest(0x01020304))
    assert request[8:] == b"\x01\x0a\x01\x02\x03\x04"  # version 1, type 10, no body
    response = encode_frame(PingResponse(5, "proxy-a", "0.1.0"))
    assert response[8:14] == b"\x01\x0b\x00\x00\x00\x05"
    assert response[14:] == b"\x00\x07proxy-a\x00\x050.1.0"
    with pytest.raises(PeerProtocolError, match="1 trailing bytes after a PingRequest"):
        decode_frame(reframe(request[8:] + b"!"))


def test_frames_of_the_older_messages_are_unchanged():
    """Adding a message type never changes another's frame: a proxy of an older version
    reads these, and this code reads theirs (the digest is of the frames before pings)."""
    newer = (
        PingRequest
        | PingResponse
        | CatchUpRequest
        | ProducerCatchUpRequest
        | CleanCommitRequest
        | ProducersRequest
        | ProducersResponse
        | ShardReadRequest
    )
    older = [m for m in MESSAGES if not isinstance(m, newer)]
    frames = b"".join(encode_frame(m) for m in older)
    assert hashlib.sha256(frames).hexdigest() == OLDER_FRAMES_SHA256
    assert [decode_frame(encode_frame(m)) for m in older] == older


def test_an_append_may_name_its_producer_batch_and_the_senders_hole():
    batch = ProducerBatch(7, 3, 100, 104)
    location = S3WalLocation("wal/k", 0, 10, 5, 9)
    for request in (
        AppendRequest(1, 5, -1, 100, records=b"abc", batch=batch, hole=95),
        AppendRequest(2, 5, -1, 100, location=location, batch=batch),
        AppendRequest(3, 5, -1, 100, records=b"abc"),  # no producer id: no trailer
    ):
        decoded = decode_frame(encode_frame(request))
        assert (decoded.batch, decoded.hole) == (request.batch, request.hole)
    with pytest.raises(ValueError, match="hole only with its batch"):
        AppendRequest(4, 5, -1, 100, records=b"abc", hole=3)
    frame = bytearray(encode_frame(AppendRequest(5, 5, -1, 100, records=b"abc", batch=batch)))
    del frame[-1]  # a trailer cut short
    struct.pack_into(">I", frame, 0, len(frame) - 8)
    struct.pack_into(">I", frame, 4, crc32c(bytes(frame[8:])))
    with pytest.raises(PeerProtocolError, match="append request sequences"):
        decode_frame(bytes(frame))


def test_the_producer_catch_up_request_is_type_13():
    frame = encode_frame(ProducerCatchUpRequest(5, 1001, 5000))
    assert frame[8:14] == b"\x01\x0d\x00\x00\x00\x05"  # version 1, type 13
    assert frame[14:] == (1001).to_bytes(8, "big") + (5000).to_bytes(4, "big")
    with pytest.raises(PeerProtocolError, match="producer_id"):
        decode_frame(reframe(frame[8:14] + (-1).to_bytes(8, "big", signed=True) + frame[22:]))


def test_the_producers_request_and_response_are_types_15_and_16():
    request = encode_frame(ProducersRequest(5, 42))
    assert request[8:14] == b"\x01\x0f\x00\x00\x00\x05"  # version 1, type 15
    assert request[14:] == (42).to_bytes(8, "big")
    producer = DescribedProducer(1001, 2, 41, 1_700_000_000_000, 3, 120)
    response = encode_frame(ProducersResponse(6, 0, (producer,)))
    assert response[8:14] == b"\x01\x10\x00\x00\x00\x06"  # type 16
    assert response[14:] == struct.pack(">hI", 0, 1) + struct.pack(
        ">qiiqiq", 1001, 2, 41, 1_700_000_000_000, 3, 120
    )
    # a count larger than the bytes that follow is refused before anything is built
    huge = response[8:14] + struct.pack(">hI", 0, 0xFFFF_FFFF) + response[20:]
    with pytest.raises(PeerProtocolError, match="truncated producers response"):
        decode_frame(reframe(huge))
    with pytest.raises(ValueError, match="last_sequence -2"):
        ProducersResponse(7, 0, (DescribedProducer(1, 0, -2, 0, -1, -1),))


def test_the_shard_read_request_is_type_17():
    frame = encode_frame(ShardReadRequest(5, 1, 4242, 5000))
    assert frame[8:14] == b"\x01\x11\x00\x00\x00\x05"  # version 1, type 17
    assert frame[14:] == struct.pack(">Iqi", 1, 4242, 5000)
    with pytest.raises(PeerProtocolError, match="offset"):
        decode_frame(reframe(frame[8:14] + struct.pack(">Iqi", 1, -1, 5000)))
