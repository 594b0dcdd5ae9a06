"""Transactions in the partition sequencer: Kafka's ProducerAppendInfo rules for
transactional batches and markers, the last stable offset, the marker follower's
position, the snapshot (v2, v1 still read) and the rebuild by replay."""

from __future__ import annotations

import struct

import crc32c
import pytest
from kio.schema.errors import ErrorCode
from test_sequencer import NOW, PID, appended, batch, idem, rejected

from proxy.partition.appends import CompletedTxn
from proxy.partition.producer_snapshot import read_snapshot
from proxy.partition.producer_state import ProducerStateEntry
from proxy.partition.sequencer import PartitionSequencer, PendingAppend, Rejected
from proxy.records.batches import iter_batches, validate_batch
from proxy.records.markers import Marker, marker_batch, read_marker

A, B = PID, PID + 1


def txn(seq: int, count: int = 3, *, pid: int = A, epoch: int = 0) -> bytes:
    return batch(count, pid=pid, epoch=epoch, seq=seq, transactional=True)


def marker(
    pid: int = A, *, commit: bool = True, epoch: int = 0, coordinator: int = 5, at: int = 0
) -> Marker:
    """A marker at upstream offset 2000 + `at`, its timestamp NOW + `at`."""
    return Marker(pid, epoch, coordinator, commit, NOW + at, 2000 + at)


def ended(sequencer: PartitionSequencer, m: Marker) -> PendingAppend:
    """Append and commit a marker, as the owner does once its write is durable."""
    result = sequencer.append_marker(m, NOW)
    assert isinstance(result, PendingAppend), result
    assert sequencer.commit(result) is ErrorCode.none
    return result


def skipped(sequencer: PartitionSequencer, m: Marker, code: ErrorCode) -> Rejected:
    end = sequencer.log_end_offset
    result = sequencer.append_marker(m, NOW)
    assert isinstance(result, Rejected), result
    assert result.error_code is code, result.message
    assert sequencer.log_end_offset == end  # no offset
    return result


# -- transactional batches --------------------------------------------------------------


def test_the_first_transactional_batch_opens_the_transaction_at_its_offset():
    sequencer = PartitionSequencer(100)
    appended(sequencer, idem(0))
    assert sequencer.last_stable_offset == sequencer.high_watermark == 103
    appended(sequencer, txn(3))
    appended(sequencer, txn(6))
    assert sequencer.open_transactions == {A: 103}
    assert sequencer.producer_states[A].current_txn_first_offset == 103
    assert (sequencer.last_stable_offset, sequencer.high_watermark) == (103, 109)
    # pending appends do not count: the LSO is of the committed state
    pending = sequencer.append(txn(0, pid=B), NOW)
    assert isinstance(pending, PendingAppend)
    assert sequencer.open_transactions == {A: 103}


def test_a_non_transactional_batch_while_a_transaction_is_open_is_invalid_txn_state():
    sequencer = PartitionSequencer(0)
    appended(sequencer, txn(0))
    message = rejected(sequencer, idem(3), ErrorCode.invalid_txn_state).message
    assert f"producer {A}" in message and "offset 0" in message
    # epoch and sequence rules come first, as in Kafka's appendDataBatch
    rejected(sequencer, idem(9), ErrorCode.out_of_order_sequence_number)
    ended(sequencer, marker())
    assert appended(sequencer, idem(3)).base_offset == 4  # after the marker, allowed


def test_a_retried_transactional_batch_is_a_duplicate_and_sequences_go_on_across_transactions():
    sequencer = PartitionSequencer(0)
    first = appended(sequencer, txn(0))
    retry = sequencer.append(txn(0), NOW)
    assert (retry.base_offset, retry.last_offset) == (first.base_offset, first.last_offset)
    ended(sequencer, marker())
    # transactions v1: the next transaction keeps the epoch and goes on with the sequence
    assert appended(sequencer, txn(3)).base_offset == 4
    assert sequencer.open_transactions == {A: 4}
    rejected(sequencer, txn(9), ErrorCode.out_of_order_sequence_number)
    assert isinstance(sequencer.append(txn(0), NOW), type(retry))  # still a retry


