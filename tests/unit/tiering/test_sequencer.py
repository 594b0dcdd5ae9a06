"""The partition sequencer, on real batches built by kafka-python's producer code."""

from __future__ import annotations

import struct

import crc32c
import pytest
from kio.schema.errors import ErrorCode

from proxy.partition.producer_snapshot import (
    CorruptSnapshotError,
    decode_snapshot,
    encode_snapshot,
    read_snapshot,
)
from proxy.partition.producer_state import INT32_MAX, BatchMetadata, ProducerStateEntry
from proxy.partition.sequencer import (
    Duplicate,
    PartitionSequencer,
    PendingAppend,
    Rejected,
)
from proxy.records.batches import iter_batches, read_batch_header, validate_batch
from tests.support.batches import build_batch, patched
from tests.support.kafka_python import DefaultRecordBatch

NOW = 1_700_000_000_000
PID = 4242


def batch(
    count: int = 3,
    *,
    pid: int = -1,
    epoch: int = -1,
    seq: int = -1,
    transactional: bool = False,
    compression: int = 0,
) -> bytes:
    """A batch as a kafka-python producer writes it (base offset 0)."""
    return build_batch(
        [b"v" * 10] * count, keys=[b"k%d" % i for i in range(count)], codec=compression,
        producer_id=pid, producer_epoch=epoch, base_sequence=seq, transactional=transactional,
    )  # fmt: skip


def idem(seq: int, count: int = 3, *, epoch: int = 0, pid: int = PID) -> bytes:
    return batch(count, pid=pid, epoch=epoch, seq=seq)


def appended(sequencer: PartitionSequencer, records: bytes, now: int = NOW) -> PendingAppend:
    """Append and commit, as the owner task does once the WAL write is durable."""
    result = sequencer.append(records, now)
    assert isinstance(result, PendingAppend), result
    assert sequencer.commit(result) is ErrorCode.none
    return result


def rejected(sequencer: PartitionSequencer, records: bytes, code: ErrorCode) -> Rejected:
    before = state_of(sequencer)
    result = sequencer.append(records, NOW)
    assert isinstance(result, Rejected), result
    assert result.error_code is code, result.message
    assert state_of(sequencer) == before  # nothing changed
    return result


def state_of(sequencer: PartitionSequencer):
    return (
        sequencer.high_watermark,
        sequencer.log_end_offset,
        dict(sequencer.producer_states),
        sequencer.pending,
        {pid: sequencer.producer_state(pid) for pid in (PID, PID + 1)},
    )


# -- offsets ---------------------------------------------------------------------------


def test_offsets_are_assigned_from_the_log_end_in_one_copy():
    sequencer = PartitionSequencer(1000)
    records = batch(5)
    pending = sequencer.append(records, NOW)
    assert isinstance(pending, PendingAppend)
    assert (pending.base_offset, pending.last_offset, pending.next_offset) == (1000, 1004, 1005)
    assert pending.log_append_time_ms == -1
    assert records == batch(5)  # the caller's bytes are not touched
    assert sequencer.log_end_offset == 1005 and sequencer.high_watermark == 1000
    theirs = DefaultRecordBatch(bytes(pending.records))
    assert theirs.base_offset == 1000 and theirs.validate_crc()
    assert [record.offset for record in theirs] == list(range(1000, 1005))
    assert sequencer.commit(pending) is ErrorCode.none
    assert sequencer.high_watermark == sequencer.log_end_offset == 1005
    assert appended(sequencer, batch(1)).base_offset == 1005


def test_several_batches_of_one_partition_get_contiguous_offsets():
    sequencer = PartitionSequencer(0)
    records = batch(2) + batch(3, compression=1) + idem(0, 4)
    pending = appended(sequencer, memoryview(records))
    assert (pending.base_offset, pending.last_offset) == (0, 8)
    bases = [validate_batch(view).base_offset for _, view in iter_batches(pending.records)]
    assert bases == [0, 2, 5]
    assert sequencer.producer_states[PID].batches == (BatchMetadata(3, 8, 3, NOW + 3),)


