"""What the fault-injection suite watches while it breaks things: what the producers were
told (`Progress`, over cutover_load's `LoadProducer`s and a `BurstProducer`), what a
consumer reading through the fleet got (`FleetConsumer`), and the figures of a run
(`Figures`, written as JSON and printed).

Values are `<producer>:<sequence>:<padding>` (cutover_load's format), so a consumed
record names who wrote it and in what order.
"""

from __future__ import annotations

import contextlib
import json
import logging
import statistics
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition
from cutover_load import Ack, LoadProducer


def _quiet_logger(name: str, lines: list[str], path: Path | None = None) -> logging.Logger:
    """librdkafka's log lines kept in `lines`, not printed: proxies that are down are
    what this suite is about, and each would be a line on stderr. With `path`, every
    line (debug ones too, which `lines` leaves out) also goes there with its wall time,
    to be read beside the proxies' logs."""
    logger = logging.getLogger(f"faultload.{name}.{uuid.uuid4().hex[:6]}")
    logger.propagate = False
    logger.setLevel(logging.DEBUG)
    out = None if path is None else path.open("a", buffering=1)  # noqa: SIM115

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            message = record.getMessage()
            if record.levelno > logging.DEBUG:
                lines.append(message)
            if out is not None:
                stamp = time.strftime("%H:%M:%S", time.gmtime(record.created))
                out.write(f"{stamp}.{int(record.created % 1 * 1000):03d} {message}\n")

    logger.addHandler(Keep())
    return logger


# librdkafka's batch.size (its default is 1,000,000) for the producers of the suite: one
# WAL entry is at most this plus its framing, so a WAL that takes no more appends is
# within that of its bound (faultsteps.WalFill.room)
BATCH_BYTES = 128 * 1024
# the steady load of a fault run (`start_load`): per producer, records a second and their
# size; librdkafka times a request out after 10 s and retries it, for 300 s
RATE = 150
VALUE_BYTES = 128
CLIENT = {"socket.timeout.ms": 10_000, "message.timeout.ms": 300_000, "batch.size": BATCH_BYTES}


class BurstProducer:
    """An idempotent producer (acks=all) sending as fast as its queue takes records to
    some partitions only (those of one owner, to fill its WAL), until `stop()`; its acks
    are `Ack`s like LoadProducer's."""

    def __init__(
        self, name: str, bootstrap: str, topic: str, partitions: list[int], zone: str, size: int
    ) -> None:
        self.name, self.bootstrap, self.topic = name, bootstrap, topic
        self.partitions, self.zone, self.size = partitions, zone, size
        self.acks: list[Ack] = []
        self.errors: list[str] = []
        self.client_log: list[str] = []
        self.sent = 0
        self.flushed: int | None = None
        self._flush_timeout_s = 300.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"burst {name}", daemon=True)

    def start(self) -> BurstProducer:
        self._thread.start()
        return self

    def stop_sending(self) -> None:
        self._stop.set()

    def stop(self, flush_timeout_s: float = 300.0) -> None:
        """Stop sending, wait for the answers to what was sent."""
        self._flush_timeout_s = flush_timeout_s
        self._stop.set()
        self._thread.join(flush_timeout_s + 30)
        assert not self._thread.is_alive(), f"{self.name} is still flushing"

    def _run(self) -> None:
        producer = Producer(
            {
                "bootstrap.servers": self.bootstrap,
                "client.id": f"{self.name},tierproxy_az={self.zone}",
                "enable.idempotence": True,
                "acks": "all",
                "linger.ms": 5,
                "batch.size": BATCH_BYTES,
                "message.timeout.ms": 300_000,
                "queue.buffering.max.messages": 20_000,
            },
            logger=_quiet_logger(self.name, self.client_log),
        )

        def delivered(err, msg) -> None:
            now = time.monotonic()
            if err is not None:
                self.errors.append(f"{msg.partition()}: {err}")
            else:
                wall = time.time_ns() // 1_000_000
                self.acks.append(Ack(msg.partition(), msg.offset(), msg.value(), 0, now, wall))

        padding = b"x" * max(0, self.size - 24)
        while not self._stop.is_set():
            value = f"{self.name}:{self.sent}:".encode() + padding
            partition = self.partitions[self.sent % len(self.partitions)]
            try:
                producer.produce(self.topic, value, partition=partition, on_delivery=delivered)
            except BufferError:  # the queue is full: the proxy holds produce
                producer.poll(0.1)
                continue
            self.sent += 1
            producer.poll(0)
        self.flushed = producer.flush(self._flush_timeout_s)


