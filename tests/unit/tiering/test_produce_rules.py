"""What Kafka refuses on produce (produce_rules.py), on batches built by aiokafka's
producer code; the answers are those Kafka 4.1 gives (tests/integration/tiering/
test_tiered_produce_rules.py compares them with a passthrough topic's)."""

from __future__ import annotations

import struct

import crc32c
import pytest
from aiokafka.record.default_records import DefaultRecordBatchBuilder

from proxy.partition.produce_rules import (
    CORRUPT_MESSAGE,
    INVALID_RECORD,
    INVALID_TIMESTAMP,
    LONG_MAX,
    MESSAGE_TOO_LARGE,
    RECORD_LIST_TOO_LARGE,
    UNSUPPORTED_COMPRESSION_TYPE,
    ProduceRules,
    check_records,
    produce_rules,
)
from proxy.records.batches import read_batch_header, set_log_append_time

NOW = 1_700_000_000_000
HOUR = 3_600_000
RULES = ProduceRules()
PARTITION = "t-0"


def batch(timestamps=(NOW, NOW + 1), *, codec: int = 0, keys=None, value=b"v" * 10) -> bytes:
    """A batch as a producer writes it: base offset 0, one record per timestamp."""
    builder = DefaultRecordBatchBuilder(2, codec, 0, -1, -1, -1, 1 << 22)
    for n, ts in enumerate(timestamps):
        key = b"k%d" % n if keys is None else keys[n]
        builder.append(n, timestamp=ts, key=key, value=value, headers=[])
    return bytes(builder.build())


def check(records: bytes, rules: ProduceRules = RULES, api_version: int = 9):
    return check_records(records, rules, NOW, api_version, PARTITION)


def patched(data: bytes, position: int, fmt: str, value: int, *, fix_crc: bool = True) -> bytes:
    out = bytearray(data)
    struct.pack_into(fmt, out, position, value)
    if fix_crc:
        struct.pack_into(">I", out, 17, crc32c.crc32c(out[21:]))
    return bytes(out)


@pytest.mark.parametrize("codec", [0, 1, 2, 3, 4])
def test_records_within_the_bounds_pass_with_every_codec(codec):
    assert check(batch((NOW - 10 * HOUR, NOW, NOW + HOUR), codec=codec)) is None


@pytest.mark.parametrize("codec", [0, 1, 2, 3, 4])
def test_a_record_too_far_ahead_refuses_the_batch_naming_the_record(codec):
    refusal = check(batch((NOW, NOW + 2 * HOUR, NOW + 1), codec=codec))
    assert refusal is not None and refusal.error_code == INVALID_TIMESTAMP
    assert (
        refusal.error_message == "One or more records have been rejected due to invalid timestamp"
    )
    assert refusal.record_errors == (
        (
            1,
            f"Timestamp {NOW + 2 * HOUR} of message with offset 1 is out of range. The "
            f"timestamp should be within [{NOW - LONG_MAX}, {NOW + HOUR}]",
        ),
    )


def test_the_after_bound_is_inclusive_and_the_topic_may_move_it():
    assert check(batch((NOW + HOUR,))) is None
    assert check(batch((NOW + HOUR + 1,))).error_code == INVALID_TIMESTAMP
    wider = ProduceRules(timestamp_after_max_ms=3 * HOUR)
    assert check(batch((NOW + 2 * HOUR,)), wider) is None


def test_the_before_bound_reads_every_record_when_set():
    rules = produce_rules({"message.timestamp.before.max.ms": str(HOUR)})
    assert rules.decodes_records
    # the oldest record is neither the first nor the largest: only the records show it
    refusal = check(batch((NOW, NOW - 2 * HOUR, NOW + 5)), rules)
    assert refusal.error_code == INVALID_TIMESTAMP
    assert [index for index, _ in refusal.record_errors] == [1]
    assert f"within [{NOW - HOUR}, {NOW + HOUR}]" in refusal.record_errors[0][1]
    assert check(batch((NOW - HOUR, NOW)), rules) is None


def test_a_log_append_time_topic_checks_no_timestamp():
    rules = ProduceRules(log_append_time=True, timestamp_before_max_ms=HOUR)
    assert not rules.decodes_records
    assert check(batch((NOW + 10 * HOUR, NOW - 10 * HOUR)), rules) is None


def test_a_producer_may_not_set_log_append_time_on_a_log_append_time_topic():
    data = bytearray(batch((NOW, NOW + 1)))
    header = read_batch_header(data)
    set_log_append_time(data, 0, header, NOW)
    refusal = check(bytes(data), ProduceRules(log_append_time=True))
    assert refusal.error_code == INVALID_TIMESTAMP
    assert [index for index, _ in refusal.record_errors] == [0, 1]
    assert "Producer should not set timestamp type to LogAppendTime" in refusal.record_errors[0][1]
    # on a CreateTime topic its records' timestamps are the max timestamp, checked as such
    assert check(bytes(data)) is None