# -- markers ----------------------------------------------------------------------------


def test_a_marker_is_appended_as_kafkas_control_batch_and_ends_the_transaction():
    sequencer = PartitionSequencer(10)
    appended(sequencer, txn(0))
    m = marker(commit=False)
    pending = sequencer.append_marker(m, NOW)
    assert isinstance(pending, PendingAppend)
    assert bytes(pending.records) == bytes(marker_batch(m, 13))
    assert (pending.base_offset, pending.last_offset, pending.marker) == (13, 13, m)
    assert pending.completed == CompletedTxn(A, 10, 13, aborted=True)
    assert sequencer.last_stable_offset == 10  # until the marker's append commits
    assert sequencer.marker_position is None
    assert sequencer.commit(pending) is ErrorCode.none
    assert sequencer.last_stable_offset == sequencer.high_watermark == 14
    assert sequencer.open_transactions == {}
    assert sequencer.marker_position == 2001
    entry = sequencer.producer_states[A]
    assert (entry.coordinator_epoch, entry.last_seq, entry.current_txn_first_offset) == (5, 2, None)


def test_a_marker_without_a_transaction_here_is_appended_and_completes_nothing():
    sequencer = PartitionSequencer(0)
    pending = ended(sequencer, marker(pid=B, at=3))
    assert pending.completed is None and pending.base_offset == 0
    assert sequencer.producer_states[B] == ProducerStateEntry(B, 0, NOW, (), 5, None)
    assert sequencer.marker_position == 2004


def test_marker_then_data_opens_a_new_transaction_at_the_data():
    sequencer = PartitionSequencer(0)
    appended(sequencer, txn(0))
    ended(sequencer, marker())
    appended(sequencer, txn(3))
    assert sequencer.open_transactions == {A: 4}
    assert sequencer.last_stable_offset == 4


def test_the_last_stable_offset_with_interleaved_producers():
    sequencer = PartitionSequencer(0)
    appended(sequencer, txn(0))  # A: 0-2
    appended(sequencer, txn(0, pid=B))  # B: 3-5
    appended(sequencer, txn(3))  # A: 6-8
    assert sequencer.last_stable_offset == 0
    ended(sequencer, marker(at=0))  # A commits: 9
    assert (sequencer.last_stable_offset, sequencer.open_transactions) == (3, {B: 3})
    appended(sequencer, txn(6))  # A again: 10-12
    assert sequencer.last_stable_offset == 3
    ended(sequencer, marker(pid=B, commit=False, at=1))  # B aborts: 13
    assert (sequencer.last_stable_offset, sequencer.open_transactions) == (10, {A: 10})
    ended(sequencer, marker(at=2))
    assert sequencer.last_stable_offset == sequencer.high_watermark == 15


def test_a_marker_of_an_older_epoch_is_skipped_and_a_newer_one_fences_the_old_epoch():
    sequencer = PartitionSequencer(0)
    appended(sequencer, txn(0, epoch=3))
    skipped(sequencer, marker(epoch=2), ErrorCode.invalid_producer_epoch)
    assert sequencer.open_transactions == {A: 0}
    assert sequencer.marker_position == 2001  # considered: the follower goes on past it
    # fencing (InitProducerId by a second instance): the coordinator aborts with epoch + 1
    pending = ended(sequencer, marker(epoch=4, commit=False, at=1))
    assert pending.completed == CompletedTxn(A, 0, 3, aborted=True)
    assert sequencer.producer_states[A].batches == ()  # the new epoch forgets the old's
    # a zombie batch of the old epoch after the marker
    rejected(sequencer, txn(3, epoch=3), ErrorCode.invalid_producer_epoch)
    assert appended(sequencer, txn(0, epoch=4)).base_offset == 4