class Progress:
    """Per partition, when the last acknowledgement came and the highest offset
    acknowledged so far, over every producer watched (read incrementally)."""

    def __init__(self, partitions: int) -> None:
        self.partitions = partitions
        self._sources: list[tuple[list[Ack], list[int]]] = []
        self.last_ack_at: dict[int, float] = {}
        self.max_offset: dict[int, int] = {}

    def watch(self, producer: LoadProducer | BurstProducer) -> None:
        self._sources.append((producer.acks, [0]))

    def update(self) -> None:
        for acks, seen in self._sources:
            end = len(acks)
            for ack in acks[seen[0] : end]:
                if ack.acked_at > self.last_ack_at.get(ack.partition, 0.0):
                    self.last_ack_at[ack.partition] = ack.acked_at
                if ack.offset is None:  # persisted, the offset not told: see _compare
                    continue
                if ack.offset > self.max_offset.get(ack.partition, -1):
                    self.max_offset[ack.partition] = ack.offset
            seen[0] = end

    def acks(self) -> Iterator[Ack]:
        """Every acknowledgement so far, of every producer watched."""
        for acks, _ in self._sources:
            yield from acks[:]

    def acked_since(self, since: float) -> bool:
        """Every partition had an acknowledgement after `since`."""
        self.update()
        return all(self.last_ack_at.get(p, 0.0) > since for p in range(self.partitions))


def start_load(
    bootstrap: str,
    zones: list[str],
    topic: str,
    partitions: int,
    producers: list[LoadProducer],
    *,
    rate: float = RATE,
    value_bytes: int = VALUE_BYTES,
    settings: dict | None = None,
    prefix: str = "load",
) -> Progress:
    """The steady load: one `LoadProducer` a zone (`load-a`, `load-b`, ...: `prefix`)
    writing `rate` records a second round robin over the partitions, appended to
    `producers` as each starts (the caller stops them, however far this got); their
    `Progress`."""
    progress = Progress(partitions)
    for zone in zones:
        producer = LoadProducer(
            f"{prefix}-{zone[-1]}",
            bootstrap,
            topic,
            partitions,
            rate,
            zone,
            value_bytes=value_bytes,
            settings=CLIENT if settings is None else settings,
        )
        producers.append(producer.start())
        progress.watch(producer)
    return progress


def stop_quietly(stoppables: list) -> None:
    """A failed run's producers and consumers stopped quickly, whatever is left unsent
    (None: never started)."""
    for stoppable in stoppables:
        if stoppable is not None:
            with contextlib.suppress(AssertionError):
                stoppable.stop(flush_timeout_s=5)


