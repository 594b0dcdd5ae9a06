"""From measured phases to the Markdown report: direct vs proxy, targets, proxy resources.

Each figure is the mean over rounds, with the lowest and highest round in parentheses
when there are several. Nothing here measures; it only sums and divides what was.
"""

from __future__ import annotations

import argparse
from collections import defaultdict
from statistics import fmean

GIB = 1 << 30
MIB = 1 << 20
THROUGHPUT_TARGET = 0.90  # proxy MB/s at least this share of direct
ADDED_P99_TARGET_MS = 2.0
CLIENT_NAMES = {"java": "ProducerPerformance", "librdkafka": "librdkafka"}
CONSUMER_NAMES = {"java": "ConsumerPerformance", "librdkafka": "librdkafka"}


def _rows(args: argparse.Namespace) -> list[dict[str, str]]:
    """(metric, phase kind, result key, throughput|latency, client) of every table row."""
    rows = []
    for client in args.clients:
        producer, consumer = CLIENT_NAMES[client], CONSUMER_NAMES[client]
        specs = [(f"{producer} produce MB/s, full speed", "produce", "mb_per_s", "throughput")]
        for pct in ("p50", "p99", "p99.9"):
            paced = f"{producer} produce {pct} ms at {args.latency_rate} rec/s"
            specs.append((paced, "latency", pct, "latency"))
        for pct in ("p50", "p99", "p99.9"):
            full = f"{producer} produce {pct} ms at full speed (queueing)"
            specs.append((full, "produce", pct, "latency"))
        specs.append((f"{consumer} consume MB/s", "consume", "mb_per_s", "throughput"))
        keys = ("metric", "kind", "key", "type")
        rows += [dict(zip(keys, spec, strict=True), client=client) for spec in specs]
    return rows


def _value(result: dict, key: str) -> float:
    return float(result["mb_per_s"] if key == "mb_per_s" else result["latency_ms"][key])


def summarize(phases: list, args: argparse.Namespace) -> dict[str, object]:
    by_group: dict[tuple[str, str, str], list] = defaultdict(list)
    for phase in phases:
        by_group[(phase.kind, phase.client, phase.path)].append(phase)

    rows = []
    for spec in _rows(args):
        values = {
            path: [
                _value(p.result, spec["key"])
                for p in by_group[(spec["kind"], spec["client"], path)]
            ]
            for path in ("direct", "proxy")
        }
        if not values["direct"] or not values["proxy"]:
            continue
        direct, proxy = fmean(values["direct"]), fmean(values["proxy"])
        rows.append(
            spec
            | {
                "direct": values["direct"],
                "proxy": values["proxy"],
                "direct_mean": direct,
                "proxy_mean": proxy,
                "ratio": proxy / direct if direct else None,
                "added": proxy - direct,
            }
        )

    resources = []
    for (kind, client, path), group in sorted(by_group.items()):
        moved = sum(p.payload_bytes for p in group)
        wall = sum(p.wall_s for p in group)
        moving = sum(float(p.result["seconds"]) for p in group)  # without client start-up
        cpu = {who: sum(p.cpu_s[who] for p in group) for who in group[0].cpu_s}
        resources.append(
            {
                "kind": kind,
                "client": client,
                "path": path,
                "gib": moved / GIB,
                "wall_s": wall,
                "cpu_s": cpu,
                "proxy_cpu_s_per_gib": cpu["proxy"] / (moved / GIB),
                "brokers_cpu_s_per_gib": cpu["brokers"] / (moved / GIB),
                "proxy_cores": cpu["proxy"] / moving,
                "machine_busy_cores": fmean(p.machine_busy_cores for p in group),
                "proxy_wait_ms_per_slice": 1000
                * sum(p.proxy_sched["wait_s"] for p in group)
                / max(1, sum(p.proxy_sched["slices"] for p in group)),
            }
        )
    proxied = [p for p in phases if p.path == "proxy"]
    moved = sum(p.payload_bytes for p in proxied)
    overall = {
        "proxy_cpu_s": sum(p.cpu_s["proxy"] for p in proxied),
        "gib_through_proxy": moved / GIB,
    }
    overall["proxy_cpu_s_per_gib"] = overall["proxy_cpu_s"] / overall["gib_through_proxy"]
    overall["proxy_cpu_s_in_direct_phases"] = sum(
        p.cpu_s["proxy"] for p in phases if p.path == "direct"
    )
    return {"rows": rows, "resources": resources, "overall": overall}


# -- Markdown ----------------------------------------------------------------------------


def fmt(value: float) -> str:
    if abs(value) >= 100:
        return f"{value:.0f}"
    return f"{value:.1f}" if abs(value) >= 10 else f"{value:.2f}"


def cell(values: list[float]) -> str:
    mean = fmt(fmean(values))
    return mean if len(values) == 1 else f"{mean} ({fmt(min(values))}–{fmt(max(values))})"


