"""The two clients of the benchmark: Kafka's own Java performance tools, and librdkafka.

Every run produces `records` records of `record_size` bytes (no key) with acks=all and
idempotence on, or consumes that many, and returns MB/s (MB = 2^20 bytes of record
values, as Kafka's tools count) and, for produce, latency percentiles in milliseconds.
`rate` None means as fast as possible; a number paces the producer at that many
records per second, so latency is measured below saturation and is not queueing time.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path

from confluent_kafka import Consumer, KafkaError, Producer

from benchmarks.common.procs import run_tool

MIB = 1 << 20
PERCENTILES = {"p50": 0.50, "p99": 0.99, "p99.9": 0.999}


@dataclass
class ProduceResult:
    records: int
    mb_per_s: float
    latency_ms: dict[str, float]  # p50, p99, p99.9 (+ avg, max, p95 where known)
    seconds: float  # from the first record sent to the last acknowledged
    details: dict[str, object] = field(default_factory=dict)

    def to_json(self) -> dict[str, object]:
        return asdict(self)


@dataclass
class ConsumeResult:
    records: int
    mb_per_s: float
    seconds: float  # from the assignment to the last record read
    details: dict[str, object] = field(default_factory=dict)

    def to_json(self) -> dict[str, object]:
        return asdict(self)


# -- Kafka's Java tools ------------------------------------------------------------------

# The last line of ProducerPerformance (Kafka 4.1), e.g. "300000 records sent, 41017.0
# records/sec (40.06 MB/sec), 612.29 ms avg latency, 1023.00 ms max latency, 623 ms 50th,
# 951 ms 95th, 1002 ms 99th, 1019 ms 99.9th."
_PRODUCER_FINAL = re.compile(
    r"(?P<records>\d+) records sent, (?P<rps>[\d.]+) records/sec \((?P<mbps>[\d.]+) MB/sec\), "
    r"(?P<avg>[\d.]+) ms avg latency, (?P<max>[\d.]+) ms max latency, (?P<p50>\d+) ms 50th, "
    r"(?P<p95>\d+) ms 95th, (?P<p99>\d+) ms 99th, (?P<p999>\d+) ms 99\.9th"
)


# With --print-metrics, e.g. "producer-metrics:records-per-request-avg:{client-id=x} : 52.3":
# how the client batched, which changes how hard the brokers work per byte.
_PRODUCER_METRIC = re.compile(
    r"^producer-metrics:([\w-]+):\{client-id=[^}]*\}\s*:\s*([-\d.E]+)\s*$", re.MULTILINE
)
_PRODUCER_METRICS_KEPT = {
    "records-per-request-avg",
    "batch-size-avg",
    "request-total",
    "request-latency-avg",
    "request-latency-max",
}


class JavaTools:
    """org.apache.kafka.tools.ProducerPerformance / ConsumerPerformance from the cached jars."""

    def __init__(self, libs: Path, heap: str = "-Xmx512m") -> None:
        self.libs = libs
        self.heap = heap

    def argv(self, main_class: str, *args: str) -> list[str]:
        java = shutil.which("java") or "java"
        return [
            java,
            self.heap,
            "-Djava.net.preferIPv4Stack=true",
            "-cp",
            f"{self.libs}/*",
            main_class,
            *args,
        ]

    def produce_argv(
        self,
        bootstrap: str,
        topic: str,
        records: int,
        record_size: int,
        rate: int | None,
        config_file: Path | None = None,
        extra_args: tuple[str, ...] = (),
    ) -> list[str]:
        # --producer.config: --producer-props splits each setting at every "=", so a value
        # holding one (client.id=app,tierproxy_az=zone-b) only passes in a file
        extra = [] if config_file is None else ["--producer.config", str(config_file)]
        return self.argv(
            "org.apache.kafka.tools.ProducerPerformance",
            "--topic",
            topic,
            "--num-records",
            str(records),
            "--record-size",
            str(record_size),
            "--throughput",
            str(rate or -1),
            "--producer-props",
            f"bootstrap.servers={bootstrap}",
            "acks=all",
            "enable.idempotence=true",
            "--print-metrics",
            *extra,
            *extra_args,
        )

    def produce(
        self,
        bootstrap: str,
        topic: str,
        records: int,
        record_size: int,
        rate: int | None = None,
        settings: dict[str, str] | None = None,
        extra_args: tuple[str, ...] = (),
    ) -> ProduceResult:
        """`settings`: more producer settings (client.id, batch.size, ...), from a file;
        `extra_args`: more of the tool's options (--transaction-duration-ms 100)."""
        config_file = None
        if settings:
            with tempfile.NamedTemporaryFile(
                "w", prefix="producer-", suffix=".properties", delete=False
            ) as file:
                file.writelines(f"{key}={value}\n" for key, value in settings.items())
            config_file = Path(file.name)
        started = time.perf_counter()
        argv = self.produce_argv(
            bootstrap, topic, records, record_size, rate, config_file, extra_args
        )
        try:
            out = run_tool(argv, timeout=max(600.0, records / 1000))
        finally:
            if config_file is not None:
                config_file.unlink()
        seconds = time.perf_counter() - started
        matches = [m for m in map(_PRODUCER_FINAL.search, out.splitlines()) if m]
        if not matches:
            raise RuntimeError(f"no final line in ProducerPerformance's output:\n{out[-3000:]}")
        m = matches[-1]
        if int(m["records"]) != records:
            raise RuntimeError(f"ProducerPerformance sent {m['records']} of {records}:\n{out}")
        latency = {
            key: float(m[group])
            for key, group in (
                ("p50", "p50"),
                ("p95", "p95"),
                ("p99", "p99"),
                ("p99.9", "p999"),
                ("avg", "avg"),
                ("max", "max"),
            )
        }
        sending = records / float(m["rps"])  # the tool's own clock, without the JVM start
        metrics = {
            name: float(value)
            for name, value in _PRODUCER_METRIC.findall(out)
            if name in _PRODUCER_METRICS_KEPT
        }
        details = {"final_line": m.group(0), "wall_s": seconds, "producer_metrics": metrics}
        return ProduceResult(records, float(m["mbps"]), latency, sending, details)

    def consume(self, bootstrap: str, topic: str, records: int, group: str) -> ConsumeResult:
        argv = self.argv(
            "org.apache.kafka.tools.ConsumerPerformance",
            "--bootstrap-server",
            bootstrap,
            "--topic",
            topic,
            "--messages",
            str(records),
            "--group",
            group,
            "--timeout",
            "60000",
        )
        started = time.perf_counter()
        out = run_tool(argv, timeout=max(600.0, records / 1000))
        seconds = time.perf_counter() - started
        lines = [line.strip() for line in out.splitlines()]
        header_at = next((i for i, line in enumerate(lines) if line.startswith("start.time")), None)
        if header_at is None or header_at + 1 >= len(lines):
            raise RuntimeError(f"no result in ConsumerPerformance's output:\n{out[-3000:]}")
        names = [name.strip() for name in lines[header_at].split(",")]
        values = [value.strip() for value in lines[header_at + 1].split(",")]
        stats = dict(zip(names, values, strict=False))
        consumed = int(stats["data.consumed.in.nMsg"])
        if consumed < records:
            raise RuntimeError(f"ConsumerPerformance read {consumed} of {records}:\n{out}")
        # fetch.MB.sec leaves the group join (rebalance.time.ms) out, like the librdkafka
        # consumer below, whose clock starts at the assignment.
        fetching = float(stats["fetch.time.ms"]) / 1000
        details = {"stats": stats, "wall_s": seconds}
        return ConsumeResult(consumed, float(stats["fetch.MB.sec"]), fetching, details)


