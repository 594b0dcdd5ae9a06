"""Peer protocol messages: what is encoded is decoded back (a fetch answer's records pieces
as one piece holding the same bytes), its frame is `frame_size` bytes, and a stream of
frames cut into chunks anywhere comes out of the incremental reader as the same messages."""

from __future__ import annotations

import dataclasses
import uuid

from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.handoff.objects import S3WalLocation
from proxy.peer.codec import PeerFrameReader, decode_frame, encode_frame, frame_size, read_frame
from proxy.peer.messages import (
    AdminRequest,
    AdminResponse,
    AppendRequest,
    AppendResponse,
    FetchRequest,
    FetchResponse,
    PeerMessage,
    PingRequest,
    PingResponse,
    TrimRequest,
    TrimResponse,
)
from tests.support.peer_strategies import I16, I32, I64, NON_NEGATIVE_I32, TEXT, U32, U64

NON_NEGATIVE_I64 = st.integers(min_value=0, max_value=(1 << 63) - 1)
ACKS = st.sampled_from([-1, 0, 1])
UUIDS = st.builds(uuid.UUID, bytes=st.binary(min_size=16, max_size=16))


@st.composite
def append_requests(draw) -> AppendRequest:
    cid, stream_id, acks, timeout_ms = draw(U32), draw(U64), draw(ACKS), draw(I32)
    if draw(st.booleans()):
        return AppendRequest(
            cid, stream_id, acks, timeout_ms, records=draw(st.binary(max_size=300))
        )
    start = draw(U64)
    end = draw(st.integers(min_value=start, max_value=(1 << 64) - 1))
    location = S3WalLocation(draw(TEXT), start, end, stream_id, draw(U32))
    return AppendRequest(cid, stream_id, acks, timeout_ms, location=location)


PIECES = st.lists(
    st.one_of(
        st.binary(max_size=100),
        st.binary(max_size=100).map(bytearray),
        st.binary(max_size=100).map(memoryview),
    ),
    max_size=4,
)

MESSAGES = st.one_of(
    append_requests(),
    st.builds(AppendResponse, U32, I16, I64, I64, I64, st.none() | TEXT),
    st.builds(AdminRequest, U32, st.sampled_from(["tier", "untier"]), TEXT, UUIDS),
    st.builds(AdminResponse, U32, I16, TEXT),
    st.builds(FetchRequest, U32, U64, NON_NEGATIVE_I64, NON_NEGATIVE_I32, NON_NEGATIVE_I32),
    st.builds(FetchResponse, U32, I16, I64, I64, PIECES),
    st.builds(TrimRequest, U32, U64, st.integers(-1, (1 << 63) - 1), NON_NEGATIVE_I32),
    st.builds(TrimResponse, U32, I16, st.integers(-1, (1 << 63) - 1), TEXT),
    st.builds(PingRequest, U32),
    st.builds(PingResponse, U32, TEXT, TEXT),
)


def joined(message: PeerMessage) -> PeerMessage:
    """`message` with a fetch answer's records as one piece, as they are decoded."""
    if isinstance(message, FetchResponse):
        return dataclasses.replace(message, records=[b"".join(message.records)])
    return message


@settings(max_examples=500, deadline=None)
@given(message=MESSAGES)
def test_round_trip(message):
    frame = encode_frame(message)
    assert frame_size(message) == len(frame)
    assert decode_frame(frame) == joined(message)
    assert read_frame(frame) == (joined(message), len(frame))


@settings(max_examples=300, deadline=None)
@given(messages=st.lists(MESSAGES, max_size=10), data=st.data())
def test_any_split_of_a_stream_gives_back_the_same_messages(messages, data):
    stream = b"".join(encode_frame(m) for m in messages)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=20)))
    reader = PeerFrameReader()
    decoded = []
    for start, end in zip([0, *cuts], [*cuts, len(stream)], strict=True):
        reader.feed(stream[start:end])
        decoded.extend(reader.messages())
    assert decoded == [joined(m) for m in messages]
    assert reader.buffered == 0


@settings(max_examples=300, deadline=None)
@given(messages=st.lists(MESSAGES, min_size=1, max_size=6), data=st.data())
def test_a_cut_stream_gives_the_whole_frames_before_the_cut(messages, data):
    frames = [encode_frame(m) for m in messages]
    stream = b"".join(frames)
    cut = data.draw(st.integers(0, len(stream)))
    reader = PeerFrameReader()
    reader.feed(stream[:cut])
    decoded = reader.messages()
    whole = 0
    while whole < len(frames) and sum(map(len, frames[: whole + 1])) <= cut:
        whole += 1
    assert decoded == [joined(m) for m in messages[:whole]]
    assert reader.buffered == cut - sum(map(len, frames[:whole]))
