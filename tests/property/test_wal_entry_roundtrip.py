"""WAL entries: what is encoded is read back; a cut anywhere gives exactly the whole
entries before it; reading a file in chunks of any size finds the same entries."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.wal.entry import Stop, classify_stop, encode_entry, read_entries
from proxy.wal.memfs import MemoryFilesystem
from proxy.wal.segments import scan_segment

INT64 = st.integers(min_value=-(1 << 63), max_value=(1 << 63) - 1)
ENTRIES = st.lists(st.tuples(INT64, INT64, st.binary(max_size=200)), max_size=12)


def encode_all(entries) -> tuple[bytes, list[int]]:
    frames = [encode_entry(*entry) for entry in entries]
    ends = []
    total = 0
    for frame in frames:
        total += len(frame)
        ends.append(total)
    return b"".join(frames), ends


@settings(max_examples=300, deadline=None)
@given(entries=ENTRIES)
def test_round_trip(entries):
    buf, _ = encode_all(entries)
    decoded, valid = read_entries(buf)
    assert valid == len(buf)
    assert [(e.stream_id, e.base_offset, bytes(e.batch)) for e in decoded] == entries
    assert classify_stop(buf, valid) is Stop.END


@settings(max_examples=300, deadline=None)
@given(entries=ENTRIES.filter(bool), data=st.data())
def test_any_truncation_gives_the_whole_entries_before_the_cut(entries, data):
    buf, ends = encode_all(entries)
    cut = data.draw(st.integers(min_value=0, max_value=len(buf)))
    decoded, valid = read_entries(buf[:cut])
    whole = [end for end in ends if end <= cut]
    assert valid == (whole[-1] if whole else 0)
    assert [(e.stream_id, e.base_offset, bytes(e.batch)) for e in decoded] == entries[: len(whole)]
    assert classify_stop(buf[:cut], valid) is (Stop.END if cut == valid else Stop.TORN)


@settings(max_examples=150, deadline=None)
@given(
    entries=ENTRIES,
    tail=st.binary(max_size=60),
    chunk=st.integers(min_value=1, max_value=600),
)
def test_scanning_a_file_in_chunks_matches_reading_it_whole(entries, tail, chunk):
    buf, _ = encode_all(entries)
    fs = MemoryFilesystem()
    fs.make_dirs("/w")
    file = fs.open("/w/segment", "create")
    file.write([buf + tail])
    expected, expected_valid = read_entries(buf + tail)
    valid, stop, count = scan_segment(file, 1000, len(buf) + len(tail), chunk, count_after=0)
    assert valid == expected_valid
    assert count == len(expected)
    assert stop is classify_stop(buf + tail, expected_valid)
