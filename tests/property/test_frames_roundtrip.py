"""Any chunking of a stream of frames gives back exactly those frames, in order."""

from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.kafka.frames import FrameDecoder, frame


@settings(max_examples=300, deadline=None)
@given(
    payloads=st.lists(st.binary(max_size=300), max_size=20),
    cuts=st.lists(st.integers(min_value=0, max_value=10_000), max_size=30),
    drain_every_chunk=st.booleans(),
)
def test_frames_survive_any_chunking(payloads, cuts, drain_every_chunk):
    stream = b"".join(frame(payload) for payload in payloads)
    points = sorted({cut % (len(stream) + 1) for cut in cuts} | {0, len(stream)})
    decoder = FrameDecoder(max_frame_bytes=300)
    got = []
    for start, end in zip(points, points[1:], strict=False):
        decoder.feed(stream[start:end])
        if drain_every_chunk:
            while (body := decoder.next_frame()) is not None:
                got.append(bytes(body))
    while (body := decoder.next_frame()) is not None:
        got.append(bytes(body))
    assert got == payloads
    assert decoder.buffered == 0
