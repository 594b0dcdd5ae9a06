"""A Fetch v16+ answer walked as it streams: the walk stops exactly where the top-level
tagged fields begin, whatever the answer holds (records, aborted transactions, partition
tags, null arrays, tags kio does not know), and the trailing section is rewritten at its
own length, the answer passing through otherwise byte for byte, in any chunking."""

from __future__ import annotations

import asyncio
import random
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_fetch_split import RESPONSES, answer, endpoints, mod, partition_data, upstream_answer

from proxy.apis.api01_fetch import rewrite_response
from proxy.apis.fetch_stream import PADDING_TAG, rewrite_tail, walk_fetch_answer
from proxy.kafka.codec import decode, encode
from proxy.kafka.frames import FrameError
from proxy.kafka.wire import read_tagged_fields, write_uvarint
from proxy.server.streams import stream_walked_answer

FLEXIBLE = range(12, 19)
HEADER = struct.pack(">i", 7) + b"\x00"  # correlation id, no header tags


def walk_over(api_version: int, after_header: bytes) -> int:
    """Where the walk of `after_header` (the header's tags and the body) stops."""
    walk, at = walk_fetch_answer(api_version), 0
    try:
        want = next(walk)
        while True:
            size = abs(want)
            assert at + size <= len(after_header), "the walk went past the end"
            data = after_header[at : at + size]
            at += size
            want = walk.send(data if want > 0 else b"")
    except StopIteration:
        return at


@pytest.mark.parametrize("version", FLEXIBLE)
def test_the_walk_stops_at_the_top_level_tags(version):
    body = encode(upstream_answer(version))
    section = encode(answer(version, [], endpoints=endpoints(version)))[4 + 2 + 4 + 1 :]
    assert body.endswith(section)
    stop = walk_over(version, b"\x00" + body)
    assert stop == 1 + len(body) - len(section)


@pytest.mark.parametrize("version", [16, 18])
def test_the_walk_skips_header_tags_null_arrays_and_unknown_tags(version):
    data = partition_data(version, 0, records=None, aborted_transactions=None)
    body = encode(answer(version, [("t", [data, data])], endpoints=endpoints(version)))
    # header tags: one unknown tag of 3 bytes; the body as it is
    header_tags = b"\x01\x05\x03abc"
    stop = walk_over(version, header_tags + body)
    section = encode(answer(version, [], endpoints=endpoints(version)))[4 + 2 + 4 + 1 :]
    assert stop == len(header_tags) + len(body) - len(section)


def test_a_truncated_answer_is_cut_short_of_its_walk():
    body = encode(upstream_answer(16))
    cut = 1 + len(body) // 2
    with pytest.raises(AssertionError, match="past the end"):
        walk_over(16, (b"\x00" + body)[:cut])


def test_a_runaway_varint_is_a_frame_error():
    walk = walk_fetch_answer(16)
    assert next(walk) == 1
    with pytest.raises(FrameError, match="varint longer than 5 bytes"):
        for _ in range(6):
            walk.send(b"\xff")


def test_only_flexible_versions_are_walked():
    with pytest.raises(ValueError, match="not flexible"):
        next(walk_fetch_answer(11))


def advertise_as(host: str):
    return lambda node_id, upstream_host, port: (host, 19000 + node_id)


def without_padding(section: bytes) -> bytes:
    fields, _ = read_tagged_fields(memoryview(section), 0)
    kept = [(tag, section[start:end]) for tag, start, end in fields if tag != PADDING_TAG]
    return write_uvarint(len(kept)) + b"".join(
        write_uvarint(tag) + write_uvarint(len(value)) + value for tag, value in kept
    )


@pytest.mark.parametrize("version", [16, 17, 18])
@pytest.mark.parametrize("host", ["h", "proxy-b", "broker-2", "proxy.zone-b.example.com"])
def test_the_tail_is_rewritten_at_its_own_length(version, host):
    body = encode(upstream_answer(version))
    section = encode(answer(version, [], endpoints=endpoints(version)))[4 + 2 + 4 + 1 :]
    tail = rewrite_tail(version, memoryview(section), advertise_as(host))
    assert len(tail) == len(section)
    new_body = body[: len(body) - len(section)] + without_padding(bytes(tail))
    m = mod(RESPONSES, version)
    got = decode(RESPONSES[version], new_body)
    if len(host) <= len("broker-2"):  # fits
        assert got.node_endpoints == (
            m.NodeEndpoint(node_id=2, host=host, port=19002, rack="zone-b"),
        )
        whole = rewrite_response(version, memoryview(body), advertise_as(host))
        assert decode(RESPONSES[version], whole) == got
    else:  # longer than Kafka's: left out, the client asks Metadata
        assert got.node_endpoints == ()
    assert got.responses == decode(RESPONSES[version], body).responses


def test_a_tail_without_endpoints_is_kept_as_it_came():
    section = memoryview(encode(answer(16, []))[4 + 2 + 4 + 1 :])
    assert rewrite_tail(16, section, advertise_as("x")) is section


async def streamed(version: int, frame: bytes, chunks: list[int], buffer_bytes: int) -> bytes:
    reader = asyncio.StreamReader()
    at = 0
    for size in chunks:
        reader.feed_data(frame[at : at + size])
        at += size
    reader.feed_data(frame[at:])
    reader.feed_eof()
    head = await reader.readexactly(8)
    out: list[bytes] = []

    async def drain() -> None:
        await asyncio.sleep(0)

    await stream_walked_answer(
        reader, head, len(frame) - 8, walk_fetch_answer(version), buffer_bytes,
        lambda *pieces: out.extend(bytes(p) for p in pieces), drain,
        lambda tail: rewrite_tail(version, tail, advertise_as("proxy-b")),
    )  # fmt: skip
    return b"".join(out)


@settings(max_examples=40, deadline=None)
@given(
    version=st.sampled_from([16, 17, 18]),
    seed=st.integers(0, 2**32 - 1),
    buffer_bytes=st.sampled_from([16, 4096, 1 << 20]),
)
def test_the_stream_is_the_whole_rewrite_in_any_chunking(version, seed, buffer_bytes):
    body = encode(upstream_answer(version))
    frame = struct.pack(">i", len(HEADER) + len(body)) + HEADER + body
    rng = random.Random(seed)
    chunks = [rng.randint(1, 300) for _ in range(rng.randint(0, 20))]
    out = asyncio.run(streamed(version, frame, chunks, buffer_bytes))
    whole = rewrite_response(version, memoryview(body), advertise_as("proxy-b"))
    assert len(out) == len(frame)  # "proxy-b" is shorter than "broker-2": made up
    section = encode(answer(version, [], endpoints=endpoints(version)))[4 + 2 + 4 + 1 :]
    section_at = len(frame) - len(section)
    assert out[:section_at] == frame[:section_at]
    rewritten_body = out[len(frame) - len(body) : section_at] + without_padding(out[section_at:])
    assert decode(RESPONSES[version], rewritten_body) == decode(RESPONSES[version], whole)


def test_an_answer_ending_early_is_a_frame_error():
    body = encode(upstream_answer(16))
    frame = struct.pack(">i", len(HEADER) + len(body)) + HEADER + body
    short = frame[: len(frame) // 2]
    with pytest.raises(FrameError, match="ends .* early"):
        asyncio.run(streamed(16, struct.pack(">i", len(short) - 4) + short[4:], [], 1 << 20))
