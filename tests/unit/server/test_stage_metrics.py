"""`tierproxy_stage_seconds` (proxy/metrics.py, `Stages`) and the benchmarks' summary of
it (benchmarks/common/stages.py): observations per path and stage, percentiles from the
buckets, exact means, and only what grew between two scrapes."""

from __future__ import annotations

import re

import pytest
from prometheus_client import generate_latest

from benchmarks.common import stages
from proxy.metrics import ProxyMetrics


def scraped(metrics: ProxyMetrics) -> dict[tuple, float]:
    """What `stages.snapshot` keeps of one proxy, from its exposition."""
    found = {}
    text = generate_latest(metrics.registry).decode()
    for name, labels, value in re.findall(r"^(\w+)(?:\{([^}]*)\})? (\S+)$", text, re.M):
        if name.startswith(stages.METRIC):
            found[(name, tuple(sorted(re.findall(r'(\w+)="([^"]*)"', labels))))] = float(value)
    return found


def test_stages_are_summarised_per_path_and_stage_from_what_grew():
    metrics = ProxyMetrics()
    metrics.produce_stages.observe("notify", 0.5)  # before the first scrape: not counted
    before = {"b": scraped(metrics)}
    for seconds in (0.01, 0.02, 0.3, 0.31, 0.32):
        metrics.produce_stages.observe("notify", seconds)
    metrics.fetch_stages.observe("read", 0.002)
    metrics.answer_stage(0, 0.0)  # a Produce answer: the produce path's "answer"
    found = stages.summary(before, {"b": scraped(metrics)})

    notify = found["b produce"]["notify"]
    assert notify["count"] == 5
    assert notify["mean_ms"] == pytest.approx(192.0)
    assert 250 <= notify["p50_ms"] <= 300  # inside the bucket holding the 3rd of 5
    assert 300 <= notify["p99_ms"] <= 400
    assert found["b fetch"]["read"]["count"] == 1
    assert found["b produce"]["answer"]["count"] == 1
    assert stages.ordered(found["b produce"]) == ["notify", "answer"]
    assert any("notify" in line for line in stages.describe(found))
    assert "| b produce | notify | 5 |" in "\n".join(stages.table({"phase": found}))
