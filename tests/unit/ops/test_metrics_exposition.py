"""What /metrics exposes of the connection layer and the tiered data plane: names,
labels, and values that follow a real WAL, uploader and log cache (no proxy, no Kafka)."""

from __future__ import annotations

from types import SimpleNamespace

from prometheus_client.parser import text_string_to_metric_families

from proxy.metrics import ProxyMetrics
from proxy.objects.local import LocalDirectoryStore
from proxy.reads.logcache import LogCache
from proxy.tiered.beyond_cutover import BeyondCutover
from proxy.tiered.metrics import TieringMetrics
from proxy.upload.uploader import Uploader
from proxy.wal.log import WriteAheadLog
from proxy.wal.types import WalConfig


def _samples(metrics: ProxyMetrics) -> dict[tuple[str, tuple], float]:
    samples = {}
    for family in text_string_to_metric_families(metrics.exposition().decode()):
        for s in family.samples:
            samples[s.name, tuple(sorted(s.labels.items()))] = s.value
    return samples


def test_request_latency_is_a_histogram_per_api_key():
    metrics = ProxyMetrics()
    for seconds in (0.0003, 0.004, 0.2):
        metrics.answered(0, seconds)
    metrics.answered(1, 0.6)
    samples = _samples(metrics)
    assert samples["tierproxy_request_seconds_count", (("api_key", "0"),)] == 3
    assert samples["tierproxy_request_seconds_count", (("api_key", "1"),)] == 1
    bucket = "tierproxy_request_seconds_bucket"
    assert samples[bucket, (("api_key", "0"), ("le", "0.0005"))] == 1
    assert samples[bucket, (("api_key", "0"), ("le", "0.005"))] == 2
    assert samples[bucket, (("api_key", "0"), ("le", "+Inf"))] == 3
    assert samples[bucket, (("api_key", "1"), ("le", "0.5"))] == 0
    assert abs(samples["tierproxy_request_seconds_sum", (("api_key", "0"),)] - 0.2043) < 1e-9


async def test_wal_uploader_and_log_cache_metrics_follow_the_real_parts(tmp_path):
    metrics = ProxyMetrics()
    wal = await WriteAheadLog.open(WalConfig(str(tmp_path / "wal"), capacity_bytes=1 << 20))
    store = LocalDirectoryStore(tmp_path / "objects")
    cache = LogCache(4096)

    async def commit(objects) -> None:
        return None

    uploader = Uploader(wal, store, commit, lambda: 1)  # not started: everything lags
    service = SimpleNamespace(
        wal=wal,
        uploader=uploader,
        log_cache=cache,
        config=SimpleNamespace(wal_capacity_bytes=1 << 20),
        beyond_cutover=BeyondCutover(),
        s3wal_reader=None,  # notify: direct, or before the start
        referencing=None,  # no batch taken by reference (S3-WAL mode, or references off)
        held_locations=0,
    )
    tiering = TieringMetrics(metrics.registry)
    tiering.attach(service)
    try:
        for n in range(3):
            await wal.append(7, n, b"x" * 100)
        cache.append(7, 0, 0, memoryview(b"y" * 50))
        assert cache.read(7, 0, 1000)[0]
        cache.read(7, 5, 1000)  # at the end: neither hit nor miss
        cache.read(8, 0, 1000)  # a stream it lacks: a miss
        service.beyond_cutover.note("fetch", "t", 0, 10, 11)
        service.beyond_cutover.note("fetch", "t", 0, 10, 12)
        samples = _samples(metrics)
    finally:
        tiering.close()
        await wal.close()

    def value(name: str) -> float:
        return samples[name, ()]

    assert value("tierproxy_wal_appends_total") == 3
    assert value("tierproxy_wal_fsyncs_total") >= 1
    assert value("tierproxy_wal_fsync_seconds_count") == value("tierproxy_wal_fsyncs_total")
    assert value("tierproxy_wal_fsync_seconds_sum") > 0
    retained = value("tierproxy_wal_retained_bytes")
    assert retained == value("tierproxy_wal_appended_bytes_total") > 300
    assert value("tierproxy_wal_capacity_bytes") == 1 << 20
    assert value("tierproxy_wal_broken") == 0
    assert value("tierproxy_uploader_lag_bytes") == retained
    assert value("tierproxy_uploader_lag_seconds") == 0  # not started: no entry seen yet
    assert value("tierproxy_uploader_failed") == 0
    assert value("tierproxy_log_cache_hits_total") == 1
    assert value("tierproxy_log_cache_misses_total") == 1
    assert value("tierproxy_log_cache_bytes") == 50
    assert value("tierproxy_log_cache_capacity_bytes") == 4096
    assert samples["tierproxy_kafka_beyond_cutover_total", (("api", "fetch"),)] == 2
    assert value("tierproxy_held_locations") == 0
    assert not any(n.startswith("tierproxy_referenc") for n, _ in samples)
    # closed: off the registry, so a proxy restarted in the same process registers again
    assert not any(n.startswith("tierproxy_wal") for n, _ in _samples(metrics))
