"""Record batch headers, checked against kafka-python's own reader on real batch bytes."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.records.batches import (
    HEADER_SIZE,
    BatchHeader,
    Compression,
    CorruptBatchError,
    TruncatedBatchError,
    assign_offsets,
    iter_batches,
    read_batch_header,
    set_base_offset,
    validate_batch,
    whole_batches,
    with_base_offset,
)
from tests.support.batches import NOW_MS, control_batch, patched
from tests.support.batches import build_batch as support_batch
from tests.support.kafka_python import DefaultRecordBatch, MemoryRecords


def build_batch(
    count: int = 3,
    *,
    compression: int = 0,
    producer: tuple[int, int, int] | None = None,
    transactional: bool = False,
    headers: list[tuple[str, bytes]] | None = None,
    value_size: int = 10,
) -> bytes:
    """A batch as a kafka-python producer writes it (base offset 0, leader epoch 0)."""
    producer_id, producer_epoch, base_sequence = producer or (-1, -1, -1)
    return support_batch(
        [bytes([i % 256]) * value_size for i in range(count)],
        keys=[None if i % 3 == 2 else f"key-{i}".encode() for i in range(count)],
        timestamps=[NOW_MS + 7 * i for i in range(count)],
        headers=headers, codec=compression, producer_id=producer_id,
        producer_epoch=producer_epoch, base_sequence=base_sequence, transactional=transactional,
    )  # fmt: skip


BATCHES = {
    "one record": build_batch(1),
    "plain": build_batch(5),
    "empty values and headers": build_batch(4, value_size=0, headers=[("h", b"v"), ("n", b"")]),
    "gzip": build_batch(50, compression=1, value_size=100),
    "idempotent": build_batch(7, producer=(4242, 3, 17)),
    "transactional": build_batch(2, producer=(99, 1, 0), transactional=True),
    "leader epoch set": patched(build_batch(2), 12, ">i", 31, fix_crc=False),
    "log append time": patched(build_batch(2), 21, ">h", 0x08, fix_crc=True),
    "control": control_batch(99, 1, 1, coordinator_epoch=5),
}


def assert_same_as_kafka_python(header: BatchHeader, batch: bytes | memoryview) -> None:
    theirs = DefaultRecordBatch(bytes(batch))
    assert header.base_offset == theirs.base_offset
    assert header.size == theirs.size_in_bytes == len(batch)
    assert header.partition_leader_epoch == theirs.leader_epoch
    assert header.magic == theirs.magic == 2
    assert header.crc == theirs.crc
    assert header.attributes == theirs.attributes
    assert header.last_offset_delta == theirs.last_offset_delta
    assert header.last_offset == theirs.last_offset
    assert header.next_offset == theirs.next_offset
    assert header.base_timestamp == theirs.first_timestamp
    assert header.max_timestamp == theirs.max_timestamp
    assert header.producer_id == theirs.producer_id
    assert header.producer_epoch == theirs.producer_epoch
    assert header.base_sequence == theirs.base_sequence
    assert header.record_count == theirs.records_count
    assert header.codec == theirs.compression_type
    assert header.is_log_append_time == bool(theirs.timestamp_type)
    assert header.is_transactional == theirs.is_transactional
    assert header.is_control == theirs.is_control_batch
    assert theirs.validate_crc()


@pytest.mark.parametrize("name", BATCHES)
def test_header_agrees_with_kafka_python(name):
    batch = BATCHES[name]
    header = read_batch_header(batch)
    assert_same_as_kafka_python(header, batch)
    assert validate_batch(batch) == header


def test_flags_and_codec():
    assert read_batch_header(BATCHES["gzip"]).compression is Compression.GZIP
    assert read_batch_header(BATCHES["plain"]).compression is Compression.NONE
    transactional = read_batch_header(BATCHES["transactional"])
    assert transactional.is_transactional and not transactional.is_control
    control = read_batch_header(BATCHES["control"])
    assert control.is_transactional and control.is_control
    assert read_batch_header(BATCHES["log append time"]).is_log_append_time
    assert read_batch_header(BATCHES["leader epoch set"]).partition_leader_epoch == 31


def test_header_at_a_position_and_size():
    run = BATCHES["plain"] + BATCHES["idempotent"]
    first = read_batch_header(run)
    second = read_batch_header(run, first.size)
    assert first.size == first.batch_length + 12 == len(BATCHES["plain"])
    assert second.producer_id == 4242
    assert HEADER_SIZE == 61


def test_iter_batches_agrees_with_kafka_python_memory_records():
    run = with_base_offset(b"".join(BATCHES.values()), 1000)
    ours = list(iter_batches(memoryview(run)))
    theirs = []
    records = MemoryRecords(bytes(run))
    while (batch := records.next_batch()) is not None:
        theirs.append(batch)
    assert len(ours) == len(theirs) == len(BATCHES)
    expected_base = 1000
    for (header, view), their_batch in zip(ours, theirs, strict=True):
        assert header.base_offset == their_batch.base_offset == expected_base
        assert_same_as_kafka_python(header, view)
        assert [record.offset for record in their_batch] == list(
            range(expected_base, expected_base + header.record_count)
        )
        expected_base = header.next_offset


def test_iter_batches_yields_views_of_the_buffer_not_copies():
    run = bytearray(BATCHES["plain"] * 2)
    (_, first), (_, second) = iter_batches(memoryview(run))
    assert first.obj is run and second.obj is run
    run[len(first)] ^= 0xFF
    assert second[0] == run[len(first)]


def test_empty_records_field_has_no_batches():
    assert list(iter_batches(b"")) == []
    assert whole_batches(b"") == ([], 0)


def test_with_base_offset_copies_once_and_keeps_crcs_valid():
    original = BATCHES["plain"] + BATCHES["gzip"] + BATCHES["idempotent"]
    rebased = with_base_offset(original, 5_000_000_000)
    assert original == BATCHES["plain"] + BATCHES["gzip"] + BATCHES["idempotent"]
    headers = [validate_batch(view) for _, view in iter_batches(rebased)]
    assert [h.base_offset for h in headers] == [5_000_000_000, 5_000_000_005, 5_000_000_055]
    for header, view in iter_batches(rebased):
        assert DefaultRecordBatch(bytes(view)).validate_crc()
        assert header.crc == read_batch_header(view).crc
    # only the 8 base offset bytes of each batch changed
    changed = [i for i, (a, b) in enumerate(zip(original, rebased, strict=True)) if a != b]
    starts = [0, len(BATCHES["plain"]), len(BATCHES["plain"]) + len(BATCHES["gzip"])]
    assert all(any(s <= i < s + 8 for s in starts) for i in changed)


def test_assign_offsets_in_place_returns_the_next_offset():
    run = bytearray(BATCHES["plain"] * 3)
    assert assign_offsets(run, 10) == 25
    assert [h.base_offset for h, _ in iter_batches(run)] == [10, 15, 20]
    set_base_offset(run, len(BATCHES["plain"]), 7)
    assert read_batch_header(run, len(BATCHES["plain"])).base_offset == 7
    validate_batch(memoryview(run)[: len(BATCHES["plain"])])


def test_every_single_byte_change_is_caught_except_in_fields_the_crc_skips():
    """The CRC covers attributes onwards; magic, length and CRC are checked on their own.
    Only the base offset and the leader epoch, which the broker assigns, are unguarded."""
    batch = BATCHES["idempotent"]
    unguarded = set(range(0, 8)) | set(range(12, 16))
    for position in range(len(batch)):
        damaged = bytearray(batch)
        damaged[position] ^= 0x5A
        if position in unguarded:
            validate_batch(damaged)
            continue
        with pytest.raises(CorruptBatchError) as caught:
            validate_batch(damaged, position=4096)
        assert caught.value.position == 4096
        assert "record batch at byte 4096" in str(caught.value)


def test_corruption_messages_say_what_is_wrong():
    batch = BATCHES["plain"]
    with pytest.raises(CorruptBatchError, match=r"at byte 40: CRC-32C mismatch.*bytes 61\.\."):
        validate_batch(bytes(batch[:-1]) + bytes([batch[-1] ^ 1]), position=40)
    with pytest.raises(CorruptBatchError, match="magic is 1"):
        validate_batch(patched(batch, 16, ">b", 1, fix_crc=False))
    with pytest.raises(CorruptBatchError, match="unknown compression codec 5"):
        validate_batch(patched(batch, 21, ">h", 5, fix_crc=True))
    with pytest.raises(CorruptBatchError, match="negative last offset delta"):
        validate_batch(patched(batch, 23, ">i", -1, fix_crc=True))
    with pytest.raises(CorruptBatchError, match="negative record count"):
        validate_batch(patched(batch, 57, ">i", -2, fix_crc=True))
    with pytest.raises(CorruptBatchError, match="below the minimum 49"):
        read_batch_header(patched(batch, 8, ">i", 48, fix_crc=False))
    with pytest.raises(CorruptBatchError, match="batch length says"):
        validate_batch(batch + b"\x00")
    assert issubclass(CorruptBatchError, ValueError)


def test_validate_reports_a_truncated_batch_at_the_callers_position():
    with pytest.raises(TruncatedBatchError, match="record batch at byte 77"):
        validate_batch(BATCHES["plain"][:-3], position=77)


def test_a_truncated_run_fails_at_the_cut_batch_and_whole_batches_stops_before_it():
    first, second = BATCHES["plain"], BATCHES["gzip"]
    run = first + second
    for cut in range(len(first) + 1, len(run)):
        with pytest.raises(TruncatedBatchError) as caught:
            list(iter_batches(run[:cut]))
        assert caught.value.position == len(first)
        batches, end = whole_batches(run[:cut])
        assert end == len(first)
        assert [bytes(view) for _, view in batches] == [first]
    for cut in range(1, len(first)):
        with pytest.raises(TruncatedBatchError):
            list(iter_batches(run[:cut]))
        assert whole_batches(run[:cut]) == ([], 0)
    batches, end = whole_batches(run)
    assert end == len(run) and len(batches) == 2


def test_whole_batches_still_refuses_corruption():
    run = BATCHES["plain"] + patched(BATCHES["plain"], 16, ">b", 0, fix_crc=False)
    with pytest.raises(CorruptBatchError, match=f"at byte {len(BATCHES['plain'])}: magic is 0"):
        whole_batches(run)


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.binary(max_size=200), position=st.integers(0, 10_000))
def test_random_bytes_only_ever_raise_corrupt_batch_error(data, position):
    for attempt in (
        lambda: list(iter_batches(data)),
        lambda: whole_batches(data),
        lambda: validate_batch(data, position),
        lambda: read_batch_header(data, min(position, len(data))),
    ):
        try:
            attempt()
        except CorruptBatchError:
            pass


@settings(max_examples=300, deadline=None)
@given(
    position=st.integers(0, len(BATCHES["plain"]) - 1),
    value=st.integers(0, 255),
    prefix=st.sampled_from([b"", BATCHES["control"]]),
)
def test_mutated_runs_only_ever_raise_corrupt_batch_error(position, value, prefix):
    damaged = bytearray(prefix + BATCHES["plain"])
    damaged[len(prefix) + position] = value
    try:
        for index, (_, view) in enumerate(iter_batches(damaged)):
            validate_batch(view, index)
    except CorruptBatchError:
        pass