def test_log_append_time_stamps_each_batch_and_keeps_the_crc_valid():
    sequencer = PartitionSequencer(0, log_append_time=True)
    pending = appended(sequencer, batch(2) + idem(0, 3), now=NOW + 999)
    assert pending.log_append_time_ms == NOW + 999
    for header, view in iter_batches(pending.records):
        assert validate_batch(view) == header
        assert header.is_log_append_time and header.max_timestamp == NOW + 999
        assert header.base_timestamp == NOW
        theirs = DefaultRecordBatch(bytes(view))
        assert theirs.validate_crc() and theirs.timestamp_type == 1
    retry = sequencer.append(idem(0, 3), NOW + 5000)
    assert retry == Duplicate(2, 4, NOW + 999, None)  # the original append time


# -- bad input -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "damage",
    [
        lambda b: b[:-1] + bytes([b[-1] ^ 1]),  # CRC
        lambda b: patched(b, 16, ">b", 1, fix_crc=False),  # magic
        lambda b: b[:-3],  # truncated
        lambda b: patched(b, 8, ">i", 20, fix_crc=False),  # length below a header
        lambda b: patched(b, 21, ">h", 6),  # unknown codec
    ],
    ids=["crc", "magic", "truncated", "length", "codec"],
)
def test_a_corrupt_batch_is_corrupt_message_and_changes_nothing(damage):
    sequencer = PartitionSequencer(7)
    appended(sequencer, idem(0))
    message = rejected(sequencer, idem(3) + damage(idem(6)), ErrorCode.corrupt_message).message
    assert f"record batch at byte {len(idem(3))}" in message


@pytest.mark.parametrize(
    ("records", "words"),
    [
        (b"", "no record batch"),
        (patched(batch(3), 57, ">i", 2), "record count 2"),  # count != last offset delta + 1
        (patched(batch(1), 57, ">i", 0), "record count 0"),
        (patched(batch(3), 21, ">h", 0x30), "control records"),
        (idem(-1), "invalid sequence number -1"),
    ],
    ids=["empty", "count", "zero records", "control", "negative sequence"],
)
def test_batches_kafka_refuses_from_clients_are_invalid_record(records, words):
    assert words in rejected(PartitionSequencer(0), records, ErrorCode.invalid_record).message


# -- idempotent producers --------------------------------------------------------------


def test_sequences_must_follow_on_and_a_gap_is_out_of_order():
    sequencer = PartitionSequencer(0)
    appended(sequencer, idem(0, 3))
    appended(sequencer, idem(3, 2))
    message = rejected(sequencer, idem(6), ErrorCode.out_of_order_sequence_number).message
    assert "6 (incoming seq. number), 4 (current end sequence number)" in message
    rejected(sequencer, idem(4, 1, pid=PID) + idem(6), ErrorCode.out_of_order_sequence_number)
    assert appended(sequencer, idem(5)).base_offset == 5
    entry = sequencer.producer_states[PID]
    assert (entry.producer_epoch, entry.last_seq, entry.last_timestamp) == (0, 7, NOW)


def test_a_retry_of_any_of_the_last_five_gets_its_original_offsets():
    sequencer = PartitionSequencer(100)
    originals = [appended(sequencer, idem(seq, 2)) for seq in range(0, 12, 2)]
    before = state_of(sequencer)
    for seq, original in zip(range(2, 12, 2), originals[1:], strict=True):
        retry = sequencer.append(idem(seq, 2), NOW + 1)
        assert retry == Duplicate(original.base_offset, original.last_offset, -1, None)
    assert state_of(sequencer) == before  # duplicates write nothing, change nothing
    # the sixth most recent is forgotten: it is neither a duplicate nor in sequence
    rejected(sequencer, idem(0, 2), ErrorCode.out_of_order_sequence_number)
    # a batch overlapping a retained one but not the same range is no duplicate
    rejected(sequencer, idem(2, 3), ErrorCode.out_of_order_sequence_number)


def test_an_older_epoch_is_invalid_producer_epoch():
    sequencer = PartitionSequencer(0)
    appended(sequencer, idem(0, epoch=3))
    message = rejected(sequencer, idem(3, epoch=2), ErrorCode.invalid_producer_epoch).message
    assert "epoch 2 of producer 4242 is smaller than the last seen epoch 3" in message
    rejected(sequencer, idem(0, epoch=2), ErrorCode.invalid_producer_epoch)


def test_a_new_epoch_starts_at_sequence_zero_and_forgets_the_old_batches():
    sequencer = PartitionSequencer(0)
    appended(sequencer, idem(0, epoch=1))
    appended(sequencer, idem(3, epoch=1))
    message = rejected(sequencer, idem(6, epoch=2), ErrorCode.out_of_order_sequence_number).message
    assert "new epoch 2" in message
    appended(sequencer, idem(0, epoch=2))
    assert sequencer.producer_states[PID].batches == (BatchMetadata(2, 8, 2, NOW + 2),)
    rejected(sequencer, idem(3, epoch=1), ErrorCode.invalid_producer_epoch)  # old retry
    assert appended(sequencer, idem(3, epoch=2)).base_offset == 9


