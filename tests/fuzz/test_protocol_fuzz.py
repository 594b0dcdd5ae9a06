"""Garbage in, FrameError out: no input makes the protocol layer raise anything else.

The server closes a connection on FrameError and treats any other exception as a bug,
so every reader is fed random bytes and mutated valid messages.
"""

import random
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kio.static.primitive import Records

from proxy.apis import RESPONSE_REWRITERS
from proxy.apis.api18_api_versions import (
    RESPONSES as API_VERSIONS_RESPONSES,
)
from proxy.apis.api18_api_versions import (
    ApiVersionsError,
    parse_api_versions_response,
)
from proxy.kafka.codec import encode, load_response_types
from proxy.kafka.frames import FrameDecoder, FrameError
from proxy.kafka.headers import parse_request_header, produce_acks, response_header_size
from proxy.kafka.versions import APIS

st.register_type_strategy(Records, st.binary(max_size=40).map(Records))

FUZZ = settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
REWRITTEN = [
    (api_key, version)
    for api_key in sorted(RESPONSE_REWRITERS)
    for version in range(APIS[api_key].min_version, APIS[api_key].max_version + 1)
]


def mutations(data: bytes, seed: int, count: int = 30):
    """`count` variants of data: truncated, or with a few bytes overwritten or inserted."""
    rng = random.Random(seed)
    for _ in range(count):
        out = bytearray(data)
        for _ in range(rng.randint(1, 4)):
            action = rng.choice(["truncate", "overwrite", "insert"])
            position = rng.randint(0, len(out))
            if action == "truncate":
                del out[position:]
            elif action == "overwrite" and position < len(out):
                out[position] = rng.randrange(256)
            else:
                out[position:position] = rng.randbytes(rng.randint(1, 4))
        yield bytes(out)


@FUZZ
@given(chunks=st.lists(st.binary(max_size=64), max_size=20))
def test_frame_decoder_on_random_bytes(chunks):
    decoder = FrameDecoder(max_frame_bytes=1000)
    total = 0
    try:
        for chunk in chunks:
            decoder.feed(chunk)
            while (body := decoder.next_frame()) is not None:
                total += 4 + len(body)
    except FrameError:
        return
    assert total + decoder.buffered == sum(map(len, chunks))


@FUZZ
@given(
    api_key=st.sampled_from(sorted(APIS)) | st.integers(-(2**15), 2**15 - 1),
    api_version=st.integers(min_value=-2, max_value=20),
    rest=st.binary(max_size=40),
)
def test_request_header_on_random_bytes(api_key, api_version, rest):
    data = struct.pack(">hh", api_key, api_version) + rest
    try:
        header = parse_request_header(memoryview(data))
    except FrameError:
        return
    assert header.size <= len(data)


@FUZZ
@given(api_version=st.integers(min_value=3, max_value=13), body=st.binary(max_size=20))
def test_produce_acks_on_random_bytes(api_version, body):
    try:
        produce_acks(api_version, memoryview(body))
    except FrameError:
        pass


@FUZZ
@given(
    case=st.sampled_from(REWRITTEN + [(18, v) for v in range(5)]),
    frame=st.binary(max_size=20),
)
def test_response_header_size_on_random_bytes(case, frame):
    try:
        assert response_header_size(*case, memoryview(frame)) <= len(frame)
    except FrameError:
        pass


@pytest.mark.parametrize(("api_key", "version"), REWRITTEN)
def test_rewriters_on_random_and_mutated_bodies(api_key, version):
    rewrite = RESPONSE_REWRITERS[api_key]
    response = load_response_types(api_key)[version]

    @settings(
        max_examples=10,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(answer=st.from_type(response), noise=st.binary(max_size=200), seed=st.integers())
    def check(answer, noise, seed):
        for body in [noise, *mutations(encode(answer), seed)]:
            try:
                rewrite(version, memoryview(body), lambda n, h, p: ("p", 1))
            except FrameError:
                pass

    check()


@FUZZ
@given(
    version=st.sampled_from(sorted(API_VERSIONS_RESPONSES)),
    data=st.data(),
    seed=st.integers(),
)
def test_api_versions_parse_on_mutated_bodies(version, data, seed):
    answer = data.draw(st.from_type(API_VERSIONS_RESPONSES[version]))
    for body in mutations(encode(answer), seed, count=5):
        try:
            parse_api_versions_response(version, memoryview(body))
        except (FrameError, ApiVersionsError):
            pass