# -- librdkafka (confluent-kafka) ---------------------------------------------------------


def percentiles(latencies_ns: list[int]) -> dict[str, float]:
    ordered = sorted(latencies_ns)
    out = {
        key: ordered[min(len(ordered) - 1, int(q * len(ordered)))] / 1e6
        for key, q in PERCENTILES.items()
    }
    out["avg"] = sum(ordered) / len(ordered) / 1e6
    out["max"] = ordered[-1] / 1e6
    return out


def librdkafka_produce(
    bootstrap: str,
    topic: str,
    records: int,
    record_size: int,
    rate: int | None = None,
    settings: dict[str, str] | None = None,
    stamp: bool = False,
    count_requests: bool = False,
) -> ProduceResult:
    """Latency is from produce() to the delivery report, per record (perf_counter_ns).
    `settings`: more producer settings (client.id, batch.size, ...). `stamp`: each value
    starts with time.time_ns() at its produce() (8 bytes, big-endian), for end-to-end
    latency. `count_requests`: `details["produce_requests"]` is the Produce requests the
    client sent over the run, from librdkafka's statistics (its brokers' `req.Produce`)."""
    stats: list[int] = []

    def on_stats(text: str) -> None:
        brokers = json.loads(text).get("brokers", {}).values()
        stats.append(sum(broker.get("req", {}).get("Produce", 0) for broker in brokers))

    counting = {"statistics.interval.ms": 100, "stats_cb": on_stats} if count_requests else {}
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "acks": "all",
            "enable.idempotence": True,
            "client.id": "tierproxy-bench",
        }
        | (settings or {})
        | counting
    )
    producer.list_topics(topic, timeout=30)  # connections and metadata before the clock
    if count_requests:
        _next_stats(producer, stats)
    sent_before = stats[-1] if stats else 0
    value = os.urandom(record_size)
    latencies: list[int] = []
    errors: list[str] = []
    now = time.perf_counter_ns

    def delivered(started: int, err, _msg) -> None:
        latencies.append(now() - started)
        if err is not None:
            errors.append(str(err))

    produce = producer.produce
    poll = producer.poll
    started = time.perf_counter()
    interval = None if rate is None else 1.0 / rate
    for i in range(records):
        if interval is not None:
            while (wait := started + i * interval - time.perf_counter()) > 0:
                poll(wait)
        record = time.time_ns().to_bytes(8, "big") + value[8:] if stamp else value
        while True:
            try:
                produce(topic, record, on_delivery=partial(delivered, now()))
                break
            except BufferError:  # queue.buffering.max.messages reached: wait for reports
                poll(0.005)
        if i % 1000 == 0:
            poll(0)
    left = producer.flush(120)
    seconds = time.perf_counter() - started
    if left or errors or len(latencies) != records:
        raise RuntimeError(
            f"librdkafka produce: {left} undelivered, {len(errors)} errors "
            f"(first: {errors[:1]}), {len(latencies)} reports of {records}"
        )
    mb_per_s = records * record_size / MIB / seconds
    result = ProduceResult(records, mb_per_s, percentiles(latencies), seconds)
    if count_requests:  # a report made after the last delivery counts every request
        result.details["produce_requests"] = _next_stats(producer, stats) - sent_before
    return result


