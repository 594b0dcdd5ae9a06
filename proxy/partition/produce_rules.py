"""What Kafka refuses on produce, decided per batch for a tiered partition.

A tiered topic must answer a Produce as Kafka would (docs/tiering.md, "What a tiered
partition refuses"). Kafka's checks, in its order, read off its source (apache/kafka
4.1): `ProduceRequest.validateRecords` (KafkaApis), `UnifiedLog.analyzeAndValidateRecords`
and `LogValidator`:

1. the request: exactly one batch per partition, magic 2 (INVALID_RECORD); ZSTD needs
   Produce v7+ (UNSUPPORTED_COMPRESSION_TYPE);
2. the batch: base offset 0 (INVALID_RECORD); its size at most the topic's
   `max.message.bytes` (MESSAGE_TOO_LARGE) and, as it is written whole, `segment.bytes`
   (RECORD_LIST_TOO_LARGE); its CRC (CORRUPT_MESSAGE); record count, control and
   sequence fields (INVALID_RECORD): the sequencer's `appends.refuse_batch` and `validate_batch`;
3. each record: a key on a compacted topic (INVALID_RECORD), and on a CreateTime topic a
   timestamp within [now - `message.timestamp.before.max.ms`, now +
   `message.timestamp.after.max.ms`] (INVALID_TIMESTAMP), both answered with the
   records' `record_errors` (Produce v8+) and Kafka's top-level message.

Per batch, never per record, on the hot path: the after-bound is checked on the batch's
max timestamp (a record is too far ahead exactly when the largest is). The records are
decoded (one batch, decompressed) only to name the refused ones once a batch is refused,
and on every produce when the topic sets `message.timestamp.before.max.ms` (the oldest
record is not in the header) or is compacted (keys are not either). Once a batch is to be
refused for its records, its CRC is checked first, as Kafka's order says.

Pure: no I/O, no asyncio.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import crc32c
from kio.schema.errors import ErrorCode

from proxy.kafka.topic_configs import cleanup_policies, config_number
from proxy.records.batches import (
    ATTRIBUTES_POSITION,
    LOG_OVERHEAD,
    MAGIC_POSITION,
    MIN_BATCH_LENGTH,
    BatchHeader,
    Compression,
    CorruptBatchError,
    read_batch_header,
)
from proxy.records.record_walk import walk_records

__all__ = [
    "CONFIG_KEYS",
    "ProduceRefusal",
    "ProduceRules",
    "check_records",
    "produce_rules",
]


LONG_MAX = 2**63 - 1
_LENGTH = struct.Struct(">i")
_LENGTH_POSITION = 8  # the batch length, after the base offset
_MIN_SIZE = 14  # Kafka's smallest record set entry (a v0 record's overhead)
NO_TIMESTAMP = -1

# The topic configs the rules read (DescribeConfigs names); the legacy
# message.timestamp.difference.max.ms is Kafka 3.x's (removed in 4.0).
CONFIG_KEYS = (
    "message.timestamp.type",
    "message.timestamp.after.max.ms",
    "message.timestamp.before.max.ms",
    "message.timestamp.difference.max.ms",
    "max.message.bytes",
    "segment.bytes",
    "cleanup.policy",
    "compression.type",
)


@dataclass(frozen=True, slots=True)
class ProduceRules:
    """A topic's produce configs as Kafka resolves them (defaults: Kafka 4.1's)."""

    log_append_time: bool = False  # message.timestamp.type=LogAppendTime
    timestamp_before_max_ms: int = LONG_MAX  # unlimited
    timestamp_after_max_ms: int = 3_600_000  # KIP-937's default since Kafka 4.0
    max_message_bytes: int = 1_048_588
    segment_bytes: int = 1_073_741_824
    compact: bool = False  # cleanup.policy holds compact: every record needs a key
    compression_type: str = "producer"

    @property
    def decodes_records(self) -> bool:
        """Whether every batch's records are read: a rule the header cannot answer."""
        checks_before = not self.log_append_time and self.timestamp_before_max_ms < LONG_MAX
        return self.compact or checks_before


