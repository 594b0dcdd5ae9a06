"""The object store goes away for 30 s under a steady tiered produce load.

One proxy tiers a topic to a MinIO of this test's own, with a small WAL (8 MiB capacity,
1 MiB segments) and uploads every 0.2 s. An idempotent producer (acks=all) writes about
1 MB/s. MinIO is stopped for 30 s and started again on the same port and data:

- at first produce goes on, acknowledged once in the WAL, while the uploader's PUTs fail;
- once the WAL holds its capacity, appends wait: no acknowledgement at all, the WAL's
  retained bytes at the bound, never past it, the writer waiting for room; nothing fails;
- with MinIO back, the uploader's retried PUTs land, the WAL drains, acknowledgements
  resume;
- in the end every acknowledged record is committed exactly once, in the objects.

The producer times its requests out after 10 s (socket.timeout.ms), well inside the
stall: the requests held at the WAL time out on the client, which reconnects and sends the
same batches again, so the sequencer's idempotence must answer each batch once (it shows
as no duplicate in the objects). With a timeout above the stall the figures are the same.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from dataclasses import dataclass

import pytest
from cutover_load import (
    LoadProducer,
    committed_records,
    create_topic,
    metadata_states,
    proxy_config,
    started,
    tiered_topic_id,
    topics_command,
    wait_owned,
)

from proxy.config import parse_config
from proxy.devstack import MinioServer
from proxy.devstack.paths import free_port_block
from proxy.devstack.proxy_thread import ProxyThread
from proxy.metadata.streams import stream_id
from proxy.objects.s3 import S3Store
from proxy.objects.s3config import S3Config
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.kafka, pytest.mark.minio]

MiB = 1024 * 1024
CAPACITY = 8 * MiB
SEGMENT = 1 * MiB
PARTITIONS = 4
RATE = 1000  # records a second
VALUE_BYTES = 1000
BEFORE_S = 8.0
OUTAGE_S = 30.0
AFTER_MAX_S = 60.0  # produce after the restart until the WAL drained, at most this long
SHARDS = 2
# librdkafka times a Produce in flight out after socket.timeout.ms (60 s by default), then
# reconnects and sends the same batches again: 10 s is well inside the stall
CLIENT_SETTINGS = {"socket.timeout.ms": 10_000, "message.timeout.ms": 300_000}


@dataclass(frozen=True, slots=True)
class Sample:
    at: float
    acked: int
    retained: int  # WAL bytes not trimmed
    throttled_appends: int  # appends that waited for room, counted once written
    throttled_seconds: float  # time the WAL's writer waited for room, the wait now included
    uploads: int
    put_failures: int
    backlog: int  # WAL bytes acknowledged, not committed


class Monitor:
    """Samples the proxy's WAL and uploader and the producer's acks every 0.25 s."""

    def __init__(self, proxy: ProxyThread, producer: LoadProducer) -> None:
        self.proxy, self.producer = proxy, producer
        self.samples: list[Sample] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="monitor")

    def __enter__(self) -> Monitor:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def sample(self) -> Sample:
        tiering = self.proxy.proxy.tiering
        wal, uploader = tiering.wal.stats, tiering.uploader.stats
        return Sample(
            time.monotonic(),
            self.producer.acked_count(),
            wal.retained_bytes,
            wal.throttled_appends,
            wal.throttled_seconds,
            uploader.uploads,
            uploader.put_failures,
            uploader.backlog_bytes,
        )

    def _run(self) -> None:
        while not self._stop.wait(0.25):
            self.samples.append(self.sample())

    def between(self, start: float, end: float) -> list[Sample]:
        return [s for s in self.samples if start <= s.at <= end]


def _stopped_growing(samples: list[Sample]) -> float:
    """When the last run of equal retained bytes in `samples` began."""
    at = len(samples) - 1
    while at > 0 and samples[at - 1].retained == samples[-1].retained:
        at -= 1
    return samples[at].at


def _acks_between(producer: LoadProducer, start: float, end: float) -> int:
    return sum(1 for ack in producer.acks if start <= ack.acked_at < end)


def _s3_settings(minio: MinioServer) -> dict:
    return {
        "kind": "s3",
        "bucket": minio.bucket,
        "endpoint_url": minio.endpoint,
        "access_key_id": minio.access_key,
        "secret_access_key": minio.secret_key,
        "path_style": True,
    }


def _s3_config(minio: MinioServer) -> S3Config:
    return S3Config(
        bucket=minio.bucket,
        endpoint_url=minio.endpoint,
        access_key_id=minio.access_key,
        secret_access_key=minio.secret_key,
        path_style=True,
    )


def test_object_store_outage_fills_the_wal_then_catches_up(kafka_cluster, tmp_path):
    suffix = uuid.uuid4().hex[:8]
    topic = f"outage-{suffix}"
    create_topic(kafka_cluster, topic, PARTITIONS)
    minio = MinioServer(name="minio-outage").start()
    try:
        config = proxy_config(
            kafka_cluster,
            tmp_path,
            f"p-{suffix}",
            "zone-a",
            suffix,
            free_port_block(8),
            wal={
                "directory": str(tmp_path / "wal"),
                "capacity_bytes": CAPACITY,
                "segment_bytes": SEGMENT,
            },
            object_store=_s3_settings(minio),
            upload_bytes=MiB,
        )
        with ProxyThread(parse_config(config)) as proxy:
            wait_owned([proxy], SHARDS)
            done = topics_command("tier", topic, proxy.proxy.tiering.peer_port)
            assert done.returncode == 0, done.stdout + done.stderr
            tiering = proxy.proxy.tiering
            topic_id = tiered_topic_id(proxy, topic)
            streams = [stream_id(topic_id, p) for p in range(PARTITIONS)]
            wait_until(
                lambda: all(started(tiering, s) for s in streams),
                30,
                "cutover of every partition",
            )
            producer = LoadProducer(
                "w",
                proxy.bootstrap,
                topic,
                PARTITIONS,
                RATE,
                "zone-a",
                value_bytes=VALUE_BYTES,
                settings=CLIENT_SETTINGS,
            )
            with Monitor(proxy, producer) as monitor:
                producer.start()
                try:
                    time.sleep(BEFORE_S)
                    down_at = time.monotonic()
                    minio.pause_service()
                    stopped_at = time.monotonic()
                    time.sleep(OUTAGE_S - (stopped_at - down_at))
                    # the outage ends when MinIO starts, not when the test has seen it
                    # ready: it may serve (and the WAL drain) before that
                    up_at = time.monotonic()
                    minio.resume_service()
                    drained_in = wait_until(
                        lambda: tiering.wal.stats.retained_bytes < CAPACITY // 4,
                        AFTER_MAX_S,
                        "the WAL drained after the restart",
                        interval_s=0.25,
                    )
                    time.sleep(3.0)  # the load goes on a little longer
                finally:
                    producer.stop(flush_timeout_s=120)
                stop_at = time.monotonic()
                assert not producer.errors, producer.errors[:5]
                assert producer.flushed == 0 and producer.sent == len(producer.acks)
                wait_until(lambda: tiering.uploader.stats.backlog_bytes == 0, 30, "backlog")
                last = monitor.sample()

        # -- what happened, phase by phase --------------------------------------------
        outage = monitor.between(down_at, up_at)
        assert max(s.retained for s in monitor.samples) <= CAPACITY, "the WAL passed its bound"
        # the WAL is full from the first sample of its last value in the outage: nothing
        # is uploaded then, so nothing is trimmed, and any append would have grown it
        full_at = _stopped_growing(outage)
        assert outage[-1].retained > CAPACITY - MiB, "the WAL never filled during the outage"
        # produce went on into the WAL first ...
        into_wal = _acks_between(producer, stopped_at, full_at)
        assert into_wal > 0
        # ... then waited at the bound: the WAL full, appends throttled, and no record
        # handed to the client after the WAL stopped growing acknowledged before MinIO's
        # start (it was never appended). Records handed over before may be acknowledged
        # a little later: their append came first, their answer waits for the loop or for
        # a duplicate retry's answer; the sequencer answers those without an append.
        assert full_at < up_at - 10, f"the WAL filled {full_at - down_at:.1f} s into the outage"
        throttled = monitor.between(full_at + 1, up_at)
        handed_over = [a for a in producer.acks if full_at < a.sent_at < up_at]
        assert handed_over, "no record was handed to the client while the WAL was full"
        early = [a for a in handed_over if a.acked_at < up_at]
        assert not early, (
            f"{len(early)} records handed over after the WAL stopped growing were "
            f"acknowledged before MinIO's start, e.g. {early[0]}"
        )
        assert all(s.retained > CAPACITY - MiB for s in throttled)
        waited = throttled[-1].throttled_seconds - throttled[0].throttled_seconds
        assert waited > 0.9 * (throttled[-1].at - throttled[0].at)
        assert outage[-1].put_failures > outage[0].put_failures, "no failed PUT"
        # ... and caught up
        after = [*monitor.between(up_at, stop_at), last]
        assert after[-1].uploads > after[0].uploads
        assert _acks_between(producer, up_at, stop_at) > 0
        timeouts = [line for line in producer.client_log if "Timed out ProduceRequest" in line]
        assert timeouts, "no request timed out on the client: the retries were not tested"
        assert last.backlog == 0
        first_upload = next(s.at for s in after if s.uploads > after[0].uploads)
        assert first_upload - up_at < 15, "the uploader's retry came late"

        resumed = min(a.acked_at for a in producer.acks if a.acked_at >= up_at)
        rate = {
            "before the outage": _acks_between(producer, down_at - 5, down_at) / 5,
            "outage, into the WAL": into_wal / (full_at - stopped_at),
            "outage, WAL full": _acks_between(producer, full_at + 1, up_at) / (up_at - full_at - 1),
            "restarted, until the first upload": _acks_between(producer, up_at, first_upload)
            / (first_upload - up_at),
            "from the first upload on (the client's queue drains)": _acks_between(
                producer, first_upload, stop_at
            )
            / (stop_at - first_upload),
        }
        print(
            f"\nobject store outage: MinIO down {up_at - down_at:.1f} s; WAL full "
            f"{full_at - down_at:.1f} s into it ({into_wal} records acknowledged into the WAL "
            f"meanwhile); {outage[-1].put_failures - outage[0].put_failures} failed PUT rounds; "
            f"no ack for {resumed - full_at:.1f} s (the WAL writer waited "
            f"{last.throttled_seconds:.1f} s for room, {last.throttled_appends} appends "
            f"waited; {len(timeouts)} Produce requests timed out on the client and were "
            f"sent again); first upload {first_upload - up_at:.1f} s after the restart, first ack "
            f"{resumed - up_at:.1f} s after it; WAL below {CAPACITY // 4 // MiB} MiB "
            f"{drained_in:.1f} s after it"
        )
        for phase, per_s in rate.items():
            print(f"  acks/s {phase}: {per_s:.0f} ({per_s * VALUE_BYTES / 1e6:.2f} MB/s)")

        # -- every acknowledged record committed exactly once ----------------------------
        async def read_back():
            states = await metadata_states(kafka_cluster.bootstrap, f"meta-{suffix}", SHARDS)
            async with S3Store(_s3_config(minio)) as store:
                return await committed_records(store, states, topic_id, PARTITIONS)

        committed = asyncio.run(read_back())
        acked = {(a.partition, a.offset): a.value for a in producer.acks}
        assert len(acked) == len(producer.acks), "an offset acknowledged twice"
        held = {(p, o): v for p, records in committed.items() for o, v in records.items()}
        assert held == acked
        for partition, records in committed.items():
            assert sorted(records) == list(range(len(records))), f"partition {partition}: gap"
    finally:
        minio.stop()
