"""Block-cache benchmark: catch-up reads of stream objects from MinIO through one cold
block cache, object format version 2 against version 3 on the same records, in one run.

Why a benchmark of its own: tiered_read's catch-up figures depend on the stream objects
compaction happened to make during its write (their sizes move between runs of one
commit, and with them the GETs per GB) and on six consumers, a proxy, Kafka and MinIO
sharing the machine. Here a seeded RNG lays out the same streams of the same objects in
each format, and the proxy's own `StreamReader` and `BlockCache` read them the way a
fetch does (1 MiB per read, each reader its own stream, `reader_id` per stream): the
GETs per GB compare the formats, or two commits run on the same seed, not two runs.

    .venv/bin/python -m benchmarks.block_cache --json cache.json

The readers read as fast as the cache serves them, all in this one process: MB/s is the
cache's and MinIO's, without a consumer, a proxy connection or Kafka.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import struct
import tempfile
import time
from pathlib import Path
from uuid import UUID

import crc32c

from benchmarks.common.procs import machine_description
from benchmarks.common.run import git_state, publish, run_facts, run_main, stop_on_signals
from proxy.devstack import MinioServer
from proxy.metadata.codec import encode
from proxy.metadata.records import ObjectCommit, OffsetRange, ShardClaim, StreamCutover
from proxy.metadata.state import MetadataState
from proxy.metadata.streams import stream_id
from proxy.objects.format_writer import ObjectWriter
from proxy.objects.keys import ObjectKind
from proxy.objects.s3 import S3Store
from proxy.reads.blockcache import BlockCache
from proxy.reads.stream_reader import StreamReader
from proxy.records.batches import set_base_offset

MiB = 1 << 20
GB = 10**9
TOPIC = UUID("5a1c0de5-0000-4000-8000-00000000b10c")
NOW_MS = 1_700_000_000_000
BATCH_PAYLOAD = 256 * 1024  # bytes of records per batch, opaque: a producer's 256 KiB batch
BATCH_RECORDS = 256


def template_batch() -> bytes:
    """A v2 record batch of BATCH_RECORDS opaque records (the reader reads batch headers
    only), base offset 0: its CRC does not cover the base offset, so copies of it are
    given their offsets in place."""
    body = struct.pack(">hiqqqhii", 0, BATCH_RECORDS - 1, NOW_MS, NOW_MS, -1, -1, -1, BATCH_RECORDS)
    body += random.Random(0).randbytes(BATCH_PAYLOAD)
    return struct.pack(">qiibI", 0, 9 + len(body), 0, 2, crc32c.crc32c(body)) + body


class Layout:
    """Streams of stream objects in one format, committed to a metadata state."""

    def __init__(self, version: int, first_id: int) -> None:
        self.version = version
        self.state = MetadataState(0, 1)
        self.ends: dict[int, int] = {}
        self.sizes: list[int] = []
        self._next_id = first_id
        self._write(ShardClaim(0, 1, "bench", NOW_MS))

    def _write(self, record: object) -> None:
        key, value = encode(record)
        verdict = self.state.apply(key, value, self.state.next_offset)
        assert verdict.accepted, verdict.reason

    async def put(self, store: S3Store, sizes: dict[int, list[int]]) -> None:
        """Per partition, one stream object of each size (bytes of batches)."""
        batch = template_batch()
        for partition, objects in sizes.items():
            stream = stream_id(TOPIC, partition)
            self._write(StreamCutover(0, stream, 1, 1, TOPIC, partition, 0, 0, 0, NOW_MS))
            self.ends[stream] = 0
            for size in objects:
                count = max(1, size // len(batch))
                records = bytearray(batch * count)
                start = self.ends[stream]
                for n in range(count):
                    set_base_offset(records, n * len(batch), start + n * BATCH_RECORDS)
                writer = ObjectWriter(self._next_id, ObjectKind.STREAM, version=self.version)
                self._next_id += 1
                writer.add_batches(stream, records, max_block_bytes=MiB, validate=False)
                built = writer.build()
                await store.put(built.key, built.pieces)
                end = start + count * BATCH_RECORDS
                self.ends[stream] = end
                self.sizes.append(built.size)
                ranges = (OffsetRange(stream, start, end),)
                self._write(
                    ObjectCommit(
                        0, built.footer.object_id, ObjectKind.STREAM, built.size, 1, NOW_MS, ranges
                    )
                )


async def read_streams(
    layout: Layout, store: S3Store, streams: list[int], cache_bytes: int, fetch_bytes: int
) -> dict[str, float]:
    """Each stream read from offset 0 to its end by a reader of its own, all at once,
    through one cold cache: that cache's counts and the wall time."""
    cache = BlockCache(store, capacity_bytes=cache_bytes)
    reader = StreamReader(cache)
    read = 0

    async def catch_up(stream: int) -> None:
        nonlocal read
        offset = 0
        while offset < layout.ends[stream]:
            got = await reader.read(layout.state, stream, offset, fetch_bytes, reader_id=stream)
            read += got.size
            offset = got.next_offset

    started = time.perf_counter()
    try:
        await asyncio.gather(*(catch_up(s) for s in streams))
    finally:
        wall = time.perf_counter() - started
        await cache.close()
    gb = read / GB
    return {
        "read_bytes": read,
        "seconds": wall,
        "MB/s": read / MiB / wall,
        "GETs per GB": cache.gets / gb,
        "index GETs per GB": cache.index_gets / gb,
        "bytes fetched per byte read": cache.bytes_fetched / read,
        "blocks with an index read of the first window": getattr(cache, "head_blocks", 0),
        "blocks with an index read of the tail": cache.tail_blocks,
        "evictions": cache.evictions,
    }


