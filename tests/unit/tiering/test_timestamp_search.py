"""Kafka's ListOffsets rules over record batches (timestamp_search.py), for every codec,
with out-of-order timestamps, a log start inside a batch and LogAppendTime batches; the
objects' time index (format version 2) and the reading of version 1 objects; and how the
proxy completes Kafka's answer with the stream's (tiered_offsets.combine)."""

from __future__ import annotations

import struct

import cramjam
import crc32c
import pytest

from proxy.apis.api02_list_offsets import EARLIEST_LOCAL_TIMESTAMP, MAX_TIMESTAMP, OffsetsResult
from proxy.objects.format import (
    INDEX_ENTRY_SIZE,
    INDEX_ENTRY_SIZE_V1,
    IndexEntry,
    ObjectKind,
    read_object,
)
from proxy.objects.format_writer import ObjectWriter
from proxy.records.batches import (
    ATTRIBUTES_POSITION,
    CRC_POSITION,
    HEADER_SIZE,
    CorruptBatchError,
    iter_batches,
    read_batch_header,
    set_log_append_time,
)
from proxy.records.timestamp_search import (
    Found,
    candidate_blocks,
    in_batch,
    in_batches,
    max_timestamp_in,
    offset_of_max,
)
from proxy.tiered.offsets import StreamPart, combine, epoch_at
from tests.support.batches import build_batch

TIMESTAMPS = (100, 300, 200, 400, 300)  # out of order, and the max (400) not last


def batch(timestamps=TIMESTAMPS, *, codec: int = 0, base_offset: int = 10, epoch: int = -1):
    """A producer's batch (aiokafka's builder, each codec as a client writes it: snappy
    in xerial's framing, as the Java client does), given `base_offset` and `epoch`."""
    values = [b"value %d" % i * 20 for i in range(len(timestamps))]
    data = bytearray(
        build_batch(values, timestamps=timestamps, codec=codec, base_offset=base_offset)
    )
    struct.pack_into(">i", data, 12, epoch)
    return data


def raw_snappy(data: bytearray) -> bytearray:
    """The batch with its records compressed as raw snappy (librdkafka's way)."""
    records = bytes(cramjam.snappy.compress_raw(bytes(data[HEADER_SIZE:])))
    out = bytearray(data[:HEADER_SIZE]) + records
    struct.pack_into(">i", out, 8, len(out) - 12)
    attributes = struct.unpack_from(">h", out, ATTRIBUTES_POSITION)[0] | 2
    struct.pack_into(">h", out, ATTRIBUTES_POSITION, attributes)
    struct.pack_into(">I", out, CRC_POSITION, crc32c.crc32c(out[ATTRIBUTES_POSITION:]))
    return out


CODECS = {
    "none": lambda ts, **kw: batch(ts, codec=0, **kw),
    "gzip": lambda ts, **kw: batch(ts, codec=1, **kw),
    "snappy-xerial": lambda ts, **kw: batch(ts, codec=2, **kw),
    "snappy-raw": lambda ts, **kw: raw_snappy(batch(ts, codec=0, **kw)),
    "lz4": lambda ts, **kw: batch(ts, codec=3, **kw),
    "zstd": lambda ts, **kw: batch(ts, codec=4, **kw),
}


def look(data, target: int, start: int = 0):
    view = memoryview(data)
    return in_batch(read_batch_header(view), view, target, start)


@pytest.mark.parametrize("make", CODECS.values(), ids=CODECS.keys())
def test_the_exact_record_is_found_inside_a_batch_of_every_codec(make):
    data = make(TIMESTAMPS)
    assert (read_batch_header(data).codec == 0) == (make is CODECS["none"])
    assert look(data, 50) == Found(100, 10, -1)
    assert look(data, 100) == Found(100, 10, -1)
    # out of order: the first record at or after 150 is offset 11 (300), not 12 (200)
    assert look(data, 150) == Found(300, 11, -1)
    assert look(data, 350) == Found(400, 13, -1)
    assert look(data, 400) == Found(400, 13, -1)
    assert look(data, 401) is None


@pytest.mark.parametrize("make", CODECS.values(), ids=CODECS.keys())
def test_a_log_start_inside_the_batch_is_never_answered_below(make):
    data = make(TIMESTAMPS)
    assert look(data, 50, start=12) == Found(200, 12, -1)
    assert look(data, 250, start=12) == Found(400, 13, -1)
    assert look(data, 350, start=14) is None  # only offset 13 has 400, below the start
    assert look(data, 50, start=15) is None  # the batch is all below the start


def test_a_batch_whose_only_match_is_below_the_start_is_passed_over():
    first = CODECS["zstd"]((500, 100), base_offset=0)
    second = CODECS["gzip"]((600,), base_offset=2, epoch=7)
    run = memoryview(bytes(first + second))
    assert in_batches(run, 400, 1) == Found(600, 2, 7)
    assert in_batches(run, 400, 0) == Found(500, 0, -1)
    assert in_batches(run, 400, 1, end=2) is None  # the range ends before the second


