"""The verification job: is the object store's copy of a tiered topic the same as Kafka's?

Per partition, one Spark task reads the range both should hold, Kafka's log start to the
cutover (or Kafka's high watermark, if lower), from both sides: Kafka's batches through
the cluster reader, the objects' through the ranges the fleet's metadata commits (each
block's CRC checked by the object format, each batch's CRC checked here). The pure
comparison (`verify_compare`) then wants the same batches, base and last offset, record
count and CRC-32C, in the same order. The report (JSON and a table) is what a platform
team signs off before cutting Kafka's retention; every mismatch names the partition and
the offset, and a side that cannot be read fails that partition, not the job.

A compacted topic's two copies are each cleaned by their own cleaner (Kafka's, the
proxy's), so their batches differ once either ran: it is compared record by record
instead (`verify_records`): every key's latest record, and the records both copies hold.

Runs as `tierproxy verify` (local[*]) or inside any Spark application (`verify(spark, job)`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from offload_jobs.cluster_reader import ClusterReadError, read_batches
from offload_jobs.kafka_client import describe_topic, log_offsets
from offload_jobs.migrate import StoreSpec
from offload_jobs.object_source import object_batches
from offload_jobs.progress import TaskProgress
from offload_jobs.verify_compare import (
    BatchSummary,
    Mismatch,
    PartitionReport,
    VerifyReport,
    compare,
    summarize,
)
from offload_jobs.verify_records import SideSummary, compare_compacted
from proxy.metadata.state import MetadataState
from proxy.metadata.streams import StreamRange, shard_of, stream_id


@dataclass(frozen=True, slots=True)
class VerifyJob:
    topic: str
    bootstrap: str  # the upstream Kafka: its log, and the metadata topic
    store: StoreSpec
    metadata_topic: str = "__tierproxy_metadata"
    shard_count: int = 8
    cluster_settings: dict[str, Any] = field(default_factory=dict)
    compacted: bool = False  # compared record by record (set by `verify` from the topic)


@dataclass(frozen=True, slots=True)
class PartitionCheck:
    """One task: [start, end) of a partition, and the committed ranges overlapping it."""

    partition: int
    stream_id: int
    start: int
    end: int
    ranges: tuple[StreamRange, ...]


def plan(
    job: VerifyJob, topic_id, partitions: int, states: Mapping[int, MetadataState]
) -> tuple[list[PartitionCheck], list[PartitionReport]]:
    """The checks to run, and reports already decided (a partition that is not tiered)."""
    checks, decided = [], []
    for partition in range(partitions):
        stream = stream_id(topic_id, partition)
        state = states[shard_of(stream, job.shard_count)]
        info = state.stream(stream)
        start, high = log_offsets(job.bootstrap, job.topic, partition, **job.cluster_settings)
        if info is None:
            decided.append(
                PartitionReport(
                    job.topic, partition, start, high,
                    error="not tiered: the metadata has no stream for this partition, "
                    "so no object copy to verify",
                )
            )  # fmt: skip
            continue
        end = min(info.cutover_offset, high)
        # a compacted partition's objects are read on past `end` for the keys written
        # again there (verify_records)
        ranges = tuple(
            r
            for r in state.committed_ranges(stream)
            if r.end_offset > start and (job.compacted or r.start_offset < end)
        )
        checks.append(PartitionCheck(partition, stream, start, max(start, end), ranges))
    return checks, decided


def check_partition(job: VerifyJob, check: PartitionCheck) -> PartitionReport:
    """One task, on an executor: both sides of one partition, compared batch by batch, or
    record by record on a compacted topic (`verify_records`)."""
    if job.compacted:
        return check_compacted(job, check)
    try:
        # gaps allowed: a compacted topic has them, and the comparison finds any that differ
        kafka = [
            summarize(b.data)
            for b in read_batches(
                job.bootstrap, job.topic, check.partition, check.start, check.end,
                allow_gaps=True, **job.cluster_settings,
            )
        ] if check.end > check.start else []  # fmt: skip
    except ClusterReadError as exc:
        return PartitionReport(job.topic, check.partition, check.start, check.end, error=str(exc))
    objects, problems = asyncio.run(object_summaries(job.store, check))
    return compare(job.topic, check.partition, check.start, check.end, kafka, objects, problems)


def check_compacted(job: VerifyJob, check: PartitionCheck) -> PartitionReport:
    """A compacted partition: each copy cleaned by its own cleaner, so compared by what a
    consumer relies on (each key's latest record, and the records both hold)."""
    kafka = SideSummary(check.start, check.end)
    try:
        if check.end > check.start:
            for b in read_batches(
                job.bootstrap, job.topic, check.partition, check.start, check.end,
                allow_gaps=True, **job.cluster_settings,
            ):  # fmt: skip
                kafka.add(b.data)
    except ClusterReadError as exc:
        return PartitionReport(job.topic, check.partition, check.start, check.end, error=str(exc))
    objects, problems = asyncio.run(object_records(job.store, check))
    return compare_compacted(job.topic, check.partition, kafka, objects, problems)


async def object_records(
    spec: StoreSpec, check: PartitionCheck
) -> tuple[SideSummary, list[Mismatch]]:
    """The objects' side of a compacted partition, and what was wrong on the way."""
    problems: list[Mismatch] = []
    side = SideSummary(check.start, check.end)
    store = await spec.open()
    try:
        async for b in object_batches(
            store, check.stream_id, check.ranges,
            lambda offset, what: problems.append(Mismatch(offset, what)),
        ):  # fmt: skip
            side.add(b.data)
    finally:
        await store.close()
    return side, problems


async def object_summaries(
    spec: StoreSpec, check: PartitionCheck
) -> tuple[list[BatchSummary], list[Mismatch]]:
    """The batches the committed ranges hold, in offset order, and what was wrong on the
    way (an object missing or corrupt, a batch whose CRC fails), each at its offset."""
    problems: list[Mismatch] = []
    store = await spec.open()
    try:
        found = [
            summarize(b.data)
            async for b in object_batches(
                store, check.stream_id, check.ranges,
                lambda offset, what: problems.append(Mismatch(offset, what)),
            )
        ]  # fmt: skip
    finally:
        await store.close()
    return found, problems


async def read_states(
    bootstrap: str, metadata_topic: str, shard_count: int
) -> dict[int, MetadataState]:
    """Every shard's metadata as committed now (read to its end)."""
    from proxy.metadata.reader import ShardReader

    kafka = {"bootstrap_servers": bootstrap}
    readers = [ShardReader(kafka, metadata_topic, k, shard_count) for k in range(shard_count)]
    try:
        await asyncio.gather(*(reader.start() for reader in readers))
        await asyncio.gather(*(reader.read_to_end() for reader in readers))
        return {reader.shard: reader.state for reader in readers}
    finally:
        await asyncio.gather(*(reader.close() for reader in readers))


def verify(
    spark,
    job: VerifyJob,
    states: Mapping[int, MetadataState] | None = None,
    progress: Callable[[str], None] = print,
    redraw: Callable[[str], None] | None = None,
) -> VerifyReport:
    """Run the job on `spark`. `states`: each shard's metadata, read from the metadata
    topic when not given. `redraw`: a terminal's progress bar (`progress.Console`)."""
    started = time.monotonic()
    from offload_jobs.fleet import is_compacted

    topic_id, partitions = describe_topic(job.bootstrap, job.topic, **job.cluster_settings)
    if asyncio.run(is_compacted({"bootstrap_servers": job.bootstrap}, job.topic)):
        job = dataclasses.replace(job, compacted=True)
        progress(f"{job.topic}: compacted: comparing each key's latest record, record by record")
    if states is None:
        states = asyncio.run(read_states(job.bootstrap, job.metadata_topic, job.shard_count))
    checks, reports = plan(job, topic_id, partitions, states)
    progress(f"{job.topic}: verifying {len(checks)} of {partitions} partitions")
    if checks:
        watcher = TaskProgress(spark, len(checks), "partitions verified", progress, redraw)
        try:
            rdd = spark.sparkContext.parallelize(checks, len(checks))
            task = watcher.counting(
                functools.partial(check_partition, job), lambda r: r.kafka_bytes
            )
            reports += rdd.map(task).collect()
            watcher.finished()
        finally:
            watcher.stop()
    reports.sort(key=lambda r: r.partition)
    return VerifyReport(job.topic, tuple(reports), time.monotonic() - started)
