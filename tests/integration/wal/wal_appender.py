"""The process `test_wal_recovers_after_kill` kills: it appends to a WAL until it dies.

    python wal_appender.py DIR [--writers N] [--first-stream S] [--max-batch BYTES]
                               [--segment-bytes BYTES]

It first prints `R <recovered end> <bytes cut>`. Writer w appends batches to stream
S + w with base offsets 0, 1, 2, ..., one at a time, and prints
`A <stream> <base_offset> <start> <end>` once each append is acknowledged. Batch contents
and sizes follow from (stream, base offset) alone (`expected_batch`), so the test can
check every byte. A trimmer trims behind the writers, as an uploader would, and prints
`T <offset>` once each trim returned. Every line is flushed as it is printed.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from proxy.wal import WalConfig, WriteAheadLog  # noqa: E402


def expected_batch(stream_id: int, base_offset: int, max_batch: int) -> bytes:
    rng = random.Random(stream_id * 1_000_003 + base_offset)
    return rng.randbytes(rng.randrange(1, max_batch))


def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


async def writer(wal: WriteAheadLog, stream_id: int, max_batch: int) -> None:
    base_offset = 0
    while True:
        position = await wal.append(
            stream_id, base_offset, expected_batch(stream_id, base_offset, max_batch)
        )
        say(f"A {stream_id} {base_offset} {position.start} {position.end}")
        base_offset += 1


async def trimmer(wal: WriteAheadLog, lag_bytes: int) -> None:
    while True:
        await asyncio.sleep(0.05)
        target = wal.durable_end - lag_bytes
        if target > wal.trimmed_to:
            await wal.trim_to(target)  # mid-entry is allowed: replay keeps that entry
            say(f"T {target}")


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("directory")
    parser.add_argument("--writers", type=int, default=16)
    parser.add_argument("--first-stream", type=int, default=0)
    parser.add_argument("--max-batch", type=int, default=64 * 1024)
    parser.add_argument("--segment-bytes", type=int, default=1 << 20)
    args = parser.parse_args()
    config = WalConfig(
        args.directory, segment_bytes=args.segment_bytes, capacity_bytes=16 * args.segment_bytes
    )
    wal = await WriteAheadLog.open(config)
    say(f"R {wal.recovery.end} {wal.recovery.truncated_bytes}")
    await asyncio.gather(
        trimmer(wal, lag_bytes=2 * args.segment_bytes),
        *(writer(wal, args.first_stream + w, args.max_batch) for w in range(args.writers)),
    )


if __name__ == "__main__":
    asyncio.run(main())