def _next_stats(producer: Producer, stats: list[int], timeout: float = 5.0) -> int:
    """The Produce requests sent, from the next statistics report librdkafka makes."""
    seen = len(stats)
    deadline = time.monotonic() + timeout
    while len(stats) == seen:
        if time.monotonic() > deadline:
            raise RuntimeError("librdkafka made no statistics report")
        producer.poll(0.05)
    return stats[-1]


def librdkafka_consume(bootstrap: str, topic: str, records: int, group: str) -> ConsumeResult:
    """Records read per second from the assignment (after the group join) to the last."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "client.id": "tierproxy-bench",
        }
    )
    assigned_at: list[float] = []

    def on_assign(c, partitions) -> None:
        if not assigned_at:
            assigned_at.append(time.perf_counter())

    try:
        consumer.subscribe([topic], on_assign=on_assign)
        count = 0
        nbytes = 0
        last = 0.0
        deadline = time.monotonic() + max(120.0, records / 2000)
        while count < records:
            if time.monotonic() > deadline:
                raise RuntimeError(f"librdkafka consume: {count} of {records} before the deadline")
            batch = consumer.consume(num_messages=10000, timeout=1.0)
            for msg in batch:
                error = msg.error()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        continue
                    raise RuntimeError(f"librdkafka consume: {error}")
                count += 1
                nbytes += len(msg)
            if batch:
                last = time.perf_counter()
    finally:
        consumer.close()
    seconds = last - assigned_at[0]
    return ConsumeResult(count, nbytes / MIB / seconds, seconds)


# -- librdkafka's own byte counts, per connection -----------------------------------------


@dataclass
class Handle:
    """One librdkafka broker handle (one connection, reconnects included) of a client."""

    role: str  # what the client does: produce, consume, ...
    zone: str  # where the client is
    name: str  # librdkafka's: host:port/<node id>, GroupCoordinator, ...
    address: str  # host:port it connected to ("" if it never did)
    sent: int  # txbytes: request bytes written to the socket
    received: int  # rxbytes: answer bytes read from it


class Traffic:
    """A client's bytes per broker handle, from librdkafka's statistics: pass `on_stats`
    as `stats_cb` with `statistics.interval.ms` = INTERVAL_MS. Counts are cumulative, so
    the last emission seen of each handle is kept. librdkafka 2.16 drops its bootstrap
    handles, with their counts, before the first emission: those bytes (ApiVersions and
    Metadata, about a kilobyte per client) are never seen."""

    INTERVAL_MS = 1000

    def __init__(self) -> None:
        self.handles: dict[str, dict] = {}
        self.emissions = 0

    def on_stats(self, text: str) -> None:
        for name, broker in json.loads(text)["brokers"].items():
            address = broker["nodename"] or self.handles.get(name, {}).get("address", "")
            self.handles[name] = {
                "address": address,
                "sent": broker["txbytes"],
                "received": broker["rxbytes"],
            }
        self.emissions += 1

    def settle(self, serve, role: str, zone: str) -> list[Handle]:
        """Call `serve(timeout)` (poll, consume) until two more emissions are in (the
        first may have been gathered before the last bytes moved); the handles then."""
        target = self.emissions + 2
        deadline = time.monotonic() + 20 * self.INTERVAL_MS / 1000
        while self.emissions < target:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{role} client in {zone}: no librdkafka statistics")
            serve(0.1)
        return [Handle(role, zone, name, **h) for name, h in sorted(self.handles.items())]
