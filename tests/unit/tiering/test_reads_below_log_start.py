"""A Fetch or ListOffsets EARLIEST below a tiered partition's log start when that log
start lies below the cutover (retention or DeleteRecords trimmed migrated ranges): Kafka
may still hold its copy of those offsets, but the partition's log starts at the stream's
log start, so the proxy answers the Fetch (OFFSET_OUT_OF_RANGE) instead of sending it to
Kafka, and EARLIEST is never below that log start (issue 15)."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest
from kio.schema.errors import ErrorCode
from test_rebuild_log_start import CUTOVER, NOW, STREAM, TOPIC, Shard

from proxy.apis.api02_list_offsets import OffsetsResult
from proxy.metadata.records import StreamTrim
from proxy.metadata.topic_index import TieredTopic
from proxy.metrics import ProxyMetrics
from proxy.tiered.offsets import StreamPart, combine
from proxy.tiered.reads import START_WAIT_S, TieredReads


def migrated() -> Shard:
    """[0, 400) of Kafka's part in objects, as an offload job commits it."""
    made = Shard()
    made.commit(1, 0, 200)
    made.commit(2, 200, 400)
    return made


class Topics:
    def topic(self, topic):
        return TieredTopic(TOPIC, "t", NOW) if topic == "t" else None


def reads_of(shard: Shard, partitions: dict | None = None) -> TieredReads:
    service = SimpleNamespace(topics=Topics(), state=lambda stream: shard.state)
    service.partitions = partitions
    service.fetch_stages = ProxyMetrics().fetch_stages
    return TieredReads(service, None, None)


def fetch_at(offset: int) -> SimpleNamespace:
    return SimpleNamespace(partition=0, fetch_offset=offset)


def test_a_fetch_below_a_log_start_below_the_cutover_is_answered_here():
    shard = migrated()
    reads = reads_of(shard)
    here = {o: reads.fetch_here("t", fetch_at(o)) for o in (0, 199, 399, 400, 999, 1000)}
    assert here == {0: True, 199: True, 399: True, 400: False, 999: False, 1000: True}
    shard.write(StreamTrim(0, STREAM, 1, 200, 1, NOW))  # retention dropped the first range
    here = {o: reads.fetch_here("t", fetch_at(o)) for o in (0, 199, 200, 400, 999)}
    # below 200 Kafka may still hold its copy: answered here (OFFSET_OUT_OF_RANGE)
    assert here == {0: True, 199: True, 200: True, 400: False, 999: False}
    shard.write(StreamTrim(0, STREAM, 1, 450, 1, NOW))  # DeleteRecords past the objects
    here = {o: reads.fetch_here("t", fetch_at(o)) for o in (0, 449, 450, 999)}
    assert here == {0: True, 449: True, 450: False, 999: False}
    assert reads.fetch_here("other", fetch_at(0)) is False


def kafka(offset: int, epoch: int = 0) -> OffsetsResult:
    return OffsetsResult(0, -1, offset, epoch)


@pytest.mark.parametrize(
    ("kafka_start", "log_start", "held", "earliest"),
    [
        (0, 0, True, kafka(0)),  # the same: Kafka's answer, its epoch kept
        (0, 200, True, OffsetsResult(0, -1, 200)),  # trimmed, Kafka's copy lives on
        # DeleteRecords past the objects: Kafka's batch, the epoch of Kafka's log start
        (0, 450, False, OffsetsResult(0, -1, 450, 0)),
        (400, 200, True, OffsetsResult(0, -1, 200)),  # migrated, gone from Kafka
        (600, 200, False, kafka(600)),  # nothing holds 200: a Fetch there is Kafka's
        (1003, 200, True, OffsetsResult(0, -1, 1000)),  # past the cutover: clamped
    ],
)
def test_earliest_is_what_a_fetch_from_it_is_served(kafka_start, log_start, held, earliest):
    part = StreamPart(0, CUTOVER, log_start, start_held=held)
    assert combine(-2, kafka(kafka_start), part) == earliest


async def test_a_fetch_on_the_owner_right_after_a_trim_is_out_of_range_before_the_reader_sees_it():
    """The owner's partition moved its log start (a DeleteRecords answered: the trim is
    written); this proxy's metadata reader has not applied the StreamTrim yet. The Fetch
    at a dropped offset gets OFFSET_OUT_OF_RANGE and the new log start, as Kafka answers
    right after a DeleteRecords, never the dropped records."""
    shard = migrated()
    owned = SimpleNamespace(high_watermark=CUTOVER, log_start_offset=300)
    reads = reads_of(shard, {STREAM: owned})
    part = SimpleNamespace(topic="t", partition=0, fetch_offset=250)
    result = await reads._read_one(part, 0, "reader", 0)
    assert (result.error_code, result.log_start_offset) == (ErrorCode.offset_out_of_range, 300)
    part.fetch_offset = 300
    result = await reads._read_one(part, 0, "reader", 0)  # max_bytes 0: no read
    assert (result.error_code, result.log_start_offset) == (ErrorCode.none, 300)


async def test_every_read_at_the_owner_waits_for_the_partition_being_started():
    """Right after the cutover (or a takeover) the owner's partition is being started: a
    Fetch, a last stable offset, the producers and the high watermark wait for it
    (`partition_here`), as Kafka's leader answers then (the tail for a timestamp
    search does too; it needs a log cache, not run here). Before, the Fetch was served the
    committed end as its high watermark, the others NOT_LEADER_OR_FOLLOWER or no answer."""
    shard = migrated()
    started = SimpleNamespace(
        high_watermark=CUTOVER + 7,
        log_start_offset=0,
        last_stable_offset=CUTOVER + 5,
        producers=lambda: ("p",),
    )
    partitions: dict = {}
    reads = reads_of(shard, partitions)
    waited: list[int] = []

    async def partition_here(stream, deadline=None):
        waited.append(stream)
        partitions[stream] = started  # the rebuild ends
        return started

    reads.service.partition_here = partition_here
    reads.service.owner_address = lambda stream: None  # the owner is this proxy
    part = SimpleNamespace(topic="t", partition=0, fetch_offset=CUTOVER + 7)
    result = await reads._read_one(part, 0, "reader", 0)
    assert (result.error_code, result.high_watermark) == (ErrorCode.none, CUTOVER + 7)
    for ask, answer in (
        (reads.owner_last_stable, CUTOVER + 5),
        (reads.owner_producers, (ErrorCode.none, ("p",))),
        (reads.owner_high_watermark, CUTOVER + 7),
    ):
        partitions.clear()
        assert await ask(STREAM) == answer
    assert waited == [STREAM] * 4


async def test_a_fetch_waits_for_its_partitions_being_started_one_second_in_all():
    """Partitions being started share the Fetch's one deadline (a cutover starts many
    streams, rebuilt 8 at a time: waiting a second for each, one after the other, took a
    Fetch past the client's timeout)."""
    reads = reads_of(migrated(), {})
    deadlines: list[float] = []

    async def partition_here(stream, deadline=None):
        deadlines.append(deadline)
        return None  # not started by the deadline

    reads.service.partition_here = partition_here
    part = SimpleNamespace(topic="t", partition=0, fetch_offset=CUTOVER, partition_max_bytes=0)
    await reads._read_all([part, part, part], 0, "reader", 0)
    assert len(deadlines) == 3 and len(set(deadlines)) == 1
    assert deadlines[0] <= time.monotonic() + START_WAIT_S
