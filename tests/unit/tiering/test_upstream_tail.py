"""The tail of Kafka's log below a cutover that a rebuild takes its producers from
(proxy/markers/upstream_log.py, `tail` and `tail_read`): found backwards, since Kafka's
Fetch reads forward only. Kafka's log here is a list of batch headers in memory; what a
Fetch from an offset answers (from the batch holding it, or from Kafka's log start) is
what `UpstreamLog.headers` gives, checked against a real Kafka by the integration tests."""

from __future__ import annotations

import asyncio
import logging

import pytest
from aiokafka.errors import KafkaError

from proxy.markers.upstream_log import (
    FIRST_SPAN,
    GROWTH,
    RECENT_MS,
    TAIL_BYTES,
    Span,
    UpstreamLog,
    tail_read,
)
from proxy.records.batches import BatchHeader, read_batch_header, with_base_offset
from tests.support.batches import build_batch

NOW = 1_700_000_000_000


def header(offset: int, records: int, timestamp: int, size: int = 0) -> BatchHeader:
    """A batch of `records` records at `offset` whose max timestamp is `timestamp`, of
    about `size` bytes."""
    filler = b"x" * max(0, size // max(records, 1) - 20)
    batch = build_batch([filler] * records, timestamps=[timestamp] * records)
    return read_batch_header(with_base_offset(batch, offset))


class MemoryLog(UpstreamLog):
    """Kafka's log of one partition, its batches in offset order from its log start (the
    first batch's, unless `log_start` says otherwise: a compacted log's first batches
    may have been cleaned); each read answers the log start, as a Fetch answer does."""

    def __init__(
        self,
        batches: list[BatchHeader],
        fail_after: int | None = None,
        log_start: int | None = None,
        slow_after: int | None = None,
    ) -> None:
        super().__init__({})
        self.batches = batches
        self.reads: list[tuple[int, int]] = []  # [start, end) of each read
        self.fail_after = fail_after  # reads answered before Kafka goes away
        self.slow_after = slow_after  # reads answered before Kafka stops answering
        first = batches[0].base_offset if batches else 0
        self.log_start = first if log_start is None else log_start

    async def headers(self, topic, partition, start, end, timeout_s=30.0):
        if self.fail_after is not None and len(self.reads) >= self.fail_after:
            raise KafkaError("Kafka went away")
        if self.slow_after is not None and len(self.reads) >= self.slow_after:
            await asyncio.sleep(60)  # a fetch under way that does not end
        self.reads.append((start, end))
        await asyncio.sleep(0)  # a real read yields: a loop that never ends can be cut
        found = [h for h in self.batches if h.next_offset > start and h.base_offset < end]
        return Span(found, self.log_start)

    @property
    def starts(self) -> list[int]:
        return [start for start, _ in self.reads]


def steady(start: int, end: int, step: int = 10, ms_per_offset: int = 1) -> list[BatchHeader]:
    """Batches of `step` records from `start` to `end`, timestamps rising with offsets."""
    return [header(o, step, NOW + o * ms_per_offset) for o in range(start, end, step)]


def test_the_tail_is_read_when_it_spans_recent_ms_reaches_the_log_start_or_weighs_enough():
    old, new = header(100, 10, NOW), header(110, 10, NOW + RECENT_MS + 1)
    assert tail_read([old, new], 100)  # spans more than RECENT_MS
    assert not tail_read([header(100, 10, NOW), header(110, 10, NOW + 5)], 100)
    assert tail_read([header(100, 10, NOW)], 0)  # Kafka's log start
    assert tail_read([header(150, 10, NOW)], 100)  # retention moved the log start past 100
    assert tail_read([header(150, 10, NOW)], 100, log_start=150)  # ... as Kafka said
    # compaction cleaned the batches at 100-149, Kafka's log starts at 0: read on
    assert not tail_read([header(150, 10, NOW)], 100, log_start=0)
    assert tail_read([], 100)  # nothing below the cutover
    big = [header(100 + 10 * n, 10, NOW + n, size=TAIL_BYTES // 4) for n in range(5)]
    assert tail_read(big, 100)


async def test_a_quiet_partition_is_read_once_a_busy_one_further_back_until_recent_ms():
    quiet = MemoryLog(steady(0, 50_000, ms_per_offset=RECENT_MS))  # a batch a minute
    found = await quiet.tail("t", 0, 50_000)
    assert quiet.starts == [50_000 - FIRST_SPAN]
    assert found[0].base_offset <= 50_000 - FIRST_SPAN < found[0].next_offset
    assert found[-1].next_offset == 50_000

    busy = MemoryLog(steady(0, 200_000, ms_per_offset=1))  # 1,000 records a second
    found = await busy.tail("t", 0, 200_000)
    reads = len(busy.reads)
    assert busy.starts == [200_000 - FIRST_SPAN * GROWTH**n for n in range(reads)]
    assert found[-1].max_timestamp - found[0].max_timestamp > RECENT_MS
    assert found[1].max_timestamp - found[0].max_timestamp < RECENT_MS  # no further
    # each chunk read once, up to the batch holding where the one before began (batches
    # of 10 records from offset 0); every batch once, in order
    assert [end for _, end in busy.reads] == [200_000] + [s - s % 10 for s in busy.starts[:-1]]
    offsets = [h.base_offset for h in found]
    assert offsets == list(range(offsets[0], 200_000, 10))


async def test_the_tail_reaches_back_to_a_transaction_open_at_the_cutover(caplog):
    kafka = MemoryLog(steady(0, 5_000, ms_per_offset=100))
    found = await kafka.tail("t", 0, 5_000, lowest=1_234)
    assert kafka.starts == [1_234] and found[0].base_offset == 1_230  # the batch holding it
    gone = MemoryLog(steady(2_000, 5_000, ms_per_offset=100))  # retention took it
    with caplog.at_level(logging.WARNING, "tierproxy.transactions"):
        found = await gone.tail("t", 0, 5_000, lowest=1_234)
    assert found[0].base_offset == 2_000
    assert "Kafka's log starts past 1234" in caplog.text


@pytest.mark.parametrize("end", [0, 5])
async def test_a_cutover_at_or_near_offset_0_reads_from_0(end):
    kafka = MemoryLog(steady(0, end, step=1) if end else [header(0, 1, NOW)])
    await kafka.tail("t", 0, end)
    assert kafka.starts == [0]


async def test_a_log_of_big_batches_is_read_back_to_about_tail_bytes():
    """Batches of about 1 MiB, a millisecond apart: after the first read, each reaches
    only as far back as the bytes read so far say TAIL_BYTES allows (GROWTH times further
    would read about 50 MiB), and at least one batch further."""
    big = MemoryLog([header(o, 10, NOW + o, size=1 << 20) for o in range(0, 20_000, 10)])
    found = await big.tail("t", 0, 20_000)
    size = sum(h.size for h in found)
    assert TAIL_BYTES <= size < TAIL_BYTES + (2 << 20)
    assert len(big.reads) == 3 and big.reads[1][0] > 20_000 - 8 * FIRST_SPAN


async def test_a_later_read_that_fails_ends_the_tail_and_a_first_one_is_raised():
    kafka = MemoryLog(steady(0, 200_000), fail_after=1)
    found = await kafka.tail("t", 0, 200_000)
    first = 200_000 - FIRST_SPAN
    assert found[0].base_offset == first - first % 10  # the first read's
    with pytest.raises(KafkaError):
        await MemoryLog(steady(0, 200_000), fail_after=0).tail("t", 0, 200_000)


async def test_a_compacted_log_is_read_past_its_cleaned_batches_and_warns_of_no_log_start(
    caplog,
):
    """Compaction cleaned every other run of batches (their offsets gone): a read from
    an offset whose batch was cleaned begins at a later batch, which is not Kafka's log
    start (0 here, as its answers say). The tail goes on to RECENT_MS, and a transaction
    open at the cutover inside a cleaned range is read from the first batch past it,
    without the warning that Kafka's log starts past it."""
    runs = steady(0, 200_000, ms_per_offset=1)
    cleaned = [h for h in runs if (h.base_offset // 500) % 2 == 1]  # 500-999, 1,500-...
    kafka = MemoryLog(cleaned, log_start=0)
    found = await kafka.tail("t", 0, 200_000)
    assert found[-1].max_timestamp - found[0].max_timestamp > RECENT_MS
    with caplog.at_level(logging.WARNING, "tierproxy.transactions"):
        found = await MemoryLog(cleaned, log_start=0).tail("t", 0, 200_000, lowest=190_100)
    assert found[0].base_offset < 190_100  # from lowest on, and back to RECENT_MS
    assert 190_500 in [h.base_offset for h in found]  # the first batch left past 190,100
    # a quiet partition: the first read, from the cleaned offset, spans RECENT_MS
    quiet = [h for h in steady(0, 50_000, ms_per_offset=RECENT_MS) if h.base_offset != 49_000]
    with caplog.at_level(logging.WARNING, "tierproxy.transactions"):
        found = await MemoryLog(quiet, log_start=0).tail("t", 0, 50_000, lowest=49_005)
    assert found[0].base_offset == 49_010
    assert "starts past" not in caplog.text
    # a whole chunk cleaned: read further back, to the log start if need be
    sparse = MemoryLog([header(10, 10, NOW), header(199_990, 10, NOW + 1)], log_start=0)
    found = await sparse.tail("t", 0, 200_000)
    assert [h.base_offset for h in found] == [10, 199_990]
    assert sparse.starts[-1] == 0


async def test_a_cleaned_range_below_a_tail_of_almost_tail_bytes_is_read_past():
    """One batch of nearly TAIL_BYTES just below the cutover, then a range compaction
    cleaned: the bytes read so far allow no further reach, but a read that found nothing
    must still reach further back (before: the same read again, until the deadline)."""
    big = header(199_990, 10, NOW, size=TAIL_BYTES - (64 << 10))
    kafka = MemoryLog([header(10, 10, NOW), big], log_start=0)
    found = await asyncio.wait_for(kafka.tail("t", 0, 200_000), 5)
    assert [h.base_offset for h in found] == [10, 199_990]
    assert len(kafka.reads) == len(set(kafka.reads))  # no read made twice


async def test_a_read_under_way_at_the_deadline_ends_the_tail_with_what_was_read():
    """The first read answered, the second never does: at the deadline the tail is what
    the first read found (before, the caller's bound cancelled it all and the rebuild
    seeded nothing); a first read that never answers is the caller's TimeoutError."""
    kafka = MemoryLog(steady(0, 200_000), slow_after=1)
    found = await asyncio.wait_for(kafka.tail("t", 0, 200_000, timeout_s=0.2), 5)
    first = 200_000 - FIRST_SPAN
    assert found[0].base_offset == first - first % 10 and found[-1].next_offset == 200_000
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(
            MemoryLog(steady(0, 100), slow_after=0).tail("t", 0, 100, timeout_s=0.2), 5
        )
