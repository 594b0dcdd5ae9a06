"""Metrics of the tiered data plane that its parts keep as plain counters: the WAL, the
uploader, the log cache and the shards this proxy owns, read when /metrics is scraped.

The collector runs on the metrics server's thread (or the admin API's worker thread): it
reads ints, floats and frozen dataclasses that the loop replaces whole, never a
container the loop mutates. The WAL's fsync latency is a histogram fed by the WAL's
writer thread (`WriteAheadLog.on_sync`), one observation per group commit.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from proxy.tiered.ports import MetricsHost

FSYNC_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)


class TieringMetrics:
    """Registered on `registry` by `attach(service)` once the service started;
    `close()` takes them off again."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._registry = registry
        self.fsync_seconds = Histogram(
            "tierproxy_wal_fsync_seconds",
            "Time of one WAL fsync (one per group commit)",
            buckets=FSYNC_BUCKETS,
            registry=registry,
        )
        self._collector: _Collector | None = None

    def attach(self, service: MetricsHost) -> None:
        if service.wal is not None:
            service.wal.on_sync = self.fsync_seconds.observe
        self._collector = _Collector(service)
        self._registry.register(self._collector)

    def close(self) -> None:
        if self._collector is not None:
            self._registry.unregister(self._collector)
            self._collector = None
        self._registry.unregister(self.fsync_seconds)