def test_an_unknown_producer_id_is_accepted_at_any_sequence_as_kafka_does_since_kip_360():
    sequencer = PartitionSequencer(0, [ProducerStateEntry(PID + 1, 0, NOW, ())])
    assert appended(sequencer, idem(57, epoch=4)).base_offset == 0
    assert sequencer.producer_states[PID].last_seq == 59
    rejected(sequencer, idem(61, epoch=4), ErrorCode.out_of_order_sequence_number)
    # a known producer with no retained batch (seen only in markers) starts at 0, as in
    # Kafka (a transaction carried across the cutover is seeded with its batches)
    rejected(sequencer, idem(5, pid=PID + 1), ErrorCode.out_of_order_sequence_number)
    appended(sequencer, idem(0, pid=PID + 1))
    rejected(sequencer, idem(9, pid=PID + 1), ErrorCode.out_of_order_sequence_number)
    # a new epoch still starts at 0
    rejected(sequencer, idem(5, pid=PID + 1, epoch=1), ErrorCode.out_of_order_sequence_number)


def test_sequences_wrap_from_int32_max_to_zero():
    top = INT32_MAX - 1
    sequencer = PartitionSequencer(0)
    appended(sequencer, idem(top - 3, 3))  # unknown producer: any sequence
    across = appended(sequencer, idem(top, 3))  # sequences INT32_MAX - 1, INT32_MAX, 0
    assert sequencer.producer_states[PID].last_seq == 0
    assert sequencer.producer_states[PID].batches[-1].first_seq == top
    assert sequencer.append(idem(top, 3), NOW) == Duplicate(3, 5, -1, None)
    assert appended(sequencer, idem(1, 1)).base_offset == across.next_offset
    rejected(sequencer, idem(0, 1), ErrorCode.out_of_order_sequence_number)


def test_batches_of_one_request_are_checked_in_order_and_all_or_nothing():
    sequencer = PartitionSequencer(0)
    appended(
        sequencer, idem(0, 2, pid=PID + 1) + idem(0) + idem(3) + batch(1) + idem(2, pid=PID + 1)
    )
    assert sequencer.producer_states[PID].last_seq == 5
    assert sequencer.producer_states[PID + 1].last_seq == 4
    assert sequencer.log_end_offset == 12
    # the second batch is out of order once the first is counted: nothing is written
    rejected(sequencer, idem(6) + idem(10), ErrorCode.out_of_order_sequence_number)
    rejected(sequencer, idem(6) + idem(6), ErrorCode.invalid_record)  # the same batch twice
    rejected(sequencer, idem(6) + idem(9, epoch=-5), ErrorCode.invalid_producer_epoch)
    opens = batch(2, transactional=True, pid=PID + 2, epoch=0, seq=0)  # opens a transaction
    rejected(sequencer, idem(6) + opens + idem(2, pid=PID + 2), ErrorCode.invalid_txn_state)


def test_a_request_of_retries_only_is_a_duplicate_a_mix_is_refused():
    sequencer = PartitionSequencer(0)
    appended(sequencer, idem(0) + idem(3))
    appended(sequencer, idem(6))
    assert sequencer.append(idem(3) + idem(6), NOW) == Duplicate(3, 8, -1, None)
    assert sequencer.append(idem(0) + idem(3) + idem(6), NOW) == Duplicate(0, 8, -1, None)
    rejected(sequencer, idem(0) + idem(6), ErrorCode.invalid_record)  # not adjacent
    rejected(sequencer, idem(6) + idem(9), ErrorCode.invalid_record)  # retry and new
    rejected(sequencer, idem(6) + batch(1), ErrorCode.invalid_record)


def test_non_idempotent_batches_are_never_checked():
    sequencer = PartitionSequencer(0)
    for _ in range(3):
        appended(sequencer, batch(2))
    assert sequencer.log_end_offset == 6 and not sequencer.producer_states


# -- pending, commit, abort -------------------------------------------------------------


