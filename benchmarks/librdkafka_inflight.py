"""Produce requests in flight, from librdkafka's `debug=protocol,msg` log.

    .venv/bin/python -m benchmarks.tiered ... --client-config debug=protocol,msg 2> rd.log
    .venv/bin/python -m benchmarks.librdkafka_inflight rd.log [instance, e.g. producer-11]

Per producer instance and broker connection: Produce requests, their mean size, the most
in flight at once and the share of time at each count, the round trip (librdkafka's
`rtt`) and the MB/s the connection carried; per partition (the `Produce MessageSet ...
[p]` line before each `Sent ProduceRequest` names it): the most requests in flight at
once, and how soon after an answer the partition's next request went. This is how
docs/benchmarks.md ("S3 notify and librdkafka") shows that librdkafka keeps one request
per partition in flight.
"""

from __future__ import annotations

import collections
import re
import statistics
import sys

LINE = re.compile(r"^%7\|([\d.]+)\|(SEND|RECV|PRODUCE)\|([^|]+)\| \[thrd:([^\]]+)\]: (.*)$")


def main(path: str, only: str = "") -> None:
    conns: dict[tuple[str, str], list] = collections.defaultdict(list)
    partition_of: dict[tuple[str, str, int], str] = {}  # (instance, thread, corr id)
    last_set: dict[tuple[str, str], str] = {}
    with open(path, errors="replace") as lines:
        for line in lines:
            m = LINE.match(line.strip())
            if not m or only not in m[3]:
                continue
            t, kind, inst, thread, msg = float(m[1]), m[2], m[3], m[4], m[5]
            conn = (inst, thread)
            if kind == "PRODUCE" and "Produce MessageSet" in msg:
                found = re.search(r"\[(\d+)\]: Produce MessageSet", msg)
                if found:
                    last_set[conn] = found[1]
            elif kind == "SEND" and "Sent ProduceRequest" in msg:
                size = int(re.search(r"\(v\d+, (\d+) bytes", msg)[1])  # type: ignore[index]
                corr = int(re.search(r"CorrId (\d+)", msg)[1])  # type: ignore[index]
                partition_of[(inst, thread, corr)] = last_set.get(conn, "?")
                conns[conn].append((t, 1, size, None, partition_of[(inst, thread, corr)]))
            elif kind == "RECV" and "ProduceResponse" in msg:
                rtt = float(re.search(r"rtt ([\d.]+)ms", msg)[1])  # type: ignore[index]
                corr = int(re.search(r"CorrId (\d+)", msg)[1])  # type: ignore[index]
                conns[conn].append((t, -1, 0, rtt, partition_of.get((inst, thread, corr), "?")))
    for (inst, thread), events in sorted(conns.items()):
        if not any(e[1] == 1 for e in events):
            continue
        current = peak = 0
        at_count: collections.Counter = collections.Counter()
        per_part: collections.Counter = collections.Counter()
        part_peak: collections.Counter = collections.Counter()
        answered: dict[str, float] = {}
        next_after: list[float] = []
        last, sizes, rtts = events[0][0], [], []
        for t, step, size, rtt, part in events:
            at_count[current] += t - last
            last, current = t, current + step
            peak = max(peak, current)
            per_part[part] += step
            part_peak[part] = max(part_peak[part], per_part[part])
            if step == 1:
                sizes.append(size)
                if part in answered:
                    next_after.append((t - answered[part]) * 1000)
            else:
                rtts.append(rtt)
                answered[part] = t
        span = (events[-1][0] - events[0][0]) or 1.0
        share = ", ".join(f"{k}: {v / span:.0%}" for k, v in sorted(at_count.items()))
        rtts.sort()
        next_after.sort()
        parts = ", ".join(f"{p}: {n}" for p, n in sorted(part_peak.items()))
        print(
            f"{inst.split('#')[-1]} {thread.split(']')[0]}: {len(sizes)} requests, mean "
            f"{statistics.fmean(sizes) / 1e6:.2f} MB, most in flight {peak} (time at each "
            f"count {share}), rtt p50 {rtts[len(rtts) // 2]:.0f} ms p99 "
            f"{rtts[int(len(rtts) * 0.99)]:.0f} ms, {sum(sizes) / span / 2**20:.1f} MB/s over "
            f"{span:.1f} s; most in flight per partition {{{parts}}}; next request of a "
            f"partition after its answer p50 "
            f"{next_after[len(next_after) // 2] if next_after else 0:.0f} ms"
        )


if __name__ == "__main__":
    main(*sys.argv[1:3])