def produce_rules(values: Mapping[str, str | None]) -> ProduceRules:
    """The rules from DescribeConfigs' answer (name -> effective value). A value missing
    or unreadable takes Kafka's default."""
    default = ProduceRules()
    difference = config_number(values.get("message.timestamp.difference.max.ms"), LONG_MAX)
    before = config_number(values.get("message.timestamp.before.max.ms"), LONG_MAX)
    after = config_number(
        values.get("message.timestamp.after.max.ms"), default.timestamp_after_max_ms
    )
    return ProduceRules(
        log_append_time=values.get("message.timestamp.type") == "LogAppendTime",
        # Kafka 3.6-3.9: an unset before/after bound falls back to the difference
        timestamp_before_max_ms=difference if before == LONG_MAX else before,
        timestamp_after_max_ms=difference if after == LONG_MAX else after,
        max_message_bytes=config_number(values.get("max.message.bytes"), default.max_message_bytes),
        segment_bytes=config_number(values.get("segment.bytes"), default.segment_bytes),
        compact="compact" in cleanup_policies(values.get("cleanup.policy")),
        compression_type=values.get("compression.type") or default.compression_type,
    )


@dataclass(frozen=True, slots=True)
class ProduceRefusal:
    """A partition's answer to a refused Produce: Kafka's code, its top-level message
    (None where Kafka sends none) and its record errors (batch index, message)."""

    error_code: int
    error_message: str | None = None
    record_errors: tuple[tuple[int, str | None], ...] = ()


def check_records(
    records: bytes | bytearray | memoryview,
    rules: ProduceRules,
    now_ms: int,
    api_version: int,
    partition: str,
) -> ProduceRefusal | None:
    """Kafka's answer to one partition's `records` of a Produce request, or None to go on
    (the sequencer then checks the CRC and the header fields: module docstring).
    `partition` is "topic-index", as Kafka's messages name it."""
    view = memoryview(records).cast("B")
    framing = _one_batch(view)
    if framing is not None:
        return framing
    header = read_batch_header(view)
    view = view[: header.size]
    if header.codec == Compression.ZSTD and api_version < 7:
        return ProduceRefusal(ErrorCode.unsupported_compression_type)
    if header.base_offset != 0:
        return ProduceRefusal(ErrorCode.invalid_record)
    if header.size > rules.max_message_bytes:
        return ProduceRefusal(ErrorCode.message_too_large)
    if not _header_valid(header):
        return None  # refused by the sequencer, before Kafka looks at any record
    refused = _needs_record_check(header, rules, now_ms)
    if not refused and not rules.decodes_records:
        return _after_records(header, view, rules)
    if _crc_wrong(header, view):
        return ProduceRefusal(ErrorCode.corrupt_message)
    try:
        errors = list(_record_errors(header, view, rules, now_ms, partition))
    except CorruptBatchError:
        return ProduceRefusal(ErrorCode.corrupt_message)
    if not errors:
        return _after_records(header, view, rules)
    return _refusal(errors)


def _one_batch(view: memoryview) -> ProduceRefusal | None:
    """ProduceRequest.validateRecords as Kafka's batch iterator reads the bytes: one
    whole magic 2 batch. None: it is one (its header can be read); bytes after it that
    make no whole batch are left to the sequencer (CORRUPT_MESSAGE; Kafka drops them)."""
    if len(view) < LOG_OVERHEAD:
        return ProduceRefusal(ErrorCode.invalid_record)  # no batch at all
    length = _LENGTH.unpack_from(view, _LENGTH_POSITION)[0]
    if length < _MIN_SIZE:
        return ProduceRefusal(ErrorCode.corrupt_message)
    if len(view) < length + LOG_OVERHEAD:
        return ProduceRefusal(ErrorCode.invalid_record)  # no whole batch
    if view[MAGIC_POSITION] != 2:
        return ProduceRefusal(ErrorCode.invalid_record)
    if length < MIN_BATCH_LENGTH:
        return ProduceRefusal(ErrorCode.corrupt_message)
    rest = view[length + LOG_OVERHEAD :]
    if len(rest) >= LOG_OVERHEAD:
        following = _LENGTH.unpack_from(rest, _LENGTH_POSITION)[0]
        if following < _MIN_SIZE:
            return ProduceRefusal(ErrorCode.corrupt_message)
        if len(rest) >= following + LOG_OVERHEAD:
            return ProduceRefusal(ErrorCode.invalid_record)  # more than one batch
    return None