def test_an_append_is_checked_against_the_pending_ones_before_it():
    sequencer = PartitionSequencer(0)
    first = sequencer.append(idem(0), NOW)
    second = sequencer.append(idem(3), NOW + 1)
    assert isinstance(first, PendingAppend) and isinstance(second, PendingAppend)
    assert (second.base_offset, sequencer.log_end_offset, sequencer.high_watermark) == (3, 6, 0)
    assert sequencer.producer_states == {} and sequencer.pending == (first, second)
    assert sequencer.producer_state(PID).last_seq == 5
    with pytest.raises(ValueError, match="oldest pending"):
        sequencer.commit(second)
    assert sequencer.commit(first) is ErrorCode.none
    assert sequencer.high_watermark == 3 and sequencer.producer_states[PID].last_seq == 2
    assert sequencer.commit(second) is ErrorCode.none
    assert sequencer.producer_states[PID].last_seq == 5 and sequencer.pending == ()
    with pytest.raises(ValueError, match="oldest pending"):
        sequencer.commit(second)


def test_a_retry_of_a_pending_batch_waits_for_it():
    sequencer = PartitionSequencer(0)
    first = sequencer.append(idem(0), NOW)
    second = sequencer.append(idem(3), NOW)
    assert sequencer.append(idem(3), NOW) == Duplicate(3, 5, -1, second)
    assert sequencer.append(idem(0), NOW) == Duplicate(0, 2, -1, first)
    sequencer.commit(first)
    assert sequencer.append(idem(0), NOW) == Duplicate(0, 2, -1, None)
    assert sequencer.append(idem(0) + idem(3), NOW) == Duplicate(0, 5, -1, second)


def test_abort_fences_the_sequencer_and_never_reuses_an_offset():
    sequencer = PartitionSequencer(0)
    appended(sequencer, idem(0))
    first = sequencer.append(idem(3), NOW)
    second = sequencer.append(idem(6), NOW)
    sequencer.abort(first)
    assert sequencer.fenced and sequencer.pending == ()
    assert sequencer.high_watermark == 3 and sequencer.log_end_offset == 9
    assert sequencer.producer_states[PID].last_seq == 2
    result = sequencer.append(batch(1), NOW)
    assert isinstance(result, Rejected) and result.error_code is ErrorCode.kafka_storage_error
    assert sequencer.commit(second) is ErrorCode.kafka_storage_error  # its write landed too late
    sequencer.abort(second)  # every failed write may be aborted
    assert sequencer.log_end_offset == 9
    with pytest.raises(RuntimeError, match="before it appends"):
        sequencer.replay(read_batch_header(idem(9)))


def test_abort_and_commit_refuse_what_is_not_their_pending_append():
    sequencer = PartitionSequencer(0)
    other = PartitionSequencer(0).append(batch(1), NOW)
    assert isinstance(other, PendingAppend)
    with pytest.raises(ValueError, match="pending append of this sequencer"):
        sequencer.abort(other)
    with pytest.raises(ValueError, match="oldest pending"):
        sequencer.commit(other)
    assert not sequencer.fenced


# -- expiration ------------------------------------------------------------------------


def test_producers_unused_for_the_expiration_time_are_dropped():
    sequencer = PartitionSequencer(0, producer_id_expiration_ms=1000)
    appended(sequencer, idem(0), now=NOW)
    appended(sequencer, idem(0, pid=PID + 1), now=NOW + 500)
    assert sequencer.expire(NOW + 999) == []
    pending = sequencer.append(idem(3), NOW + 999)
    assert sequencer.expire(NOW + 1500) == [PID + 1]  # PID has an append pending
    sequencer.commit(pending)
    assert sequencer.expire(NOW + 1998) == []
    assert sequencer.expire(NOW + 1999) == [PID]
    assert sequencer.producer_states == {}
    # forgotten: a retry is written again and any sequence is accepted (as in Kafka)
    assert isinstance(sequencer.append(idem(3), NOW + 2000), PendingAppend)


def test_the_expiration_time_defaults_to_kafkas_day():
    sequencer = PartitionSequencer(0)
    assert sequencer.producer_id_expiration_ms == 86_400_000
    appended(sequencer, idem(0), now=NOW)
    assert sequencer.expire(NOW + 86_399_999) == []
    assert sequencer.expire(NOW + 86_400_000) == [PID]


# -- snapshot, restore, replay ---------------------------------------------------------