def test_a_marker_of_an_older_coordinator_epoch_is_transaction_coordinator_fenced():
    sequencer = PartitionSequencer(0)
    appended(sequencer, txn(0))
    ended(sequencer, marker(coordinator=7, at=0))
    appended(sequencer, txn(3))
    message = skipped(
        sequencer, marker(coordinator=6, at=1), ErrorCode.transaction_coordinator_fenced
    )
    assert "6 (zombie), 7 (current)" in message.message
    assert sequencer.open_transactions == {A: 4}
    ended(sequencer, marker(coordinator=7, at=2))  # the same coordinator epoch is fine
    assert sequencer.producer_states[A].coordinator_epoch == 7


def test_a_skipped_marker_moves_the_position_only_once_what_is_pending_before_it_commits():
    sequencer = PartitionSequencer(0)
    appended(sequencer, txn(0, epoch=1))
    first = sequencer.append_marker(marker(epoch=1, at=0), NOW)
    data = sequencer.append(txn(3, epoch=1), NOW)
    skipped(sequencer, marker(epoch=0, at=1), ErrorCode.invalid_producer_epoch)
    assert sequencer.marker_position is None
    sequencer.commit(first)
    assert sequencer.marker_position == 2001
    sequencer.commit(data)
    assert sequencer.marker_position == 2002
    # a marker considered already (the follower read it twice) is skipped, position kept
    skipped(sequencer, marker(epoch=1, at=1), ErrorCode.invalid_request)
    assert sequencer.marker_position == 2002
    assert sequencer.open_transactions == {A: 4}


def test_an_aborted_write_forgets_the_pending_marker_and_a_fenced_sequencer_refuses_markers():
    sequencer = PartitionSequencer(0)
    appended(sequencer, txn(0))
    pending = sequencer.append_marker(marker(), NOW)
    sequencer.abort(pending)
    skipped(sequencer, marker(at=1), ErrorCode.kafka_storage_error)
    assert sequencer.marker_position is None and sequencer.open_transactions == {A: 0}


def test_a_producer_known_only_from_a_marker_starts_at_sequence_zero_as_in_kafka():
    """A transaction carried across the cutover is seeded with its batches (carried.py):
    no special case for a producer the stream saw only in a marker."""
    sequencer = PartitionSequencer(0)
    ended(sequencer, marker())
    rejected(sequencer, txn(57), ErrorCode.out_of_order_sequence_number)
    assert appended(sequencer, txn(0)).base_offset == 1


def test_on_a_log_append_time_topic_the_marker_keeps_kafkas_append_time():
    sequencer = PartitionSequencer(0, log_append_time=True)
    m = marker(at=9)
    pending = ended(sequencer, m)
    header = validate_batch(pending.records)
    assert (header.is_log_append_time, header.max_timestamp) == (True, NOW + 9)
    assert pending.log_append_time_ms == NOW + 9
    assert read_marker(pending.records) == Marker(A, 0, 5, True, NOW + 9, 0)


def test_expiration_never_drops_a_producer_with_an_open_transaction():
    sequencer = PartitionSequencer(0, producer_id_expiration_ms=1000)
    appended(sequencer, txn(0))
    appended(sequencer, idem(0, pid=B))
    assert sequencer.expire(NOW + 10_000) == [B]
    assert sequencer.open_transactions == {A: 0}
    ended(sequencer, marker())
    assert sequencer.expire(NOW + 10_000) == [A]


# -- snapshot and rebuild ---------------------------------------------------------------


def busy() -> PartitionSequencer:
    """A with a transaction open at 4, B's ended by a marker, the follower at 2002."""
    sequencer = PartitionSequencer(0)
    appended(sequencer, txn(0, pid=B))
    ended(sequencer, marker(pid=B, coordinator=9, at=1))
    appended(sequencer, txn(0))
    return sequencer


def test_the_snapshot_keeps_open_transactions_coordinator_epochs_and_the_marker_position():
    sequencer = busy()
    restored = PartitionSequencer.restore(sequencer.snapshot(), 7)
    assert restored.producer_states == sequencer.producer_states
    assert restored.open_transactions == {A: 4}
    assert restored.producer_states[B].coordinator_epoch == 9
    assert (restored.marker_position, restored.replayed_markers) == (2002, ())
    assert restored.last_stable_offset == 4
    skipped(restored, marker(pid=B, coordinator=8, at=5), ErrorCode.transaction_coordinator_fenced)
    rejected(restored, idem(3), ErrorCode.invalid_txn_state)


