"""The proxy's metrics, in a registry of its own so several proxies can share a process."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest


class ProxyMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.connections = Gauge(
            "tierproxy_client_connections", "Open client connections", registry=self.registry
        )
        self.connections_accepted = Counter(
            "tierproxy_client_connections_accepted",
            "Client connections accepted, by listener",
            ["listener"],
            registry=self.registry,
        )
        self.rejected_frames = Counter(
            "tierproxy_rejected_frames",
            "Client connections closed for bad input, by reason",
            ["reason"],
            registry=self.registry,
        )
        self.requests = Counter(
            "tierproxy_requests",
            "Requests by API key",
            ["api_key"],
            registry=self.registry,
        )
        self.upstream_errors = Counter(
            "tierproxy_upstream_errors",
            "Upstream connections that failed or closed under a client",
            ["reason"],
            registry=self.registry,
        )
        self.bytes_in = Counter(
            "tierproxy_client_bytes_in", "Bytes received from clients", registry=self.registry
        )
        self.bytes_out = Counter(
            "tierproxy_client_bytes_out", "Bytes sent to clients", registry=self.registry
        )

        self._requests_by_key: dict[int, object] = {}

    def request(self, api_key: int) -> None:
        """Count one request; the labelled child is looked up once per API key, not per
        request (`labels()` takes a lock and builds a tuple)."""
        child = self._requests_by_key.get(api_key)
        if child is None:
            child = self._requests_by_key[api_key] = self.requests.labels(str(api_key))
        child.inc()

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