def busy_sequencer() -> PartitionSequencer:
    sequencer = PartitionSequencer(50)
    for seq in range(0, 21, 3):
        appended(sequencer, idem(seq), now=NOW + seq)
    appended(sequencer, idem(0, 2, epoch=7, pid=PID + 1) + batch(4), now=NOW + 100)
    return sequencer


def test_snapshot_and_restore_keep_the_committed_state():
    original = busy_sequencer()
    pending = original.append(idem(21), NOW)
    data = original.snapshot()
    restored = PartitionSequencer.restore(data, original.high_watermark)
    assert restored.producer_states == original.producer_states
    assert restored.high_watermark == restored.log_end_offset == original.high_watermark
    assert restored.producer_state_end == original.high_watermark
    assert restored.snapshot() == data
    assert isinstance(pending, PendingAppend)  # a pending append is not in a snapshot
    for seq in (9, 12, 15, 18):
        assert restored.append(idem(seq), NOW) == original.append(idem(seq), NOW)
    # the original's pending append pushed seq 6 out of its last five, not the snapshot's
    assert isinstance(original.append(idem(6), NOW), Rejected)
    assert restored.append(idem(6), NOW) == Duplicate(56, 58, -1, None)
    result = restored.append(idem(21), NOW)
    assert isinstance(result, PendingAppend) and result.base_offset == pending.base_offset


def test_the_snapshot_format_is_as_documented():
    entry = ProducerStateEntry(7, 3, 1234, (BatchMetadata(9, 100, 4, 555),), 11, 96)
    data = encode_snapshot(42, [entry], marker_position=3000)
    version, crc = struct.unpack_from(">hI", data)
    assert (version, crc) == (2, crc32c.crc32c(data[6:]))
    assert struct.unpack_from(">qqi", data, 6) == (42, 3000, 1)
    assert struct.unpack_from(">qhqiqb", data, 26) == (7, 3, 1234, 11, 96, 1)
    assert struct.unpack_from(">iqiq", data, 57) == (9, 100, 4, 555)
    assert len(data) == 81
    assert decode_snapshot(data) == (42, [entry])
    assert decode_snapshot(encode_snapshot(0, [])) == (0, [])
    none = ProducerStateEntry(8, 0, 1, ())  # no transaction open, no coordinator epoch
    assert struct.unpack_from(">qqi", encode_snapshot(5, [none]), 6) == (5, -1, 1)
    assert struct.unpack_from(">qhqiqb", encode_snapshot(5, [none]), 26) == (8, 0, 1, -1, -1, 0)


def test_version_3_adds_the_markers_end_and_the_expected_markers():
    entry = ProducerStateEntry(7, 3, 1234, (BatchMetadata(9, 100, 4, 555),), 11, 96)
    data = encode_snapshot(42, [entry], 3000, markers_end=50, expected=[(8, 1, 77)])
    version, crc = struct.unpack_from(">hI", data)
    assert (version, crc) == (3, crc32c.crc32c(data[6:]))
    assert struct.unpack_from(">qqqi", data, 6) == (42, 3000, 50, 1)
    assert struct.unpack_from(">qhqiqb", data, 34) == (7, 3, 1234, 11, 96, 1)
    assert struct.unpack_from(">iqiq", data, 65) == (9, 100, 4, 555)
    assert struct.unpack_from(">iqhq", data, 89) == (1, 8, 1, 77)
    assert len(data) == 111
    snapshot = read_snapshot(data)
    assert (snapshot.offset, snapshot.markers_end, snapshot.expected) == (42, 50, ((8, 1, 77),))
    assert snapshot.entries == [entry]
    # written as version 2 when version 3 adds nothing; read as markers end = offset
    same = encode_snapshot(42, [entry], 3000, markers_end=42)
    assert same == encode_snapshot(42, [entry], 3000) and same[:2] == b"\x00\x02"
    assert read_snapshot(same).markers_end == 42
    with pytest.raises(ValueError, match="below the snapshot's offset"):
        encode_snapshot(42, [], markers_end=41)

    def changed(at: int, fmt: str, value: int) -> bytes:  # a field changed, its CRC made again
        out = bytearray(data)
        struct.pack_into(fmt, out, at, value)
        struct.pack_into(">I", out, 2, crc32c.crc32c(out[6:]))
        return bytes(out)

    with pytest.raises(CorruptSnapshotError, match="markers end 41 below it"):
        read_snapshot(changed(22, ">q", 41))
    with pytest.raises(CorruptSnapshotError, match="cut short"):
        read_snapshot(changed(89, ">i", 2))


