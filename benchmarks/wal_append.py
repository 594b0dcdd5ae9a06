"""WAL append benchmark: latency and group commit on the local disk.

    .venv/bin/python -m benchmarks.wal_append [--concurrency 1 16 64 256]
        [--batch-bytes 1024 16384] [--seconds 3] [--dir DIR] [--uvloop] [--json out.json]

For each (concurrency, batch size): that many tasks each append a batch, await the ack,
and append the next, for `--seconds`; a trimmer trims to the durable end every 50 ms (as
the uploader will), so the capacity bound never throttles. Reported per row: acknowledged
appends per second, MB/s, appends per fsync (the group-commit factor), and the append
latency percentiles (from the call to the acknowledgement). The first line gives the raw
`write + fdatasync` latency of the same directory, for scale: no WAL is faster than that.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from proxy.wal import WalConfig, WriteAheadLog


def percentile(sorted_values: list[float], fraction: float) -> float:
    if not sorted_values:
        return float("nan")
    index = min(len(sorted_values) - 1, int(fraction * len(sorted_values)))
    return sorted_values[index]


def raw_fsync_latency(directory: str, count: int = 200) -> tuple[float, float]:
    path = os.path.join(directory, "raw-fsync-probe")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    samples = []
    try:
        for _ in range(count):
            start = time.perf_counter()
            os.write(fd, b"x" * 4096)
            os.fdatasync(fd)
            samples.append(time.perf_counter() - start)
    finally:
        os.close(fd)
        os.unlink(path)
    samples.sort()
    return percentile(samples, 0.5), percentile(samples, 0.99)


async def run_case(directory: str, concurrency: int, batch_bytes: int, seconds: float) -> dict:
    case_dir = tempfile.mkdtemp(prefix=f"c{concurrency}-b{batch_bytes}-", dir=directory)
    config = WalConfig(case_dir, segment_bytes=64 << 20, capacity_bytes=4 << 30)
    latencies: list[float] = []
    batch = os.urandom(batch_bytes)
    wal = await WriteAheadLog.open(config)
    deadline = time.perf_counter() + seconds

    async def writer(stream_id: int) -> None:
        offset = 0
        while time.perf_counter() < deadline:
            start = time.perf_counter()
            await wal.append(stream_id, offset, batch)
            latencies.append(time.perf_counter() - start)
            offset += 1

    async def trimmer() -> None:
        while time.perf_counter() < deadline:
            await asyncio.sleep(0.05)
            await wal.trim_to(wal.durable_end)

    started = time.perf_counter()
    await asyncio.gather(trimmer(), *(writer(w) for w in range(concurrency)))
    elapsed = time.perf_counter() - started
    stats = wal.stats
    await wal.close()
    shutil.rmtree(case_dir, ignore_errors=True)
    latencies.sort()
    return {
        "concurrency": concurrency,
        "batch_bytes": batch_bytes,
        "appends": stats.appends,
        "fsyncs": stats.fsyncs,
        "appends_per_s": stats.appends / elapsed,
        "mb_per_s": stats.bytes_appended / elapsed / 1e6,
        "appends_per_fsync": stats.appends / max(1, stats.fsyncs),
        "largest_group": stats.largest_group,
        "p50_ms": percentile(latencies, 0.5) * 1e3,
        "p99_ms": percentile(latencies, 0.99) * 1e3,
        "p999_ms": percentile(latencies, 0.999) * 1e3,
        "mean_ms": statistics.fmean(latencies) * 1e3 if latencies else float("nan"),
        "throttled_s": stats.throttled_seconds,
    }


def render(rows: list[dict]) -> str:
    header = (
        "| concurrency | batch B | appends/s | MB/s | appends/fsync | largest group "
        "| p50 ms | p99 ms | p99.9 ms |"
    )
    lines = [header, "|" + "---|" * 9]
    for r in rows:
        lines.append(
            f"| {r['concurrency']} | {r['batch_bytes']} | {r['appends_per_s']:,.0f} "
            f"| {r['mb_per_s']:.1f} | {r['appends_per_fsync']:.1f} | {r['largest_group']} "
            f"| {r['p50_ms']:.2f} | {r['p99_ms']:.2f} | {r['p999_ms']:.2f} |"
        )
    return "\n".join(lines)


async def main(args: argparse.Namespace) -> tuple[float, list[dict]]:
    directory = args.dir or tempfile.mkdtemp(prefix="wal-bench-")
    os.makedirs(directory, exist_ok=True)
    p50, p99 = raw_fsync_latency(directory)
    print(f"directory: {directory} (python {sys.version.split()[0]}, uvloop={args.uvloop})")
    print(f"raw write(4 KiB) + fdatasync: p50 {p50 * 1e3:.2f} ms, p99 {p99 * 1e3:.2f} ms\n")
    rows = []
    for batch_bytes in args.batch_bytes:
        for concurrency in args.concurrency:
            rows.append(await run_case(directory, concurrency, batch_bytes, args.seconds))
    print(render(rows))
    if not args.dir:
        shutil.rmtree(directory, ignore_errors=True)
    return p50, rows


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16, 64, 256])
    parser.add_argument("--batch-bytes", type=int, nargs="+", default=[1024, 16384])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--dir", help="where to write (default: a new temporary directory)")
    parser.add_argument("--uvloop", action="store_true")
    parser.add_argument("--json", help="also write the numbers to this file")
    arguments = parser.parse_args()
    if arguments.uvloop:
        import uvloop

        uvloop.install()
    raw_p50, results = asyncio.run(main(arguments))
    if arguments.json:
        report = {"raw_fsync_p50_s": raw_p50, "rows": results}
        Path(arguments.json).write_text(json.dumps(report, indent=2))
