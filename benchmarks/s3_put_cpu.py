"""S3 PUT CPU benchmark: what one PutObject costs the proxy's process and MinIO, by how the
body is checked.

One MinIO (http on loopback, as in every benchmark here), one asyncio process putting
objects of `--size` bytes one after another, `--puts` per variant and round, the variants
alternating within each round:

- `botocore`: the client as botocore sets it up by default, no checksum of ours: it
  computes a CRC-32 of the body itself and, over http, a SHA-256 for the signature (what
  `S3Store` did before it sent its own checksum);
- `signed`: `S3Store` as configured by default over http (`sign_payload` unset): the body's
  CRC-32C computed with the crc32c package, and the SHA-256 signature;
- `unsigned`: `S3Store` with `sign_payload: false`: the CRC-32C only (what S3Store does
  over https by default, without TLS's own cost).

Per variant: this process's CPU (user + system) per PUT, MinIO's, and the wall time per
PUT; then the same objects read back, this process's CPU per GET (the same in each
variant: a control).

    .venv/bin/python -m benchmarks.s3_put_cpu --json s3put.json
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from pathlib import Path
from typing import Any

from aiobotocore.config import AioConfig
from aiobotocore.session import get_session

from benchmarks.common.procs import cpu_seconds, machine_description
from benchmarks.common.run import git_state, run_facts, run_main, write_json
from proxy.devstack import MinioServer
from proxy.objects.s3 import S3Store

VARIANTS = ("botocore", "signed", "unsigned")


def _process_cpu() -> float:
    times = os.times()
    return times.user + times.system


async def _botocore_put(server: MinioServer, keys: list[str], body: bytes) -> tuple[float, ...]:
    """(this process's CPU, MinIO's, wall) over the PUTs, after a warm-up PUT."""
    config = server.s3_config()
    client_config = AioConfig(
        retries={"mode": "standard", "total_max_attempts": 1}, s3={"addressing_style": "path"}
    )
    async with get_session().create_client(
        "s3", config=client_config, **server.client_kwargs()
    ) as client:
        await client.put_object(Bucket=config.bucket, Key=keys[0] + "-warm", Body=body)
        start = _sample(server)
        for key in keys:
            await client.put_object(Bucket=config.bucket, Key=key, Body=body)
        return _since(server, start)


async def _store_put(
    server: MinioServer, keys: list[str], body: bytes, sign: bool | None
) -> tuple[float, ...]:
    async with S3Store(server.s3_config(sign_payload=sign)) as store:
        await store.put(keys[0] + "-warm", memoryview(body))
        start = _sample(server)
        for key in keys:
            await store.put(key, memoryview(body))
        return _since(server, start)


def _sample(server: MinioServer) -> tuple[float, ...]:
    assert server.process.pid is not None
    return _process_cpu(), cpu_seconds(server.process.pid), time.perf_counter()


def _since(server: MinioServer, start: tuple[float, ...]) -> tuple[float, ...]:
    return tuple(b - a for a, b in zip(start, _sample(server), strict=True))


async def _variant(server: MinioServer, variant: str, keys: list[str], body: bytes) -> dict:
    if variant == "botocore":
        cpu, minio, wall = await _botocore_put(server, keys, body)
    else:
        sign = None if variant == "signed" else False
        cpu, minio, wall = await _store_put(server, keys, body, sign)
    n = len(keys)
    async with S3Store(server.s3_config()) as store:
        cpu0 = _process_cpu()
        for key in keys:
            if len(await store.get(key)) != len(body):
                raise AssertionError(f"{key}: short read")
        get_cpu = _process_cpu() - cpu0
        await store.delete([*keys, keys[0] + "-warm"])
    return {
        "variant": variant,
        "puts": n,
        "proxy_cpu_ms_per_put": cpu / n * 1000,
        "minio_cpu_ms_per_put": minio / n * 1000,
        "wall_ms_per_put": wall / n * 1000,
        "get_cpu_ms": get_cpu / len(keys) * 1000,
    }


async def _run(args: argparse.Namespace, server: MinioServer) -> list[dict]:
    rows = []
    body = os.urandom(args.size)
    for rnd in range(args.rounds):
        order = VARIANTS if rnd % 2 == 0 else tuple(reversed(VARIANTS))
        for variant in order:
            keys = [f"bench/{variant}-{rnd}-{i}" for i in range(args.puts)]
            row = await _variant(server, variant, keys, body) | {"round": rnd}
            row["load"] = os.getloadavg()[0]
            rows.append(row)
            print(
                f"r{rnd} {variant:9s} proxy {row['proxy_cpu_ms_per_put']:5.2f} ms CPU/PUT, "
                f"MinIO {row['minio_cpu_ms_per_put']:5.2f}, wall {row['wall_ms_per_put']:5.1f} ms; "
                f"GET {row['get_cpu_ms']:5.2f} ms CPU; load {row['load']:.1f}",
                flush=True,
            )
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=4 << 20, help="bytes per object")
    parser.add_argument("--puts", type=int, default=40, help="per variant and round")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    facts = run_facts(args, git_state(), machine_description(), minio=True)
    server = MinioServer(name="minio-s3put")
    server.start()
    try:
        rows = asyncio.run(_run(args, server))
    finally:
        server.stop()
    print(f"\nproxy code {facts['proxy_code']}; {facts['date']}; {args.size:,} B objects\n")
    print(
        "| variant | proxy CPU ms per PUT | MinIO CPU ms per PUT | wall ms per PUT | GET CPU ms |"
    )
    print("| --- | ---: | ---: | ---: | ---: |")
    for variant in VARIANTS:
        mine = [r for r in rows if r["variant"] == variant]

        def spread(key: str, rows: list[dict[str, Any]] = mine) -> str:
            values = [r[key] for r in rows]
            return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"

        print(
            f"| {variant} | {spread('proxy_cpu_ms_per_put')} | {spread('minio_cpu_ms_per_put')} "
            f"| {spread('wall_ms_per_put')} | {spread('get_cpu_ms')} |"
        )
    if args.json:
        write_json(args.json, {"run": facts, "rows": rows})
    return 0


if __name__ == "__main__":
    run_main(main)
