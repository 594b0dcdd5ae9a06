"""The proxy's metrics, in a registry of its own so several proxies can share a process."""

from __future__ import annotations

import time
from wsgiref.simple_server import WSGIServer

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    start_http_server,
)

# Request latency buckets, seconds: from a cached answer (sub-millisecond) to a Fetch that
# waited its max.wait.ms or a Produce waiting for acks=all.
LATENCY_BUCKETS = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
)  # fmt: skip


# Stage buckets, seconds: from a sequencer step (tens of microseconds) to an S3 PUT
# queued behind others (seconds).
STAGE_BUCKETS = (
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.15,
    0.2, 0.25, 0.3, 0.4, 0.5, 0.75, 1.0, 1.5, 2.5, 5.0, 10.0,
)  # fmt: skip


class Stages:
    """Where the time of one path goes (`tierproxy_stage_seconds{path, stage}`): one
    observation per request or batch of a stage, never per record. The labelled children
    are looked up once per stage (`labels()` takes a lock and builds a tuple)."""

    def __init__(self, histogram: Histogram, path: str) -> None:
        self._histogram = histogram
        self._path = path
        self._children: dict[str, Histogram] = {}

    def observe(self, stage: str, seconds: float) -> None:
        child = self._children.get(stage)
        if child is None:
            child = self._children[stage] = self._histogram.labels(self._path, stage)
        child.observe(seconds)

    def since(self, stage: str, started: float) -> None:
        """Observe `stage` as the time since `started` (time.perf_counter())."""
        self.observe(stage, time.perf_counter() - started)


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
        self.zone_bytes = Counter(
            "tierproxy_zone_bytes",
            "Client traffic by (client zone, proxy zone, upstream broker zone) and direction "
            "(to_broker: requests, to_client: answers)",
            ["client_zone", "proxy_zone", "broker_zone", "direction"],
            registry=self.registry,
        )
        self.client_zones = Counter(
            "tierproxy_client_zone_resolutions",
            "Client connections by resolved zone and where the zone came from",
            ["zone", "source"],
            registry=self.registry,
        )
        self.zone_fallbacks = Counter(
            "tierproxy_zone_fallbacks",
            "Answers naming brokers for a client zone with no live proxy, by client zone "
            "and the zone served instead",
            ["client_zone", "serving_zone"],
            registry=self.registry,
        )
        self.peer_bytes = Counter(
            "tierproxy_peer_bytes",
            "Bytes of tiered Produce handed from a proxy to a partition's owner, by (from "
            "zone, to zone, notify mode) and direction (to_owner: requests, from_owner: "
            "answers); in s3 mode the records go through the object store, not this hop",
            ["from_zone", "to_zone", "mode", "direction"],
            registry=self.registry,
        )
        self.fleet_members = Gauge(
            "tierproxy_fleet_live_members",
            "Live proxies of the fleet, by zone, as this proxy sees them",
            ["zone"],
            registry=self.registry,
        )

        self.request_seconds = Histogram(
            "tierproxy_request_seconds",
            "Time from a request read off a client connection to its answer handed to the "
            "connection, by API key (a Fetch includes its wait for data)",
            ["api_key"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )

        self.relayed_frames = Counter(
            "tierproxy_relayed_frames",
            "Requests and answers forwarded by the relay, from the reader's callback with no "
            "loop step, by direction; the rest of tierproxy_requests_total (and its answers) "
            "took the connection loop",
            ["direction"],
            registry=self.registry,
        )

        self.unanswered = Counter(
            "tierproxy_unanswered_requests",
            "Requests read whose connection closed before their answer was written (the "
            "client went away, upstream was lost, or a later frame was rejected), by API key",
            ["api_key"],
            registry=self.registry,
        )

        self.stage_seconds = Histogram(
            "tierproxy_stage_seconds",
            'Time of each stage of a tiered path (docs/tiering.md, "Where the time goes"), '
            "per request or batch: produce (decode, s3wal_window, s3wal_put, s3wal_append, "
            "notify, owner_read, owner_order, queue, sequencer, wal, owner_append, local, "
            "answer) and fetch (plan, read, local, answer)",
            ["path", "stage"],
            buckets=STAGE_BUCKETS,
            registry=self.registry,
        )
        self.produce_stages = Stages(self.stage_seconds, "produce")
        self.fetch_stages = Stages(self.stage_seconds, "fetch")

        self._requests_by_key: dict[int, object] = {}
        self._latency_by_key: dict[int, object] = {}

    def request(self, api_key: int, count: int = 1) -> None:
        """Count requests of one API key; the labelled child is looked up once per API
        key, not per request (`labels()` takes a lock and builds a tuple)."""
        child = self._requests_by_key.get(api_key)
        if child is None:
            child = self._requests_by_key[api_key] = self.requests.labels(str(api_key))
        child.inc(count)

    def answered(self, api_key: int, seconds: float) -> None:
        """One answer written: one histogram observation (children cached as above)."""
        child = self._latency_by_key.get(api_key)
        if child is None:
            child = self._latency_by_key[api_key] = self.request_seconds.labels(str(api_key))
        child.observe(seconds)

    def answer_stage(self, api_key: int, ready_at: float) -> None:
        """A tiered answer written, `ready_at` its tiered part's end: stage "answer"."""
        stages = self.produce_stages if api_key == 0 else self.fetch_stages
        stages.since("answer", ready_at)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)

    def zone_bytes_totals(self) -> dict[tuple[str, str, str, str], int]:
        """(client zone, proxy zone, broker zone, direction) -> bytes, for the heartbeat."""
        totals = {}
        for metric in self.zone_bytes.collect():
            for sample in metric.samples:
                if sample.name.endswith("_total"):
                    labels = sample.labels
                    key = (
                        labels["client_zone"],
                        labels["proxy_zone"],
                        labels["broker_zone"],
                        labels["direction"],
                    )
                    totals[key] = int(sample.value)
        return totals


def serve_metrics(metrics: ProxyMetrics, host: str, port: int) -> WSGIServer:
    """GET /metrics on host:port, from a thread of its own; `shutdown()` stops it."""
    server, _thread = start_http_server(port, addr=host, registry=metrics.registry)
    return server
