import struct

import pytest

from proxy.kafka.frames import FrameDecoder, FrameError, frame


def frames_of(decoder: FrameDecoder) -> list[bytes]:
    out = []
    while (body := decoder.next_frame()) is not None:
        out.append(bytes(body))
    return out


def test_frame_prepends_the_int32_size():
    assert frame(b"abc") == b"\x00\x00\x00\x03abc"
    assert frame(bytearray(b"ab")) == b"\x00\x00\x00\x02ab"
    assert frame(memoryview(b"xyz")[1:]) == b"\x00\x00\x00\x02yz"
    assert frame(b"") == b"\x00\x00\x00\x00"


def test_many_frames_in_one_chunk_are_views_of_that_chunk():
    chunk = frame(b"one") + frame(b"") + frame(b"three")
    decoder = FrameDecoder()
    decoder.feed(chunk)
    first = decoder.next_frame()
    assert first is not None and first.obj is chunk  # no copy
    assert bytes(first) == b"one"
    assert frames_of(decoder) == [b"", b"three"]
    assert decoder.buffered == 0


def test_a_frame_split_anywhere_is_returned_once_complete():
    data = frame(b"hello world")
    for cut in range(len(data)):
        decoder = FrameDecoder()
        decoder.feed(data[:cut])
        assert decoder.next_frame() is None
        decoder.feed(data[cut:])
        assert frames_of(decoder) == [b"hello world"]


def test_a_big_frame_in_many_chunks_is_joined_once_complete():
    payload = bytes(range(256)) * 4096  # 1 MiB
    data = frame(payload)
    decoder = FrameDecoder()
    for start in range(0, len(data), 1000):
        assert decoder.next_frame() is None
        decoder.feed(data[start : start + 1000])
    assert frames_of(decoder) == [payload]


def test_fed_buffers_that_the_caller_reuses_are_copied():
    buffer = bytearray(frame(b"abcd"))
    decoder = FrameDecoder()
    decoder.feed(buffer)
    buffer[4:8] = b"XXXX"
    assert frames_of(decoder) == [b"abcd"]


def test_negative_size_is_refused():
    decoder = FrameDecoder()
    decoder.feed(struct.pack(">i", -5))
    with pytest.raises(FrameError, match=r"^negative frame size -5$"):
        decoder.next_frame()


def test_oversized_frame_is_refused_before_its_body_arrives():
    decoder = FrameDecoder(max_frame_bytes=100 * 1024 * 1024)
    decoder.feed(struct.pack(">i", 209715200))
    with pytest.raises(FrameError, match=r"^frame size 209715200 exceeds limit 104857600$"):
        decoder.next_frame()
    with pytest.raises(FrameError):  # the decoder stays failed
        decoder.next_frame()


def test_frame_at_the_limit_is_accepted():
    decoder = FrameDecoder(max_frame_bytes=3)
    decoder.feed(frame(b"abc"))
    assert frames_of(decoder) == [b"abc"]


def test_buffered_counts_what_is_not_yet_returned():
    decoder = FrameDecoder()
    decoder.feed(frame(b"abcdef")[:7])
    assert decoder.next_frame() is None
    assert decoder.buffered == 7