def _header_valid(header: BatchHeader) -> bool:
    """LogValidator.validateBatch, which comes before any record check (the sequencer
    answers these)."""
    count = header.record_count
    return (
        count > 0
        and count == header.last_offset_delta + 1
        and not header.is_control
        and not (header.producer_id >= 0 and header.base_sequence < 0)
    )


def _needs_record_check(header: BatchHeader, rules: ProduceRules, now_ms: int) -> bool:
    """Whether the header alone shows a record Kafka refuses for its timestamp."""
    if header.is_log_append_time:  # a producer's LogAppendTime: only Kafka may set it
        return (
            rules.log_append_time
            or header.max_timestamp == NO_TIMESTAMP
            or (_out_of_range(header.max_timestamp, now_ms, rules))
        )
    if rules.log_append_time or header.max_timestamp == NO_TIMESTAMP:
        return False
    return header.max_timestamp - now_ms > rules.timestamp_after_max_ms


def _out_of_range(timestamp: int, now_ms: int, rules: ProduceRules) -> bool:
    difference = now_ms - timestamp
    return difference > rules.timestamp_before_max_ms or -difference > rules.timestamp_after_max_ms


def _after_records(
    header: BatchHeader, view: memoryview, rules: ProduceRules
) -> ProduceRefusal | None:
    """Kafka's check of the validated batch: one segment holds it whole."""
    if header.size <= rules.segment_bytes:
        return None
    if _crc_wrong(header, view):
        return ProduceRefusal(ErrorCode.corrupt_message)
    return ProduceRefusal(ErrorCode.record_list_too_large)


def _crc_wrong(header: BatchHeader, view: memoryview) -> bool:
    return crc32c.crc32c(view[ATTRIBUTES_POSITION : header.size]) != header.crc


def _record_errors(
    header: BatchHeader, batch: memoryview, rules: ProduceRules, now_ms: int, partition: str
) -> Iterator[tuple[int, int, str]]:
    """(error code, batch index, message) of each record Kafka refuses: its key first,
    then its timestamp (LogValidator.validateRecord)."""
    create_time = not rules.log_append_time
    low = _java_long(now_ms - rules.timestamp_before_max_ms)
    high = _java_long(now_ms + rules.timestamp_after_max_ms)
    records = walk_records(header, batch, sizes=True)
    for index, (delta, timestamp, key_size, value_size) in enumerate(records):
        if rules.compact and key_size < 0:
            message = (
                f"Compacted topic cannot accept message without key in topic partition {partition}"
            )
            yield ErrorCode.invalid_record, index, message
        elif create_time and timestamp != NO_TIMESTAMP:
            if _out_of_range(timestamp, now_ms, rules):
                yield (
                    ErrorCode.invalid_timestamp,
                    index,
                    f"Timestamp {timestamp} of message with offset {delta} is out of range. "
                    f"The timestamp should be within [{low}, {high}]",
                )
        elif header.is_log_append_time:
            record = (
                f"DefaultRecord(offset={delta}, timestamp={timestamp}, "
                f"key={max(key_size, 0)} bytes, value={max(value_size, 0)} bytes)"
            )
            yield (
                ErrorCode.invalid_timestamp,
                index,
                f"Invalid timestamp type in message {record}. Producer should not set "
                "timestamp type to LogAppendTime.",
            )


def _refusal(errors: list[tuple[int, int, str]]) -> ProduceRefusal:
    """LogValidator.processRecordErrors: INVALID_TIMESTAMP if any record's is, else
    INVALID_RECORD naming the first three."""
    record_errors = tuple((index, message) for _, index, message in errors)
    if any(code == ErrorCode.invalid_timestamp for code, _, _ in errors):
        return ProduceRefusal(
            ErrorCode.invalid_timestamp,
            "One or more records have been rejected due to invalid timestamp",
            record_errors,
        )
    shown = ", ".join(
        f"RecordError(batchIndex={index}, message='{message}')"
        for index, message in record_errors[:3]
    )
    return ProduceRefusal(
        ErrorCode.invalid_record,
        f"One or more records have been rejected due to {len(errors)} record errors in total, "
        f"and only showing the first three errors at most: [{shown}]",
        record_errors,
    )


def _java_long(value: int) -> int:
    """`value` as Java's long arithmetic has it (Kafka's message prints the bounds so)."""
    return (value + 2**63) % 2**64 - 2**63