def render_markdown(run: dict, summary: dict, profiles: dict, args: argparse.Namespace) -> str:
    m = run["machine"]
    out = [
        "### Run",
        "",
        f"- command: `{run['command']}`",
        f"- machine: {m['nproc']} cores ({m['cpu_model']}), {m['memory_gib']} GiB, "
        f"Linux {m['kernel']}, Python {m['python']}; load average at start "
        f"{', '.join(f'{x:.2f}' for x in m['loadavg_at_start'])}, at end "
        f"{', '.join(f'{x:.2f}' for x in m['loadavg_at_end'])}",
        f"- Kafka {run['kafka']} ({args.cluster_size} nodes, KRaft), topics of "
        f"{args.partitions} partitions, replication factor {min(3, args.cluster_size)}; "
        f"proxy code at {run['proxy_code']}",
        f"- {args.rounds} round(s); full-speed phases {args.records} records of "
        f"{args.record_size} B, paced phases {args.latency_records} records at "
        f"{args.latency_rate} rec/s; acks=all, idempotence on, client defaults otherwise",
        f"- total runtime {run['runtime_s']:.0f} s",
    ]
    if args.profile:
        out.append(
            "- **py-spy was sampling the proxy during its produce/consume phases: "
            "those proxy figures are slowed by it**"
        )
    out += [
        "",
        "Mean of the rounds (lowest–highest round). MB = 2^20 bytes of record values. "
        "ratio = proxy / direct; added = proxy − direct.",
        "",
        "| metric | direct | proxy | ratio | added |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for row in summary["rows"]:
        ratio = f"{row['ratio']:.2f}" if row["ratio"] is not None else "–"
        added = f"{row['added']:+.2f} ms" if row["type"] == "latency" else ""
        ratio = ratio if row["type"] == "throughput" else ""
        out.append(
            f"| {row['metric']} | {cell(row['direct'])} | {cell(row['proxy'])} "
            f"| {ratio} | {added} |"
        )

    out += ["", "#### Targets", ""]
    for row in summary["rows"]:
        if row["type"] == "throughput":
            ok = row["ratio"] is not None and row["ratio"] >= THROUGHPUT_TARGET
            out.append(
                f"- {row['metric']}: proxy at {row['ratio']:.0%} of direct "
                f"(target ≥ {THROUGHPUT_TARGET:.0%}): {'met' if ok else 'NOT met'}"
            )
        elif row["key"] == "p99" and row["kind"] == "latency":
            ok = row["added"] <= ADDED_P99_TARGET_MS
            out.append(
                f"- {row['metric']}: added {row['added']:+.2f} ms "
                f"(target ≤ {ADDED_P99_TARGET_MS:g} ms): {'met' if ok else 'NOT met'}"
            )

    overall = summary["overall"]
    rss = run["proxy_rss_bytes"]
    out += [
        "",
        "#### Proxy resources",
        "",
        f"- CPU: {overall['proxy_cpu_s']:.1f} s for {overall['gib_through_proxy']:.2f} GiB of "
        f"record values through it = **{overall['proxy_cpu_s_per_gib']:.1f} CPU s per GiB** "
        f"(all proxied phases); {overall['proxy_cpu_s_in_direct_phases']:.2f} s while idle "
        "in the direct phases",
        f"- memory: peak RSS (VmHWM) **{rss['peak'] / MIB:.0f} MiB**; RSS after start "
        f"{rss['after_start'] / MIB:.0f} MiB, at the end {rss['end'] / MIB:.0f} MiB",
        "",
        "proxy busy = proxy CPU s / transfer s. proxy CPU wait = time the proxy was runnable "
        "but had no CPU, per time it was scheduled (/proc/<pid>/task/*/schedstat): what "
        "the extra hop costs on a crowded machine, on top of the hop itself.",
        "",
        "| phase | path | GiB | proxy CPU s/GiB | proxy busy (cores) "
        "| proxy CPU wait (ms per slice) | brokers CPU s/GiB | machine busy (cores) |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in summary["resources"]:
        names = CONSUMER_NAMES if r["kind"] == "consume" else CLIENT_NAMES
        proxy_cells = (
            f"{r['proxy_cpu_s_per_gib']:.1f} | {r['proxy_cores']:.2f} "
            f"| {r['proxy_wait_ms_per_slice']:.2f}"
            if r["path"] == "proxy"
            else "– | – | –"
        )
        out.append(
            f"| {names[r['client']]} {r['kind']} | {r['path']} | {r['gib']:.2f} "
            f"| {proxy_cells} | {r['brokers_cpu_s_per_gib']:.1f} "
            f"| {r['machine_busy_cores']:.2f} |"
        )
    if run["proxy_log_problems"]:
        out += ["", "#### Proxy warnings and errors during the run", "", "```"]
        out += run["proxy_log_problems"][:20]
        out.append("```")
    for phases, profile in profiles.items():
        if not profile.samples:
            continue
        if profile.tool == "perf":
            title = f"perf: {profile.samples} cpu-clock samples of the proxy process"
            columns = "| self | symbol (library:function) | | share | library |"
        else:
            title = (
                f"py-spy: {profile.samples} busy samples, {profile.idle_samples} idle in "
                "epoll left out"
            )
            columns = "| self | where the thread was | | incl. | Python function on the stack |"
        out += ["", f"#### Proxy profile, proxied {phases} phases ({title})", "", columns]
        out.append("| ---: | --- | --- | ---: | --- |")
        rows = max(len(profile.top), len(profile.groups))
        for i in range(rows):
            left = profile.top[i] if i < len(profile.top) else None
            right = profile.groups[i] if i < len(profile.groups) else None
            cells = [
                f"{n / profile.samples:.1%} | `{name}`" if n else " | "
                for name, n in (left or ("", 0), right or ("", 0))
            ]
            out.append(f"| {cells[0]} | | {cells[1]} |")
    return "\n".join(out)
