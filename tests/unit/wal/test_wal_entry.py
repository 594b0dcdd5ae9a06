"""The WAL entry codec: the layout byte by byte, and where a reader stops."""

from __future__ import annotations

import struct

import pytest
from crc32c import crc32c

from proxy.wal.entry import (
    HEADER_SIZE,
    MIN_LENGTH,
    VERSION,
    Stop,
    announced_size,
    classify_stop,
    encode_entry,
    encode_header,
    entry_size,
    read_entries,
)


def test_layout_byte_by_byte():
    entry = encode_entry(7, 42, b"abc")
    assert len(entry) == entry_size(3) == HEADER_SIZE + 3 == 28
    length, crc = struct.unpack_from(">II", entry, 0)
    assert length == 1 + 8 + 8 + 3 == MIN_LENGTH + 3
    assert crc == crc32c(entry[8:])
    assert entry[8] == VERSION == 1
    assert struct.unpack_from(">qq", entry, 9) == (7, 42)
    assert entry[25:] == b"abc"
    assert encode_header(7, 42, b"abc") == entry[:HEADER_SIZE]


def test_reads_back_entries_in_order_as_slices_of_the_buffer():
    batches = [b"", b"x", bytes(range(256)) * 10]
    buf = b"".join(encode_entry(i, 1000 + i, batch) for i, batch in enumerate(batches))
    entries, valid = read_entries(buf)
    assert valid == len(buf)
    assert [(e.stream_id, e.base_offset, bytes(e.batch)) for e in entries] == [
        (i, 1000 + i, batch) for i, batch in enumerate(batches)
    ]
    assert [e.offset for e in entries] == [0, entry_size(0), entry_size(0) + entry_size(1)]
    assert entries[2].batch.obj is buf  # a view, not a copy
    assert classify_stop(buf, valid) is Stop.END


def test_negative_and_extreme_ids_round_trip():
    buf = encode_entry(-1, -(1 << 63), b"z") + encode_entry((1 << 63) - 1, 0, b"")
    entries, _ = read_entries(buf)
    assert [(e.stream_id, e.base_offset) for e in entries] == [(-1, -(1 << 63)), ((1 << 63) - 1, 0)]


@pytest.mark.parametrize(("stream_id", "base_offset"), [(1 << 63, 0), (0, -(1 << 63) - 1)])
def test_ids_outside_int64_are_refused(stream_id, base_offset):
    with pytest.raises(ValueError, match="int64"):
        encode_header(stream_id, base_offset, b"")


def test_empty_buffer():
    assert read_entries(b"") == ([], 0)
    assert classify_stop(b"", 0) is Stop.END


def test_every_cut_of_the_last_entry_is_torn():
    first = encode_entry(1, 0, b"first")
    second = encode_entry(1, 1, b"second batch")
    for cut in range(1, len(second)):
        buf = first + second[:cut]
        entries, valid = read_entries(buf)
        assert valid == len(first)
        assert [bytes(e.batch) for e in entries] == [b"first"]
        assert classify_stop(buf, valid) is Stop.TORN


def test_a_flipped_bit_anywhere_stops_the_reader_at_that_entry():
    first = encode_entry(1, 0, b"first")
    second = encode_entry(2, 5, b"second")
    for index in range(len(second)):
        damaged = bytearray(second)
        damaged[index] ^= 0x10
        buf = first + bytes(damaged) + encode_entry(3, 9, b"third")
        entries, valid = read_entries(buf)
        assert valid == len(first), index
        assert classify_stop(buf, valid) in (Stop.CORRUPT, Stop.TORN)


def test_zero_filled_tail_is_corrupt_not_an_entry():
    # what a file extended by a crash before its data reached the disk reads like
    buf = encode_entry(1, 0, b"ok") + bytes(64)
    entries, valid = read_entries(buf)
    assert len(entries) == 1
    assert classify_stop(buf, valid) is Stop.CORRUPT


def test_length_too_small_for_a_header_is_corrupt():
    body = bytes([VERSION]) + b"short"
    buf = struct.pack(">II", len(body), crc32c(body)) + body
    assert read_entries(buf) == ([], 0)
    assert classify_stop(buf, 0) is Stop.CORRUPT


def test_unknown_version_with_a_good_crc_is_reported_as_such():
    body = bytes([VERSION + 2]) + bytes(16) + b"from the future"  # 2 has a reference
    newer = struct.pack(">II", len(body), crc32c(body)) + body
    buf = encode_entry(1, 0, b"ok") + newer
    entries, valid = read_entries(buf)
    assert len(entries) == 1
    assert classify_stop(buf, valid) is Stop.UNKNOWN_VERSION


def test_announced_size():
    entry = encode_entry(1, 0, b"abcdef")
    assert announced_size(entry[:3]) is None
    assert announced_size(entry[:4]) == len(entry)
