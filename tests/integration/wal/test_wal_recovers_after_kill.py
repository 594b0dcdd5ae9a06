"""kill -9 a process appending to a real WAL on the local disk, then recover it here:
every acknowledged entry is there, byte for byte, in order, and the torn tail is cut.

The child (`wal_appender.py`, run by this venv's python) prints each acknowledged
position and each completed trim. SIGKILL does not lose the page cache, so a torn tail
only appears when the kill lands inside a large writev; half the runs also add one, as a
power loss leaves it (a prefix of a valid entry), so that the cut is always exercised.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from proxy.wal import WalConfig, WriteAheadLog
from proxy.wal.entry import encode_entry
from proxy.wal.fs import OsFilesystem
from proxy.wal.segments import scan_segment

CHILD = Path(__file__).with_name("wal_appender.py")
MAX_BATCH = 64 * 1024
SEGMENT_BYTES = 1 << 20
MIN_ACKS = 50  # the kill delays count from the 50th acknowledgement


def expected_batch(stream_id: int, base_offset: int) -> bytes:
    # the child's rule (wal_appender.expected_batch); test files do not import each other
    import random

    rng = random.Random(stream_id * 1_000_003 + base_offset)
    return rng.randbytes(rng.randrange(1, MAX_BATCH))


def run_and_kill(directory: Path, delay: float, first_stream: int) -> list[str]:
    child = subprocess.Popen(
        [
            sys.executable,
            str(CHILD),
            str(directory),
            f"--first-stream={first_stream}",
            f"--max-batch={MAX_BATCH}",
            f"--segment-bytes={SEGMENT_BYTES}",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: list[str] = []
    started = threading.Event()
    acks = [0]

    def drain() -> None:  # keep the pipe empty, so the child never waits on it
        assert child.stdout is not None
        for line in child.stdout:
            lines.append(line)
            acks[0] += line.startswith("A ")
            if acks[0] >= MIN_ACKS:  # running under load, not just started
                started.set()

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    try:
        assert started.wait(15), child.stderr.read() if child.poll() is not None else "no acks"
        time.sleep(delay)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(10)
        reader.join(10)
        child.stdout.close()
        child.stderr.close()
    assert child.returncode == -signal.SIGKILL
    # a line cut by the kill has no newline: it was not fully acknowledged to us
    return [line for line in lines if line.endswith("\n")]


def add_torn_tail(directory: Path) -> bytes:
    """What a power loss mid-write leaves: the first bytes of an entry."""
    torn = encode_entry(99, 0, b"never acknowledged" * 10)[:57]
    with sorted(directory.glob("*.wal"))[-1].open("ab") as f:
        f.write(torn)
    return torn


@pytest.mark.parametrize(
    ("delays", "torn_tails"),
    [((0.2,), False), ((0.5,), True), ((0.9,), False), ((0.3, 0.6), True)],
    ids=["0.2s", "0.5s+tail", "0.9s", "0.3s+tail,0.6s+tail"],
)
async def test_wal_recovers_after_kill(tmp_path, delays, torn_tails):
    directory = tmp_path / "wal"
    acked = {}
    last_trim = 0
    injected = b""
    for life, delay in enumerate(delays):
        lines = await asyncio.to_thread(run_and_kill, directory, delay, 1000 * life)
        for line in lines:
            kind, *fields = line.split()
            if kind == "A":
                stream_id, base_offset, start, end = map(int, fields)
                acked[(start, end)] = (stream_id, base_offset)
            elif kind == "T":
                last_trim = int(fields[0])
            elif kind == "R" and life > 0:
                # the child's own recovery cut the tail the previous life left
                assert int(fields[1]) >= len(injected)
        assert len(acked) >= MIN_ACKS
        if torn_tails:
            injected = add_torn_tail(directory)
    size_before = sorted(directory.glob("*.wal"))[-1].stat().st_size

    config = WalConfig(str(directory), segment_bytes=SEGMENT_BYTES, capacity_bytes=1 << 30)
    async with await WriteAheadLog.open(config) as wal:
        recovery = wal.recovery
        replayed = [e async for e in wal.replay()]

        # the torn tail was cut, and only it: the last segment is now whole entries
        assert recovery.truncated_bytes >= len(injected)
        last = recovery.segments[-1]
        assert size_before - last.size == recovery.truncated_bytes
        file = OsFilesystem().open(last.path, "read")
        try:
            valid, _, _ = scan_segment(file, last.base, file.size(), 1 << 20, 0)
            assert valid == file.size() == last.size
        finally:
            file.close()

        # trims the child saw complete hold (the checkpoint survives a kill)
        assert recovery.trimmed_to >= last_trim

        # every acknowledged entry not trimmed is there, where it was acknowledged, intact
        by_position = {(e.position.start, e.position.end): e for e in replayed}
        wanted = {pos: ids for pos, ids in acked.items() if pos[1] > recovery.trimmed_to}
        assert wanted, "the child trimmed everything it wrote"
        for pos, (stream_id, base_offset) in wanted.items():
            entry = by_position.get(pos)
            assert entry is not None, f"acknowledged entry {stream_id}/{base_offset} at {pos} lost"
            assert (entry.stream_id, entry.base_offset) == (stream_id, base_offset)
            assert bytes(entry.batch) == expected_batch(stream_id, base_offset)

        # in order: contiguous positions, and each stream's offsets without gaps
        starts = [e.position.start for e in replayed]
        assert starts == sorted(starts)
        for before, after in zip(replayed, replayed[1:], strict=False):
            assert after.position.start == before.position.end
        streams: dict[int, list[int]] = {}
        for entry in replayed:
            streams.setdefault(entry.stream_id, []).append(entry.base_offset)
        for offsets in streams.values():
            assert offsets == list(range(offsets[0], offsets[0] + len(offsets)))

        # and it takes appends again, after what it recovered
        position = await wal.append(0, 10**9, b"after the crash")
        assert position.start == recovery.end
    print(
        f"killed after {delays}s: {len(acked)} acked, {len(replayed)} replayed, "
        f"{len(recovery.segments)} segments, cut {recovery.truncated_bytes} bytes "
        f"({recovery.truncated_bytes - len(injected)} torn by the kill)"
    )
