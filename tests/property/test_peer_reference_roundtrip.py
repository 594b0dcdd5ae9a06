"""Peer protocol level 13, any value: an append with a batch header (with or without its
sequences and transaction), a referenced answer and the held request and response are
decoded back to what was encoded, in `frame_size` bytes; and `for_peer` below level 13
gives the frame of the same append built without a header."""

from __future__ import annotations

import dataclasses

from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.handoff.objects import S3WalLocation
from proxy.partition.sequence_holes import ProducerBatch
from proxy.peer.codec import REFERENCE_PROTOCOL, decode_frame, encode_frame, for_peer, frame_size
from proxy.peer.messages import AppendRequest, AppendResponse, HeldRequest, HeldResponse
from tests.support.peer_strategies import I16, I32, I64, NON_NEGATIVE_I32, TEXT, U32, U64

HEADERS = st.binary(min_size=61, max_size=61)


@st.composite
def locations(draw, stream_id: int | None = None) -> S3WalLocation:
    start = draw(U64)
    end = draw(st.integers(min_value=start, max_value=(1 << 64) - 1))
    stream = draw(U64) if stream_id is None else stream_id
    return S3WalLocation(draw(TEXT), start, end, stream, draw(U32))


@st.composite
def referencing_appends(draw) -> AppendRequest:
    stream_id = draw(U64)
    batch, hole, txn, version = None, -1, None, -1
    if draw(st.booleans()):
        producer = draw(st.integers(0, (1 << 63) - 1))
        sequences = (draw(NON_NEGATIVE_I32), draw(NON_NEGATIVE_I32))
        batch = ProducerBatch(producer, draw(I16), *sequences)
        hole = draw(st.integers(-1, (1 << 31) - 1))
        if draw(st.booleans()):
            txn, version = draw(TEXT), draw(st.integers(0, (1 << 15) - 1))
    return AppendRequest(
        draw(U32),
        stream_id,
        draw(st.sampled_from([-1, 0, 1])),
        draw(I32),
        location=draw(locations(stream_id)),
        batch=batch,
        hole=hole,
        transactional_id=txn,
        produce_version=version,
        header=draw(HEADERS),
    )


@st.composite
def held_responses(draw) -> HeldResponse:
    if draw(st.booleans()):
        return HeldResponse(draw(U32), (), draw(I16))
    released = tuple(sorted(draw(st.sets(st.integers(0, (1 << 32) - 2), max_size=20))))
    return HeldResponse(draw(U32), released)


MESSAGES = st.one_of(
    referencing_appends(),
    st.builds(AppendResponse, U32, st.just(0), I64, I64, I64, st.none() | TEXT, st.booleans()),
    st.builds(
        HeldRequest, U32, NON_NEGATIVE_I32, st.lists(locations(), min_size=1, max_size=8).map(tuple)
    ),
    held_responses(),
)


@settings(max_examples=500, deadline=None)
@given(message=MESSAGES)
def test_round_trip(message):
    frame = encode_frame(message)
    assert frame_size(message) == len(frame)
    assert decode_frame(frame) == message


@settings(max_examples=300, deadline=None)
@given(request=referencing_appends(), level=st.integers(1, REFERENCE_PROTOCOL - 1))
def test_below_13_the_frame_is_that_of_the_append_without_a_header(request, level):
    without = dataclasses.replace(request, header=None)
    assert encode_frame(for_peer(request, level)) == encode_frame(for_peer(without, level))
    assert for_peer(request, REFERENCE_PROTOCOL) is request