def test_a_version_1_snapshot_still_reads():
    body = struct.pack(">qi", 42, 1) + struct.pack(">qhqb", A, 3, 1234, 1)
    body += struct.pack(">iqiq", 9, 40, 4, 555)
    data = struct.pack(">hI", 1, crc32c.crc32c(body)) + body
    snapshot = read_snapshot(data)
    assert (snapshot.offset, snapshot.marker_position) == (42, None)
    [entry] = snapshot.entries
    assert (entry.producer_epoch, entry.last_seq, entry.coordinator_epoch) == (3, 9, -1)
    assert entry.current_txn_first_offset is None
    sequencer = PartitionSequencer.restore(data, 42)
    assert sequencer.marker_position is None and sequencer.last_stable_offset == 42


def headers_of(*pendings: PendingAppend):
    return [h for p in pendings for h, _ in iter_batches(p.records)]


def test_replay_rebuilds_transactions_and_lists_the_markers_it_saw():
    live = PartitionSequencer(0)
    appends = [
        appended(live, txn(0)),
        appended(live, txn(0, pid=B)),
        ended(live, marker(at=0)),
        appended(live, txn(3)),
        ended(live, marker(pid=B, commit=False, at=1)),
    ]
    rebuilt = PartitionSequencer(0)
    for header in headers_of(*appends):
        assert rebuilt.replay(header, NOW)
    assert rebuilt.open_transactions == live.open_transactions == {A: 7}
    assert rebuilt.last_stable_offset == 7
    assert rebuilt.replayed_markers == ((A, 0, NOW), (B, 0, NOW + 1))
    assert rebuilt.marker_position is None  # no snapshot: the follower starts at the cutover
    for pid in (A, B):  # all but the coordinator epoch, which the header does not carry
        entry = live.producer_states[pid]
        assert rebuilt.producer_states[pid] == ProducerStateEntry(
            pid, 0, NOW, entry.batches, -1, entry.current_txn_first_offset
        )
    # live markers move the position past the replayed ones
    ended(rebuilt, marker(at=2))
    assert (rebuilt.marker_position, rebuilt.replayed_markers) == (2003, ())


def test_restore_then_replay_keeps_the_snapshot_position_and_lists_the_markers_after_it():
    sequencer = busy()
    snapshot, end = sequencer.snapshot(), sequencer.high_watermark
    tail = [ended(sequencer, marker(at=3)), appended(sequencer, txn(3, pid=B))]
    restored = PartitionSequencer.restore(snapshot, end)
    for header in headers_of(*tail):
        restored.replay(header)
    assert restored.marker_position == 2002
    assert restored.replayed_markers == ((A, 0, NOW + 3),)
    assert restored.open_transactions == sequencer.open_transactions == {B: 8}
    assert restored.producer_states[B].coordinator_epoch == 9  # kept from the snapshot
    assert restored.producer_states[A].coordinator_epoch == -1  # not in the header
    # the follower re-reads 2002 (skipped before: considered, the list's head differs),
    # then 2003: equal to the head, already in the stream
    pending = restored.append_marker(marker(pid=B, coordinator=9, at=4), NOW)
    assert isinstance(pending, PendingAppend) and pending.completed == CompletedTxn(B, 8, 11, False)


@pytest.mark.parametrize("count", [1, 5])
def test_replay_of_an_older_epochs_marker_changes_no_state_but_is_listed(count):
    sequencer = PartitionSequencer(0)
    appended(sequencer, txn(0, count, epoch=2))
    old = bytes(marker_batch(marker(epoch=1), count))
    header = next(h for h, _ in iter_batches(old))
    before = dict(sequencer.producer_states)
    sequencer.replay(header)
    assert dict(sequencer.producer_states) == before
    assert sequencer.replayed_markers == ((A, 1, NOW),)
