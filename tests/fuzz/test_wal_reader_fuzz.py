"""Garbage in, a clean stop out: the WAL reader never raises, whatever the bytes.

Random bytes, and valid WAL data with bytes flipped, inserted, removed or overwritten.
Whatever `read_entries` accepts must re-encode to exactly the bytes it claims are valid.
"""

from __future__ import annotations

import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.wal.entry import Stop, classify_stop, encode_entry, read_entries
from proxy.wal.memfs import MemoryFilesystem
from proxy.wal.segments import recover, segment_name
from proxy.wal.types import WalCorruptError

FUZZ = settings(
    max_examples=400,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def check_reader(buf: bytes) -> None:
    entries, valid = read_entries(buf)
    assert 0 <= valid <= len(buf)
    reencoded = b"".join(encode_entry(e.stream_id, e.base_offset, e.batch) for e in entries)
    assert reencoded == bytes(buf[:valid])
    stop = classify_stop(buf, valid)
    assert isinstance(stop, Stop)
    assert (stop is Stop.END) == (valid == len(buf))


def valid_wal(rng: random.Random, count: int) -> bytes:
    return b"".join(
        encode_entry(rng.randrange(-5, 5), rng.randrange(1 << 40), rng.randbytes(rng.randrange(80)))
        for _ in range(count)
    )


@FUZZ
@given(st.binary(max_size=2000))
def test_random_bytes(buf):
    check_reader(buf)


@FUZZ
@given(seed=st.integers(min_value=0, max_value=2**32), count=st.integers(min_value=1, max_value=8))
def test_mutated_wal_data(seed, count):
    rng = random.Random(seed)
    buf = bytearray(valid_wal(rng, count))
    for _ in range(rng.randrange(1, 6)):
        where = rng.randrange(len(buf) + 1)
        match rng.randrange(5):
            case 0 if buf:  # flip a bit
                index = min(where, len(buf) - 1)
                buf[index] ^= 1 << rng.randrange(8)
            case 1:  # insert garbage
                buf[where:where] = rng.randbytes(rng.randrange(1, 30))
            case 2:  # remove a run
                del buf[where : where + rng.randrange(1, 30)]
            case 3:  # overwrite a length field-sized run with an extreme value
                buf[where : where + 4] = rng.choice([b"\xff\xff\xff\xff", b"\x00\x00\x00\x00"])
            case _:  # zeros, as an unwritten page reads
                buf[where : where + rng.randrange(1, 64)] = bytes(rng.randrange(1, 64))
    check_reader(bytes(buf))


@FUZZ
@given(seed=st.integers(min_value=0, max_value=2**32))
def test_recovery_of_a_damaged_last_segment_keeps_the_good_prefix(seed):
    rng = random.Random(seed)
    good = valid_wal(rng, rng.randrange(0, 6))
    damage = rng.randbytes(rng.randrange(1, 200))
    fs = MemoryFilesystem()
    fs.make_dirs("/w")
    path = f"/w/{segment_name(0)}"
    fs.open(path, "create").close()
    fs.append_bytes(path, good + damage)
    fs.fsync_dir("/w")
    try:
        found = recover(fs, "/w")
    except WalCorruptError as exc:  # only a refusal to cut a "newer format" entry
        assert "newer" in str(exc), exc
        return
    kept = fs.file_bytes(path)
    assert kept.startswith(good)
    assert found.truncated_bytes == len(good) + len(damage) - len(kept)
    check_reader(kept)
    assert read_entries(kept)[1] == len(kept)
