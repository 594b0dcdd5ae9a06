"""Segment files and recovery, on the in-memory filesystem: what `recover` keeps, cuts,
removes, and refuses."""

from __future__ import annotations

import struct

import pytest
from crc32c import crc32c

from proxy.wal.entry import VERSION, encode_entry
from proxy.wal.memfs import MemoryFilesystem
from proxy.wal.segments import (
    CHECKPOINT_NAME,
    decode_checkpoint,
    encode_checkpoint,
    parse_segment_name,
    read_checkpoint,
    recover,
    segment_name,
    write_checkpoint,
)
from proxy.wal.types import WalCorruptError

DIR = "/wal"


def write_segment(fs: MemoryFilesystem, base: int, data: bytes) -> str:
    path = f"{DIR}/{segment_name(base)}"
    fs.open(path, "create").close()
    fs.append_bytes(path, data)
    fs.fsync_dir(DIR)
    return path


def entries(*batches: bytes, stream: int = 1) -> bytes:
    return b"".join(encode_entry(stream, i, batch) for i, batch in enumerate(batches))


@pytest.fixture
def fs():
    fs = MemoryFilesystem()
    fs.make_dirs(DIR)
    return fs


def test_segment_names_are_the_base_offset_zero_padded():
    assert segment_name(0) == "00000000000000000000.wal"
    assert segment_name(123456) == "00000000000000123456.wal"
    assert parse_segment_name("00000000000000123456.wal") == 123456
    for name in ("123.wal", "00000000000000000000.wal.deleted", "x.wal", CHECKPOINT_NAME):
        assert parse_segment_name(name) is None


def test_an_empty_directory_gets_a_first_segment(fs):
    found = recover(fs, "/fresh")
    assert [s.base for s in found.segments] == [0]
    assert fs.list_dir("/fresh") == [segment_name(0)]
    assert (found.entries, found.truncated_bytes, found.end) == (0, 0, 0)


def test_a_clean_wal_is_kept_whole(fs):
    first = entries(b"a" * 10, b"b" * 20)
    second = entries(b"c" * 5)
    write_segment(fs, 0, first)
    write_segment(fs, len(first), second)
    found = recover(fs, DIR)
    assert [(s.base, s.size) for s in found.segments] == [
        (0, len(first)),
        (len(first), len(second)),
    ]
    assert (found.entries, found.truncated_bytes) == (3, 0)


@pytest.mark.parametrize(
    "tail",
    [b"\x00" * 9, encode_entry(1, 9, b"torn entry")[:-3], b"\xff" * 40],
    ids=["zeros", "torn-entry", "garbage"],
)
def test_the_torn_tail_of_the_last_segment_is_cut_and_reported(fs, tail):
    first = entries(b"a" * 10)
    good = entries(b"b" * 10, b"c" * 10)
    write_segment(fs, 0, first)
    path = write_segment(fs, len(first), good + tail)
    found = recover(fs, DIR)
    assert found.truncated_bytes == len(tail)
    assert found.segments[-1].size == len(good)
    assert fs.file_bytes(path) == good
    assert found.entries == 3
    # and the cut is durable
    assert fs.crash().file_bytes(path) == good


def test_damage_before_the_last_segment_is_refused(fs):
    first = bytearray(entries(b"a" * 10, b"b" * 10))
    first[-1] ^= 1
    write_segment(fs, 0, bytes(first))
    write_segment(fs, len(first), entries(b"c"))
    with pytest.raises(WalCorruptError, match="corrupt entry in a segment"):
        recover(fs, DIR)


def test_a_gap_between_segments_is_refused(fs):
    first = entries(b"a" * 10)
    write_segment(fs, 0, first)
    write_segment(fs, len(first) + 100, entries(b"c"))
    with pytest.raises(WalCorruptError, match="not contiguous"):
        recover(fs, DIR)


def test_entries_of_a_newer_format_are_not_cut(fs):
    body = bytes([VERSION + 2]) + bytes(20)  # version 2 is read (a reference entry)
    newer = struct.pack(">II", len(body), crc32c(body)) + body
    write_segment(fs, 0, entries(b"a") + newer)
    with pytest.raises(WalCorruptError, match="newer"):
        recover(fs, DIR)


def test_leftovers_of_interrupted_renames_are_removed(fs):
    write_segment(fs, 0, entries(b"a"))
    fs.open(f"{DIR}/{segment_name(0)}.x", "create").close()  # not ours: left alone
    fs.open(f"{DIR}/{segment_name(999)}.deleted", "create").close()
    fs.open(f"{DIR}/{CHECKPOINT_NAME}.tmp", "create").close()
    found = recover(fs, DIR)
    assert sorted(found.removed_files) == [f"{segment_name(999)}.deleted", f"{CHECKPOINT_NAME}.tmp"]
    assert fs.list_dir(DIR) == [segment_name(0), f"{segment_name(0)}.x"]


def test_the_checkpoint_says_what_was_trimmed(fs):
    one = entries(b"a" * 10, b"b" * 10)
    two = entries(b"c" * 10, b"d" * 10)
    three = entries(b"e" * 10)
    write_segment(fs, 0, one)
    write_segment(fs, len(one), two)
    write_segment(fs, len(one) + len(two), three)
    # uploaded: all of segment one and the first entry of segment two
    trimmed = len(one) + len(two) // 2
    write_checkpoint(fs, DIR, trimmed)
    found = recover(fs, DIR)
    assert found.deleted_segments == 1
    assert found.trimmed_to == trimmed
    assert found.log_start == len(one)
    assert found.entries == 2  # "d" and "e"
    assert segment_name(0) not in fs.list_dir(DIR)


def test_a_checkpoint_past_the_end_is_clamped(fs):
    data = entries(b"a")
    write_segment(fs, 0, data)
    write_checkpoint(fs, DIR, 10_000)
    found = recover(fs, DIR)
    assert found.trimmed_to == len(data)
    assert found.entries == 0


def test_a_wal_trimmed_to_nothing_restarts_where_it_was(fs):
    write_checkpoint(fs, DIR, 5000)
    found = recover(fs, DIR)
    assert [s.base for s in found.segments] == [5000]


def test_checkpoint_codec():
    assert decode_checkpoint(encode_checkpoint(123)) == 123
    assert decode_checkpoint(b"") is None
    damaged = bytearray(encode_checkpoint(123))
    damaged[3] ^= 1
    assert decode_checkpoint(bytes(damaged)) is None


def test_an_unreadable_checkpoint_means_nothing_was_trimmed(fs):
    fs.open(f"{DIR}/{CHECKPOINT_NAME}", "create").close()
    fs.append_bytes(f"{DIR}/{CHECKPOINT_NAME}", b"garbage")
    assert read_checkpoint(fs, DIR) == 0
