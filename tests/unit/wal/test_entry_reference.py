"""Version-2 WAL entries (an entry with a reference): the layout byte by byte, version 1
unchanged, reading both back, and where a reader stops on a damaged one."""

from __future__ import annotations

import struct

import pytest
from crc32c import crc32c
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.wal.entry import (
    HEADER_SIZE,
    MAX_REFERENCE_SIZE,
    REFERENCE_HEADER_SIZE,
    VERSION_REFERENCE,
    DecodedEntry,
    Stop,
    classify_stop,
    encode_entry,
    encode_header,
    entry_size,
    header_reference,
    read_entries,
)
from proxy.wal.memfs import MemoryFilesystem
from proxy.wal.segments import recover, segment_name
from proxy.wal.types import WalCorruptError

REF = b"s3://bucket/wal/0001?range=0-4096&crc=1234"


def framed(body: bytes) -> bytes:
    """An entry with a correct length and CRC around any body: what a writer of another
    version, or a buggy one, could have left."""
    return struct.pack(">II", len(body), crc32c(body)) + body


def as_written(e: DecodedEntry) -> tuple[int, int, bytes, bytes | None]:
    return (
        e.stream_id,
        e.base_offset,
        bytes(e.batch),
        None if e.reference is None else bytes(e.reference),
    )


def test_version_1_bytes_are_unchanged():
    # computed from the version-1 layout before version 2 existed: old WALs replay
    assert encode_entry(7, 42, b"abc") == bytes.fromhex(
        "00000014d5fa4532010000000000000007000000000000002a616263"
    )
    assert encode_entry(-1, 1 << 40, b"") == bytes.fromhex(
        "0000001103293b1801ffffffffffffffff0000010000000000"
    )
    assert encode_header(7, 42, b"abc", None) == encode_header(7, 42, b"abc")
    assert len(encode_header(7, 42, b"abc")) == HEADER_SIZE == 25
    assert entry_size(3) == entry_size(3, None) == 28


def test_version_2_layout_byte_by_byte():
    entry = encode_entry(7, 42, b"abc", b"ref")
    assert len(entry) == entry_size(3, 3) == REFERENCE_HEADER_SIZE + 3 + 3 == 33
    length, crc = struct.unpack_from(">II", entry, 0)
    assert length == 1 + 8 + 8 + 2 + 3 + 3
    assert crc == crc32c(entry[8:])
    assert entry[8] == VERSION_REFERENCE == 2
    assert struct.unpack_from(">qqH", entry, 9) == (7, 42, 3)
    assert entry[27:30] == b"ref" and entry[30:] == b"abc"
    header = encode_header(7, 42, b"abc", b"ref")
    assert header == entry[:30]  # everything before the batch: the batch is written apart
    assert bytes(header_reference(header) or b"?") == b"ref"
    assert header_reference(encode_header(7, 42, b"abc")) is None


def test_both_versions_read_back_in_order_as_slices_of_the_buffer():
    written = [
        (1, 0, b"plain", None),
        (2, 10, b"\x00" * 61, REF),
        (3, 20, b"", b""),  # an empty reference is still a reference
        (4, 30, b"", REF),
        (5, 40, bytes(range(256)), None),
    ]
    buf = b"".join(encode_entry(*w) for w in written)
    entries, valid = read_entries(buf)
    assert valid == len(buf)
    assert classify_stop(buf, valid) is Stop.END
    assert [as_written(e) for e in entries] == written
    sizes = [entry_size(len(b), None if r is None else len(r)) for _, _, b, r in written]
    assert [e.size for e in entries] == sizes
    assert [e.offset for e in entries] == [sum(sizes[:i]) for i in range(len(sizes))]
    assert entries[1].reference is not None and entries[1].reference.obj is buf  # no copy
    assert entries[1].batch.obj is buf


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(min_value=-(1 << 63), max_value=(1 << 63) - 1),
            st.integers(min_value=-(1 << 63), max_value=(1 << 63) - 1),
            st.binary(max_size=120),
            st.none() | st.binary(max_size=80),
        ),
        max_size=10,
    ),
    st.data(),
)
def test_mixed_versions_round_trip_and_any_cut_is_torn(written, data):
    frames = [encode_entry(*w) for w in written]
    buf = b"".join(frames)
    entries, valid = read_entries(buf)
    assert valid == len(buf)
    assert [as_written(e) for e in entries] == written
    cut = data.draw(st.integers(min_value=0, max_value=len(buf)))
    ends = [sum(len(f) for f in frames[: i + 1]) for i in range(len(frames))]
    whole = [end for end in ends if end <= cut]
    part, valid = read_entries(buf[:cut])
    assert valid == (whole[-1] if whole else 0) and len(part) == len(whole)
    assert classify_stop(buf[:cut], valid) is (Stop.END if cut == valid else Stop.TORN)