@pytest.mark.parametrize(
    ("damage", "words"),
    [
        (lambda d: d[:-1], "CRC-32C mismatch"),
        (lambda d: d[:5], "too short"),
        (lambda d: patched(d, 0, ">h", 4, fix_crc=False), "version 4"),
        (lambda d: d[:6] + bytes([d[6] ^ 1]) + d[7:], "CRC-32C mismatch"),
    ],
)
def test_a_damaged_snapshot_is_refused(damage, words):
    data = busy_sequencer().snapshot()
    with pytest.raises(CorruptSnapshotError, match=words):
        PartitionSequencer.restore(damage(data), 10_000)


def test_a_snapshot_past_the_log_end_is_refused():
    sequencer = busy_sequencer()
    with pytest.raises(ValueError, match="past the log end"):
        PartitionSequencer.restore(sequencer.snapshot(), sequencer.high_watermark - 1)


def committed_headers(pendings: list[PendingAppend]):
    return [header for p in pendings for header, _ in iter_batches(p.records)]


def test_replay_rebuilds_the_producer_state_from_batch_headers():
    original = PartitionSequencer(50)
    appends = [(appended(original, idem(seq), now=NOW + seq), NOW + seq) for seq in range(0, 21, 3)]
    mixed = idem(0, 2, epoch=7, pid=PID + 1) + batch(4)
    appends.append((appended(original, mixed, now=NOW + 5), NOW + 5))
    rebuilt = PartitionSequencer(50)
    for pending, now in appends:
        for header, _ in iter_batches(pending.records):
            assert rebuilt.replay(header, now)
    assert rebuilt.high_watermark == rebuilt.log_end_offset == original.high_watermark
    assert rebuilt.producer_states == original.producer_states
    assert rebuilt.snapshot() == original.snapshot()
    assert rebuilt.append(idem(18), NOW) == Duplicate(68, 70, -1, None)


def test_restore_then_replay_the_tail_then_append():
    original = PartitionSequencer(0)
    appended(original, idem(0))
    data = original.snapshot()
    tail = [appended(original, idem(seq)) for seq in (3, 6)]
    headers = committed_headers(tail)
    restored = PartitionSequencer.restore(data, 3)
    assert restored.producer_state_end == 3
    with pytest.raises(RuntimeError, match="replay the batches in between"):
        PartitionSequencer.restore(data, 6).append(idem(9), NOW)
    # batches from before the snapshot are skipped; the tail moves the log end
    assert not restored.replay(read_batch_header(appended(PartitionSequencer(0), idem(0)).records))
    assert [restored.replay(h, NOW) for h in headers] == [True, True]
    assert restored.high_watermark == 9 and restored.producer_state_end == 9
    assert restored.producer_states[PID].batches == original.producer_states[PID].batches
    assert restored.append(idem(6), NOW) == Duplicate(6, 8, -1, None)
    assert appended(restored, idem(9)).base_offset == 9


def test_replay_refuses_a_batch_straddling_the_state_end_and_ignores_older_epochs():
    sequencer = PartitionSequencer(5)
    straddling = read_batch_header(patched(idem(0), 0, ">q", 3, fix_crc=False))
    with pytest.raises(ValueError, match="straddles"):
        sequencer.replay(straddling)
    sequencer.replay(read_batch_header(patched(idem(0, epoch=2), 0, ">q", 5, fix_crc=False)))
    sequencer.replay(read_batch_header(patched(idem(3, epoch=1), 0, ">q", 8, fix_crc=False)))
    entry = sequencer.producer_states[PID]
    assert (entry.producer_epoch, entry.last_seq, sequencer.log_end_offset) == (2, 2, 11)
    assert entry.last_timestamp == NOW + 2  # the batch's max timestamp when no clock is given
    # a control batch of a newer epoch (a transaction marker) bumps the epoch
    marker = patched(patched(idem(-1, 1, epoch=3), 21, ">h", 0x30), 0, ">q", 11, fix_crc=False)
    sequencer.replay(read_batch_header(marker), NOW)
    assert sequencer.producer_states[PID] == ProducerStateEntry(PID, 3, NOW, ())


# -- misuse and names ------------------------------------------------------------------


def test_settings_are_checked():
    with pytest.raises(ValueError, match="log_end_offset"):
        PartitionSequencer(-1)
    with pytest.raises(ValueError, match="producer_id_expiration_ms"):
        PartitionSequencer(0, producer_id_expiration_ms=0)
