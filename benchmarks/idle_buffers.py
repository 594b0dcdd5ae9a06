"""Idle-buffer benchmark: the memory of connections that carried one large frame each and
then went quiet, with the frame reader's idle shrink (proxy/server/frame_reader.py) and
without it, in one run.

Each of `--connections` loopback connections, one after another, receives a frame of
`--frame-kib` through a `FrameProtocol` of the default capacity (1 MiB), as a proxy's
client side receives a large Produce; its reader then waits for the next frame, idle.
One child process per setting (RSS is a process's): the shrink after `--idle-s`, and
never. Reported: the process's peak RSS (VmHWM), its RSS once everything idled for three
times `--idle-s`, and the bytes the readers' buffers hold then (`held_bytes`).

    .venv/bin/python -m benchmarks.idle_buffers --json idle.json

No proxy, Kafka or MinIO: the readers and the allocator only, so the figures are the
buffers' and what glibc makes of freeing them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

from benchmarks.common.procs import machine_description
from benchmarks.common.run import git_state, run_facts, write_json
from proxy.kafka.frames import FRAME_SIZE
from proxy.server.frame_reader import FrameProtocol

CAPACITY = 1 << 20  # limits.buffer_bytes' default
NEVER = 1e9


def _status_mib(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


async def _child(connections: int, frame_kib: int, idle_s: float, settle_s: float) -> dict:
    loop = asyncio.get_running_loop()
    frame = FRAME_SIZE.pack(frame_kib * 1024) + bytes(frame_kib * 1024)
    start = _status_mib("VmRSS")
    readers, peers, waits = [], [], []
    for _ in range(connections):
        ours, theirs = socket.socketpair()
        theirs.setblocking(False)
        _, protocol = await loop.create_connection(
            lambda: FrameProtocol(CAPACITY, idle_shrink_s=idle_s), sock=ours
        )
        sent = asyncio.ensure_future(loop.sock_sendall(theirs, frame))
        await protocol.reader.read_frame(lambda size: None)
        await sent
        waits.append(asyncio.ensure_future(protocol.reader.read_frame(lambda size: None)))
        readers.append(protocol.reader)
        peers.append(theirs)
    await asyncio.sleep(settle_s)  # the idle time itself is what is measured
    result = {
        "RSS at the start, MiB": start,
        "peak RSS, MiB": _status_mib("VmHWM"),
        "RSS once idle, MiB": _status_mib("VmRSS"),
        "buffers held once idle, MiB": sum(r.held_bytes for r in readers) / 2**20,
    }
    for wait in waits:
        wait.cancel()
    for peer in peers:
        peer.close()
    return result


def _run_child(args: argparse.Namespace, idle_s: float) -> dict:
    command = [
        sys.executable, "-m", "benchmarks.idle_buffers", "--child", str(idle_s),
        "--connections", str(args.connections), "--frame-kib", str(args.frame_kib),
        "--idle-s", str(args.idle_s),
    ]  # fmt: skip
    out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--connections", type=int, default=300)
    parser.add_argument("--frame-kib", type=int, default=900)
    parser.add_argument("--idle-s", type=float, default=0.5, help="the shrink's idle time")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--child", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        import uvloop

        settle = 3 * args.idle_s
        print(json.dumps(uvloop.run(_child(args.connections, args.frame_kib, args.child, settle))))
        return 0
    facts = run_facts(args, git_state(), machine_description(), minio=False)
    load = os.getloadavg()
    results = {
        f"shrink after {args.idle_s:g} s idle": _run_child(args, args.idle_s),
        "never shrink": _run_child(args, NEVER),
    }
    print(f"- proxy code at {facts['proxy_code']}; {facts['date']}; load {load[0]:.2f}")
    print(
        f"- {args.connections} connections, one after another, each received one frame of "
        f"{args.frame_kib} KiB and then waited, idle; capacity {CAPACITY >> 10} KiB\n"
    )
    names = list(results)
    print("| | " + " | ".join(names) + " |")
    print("| --- |" + " ---: |" * len(names))
    for figure in results[names[0]]:
        print(f"| {figure} | " + " | ".join(f"{results[n][figure]:.1f}" for n in names) + " |")
    write_json(args.json, {**facts, "load": load, "results": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