def test_every_cut_of_a_version_2_entry_is_torn():
    first = encode_entry(1, 0, b"first")
    second = encode_entry(1, 1, b"second batch", REF)
    for cut in range(1, len(second)):
        buf = first + second[:cut]
        entries, valid = read_entries(buf)
        assert valid == len(first) and len(entries) == 1
        assert classify_stop(buf, valid) is Stop.TORN, cut


def test_a_flipped_byte_anywhere_in_a_version_2_entry_is_corrupt():
    first = encode_entry(1, 0, b"first", b"r1")
    second = encode_entry(2, 5, b"second", REF)
    for index in range(len(second)):
        damaged = bytearray(second)
        damaged[index] ^= 0xFF
        buf = first + bytes(damaged)
        entries, valid = read_entries(buf)
        assert valid == len(first) and [bytes(e.reference or b"") for e in entries] == [b"r1"]
        # a flipped length byte announces a body past the end: a tear, not damage
        expected = Stop.TORN if index < 4 and damaged[:4] > second[:4] else Stop.CORRUPT
        assert classify_stop(buf, valid) is expected, index


@pytest.mark.parametrize("version", [0, 3, 255])
def test_a_version_other_than_1_and_2_is_unknown(version):
    body = struct.pack(">Bqq", version, 1, 0) + struct.pack(">H", 3) + b"ref" + b"batch"
    buf = encode_entry(1, 0, b"ok", REF) + framed(body)
    entries, valid = read_entries(buf)
    assert len(entries) == 1 and valid == entry_size(2, len(REF))
    assert classify_stop(buf, valid) is Stop.UNKNOWN_VERSION


@pytest.mark.parametrize(
    "body",
    [
        struct.pack(">Bqq", 2, 1, 0) + struct.pack(">H", 100) + b"only ten.",  # ref past the end
        struct.pack(">Bqq", 2, 1, 0) + b"\x00",  # no room for the reference length
        struct.pack(">Bqq", 2, 1, 0),
        struct.pack(">Bq", 1, 1),  # a version-1 body short of its own header
    ],
)
def test_a_known_version_too_short_for_itself_is_corrupt(body):
    buf = encode_entry(1, 0, b"ok") + framed(body)
    entries, valid = read_entries(buf)
    assert len(entries) == 1 and valid == entry_size(2)
    assert classify_stop(buf, valid) is Stop.CORRUPT


def test_a_reference_filling_the_whole_body_leaves_an_empty_batch():
    body = struct.pack(">Bqq", 2, 1, 9) + struct.pack(">H", 4) + b"abcd"
    entries, valid = read_entries(framed(body))
    assert valid == len(body) + 8
    assert bytes(entries[0].reference or b"") == b"abcd" and bytes(entries[0].batch) == b""


def test_a_reference_longer_than_a_u16_is_refused():
    longest = b"r" * MAX_REFERENCE_SIZE
    entries, _ = read_entries(encode_entry(1, 0, b"b", longest))
    assert bytes(entries[0].reference or b"") == longest
    with pytest.raises(ValueError, match="reference of 65536 bytes"):
        encode_header(1, 0, b"b", longest + b"r")
    with pytest.raises(ValueError, match="int64"):
        encode_header(1 << 63, 0, b"b", REF)


def test_recovery_keeps_version_2_entries_and_refuses_a_newer_version():
    fs = MemoryFilesystem()
    fs.make_dirs("/w")
    path = f"/w/{segment_name(0)}"
    fs.open(path, "create").close()
    good = encode_entry(1, 0, b"a") + encode_entry(1, 1, b"b", REF)
    fs.append_bytes(path, good + encode_entry(1, 2, b"torn", REF)[:-1])
    fs.fsync_dir("/w")
    found = recover(fs, "/w")
    assert found.entries == 2 and found.truncated_bytes == entry_size(4, len(REF)) - 1
    assert fs.file_bytes(path) == good
    fs.append_bytes(path, framed(struct.pack(">Bqq", 3, 1, 3)))
    with pytest.raises(WalCorruptError, match="newer"):
        recover(fs, "/w")