def test_the_answer_carries_the_batch_leader_epoch():
    assert look(batch(epoch=3), 0) == Found(100, 10, 3)


def test_log_append_time_records_all_have_the_batch_max_timestamp():
    data = batch(codec=4)
    set_log_append_time(data, 0, read_batch_header(data), 5_000)
    assert look(data, 4_000) == Found(5_000, 10, -1)
    assert look(data, 4_000, start=12) == Found(5_000, 12, -1)
    assert look(data, 5_001) is None
    view = memoryview(data)
    assert offset_of_max(view, 5_000, 0) == Found(5_000, 10, -1)


@pytest.mark.parametrize("make", CODECS.values(), ids=CODECS.keys())
def test_max_timestamp_is_the_first_record_with_the_largest(make):
    run = memoryview(bytes(make((100, 400, 400), base_offset=0) + make((400, 50), base_offset=3)))
    assert max_timestamp_in(run, 0) == 400
    assert offset_of_max(run, 400, 0) == Found(400, 1, -1)
    # a batch straddling the start counts whole, as Kafka counts its first segment whole
    assert offset_of_max(run, 400, 2) == Found(400, 1, -1)
    assert max_timestamp_in(run, 3) == 400 and offset_of_max(run, 400, 3) == Found(400, 3, -1)
    assert max_timestamp_in(run, 5) == -1
    assert max_timestamp_in(run, 0, end=3) == 400


def test_records_that_do_not_decompress_are_a_corrupt_batch():
    data = batch(codec=1)
    data[-10:] = b"\xff" * 10
    with pytest.raises(CorruptBatchError, match="GZIP"):
        look(data, 0)


# -- the time index -----------------------------------------------------------------------


@pytest.mark.parametrize("version", [2, 3])
def test_a_version_2_or_3_object_records_each_block_max_timestamp(version):
    first, second = batch((5, 900, 7), base_offset=0), batch((30, 20), base_offset=3)
    writer = ObjectWriter(1, ObjectKind.STREAM, version=version)
    writer.add_batches(4, first + second, max_block_bytes=len(first))
    built = writer.build()
    footer, index = read_object(built.to_bytes(), built.key)
    assert footer.version == version and footer.index_size == 2 * INDEX_ENTRY_SIZE == 104
    assert [(e.start_offset, e.end_offset, e.max_timestamp) for e in index] == [
        (0, 3, 900),
        (3, 5, 30),
    ]
    assert index == built.index
    # the entry is version 1's 44 bytes and the max timestamp, i64, at byte 44
    data = built.to_bytes()
    entry = data[footer.index_position : footer.index_position + INDEX_ENTRY_SIZE]
    start = footer.data_start
    first_block = memoryview(data)[start : start + len(first)]
    assert entry == struct.pack(
        ">QqQIQIIq", 4, 0, 3, 3, start, len(first), crc32c.crc32c(first_block), 900
    )


def test_add_block_reads_the_max_timestamp_off_the_batches_unless_given():
    run = batch((5, 900), base_offset=0) + batch((30,), base_offset=2)
    writer = ObjectWriter(2, ObjectKind.STREAM)
    writer.add_block(1, run, 0, 3, 3)
    writer.add_block(1, b"not batches", 3, 4, 1, max_timestamp=-1)
    with pytest.raises(CorruptBatchError):
        writer.add_block(1, b"not batches", 4, 5, 1)
    built = writer.build()
    _, index = read_object(built.to_bytes(), built.key)
    assert [e.max_timestamp for e in index] == [900, -1]


def test_a_version_1_object_still_reads_with_no_max_timestamp():
    writer = ObjectWriter(3, ObjectKind.STREAM, version=1)
    writer.add_batches(1, batch(base_offset=0))
    built = writer.build()
    footer, index = read_object(built.to_bytes(), built.key)
    assert footer.version == 1 and footer.index_size == INDEX_ENTRY_SIZE_V1
    assert index[0].max_timestamp is None
    assert candidate_blocks(index, 10**15) == list(index)  # unknown: read to learn it


def test_candidate_blocks_skip_blocks_below_the_target_unread():
    entries = [
        IndexEntry(1, 0, 10, 10, 0, 5, 0, 100),
        IndexEntry(1, 10, 20, 10, 5, 5, 0, 300),
        IndexEntry(1, 20, 30, 10, 10, 5, 0, None),
        IndexEntry(1, 30, 40, 10, 15, 5, 0, 200),
    ]
    assert [e.start_offset for e in candidate_blocks(entries, 250)] == [10, 20]
    assert [e.start_offset for e in candidate_blocks(entries, 50)] == [0, 10, 20, 30]