async def run(args: argparse.Namespace, minio: MinioServer) -> dict:
    rng = random.Random(args.seed)
    sizes = {
        p: [rng.randint(args.min_mb, args.max_mb) * MiB for _ in range(args.objects)]
        for p in range(args.streams)
    }
    store = await S3Store.open(minio.s3_config())
    try:
        layouts = [Layout(v, first_id=1 + 100_000 * n) for n, v in enumerate(args.versions)]
        for layout in layouts:
            await layout.put(store, sizes)
        results: list[dict] = []
        for readers in args.readers:
            for repeat in range(args.repeats):
                order = layouts if repeat % 2 == 0 else layouts[::-1]
                for layout in order:
                    streams = [stream_id(TOPIC, p) for p in range(readers)]
                    figures = await read_streams(
                        layout, store, streams, args.cache_bytes, args.fetch_bytes
                    )
                    results.append(
                        {"version": layout.version, "readers": readers, "repeat": repeat} | figures
                    )
                    print(f"version {layout.version}, {readers} readers: {figures}", flush=True)
        return {"sizes": [lay.sizes for lay in layouts], "results": results}
    finally:
        await store.close()


def report(results: list[dict], args: argparse.Namespace) -> tuple[dict, str]:
    rows = [
        "MB/s",
        "GETs per GB",
        "index GETs per GB",
        "bytes fetched per byte read",
        "blocks with an index read of the first window",
        "blocks with an index read of the tail",
        "evictions",
    ]
    summary: dict = {}
    lines = []
    for readers in args.readers:
        head = f"| {readers} reader(s), cold cache of {args.cache_bytes // MiB} MiB |"
        lines += ["", head + "".join(f" version {v} |" for v in args.versions)]
        lines.append("| --- |" + " ---: |" * len(args.versions))
        for row in rows:
            cells = []
            for version in args.versions:
                values = [
                    r[row] for r in results if r["readers"] == readers and r["version"] == version
                ]
                mean = sum(values) / len(values)
                summary[f"{readers} readers, version {version}: {row}"] = mean
                spread = f" ({min(values):.3g}-{max(values):.3g})" if len(values) > 1 else ""
                cells.append(f" {mean:.3g}{spread} |")
            lines.append(f"| {row} |" + "".join(cells))
    return summary, "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=6, help="streams (partitions) laid out")
    parser.add_argument("--objects", type=int, default=6, help="stream objects per stream")
    parser.add_argument("--min-mb", type=int, default=40, help="smallest object, MiB")
    parser.add_argument("--max-mb", type=int, default=64, help="largest object, MiB")
    parser.add_argument("--versions", default="2,3", help="object format versions to compare")
    parser.add_argument("--readers", default="1,6", help="concurrent readers, each list entry")
    parser.add_argument("--repeats", type=int, default=3, help="reads of each, alternating")
    parser.add_argument("--cache-bytes", type=int, default=256 * MiB, help="the block cache's")
    parser.add_argument("--fetch-bytes", type=int, default=MiB, help="bytes per read")
    parser.add_argument("--seed", type=int, default=31)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    args.versions = [int(v) for v in args.versions.split(",")]
    args.readers = [int(n) for n in args.readers.split(",")]
    if max(args.readers) > args.streams:
        parser.error("more readers than streams")
    stop_on_signals()
    facts = run_facts(args, git_state(), machine_description(), minio=True)
    with tempfile.TemporaryDirectory(prefix="tierproxy-bench-cache-") as work:
        with MinioServer(base_dir=Path(work) / "minio", name="minio-cache") as minio:
            with open("/proc/loadavg") as f:
                facts["load_at_start"] = f.read().split()[:3]
            measured = asyncio.run(run(args, minio))
            with open("/proc/loadavg") as f:
                facts["load_at_end"] = f.read().split()[:3]
    summary, table = report(measured["results"], args)
    sizes = measured["sizes"][0]
    intro = [
        f"- proxy code at {facts['proxy_code']}; {facts['date']}; load {facts['load_at_start']}"
        f" at the start, {facts['load_at_end']} at the end",
        f"- {args.streams} streams of {args.objects} stream objects each, {len(sizes)} in all:"
        f" {min(sizes) / MiB:.0f}-{max(sizes) / MiB:.0f} MiB (seed {args.seed}), blocks of"
        f" 1 MiB; each reader reads one stream from offset 0, {args.fetch_bytes} bytes a read",
    ]
    return publish(facts, summary, "\n".join(intro) + "\n" + table, args.json, **measured)


if __name__ == "__main__":
    run_main(main)