class _Collector:
    def __init__(self, service: MetricsHost) -> None:
        self._service = service

    def collect(self) -> Iterator[Metric]:
        service = self._service
        wal, uploader, cache = service.wal, service.uploader, service.log_cache
        value: float  # each loop below yields counts (int) and durations (float)
        if wal is not None:
            s = wal.stats
            for family, name, documentation, value in (
                (GaugeMetricFamily, "wal_retained_bytes",
                 "WAL bytes not yet trimmed (uploaded and committed bytes are trimmed)",
                 s.retained_bytes),
                (GaugeMetricFamily, "wal_capacity_bytes",
                 "The WAL's bound (tiering.wal.capacity_bytes): appends wait past it",
                 service.config.wal_capacity_bytes),
                (GaugeMetricFamily, "wal_segments", "WAL segment files on disk",
                 len(wal.segments)),
                (CounterMetricFamily, "wal_appends", "Entries appended to the WAL", s.appends),
                (CounterMetricFamily, "wal_appended_bytes", "Bytes appended to the WAL",
                 s.bytes_appended),
                (CounterMetricFamily, "wal_fsyncs", "WAL group commits (one fsync each)",
                 s.fsyncs),
                (CounterMetricFamily, "wal_throttled_appends",
                 "Appends that waited for room in the WAL", s.throttled_appends),
                (GaugeMetricFamily, "wal_broken", "1 once a WAL write or fsync failed",
                 int(wal.broken is not None)),
                (GaugeMetricFamily, "wal_waiting_for_space",
                 "1 while appends wait because the WAL's disk is full (ENOSPC)",
                 int(s.waiting_for_space)),
                (CounterMetricFamily, "wal_no_space_waits",
                 "Times a WAL write found the disk full and its appends waited", s.no_space_waits),
                (CounterMetricFamily, "wal_no_space_seconds",
                 "Time appends waited for the WAL's disk to have room again",
                 s.no_space_seconds),
            ):  # fmt: skip
                yield family(f"tierproxy_{name}", documentation, value=value)
        if uploader is not None:
            u = uploader.stats
            for family, name, documentation, value in (
                (GaugeMetricFamily, "uploader_lag_bytes",
                 "WAL bytes acknowledged to producers and not yet uploaded and committed",
                 u.backlog_bytes),
                (GaugeMetricFamily, "uploader_lag_seconds",
                 "How long the oldest WAL entry not yet uploaded has waited",
                 uploader.backlog_seconds),
                (CounterMetricFamily, "uploader_uploads", "Uploads done (put, committed, "
                 "trimmed), since the uploader last started", u.uploads),
                (CounterMetricFamily, "uploader_objects", "Objects uploaded", u.objects),
                (CounterMetricFamily, "uploader_object_bytes", "Bytes of the objects uploaded",
                 u.object_bytes),
                (CounterMetricFamily, "uploader_put_failures", "Failed object PUTs (retried)",
                 u.put_failures),
                (GaugeMetricFamily, "uploader_failed",
                 "1 while the uploader is stopped by an error (it restarts)",
                 int(uploader.failed is not None)),
            ):  # fmt: skip
                yield family(f"tierproxy_{name}", documentation, value=value)
        for family, name, documentation, value in (
            (CounterMetricFamily, "log_cache_hits", "Tail reads the log cache answered",
             cache.hits),
            (CounterMetricFamily, "log_cache_misses",
             "Tail reads below what the log cache holds (read from objects)", cache.misses),
            (CounterMetricFamily, "log_cache_read_bytes", "Bytes read from the log cache",
             cache.bytes_read),
            (CounterMetricFamily, "log_cache_evictions", "Entries evicted to fit",
             cache.evictions),
            (GaugeMetricFamily, "log_cache_bytes", "Batch bytes the log cache holds",
             cache.bytes),
            (GaugeMetricFamily, "log_cache_capacity_bytes", "The log cache's bound",
             cache.max_bytes),
        ):  # fmt: skip
            yield family(f"tierproxy_{name}", documentation, value=value)
        reader = service.s3wal_reader
        if reader is not None:  # the owner's reads of S3-WAL objects (handoff/reader.py)
            for name, documentation, value in (
                ("s3wal_reader_gets", "S3-WAL objects GET by this owner (one per object "
                 "unless it left the cache before a later notification)", reader.gets),
                ("s3wal_reader_hits", "S3-WAL reads served by a GET in flight or cached",
                 reader.hits),
                ("s3wal_reader_bytes", "S3-WAL object bytes GET", reader.bytes_fetched),
            ):  # fmt: skip
                yield CounterMetricFamily(f"tierproxy_{name}", documentation, value=value)
        referencing = service.referencing
        if referencing is not None:  # the owner's batches taken by reference (docs/wal.md)
            for family, name, documentation, value in (
                (GaugeMetricFamily, "references",
                 "Batches taken by reference whose reference entry is not trimmed yet",
                 referencing.references),
                (GaugeMetricFamily, "referenced_bytes",
                 "Their batches' bytes (new batches go by bytes past half the WAL's "
                 "capacity)", referencing.referenced_bytes),
                (GaugeMetricFamily, "fetched_log_bytes",
                 "Bytes of those batches fetched and held in the fetched log",
                 referencing.fetched_bytes),
                (GaugeMetricFamily, "references_disclaimed",
                 "Locations a sender was told were released while unknown here, remembered "
                 "so that they are never taken by reference", referencing.disclaimed),
                (GaugeMetricFamily, "references_off",
                 "1 while no batch is taken by reference (too many disclaimed locations)",
                 int(referencing.references_off)),
                (CounterMetricFamily, "reference_fetch_retries",
                 "Fetches of a referenced batch's bytes that failed and were tried again",
                 referencing.fetch_retries),
                (CounterMetricFamily, "references_unreadable",
                 "Referenced batches whose object is gone or corrupt (ERROR: the uploads "
                 "stop at them)", referencing.unreadable),
            ):  # fmt: skip
                yield family(f"tierproxy_{name}", documentation, value=value)
        yield GaugeMetricFamily(
            "tierproxy_held_locations",
            "S3-WAL locations this proxy keeps for owners that took them by reference, or "
            "may have (their objects are not deleted until the owner releases them)",
            value=service.held_locations,
        )
        clamped = CounterMetricFamily(
            "tierproxy_kafka_beyond_cutover",
            "Kafka answers for a tiered partition clamped at its cutover: Kafka's log held "
            "records past it (written to a broker directly; transaction markers not counted)",
            labels=["api"],
        )
        for kind, count in sorted(service.beyond_cutover.counts.items()):
            clamped.add_metric([kind], count)
        yield clamped
