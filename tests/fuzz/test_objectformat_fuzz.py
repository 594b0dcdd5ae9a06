"""Garbage in, ObjectFormatError out: no bytes make the object readers raise anything else.

Readers meet objects from S3 that may be damaged, cut short or not objects at all; any
exception other than ObjectFormatError would be a bug that escapes the request's error
handling. Inputs: random bytes, footers and indexes that are well-formed enough (right
magic, valid CRCs) to reach the deeper checks, and mutated valid objects.
"""

from __future__ import annotations

import random
import struct

import crc32c
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.objects.format import (
    FOOTER_SIZE,
    Footer,
    IndexEntry,
    ObjectFormatError,
    ObjectKind,
    ObjectWriter,
    parse_footer,
    parse_index,
    read_block,
    read_object,
)
from proxy.objects.keys import object_key

FUZZ = settings(
    max_examples=1000,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
U64 = st.integers(0, (1 << 64) - 1)
U32 = st.integers(0, (1 << 32) - 1)
KEY = object_key(7, ObjectKind.STREAM_SET)


def only_object_format_errors(read) -> None:
    try:
        read()
    except ObjectFormatError as exc:
        assert str(exc).startswith("object ")


FOOTER_FIELDS = (
    "head_magic",
    "kind",
    "reserved",
    "object_id",
    "index_position",
    "index_size",
    "block_count",
    "index_crc",
    "version",
    "footer_size",
    "footer_crc",
    "tail_magic",
)
FOOTER_VALUES = {
    "head_magic": st.sampled_from([b"TPOE", b"\x00" * 4]) | st.binary(min_size=4, max_size=4),
    "kind": st.integers(0, 255),
    "reserved": st.binary(min_size=3, max_size=3),
    "object_id": st.sampled_from([8, 0]) | U64,
    "index_position": st.integers(0, 200) | U64,
    "index_size": st.sampled_from([0, 43, 88]) | U32,
    "block_count": st.integers(0, 3) | U32,
    "index_crc": U32,
    "version": st.integers(0, 0xFFFF),
    "footer_size": st.sampled_from([0, 12, 47, 49, 1000]) | st.integers(0, 0xFFFF),
    "footer_crc": U32,
    "tail_magic": st.binary(min_size=4, max_size=4),
}


@st.composite
def footers(draw) -> tuple[bytes, int]:
    """A valid footer (of a 1-block stream set object 7) with up to three fields changed,
    the footer CRC recomputed unless it is one of them; and the object size it describes."""
    fields = {
        "head_magic": b"TPOF",
        "kind": 1,
        "reserved": bytes(3),
        "object_id": 7,
        "index_position": draw(st.integers(0, 100)),
        "index_size": 44,
        "block_count": 1,
        "index_crc": draw(U32),
        "version": 1,
        "footer_size": 48,
        "footer_crc": None,
        "tail_magic": b"TPOE",
    }
    for name in draw(st.lists(st.sampled_from(FOOTER_FIELDS), max_size=3, unique=True)):
        fields[name] = draw(FOOTER_VALUES[name])
    body = (
        fields["head_magic"]
        + bytes([fields["kind"]])
        + fields["reserved"]
        + struct.pack(
            ">QQIIIHH",
            *(fields[name] for name in FOOTER_FIELDS[3:10]),
        )
    )
    crc = crc32c.crc32c(body) if fields["footer_crc"] is None else fields["footer_crc"]
    object_size = fields["index_position"] + fields["index_size"] + FOOTER_SIZE
    return body + struct.pack(">I", crc) + fields["tail_magic"], object_size


@FUZZ
@given(tail=st.binary(max_size=200), object_size=st.integers(-10, 1 << 65))
def test_random_tails(tail, object_size):
    only_object_format_errors(lambda: parse_footer(tail, object_size, KEY))
    only_object_format_errors(lambda: parse_footer(tail, len(tail), KEY))


@FUZZ
@given(footer_and_size=footers(), prefix=st.binary(max_size=60), size_delta=st.integers(-5, 5))
def test_footers_that_are_nearly_valid(footer_and_size, prefix, size_delta):
    footer, object_size = footer_and_size
    tail = prefix + footer
    for size in (len(tail), object_size, object_size + size_delta):
        only_object_format_errors(lambda size=size: parse_footer(tail, size, KEY))


@FUZZ
@given(
    index=st.binary(max_size=300) | st.lists(st.binary(min_size=44, max_size=44)).map(b"".join),
    kind=st.sampled_from(ObjectKind),
    index_position=st.integers(0, 500) | U64,
    valid_crc=st.booleans(),
    crc=U32,
)
def test_random_indexes(index, kind, index_position, valid_crc, crc):
    footer = Footer(
        object_id=7,
        kind=kind,
        index_position=index_position,
        index_size=len(index),
        block_count=len(index) // 44,
        index_crc=crc32c.crc32c(index) if valid_crc else crc,
    )
    only_object_format_errors(lambda: parse_index(index, footer, KEY))
    # and an index the footer disagrees with about its length
    wrong = Footer(7, kind, index_position, len(index) + 1, 0, crc32c.crc32c(index))
    only_object_format_errors(lambda: parse_index(index, wrong, KEY))


ENTRY_FIELDS = ("stream_id", "start", "delta", "count", "position", "size", "crc")
ENTRY_VALUES = {
    "stream_id": st.integers(0, 4) | U64,
    "start": st.integers(-2, 40) | st.integers(-(1 << 63), (1 << 63) - 1),
    "delta": st.integers(0, 20) | U64,
    "count": st.integers(0, 20) | U32,
    "position": st.integers(0, 60) | U64,
    "size": st.integers(0, 20) | U32,
    "crc": U32,
}


@st.composite
def indexes(draw) -> tuple[bytes, int]:
    """A valid index of 1-5 blocks with up to two fields of its entries changed, and the
    data size (index position) it describes."""
    entries = []
    stream_id, offset, position = draw(st.integers(0, 3)), draw(st.integers(0, 30)), 0
    for _ in range(draw(st.integers(1, 5))):
        if draw(st.booleans()):
            stream_id, offset = stream_id + 1, draw(st.integers(0, 30))
        delta, size = draw(st.integers(1, 10)), draw(st.integers(1, 10))
        count = draw(st.integers(0, delta))
        entries.append(
            dict(
                zip(ENTRY_FIELDS, (stream_id, offset, delta, count, position, size, 0), strict=True)
            )
        )
        offset, position = offset + delta, position + size
    for _ in range(draw(st.integers(0, 2))):
        name = draw(st.sampled_from(ENTRY_FIELDS))
        draw(st.sampled_from(entries))[name] = draw(ENTRY_VALUES[name])
    index = b"".join(struct.pack(">QqQIQII", *entry.values()) for entry in entries)
    return index, position


@FUZZ
@given(index_and_size=indexes(), kind=st.sampled_from(ObjectKind), size_delta=st.integers(-2, 2))
def test_indexes_that_are_nearly_valid(index_and_size, kind, size_delta):
    index, data_size = index_and_size
    for index_position in (data_size, max(0, data_size + size_delta)):
        count, crc = len(index) // 44, crc32c.crc32c(index)
        footer = Footer(7, kind, index_position, len(index), count, crc, version=1)
        only_object_format_errors(lambda footer=footer: parse_index(index, footer, KEY))


@FUZZ
@given(
    data=st.binary(max_size=100),
    position=st.integers(0, 200) | U64,
    size=st.integers(0, 120) | U32,
    data_position=st.integers(0, 200) | U64,
    crc=U32,
)
def test_random_block_reads(data, position, size, data_position, crc):
    entry = IndexEntry(1, 0, 1, 1, position, size, crc)
    only_object_format_errors(lambda: read_block(data, entry, KEY, data_position))


def sample_object() -> bytes:
    writer = ObjectWriter(7, ObjectKind.STREAM_SET)
    writer.add_block(1, b"a" * 30, 0, 10, 10, max_timestamp=1_700_000_000_000)
    writer.add_block(1, b"b" * 20, 10, 1 << 40, 5, max_timestamp=-1)
    writer.add_block(4, b"c" * 10, 3, 4, 1, max_timestamp=5)
    return writer.build().to_bytes()


def mutations(data: bytes, seed: int, count: int = 50):
    """`count` variants of data: cut, or with a few bytes overwritten, inserted or removed."""
    rng = random.Random(seed)
    for _ in range(count):
        out = bytearray(data)
        for _ in range(rng.randint(1, 4)):
            action = rng.choice(["truncate", "overwrite", "insert", "delete"])
            position = rng.randint(0, max(0, len(out) - 1))
            if action == "truncate":
                del out[position:]
            elif action == "overwrite" and out:
                out[position] = rng.randrange(256)
            elif action == "insert":
                out[position:position] = rng.randbytes(rng.randint(1, 8))
            elif out:
                del out[position : position + rng.randint(1, 8)]
        yield bytes(out)


@settings(max_examples=200, deadline=None)
@given(seed=st.integers(0, 1 << 32))
def test_mutated_objects(seed):
    original = sample_object()
    for damaged in mutations(original, seed):

        def read_all(data=damaged):
            _, index = read_object(data, KEY)
            return [bytes(read_block(data, entry, KEY)) for entry in index]

        only_object_format_errors(read_all)