def test_empty_batches_have_no_timestamp():
    run = bytes(batch((7,), base_offset=0))
    assert [h.max_timestamp for h, _ in iter_batches(run)] == [7]


# -- Kafka's part and the stream's --------------------------------------------------------


def kafka(offset, timestamp=-1, epoch=0, error=0):
    return OffsetsResult(error, timestamp, offset, epoch)


def part(found=None, error=0):
    return StreamPart(error, cutover=100, log_start=40, found=found)


def test_kafka_answers_below_the_cutover_are_kept_with_their_epoch():
    assert combine(500, kafka(60, 510, 3), part(Found(520, 120, -1))) == kafka(60, 510, 3)
    assert combine(-2, kafka(40), part()) == kafka(40)


def test_kafka_answers_at_or_past_the_cutover_are_the_streams():
    stream = Found(520, 120, -1)
    assert combine(500, kafka(100, 999), part(stream)) == OffsetsResult(0, 520, 120, -1)
    assert combine(500, kafka(101, 999), part(None)) == OffsetsResult(0)
    assert combine(-2, kafka(103), part()) == OffsetsResult(0, -1, 100)


def test_no_kafka_match_falls_to_the_stream_and_errors_pass_through():
    assert combine(500, kafka(-1), part(Found(520, 120, -1))).offset == 120
    assert combine(500, kafka(-1, error=6), part()).error_code == 6
    assert combine(500, kafka(-1), part(error=56)).error_code == 56
    assert combine(500, None, part()).error_code == 6
    # EARLIEST (-2) and EARLIEST_LOCAL (-4) too: a failed part (its search of the log
    # start's batch, or the topic untiered since the split) knows no cutover; answered
    # offset -1 with no error, which a consumer resetting to earliest took for an answer
    for earliest in (-2, -4):
        for code in (56, 6):
            failed = StreamPart(code, current_epoch=7)
            assert combine(earliest, kafka(500, epoch=3), failed) == OffsetsResult(code)


def test_max_timestamp_is_the_larger_of_both_parts_kafka_first_on_a_tie():
    assert combine(MAX_TIMESTAMP, kafka(60, 900), part(Found(800, 120, -1))).offset == 60
    assert combine(MAX_TIMESTAMP, kafka(60, 900), part(Found(900, 120, -1))).offset == 60
    assert combine(MAX_TIMESTAMP, kafka(60, 900), part(Found(901, 120, -1))).offset == 120
    assert combine(MAX_TIMESTAMP, kafka(-1), part(Found(5, 120, -1))).offset == 120
    assert combine(MAX_TIMESTAMP, kafka(-1), part(None)) == OffsetsResult(0)
    # a marker past the cutover holds Kafka's max: not the partition's
    assert combine(MAX_TIMESTAMP, kafka(100, 10**13), part(Found(5, 120, -1))).offset == 120


# -- leader epochs: Kafka's epoch cache for a tiered partition ----------------------------


def test_the_epoch_at_or_past_the_cutover_is_the_current_one_below_it_the_stamped_one():
    assert epoch_at(100, 100, 4, -1) == 4  # every epoch since the cutover starts there
    assert epoch_at(150, 100, 4, 2) == 4  # a producer's epoch in the stream is not Kafka's
    assert epoch_at(99, 100, 4, 2) == 2  # a migrated batch keeps the epoch Kafka stamped


def test_stream_answers_carry_the_current_epoch_kafka_answers_keep_theirs():
    stream = StreamPart(0, cutover=100, log_start=40, found=Found(520, 120, -1), current_epoch=5)
    assert stream.alone(500) == OffsetsResult(0, 520, 120, 5)
    assert stream.alone(-2) == OffsetsResult(0, -1, 40, -1)  # below the cutover: stamped
    assert combine(500, kafka(-1), stream) == OffsetsResult(0, 520, 120, 5)
    assert combine(500, kafka(60, 510, 3), stream) == kafka(60, 510, 3)
    assert combine(MAX_TIMESTAMP, kafka(60, 1), stream) == OffsetsResult(0, 520, 120, 5)
    assert combine(-2, kafka(103), stream) == OffsetsResult(0, -1, 100, 5)
    trimmed = StreamPart(0, cutover=100, log_start=130, current_epoch=5)
    assert trimmed.alone(-2) == OffsetsResult(0, -1, 130, 5)
    assert trimmed.alone(EARLIEST_LOCAL_TIMESTAMP) == OffsetsResult(0, -1, 130, 5)
    migrated = StreamPart(0, cutover=100, log_start=40, current_epoch=5, start_epoch=1)
    assert migrated.alone(-2) == OffsetsResult(0, -1, 40, 1)
    migrated_hit = StreamPart(0, cutover=100, log_start=40, found=Found(7, 60, 1), current_epoch=5)
    assert migrated_hit.alone(500) == OffsetsResult(0, 7, 60, 1)
