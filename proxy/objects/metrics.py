"""Object store request metrics: counts by S3 API and outcome, latency, bytes moved.

Prometheus counters on a registry passed in, so they sit beside the proxy's own
(proxy/metrics.py keeps one registry per proxy instance).
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram


class ObjectStoreMetrics:
    """Request counters by S3 API (PutObject, UploadPart, ...: what S3 bills) and outcome,
    one count per attempt, on a registry passed in (ProxyMetrics.registry in the proxy)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = CollectorRegistry(auto_describe=True) if registry is None else registry
        self.requests = Counter(
            "tierproxy_object_store_requests",
            "Object store requests (each attempt), by S3 API and outcome",
            ["api", "outcome"],
            registry=self.registry,
        )
        self.request_seconds = Histogram(
            "tierproxy_object_store_request_seconds",
            "Object store request latency (each attempt), by S3 API",
            ["api"],
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
            registry=self.registry,
        )
        self.bytes = Counter(
            "tierproxy_object_store_bytes",
            "Object bytes moved by successful requests: out = uploaded, in = downloaded",
            ["direction"],
            registry=self.registry,
        )
        self._children: dict[tuple[str, str], Any] = {}
        self._latency: dict[str, Any] = {}
        self._bytes_out = self.bytes.labels("out")
        self._bytes_in = self.bytes.labels("in")

    def request(self, api: str, outcome: str, seconds: float) -> None:
        child = self._children.get((api, outcome))
        if child is None:
            child = self._children[api, outcome] = self.requests.labels(api, outcome)
        child.inc()
        latency = self._latency.get(api)
        if latency is None:
            latency = self._latency[api] = self.request_seconds.labels(api)
        latency.observe(seconds)

    def uploaded(self, size: int) -> None:
        self._bytes_out.inc(size)

    def downloaded(self, size: int) -> None:
        self._bytes_in.inc(size)

    def count(self, api: str, outcome: str = "ok") -> float:
        """The current count, for tests and logs."""
        value = self.registry.get_sample_value(
            "tierproxy_object_store_requests_total", {"api": api, "outcome": outcome}
        )
        return value or 0.0