class FleetConsumer:
    """A librdkafka consumer reading every partition through the fleet from the cutover
    on, in a thread; `records[p]` is (offset, value) in the order they came.

    Its re-bootstrap is off (`metadata_recovery`). librdkafka (2.10 and later) re-bootstraps
    as soon as every broker it knows is down, which for a client of a zone is every time
    that zone's proxy dies (all the broker ids it was given are that proxy's listeners);
    the brokers it decommissions then can deadlock its main thread with an
    OffsetForLeaderEpoch answer being handled at that moment: a lock-order inversion,
    confluentinc/librdkafka#5476 (open; fix proposed in #5304), found here with gdb
    (docs/reliability.md, "A consumer stuck after a kill -9"). The consumer then stops
    for good, fetching nothing and emitting no statistics. With the re-bootstrap off it
    reconnects to the brokers it knows, as librdkafka did before 2.10.
    """

    metadata_recovery = "none"  # librdkafka's metadata.recovery.strategy (see above)

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        starts: dict[int, int],
        zone: str,
        log_path: Path | None = None,
        debug: str | None = None,
        isolation: str = "read_committed",
    ) -> None:
        """`log_path`: its log lines also go there; `debug`: librdkafka's `debug` contexts
        (e.g. "fetch,broker,protocol"), their lines to `log_path` only."""
        self.bootstrap, self.topic, self.starts, self.zone = bootstrap, topic, starts, zone
        self.isolation = isolation
        self.log_path, self.debug = log_path, debug
        self.records: dict[int, list[tuple[int, bytes]]] = {p: [] for p in starts}
        self.position: dict[int, int] = dict(starts)  # the next offset expected
        self.errors: Counter[str] = Counter()
        # the latest error of each partition with its text, the time and the position then
        # (an _AUTO_OFFSET_RESET says there whether the answer was OFFSET_OUT_OF_RANGE or
        # a log truncation, and from which broker)
        self.last_error: dict[int | None, str] = {}  # partition (None: client-wide) -> text
        self.client_log: list[str] = []
        self.consumed_at = 0.0  # time.monotonic() of the last consume() call returning
        self._stats: tuple[float, str] | None = None  # (when, librdkafka's statistics JSON)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="fleet consumer", daemon=True)

    def start(self) -> FleetConsumer:
        self._thread.start()
        return self

    def stop(self, flush_timeout_s: float = 0.0) -> None:
        """Stop reading (`flush_timeout_s`: unused, as the producers' `stop` takes it)."""
        self._stop.set()
        self._thread.join(30)
        assert not self._thread.is_alive(), "the consumer did not stop"

    def caught_up(self, ends: dict[int, int]) -> bool:
        """Read past offset `ends[p]` - 1 in every partition."""
        return all(self.position[p] >= end for p, end in ends.items())

    def state(self) -> str:
        """What librdkafka says of each partition in its last statistics (every 5 s):
        fetch state, next offset to fetch, the high watermark the proxy answered, messages
        queued for the application, the leader; and how long ago its thread last came back
        from consume(): what a consumer that stopped reading waits for."""
        now = time.monotonic()
        waited = f"consume() returned {now - self.consumed_at:.1f} s ago"
        if self._stats is None:
            return f"{waited}; no statistics yet"
        at, text = self._stats
        try:
            topic = json.loads(text)["topics"][self.topic]["partitions"]
        except (ValueError, KeyError) as exc:
            return f"{waited}; statistics without the topic ({exc!r})"
        keys = (
            "fetch_state", "next_offset", "app_offset", "eof_offset", "hi_offset", "ls_offset",
            "fetchq_cnt", "rxmsgs", "leader",
        )  # fmt: skip
        parts = {p: [topic[p].get(k) for k in keys] for p in sorted(topic) if p != "-1"}
        # each broker connection: its state, requests awaiting an answer, connects, the
        # partitions it fetches (a partition nobody fetches is delegated to no broker)
        brokers = {
            b.get("nodeid"): [
                b.get("state"), b.get("waitresp_cnt"), b.get("connects"),
                sorted(b.get("toppars", {})),
            ]
            for b in json.loads(text).get("brokers", {}).values()
        }  # fmt: skip
        return (
            f"{waited}; librdkafka {now - at:.1f} s ago, per partition {keys}: {parts}; "
            f"brokers (state, waiting answers, connects, partitions): {brokers}"
        )

    def _run(self) -> None:
        settings = {
            "bootstrap.servers": self.bootstrap,
            "client.id": f"fault-consumer,tierproxy_az={self.zone}",
            "group.id": f"faults-{uuid.uuid4().hex[:8]}",  # assign() only: never joins
            "isolation.level": self.isolation,
            "enable.auto.commit": False,
            "auto.offset.reset": "error",  # a reset would hide a lost or repeated range
            "fetch.error.backoff.ms": 100,
            "reconnect.backoff.max.ms": 1000,
            "statistics.interval.ms": 5000,  # state(): kept, read only when behind
            "metadata.recovery.strategy": self.metadata_recovery,
            "stats_cb": self._keep_stats,
        }
        if self.debug:
            settings["debug"] = self.debug
        consumer = Consumer(
            settings, logger=_quiet_logger("consumer", self.client_log, self.log_path)
        )
        consumer.assign([TopicPartition(self.topic, p, o) for p, o in self.starts.items()])
        try:
            while not self._stop.is_set():
                messages = consumer.consume(1000, 0.2)
                self.consumed_at = time.monotonic()
                for msg in messages:
                    if msg.error() is not None:
                        self.errors[msg.error().name()] += 1
                        at = self.position.get(msg.partition(), -1)
                        when = time.strftime("%H:%M:%S")
                        self.last_error[msg.partition()] = f"{when} at {at}: {msg.error().str()}"
                        continue
                    partition, offset = msg.partition(), msg.offset()
                    self.records[partition].append((offset, msg.value()))
                    self.position[partition] = offset + 1
        finally:
            consumer.close()

    def _keep_stats(self, text: str) -> None:
        self._stats = (time.monotonic(), text)


@dataclass
class Figures:
    """The counts of a run, as docs/reliability.md shows them."""

    seed: int
    faults: Counter[str] = field(default_factory=Counter)
    recovery_s: dict[str, list[float]] = field(default_factory=dict)  # fault end -> recovered
    outage_s: dict[str, list[float]] = field(default_factory=dict)  # injected -> recovered
    notes: dict[str, object] = field(default_factory=dict)
    records_acknowledged: int = 0
    records_consumed: int = 0
    lost: int = 0
    duplicates: int = 0
    out_of_order: int = 0
    timeline: list[tuple[str, float, float, float]] = field(default_factory=list)

    def fault(self, kind: str, injected: float, ended: float, recovered: float) -> None:
        self.timeline.append((kind, injected, ended, recovered))
        self.faults[kind] += 1
        self.recovery_s.setdefault(kind, []).append(round(recovered - ended, 2))
        self.outage_s.setdefault(kind, []).append(round(recovered - injected, 2))

    def as_json(self) -> dict:
        def spread(values: list[float]) -> dict[str, float]:
            return {
                "min": min(values),
                "median": round(statistics.median(values), 2),
                "max": max(values),
            }

        return {
            "seed": self.seed,
            "faults_injected": dict(self.faults),
            "faults_total": sum(self.faults.values()),
            "records_acknowledged": self.records_acknowledged,
            "records_consumed": self.records_consumed,
            "lost": self.lost,
            "duplicates": self.duplicates,
            "out_of_order": self.out_of_order,
            "recovery_s": {kind: spread(v) for kind, v in self.recovery_s.items()},
            "outage_s": {kind: spread(v) for kind, v in self.outage_s.items()},
            **self.notes,
        }

    def write(self, path: Path) -> str:
        text = json.dumps(self.as_json(), indent=2, sort_keys=True)
        path.write_text(text + "\n")
        return text
