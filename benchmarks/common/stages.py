"""Where a tiered request's time goes: the proxies' `tierproxy_stage_seconds` histograms
(proxy/metrics.py, `Stages`), scraped around a phase and summarised per proxy and stage.

A histogram keeps bucket counts, not samples, so the percentiles are the bucket bound
where the rank falls, interpolated linearly inside the bucket (as Prometheus's
histogram_quantile does); the mean is exact (sum / count).
"""

from __future__ import annotations

import math

from benchmarks.common.procs import scrape

METRIC = "tierproxy_stage_seconds"
# the order a tiered produce's stages happen in (S3 notify: b first, then the owner a)
ORDER = (
    "decode", "s3wal_window", "s3wal_put", "s3wal_append", "notify", "owner_read",
    "owner_order", "queue", "sequencer", "wal", "owner_append", "local", "answer",
    "plan", "read", "objects", "owner_tail", "wait",
)  # fmt: skip


def snapshot(urls: dict[str, str]) -> dict[str, dict[tuple, float]]:
    """{proxy: {(sample name, sorted labels): value}} of every stage histogram sample."""
    out: dict[str, dict[tuple, float]] = {}
    for proxy, url in urls.items():
        found = scrape(url, (METRIC,))
        out[proxy] = {
            (name, labels): v for name, samples in found.items() for labels, v in samples.items()
        }
    return out


def _quantile(q: float, buckets: list[tuple[float, float]], count: float) -> float:
    """histogram_quantile over cumulative (upper bound, count) pairs, sorted."""
    rank, lower, below = q * count, 0.0, 0.0
    for bound, cumulative in buckets:
        if cumulative >= rank:
            if math.isinf(bound):
                return lower  # past the last finite bucket: its bound is all one can say
            inside = cumulative - below
            return lower + (bound - lower) * ((rank - below) / inside if inside else 1.0)
        lower, below = bound, cumulative
    return lower


def summary(before: dict, after: dict) -> dict[str, dict[str, dict[str, float]]]:
    """{"proxy path": {stage: {count, mean_ms, p50_ms, p99_ms}}} of what grew between two
    snapshots."""
    out: dict[str, dict[str, dict[str, float]]] = {}
    for proxy, samples in after.items():
        old = before.get(proxy, {})
        grown: dict[tuple[str, str], dict] = {}
        for (name, labels), value in samples.items():
            delta = value - old.get((name, labels), 0.0)
            tags = dict(labels)
            key = (tags.get("path", "?"), tags.get("stage", "?"))
            entry = grown.setdefault(key, {"buckets": []})
            if name.endswith("_bucket"):
                entry["buckets"].append((float(tags["le"]), delta))
            elif name.endswith("_count"):
                entry["count"] = delta
            elif name.endswith("_sum"):
                entry["sum"] = delta
        for (path, stage), entry in grown.items():
            count = entry.get("count", 0.0)
            if count <= 0:
                continue
            buckets = sorted(entry["buckets"])
            out.setdefault(f"{proxy} {path}", {})[stage] = {
                "count": count,
                "mean_ms": entry.get("sum", 0.0) / count * 1000,
                "p50_ms": _quantile(0.5, buckets, count) * 1000,
                "p99_ms": _quantile(0.99, buckets, count) * 1000,
            }
    return out


def ordered(stages: dict[str, dict]) -> list[str]:
    return sorted(stages, key=lambda s: ORDER.index(s) if s in ORDER else len(ORDER))


def describe(found: dict[str, dict[str, dict[str, float]]]) -> list[str]:
    """One line per proxy and path: each stage's p50 / p99 in ms and its count."""
    lines = []
    for where in sorted(found):
        stages = found[where]
        cells = (
            f"{s} {stages[s]['p50_ms']:.1f}/{stages[s]['p99_ms']:.0f} ms ×{stages[s]['count']:.0f}"
            for s in ordered(stages)
        )
        lines.append(f"{where}: " + ", ".join(cells))
    return lines


def table(rows: dict[str, dict[str, dict[str, dict[str, float]]]]) -> list[str]:
    """Markdown: per phase label, each proxy/path/stage's count, mean, p50, p99 (ms)."""
    out = ["| phase | proxy, path | stage | count | mean ms | p50 ms | p99 ms |"]
    out.append("| --- | --- | --- | ---: | ---: | ---: | ---: |")
    for label, found in rows.items():
        for where in sorted(found):
            stages = found[where]
            for s in ordered(stages):
                x = stages[s]
                out.append(
                    f"| {label} | {where} | {s} | {x['count']:.0f} | {x['mean_ms']:.1f} | "
                    f"{x['p50_ms']:.1f} | {x['p99_ms']:.1f} |"
                )
    return out