def test_a_compacted_topic_refuses_records_without_a_key():
    rules = produce_rules({"cleanup.policy": "compact,delete"})
    assert rules.compact and rules.decodes_records
    refusal = check(batch((NOW, NOW, NOW, NOW, NOW), keys=[b"a", None, b"", None, None]), rules)
    assert refusal.error_code == INVALID_RECORD
    message = "Compacted topic cannot accept message without key in topic partition t-0"
    assert refusal.record_errors == ((1, message), (3, message), (4, message))
    shown = ", ".join(f"RecordError(batchIndex={i}, message='{message}')" for i in (1, 3, 4))
    assert refusal.error_message == (
        "One or more records have been rejected due to 3 record errors in total, and only "
        f"showing the first three errors at most: [{shown}]"
    )
    assert check(batch((NOW,), keys=[b""]), rules) is None  # an empty key is a key


def test_a_missing_key_and_a_bad_timestamp_answer_invalid_timestamp():
    rules = ProduceRules(compact=True)
    refusal = check(batch((NOW, NOW + 2 * HOUR), keys=[None, b"k"]), rules)
    assert refusal.error_code == INVALID_TIMESTAMP
    assert [index for index, _ in refusal.record_errors] == [0, 1]


def test_max_message_bytes_refuses_a_larger_batch_before_its_crc():
    data = batch((NOW,), value=b"x" * 2000)
    small = ProduceRules(max_message_bytes=len(data) - 1)
    assert check(data, small).error_code == MESSAGE_TOO_LARGE
    assert check(patched(data, 17, ">I", 0, fix_crc=False), small).error_code == MESSAGE_TOO_LARGE
    assert check(data, ProduceRules(max_message_bytes=len(data))) is None


def test_a_batch_a_segment_cannot_hold_is_record_list_too_large():
    data = batch((NOW,), value=b"x" * 2000)
    rules = ProduceRules(segment_bytes=len(data) - 1)
    assert check(data, rules).error_code == RECORD_LIST_TOO_LARGE
    assert check(patched(data, 17, ">I", 0, fix_crc=False), rules).error_code == CORRUPT_MESSAGE


def test_a_wrong_crc_comes_before_the_records_checks():
    data = patched(batch((NOW + 2 * HOUR,)), 17, ">I", 0, fix_crc=False)
    assert check(data).error_code == CORRUPT_MESSAGE
    # a batch the records do not refuse is left to the sequencer's CRC check
    assert check(patched(batch(), 17, ">I", 0, fix_crc=False)) is None


def test_the_framing_kafka_refuses():
    data = batch()
    assert check(b"").error_code == INVALID_RECORD  # no batch
    assert check(data[:-1]).error_code == INVALID_RECORD  # no whole batch
    assert check(data + data).error_code == INVALID_RECORD  # two batches
    assert check(patched(data, 16, ">b", 1)).error_code == INVALID_RECORD  # magic 1
    assert check(patched(data, 0, ">q", 5)).error_code == INVALID_RECORD  # base offset
    assert check(patched(data, 8, ">i", 13, fix_crc=False)).error_code == CORRUPT_MESSAGE
    assert check(data + data[:20]) is None  # a partial second batch: the sequencer's


def test_zstd_needs_produce_v7():
    data = batch(codec=4)
    assert check(data, api_version=6).error_code == UNSUPPORTED_COMPRESSION_TYPE
    assert check(data, api_version=7) is None


def test_batches_the_sequencer_refuses_are_left_to_it():
    data = batch((NOW + 2 * HOUR, NOW))
    assert check(patched(data, 57, ">i", 5)) is None  # a record count not its delta + 1


def test_configs_as_kafka_describes_them():
    assert produce_rules({}) == ProduceRules()
    rules = produce_rules(
        {
            "message.timestamp.type": "LogAppendTime",
            "message.timestamp.after.max.ms": "1000",
            "message.timestamp.before.max.ms": str(LONG_MAX),
            "max.message.bytes": "2048",
            "segment.bytes": "oops",
            "cleanup.policy": "delete",
            "compression.type": "zstd",
        }
    )
    assert rules == ProduceRules(
        log_append_time=True,
        timestamp_after_max_ms=1000,
        max_message_bytes=2048,
        compression_type="zstd",
    )
    # Kafka 3.x: an unset bound falls back to message.timestamp.difference.max.ms
    legacy = produce_rules(
        {
            "message.timestamp.difference.max.ms": "5000",
            "message.timestamp.after.max.ms": str(LONG_MAX),
            "message.timestamp.before.max.ms": str(LONG_MAX),
        }
    )
    assert legacy.timestamp_before_max_ms == legacy.timestamp_after_max_ms == 5000
