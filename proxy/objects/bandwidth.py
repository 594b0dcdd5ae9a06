"""A proxy's bandwidth shared by priority (docs/tiering.md, "Bandwidth").

One `BandwidthLimiter` (proxy/objects/ratelimit.py) per proxy, `tiering.bandwidth_bytes_per_s`
bytes a second: tiered produce takes its bytes at once and never waits (reads pay its
debt afterwards); the bytes a tiered Fetch answers with wait at TAIL_READ (the log cache,
the owner's tail) or CATCHUP_READ (committed objects); compaction's GETs and PUTs wait at
COMPACTION. So a replay of history or a compaction cannot take the bandwidth produce
needs. What each priority was granted and how long it waited is on /metrics.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, Metric

from proxy.objects.ratelimit import BandwidthLimiter


class Bandwidth:
    """The limiter and its metrics; `close()` takes the metrics off the registry."""

    def __init__(self, rate: int, burst: int, registry: CollectorRegistry | None) -> None:
        self.limiter = BandwidthLimiter(rate or None, burst or None)
        self._registry = registry
        self._collector = _Collector(self.limiter)
        if registry is not None:
            registry.register(self._collector)

    def close(self) -> None:
        if self._registry is not None:
            self._registry.unregister(self._collector)
            self._registry = None


class _Collector:
    """Read when scraped, from the metrics server's thread: plain numbers only."""

    def __init__(self, limiter: BandwidthLimiter) -> None:
        self._limiter = limiter

    def collect(self) -> Iterator[Metric]:
        families = (
            ("bytes", "Bytes granted by the bandwidth limiter", "bytes_granted"),
            ("waits", "Requests of the bandwidth limiter that had to wait", "waits"),
            ("wait_seconds", "Seconds waited for the bandwidth limiter", "seconds_waited"),
        )
        for name, documentation, attribute in families:
            family = CounterMetricFamily(
                f"tierproxy_bandwidth_{name}", documentation, labels=["priority"]
            )
            for priority, stats in self._limiter.stats.items():
                family.add_metric([priority.name.lower()], getattr(stats, attribute))
            yield family
