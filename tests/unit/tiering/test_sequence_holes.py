"""SequenceHoles: which sequence gaps the proxy made (docs/sequencer.md, "Gaps the proxy
made"), and the sequencer's description of a gap."""

from __future__ import annotations

import pytest
from kio.schema.errors import ErrorCode

from proxy.partition.producer_state import INT32_MAX
from proxy.partition.rules import refusal, sequence
from proxy.partition.sequence_holes import ProducerBatch, SequenceGap, SequenceHoles, seq_within
from proxy.partition.sequencer import PartitionSequencer, Rejected
from tests.support.batches import build_batch

S = 5  # a stream
PID = 42
NOW = 1_700_000_000_000


def records(seq: int, count: int = 3, *, epoch: int = 0, pid: int = PID) -> bytes:
    return build_batch(
        [b"v"] * count, timestamps=[NOW] * count, producer_id=pid, producer_epoch=epoch,
        base_sequence=seq,
    )  # fmt: skip


def batch(seq: int, count: int = 3, epoch: int = 0) -> ProducerBatch:
    return ProducerBatch(PID, epoch, seq, (seq + count - 1) % (INT32_MAX + 1))


def test_a_batch_is_told_by_its_headers():
    assert ProducerBatch.of(records(6)) == batch(6)
    assert ProducerBatch.of(records(6) + records(9, 2)) == ProducerBatch(PID, 0, 6, 10)
    assert ProducerBatch.of(records(INT32_MAX - 1)) == ProducerBatch(PID, 0, INT32_MAX - 1, 0)
    assert ProducerBatch.of(records(0, pid=-1)) is None  # no producer id: nothing to track
    assert ProducerBatch.of(b"\x00" * 10) is None
    assert ProducerBatch.of(None) is None


def test_sequence_ranges_wrap():
    assert seq_within(3, 3, 6) and seq_within(5, 3, 6) and not seq_within(6, 3, 6)
    assert seq_within(INT32_MAX, INT32_MAX - 1, 2) and seq_within(1, INT32_MAX - 1, 2)
    assert not seq_within(2, INT32_MAX - 1, 2)


def test_a_gap_is_the_proxys_only_if_a_dropped_batch_starts_inside_it():
    holes = SequenceHoles()
    assert not holes.explains(S, SequenceGap(PID, 0, 3, 9))  # nothing dropped: the client's
    holes.dropped(S, batch(6))
    assert holes.explains(S, SequenceGap(PID, 0, 3, 9))
    assert holes.explains(S, SequenceGap(PID, 0, 6, 9))
    assert not holes.explains(S, SequenceGap(PID, 0, 7, 12))  # 6 was filled since
    assert not holes.explains(S, SequenceGap(PID, 0, 3, 6))  # the gap ends before it
    assert not holes.explains(S, SequenceGap(PID, 1, 0, 6))  # another epoch
    assert not holes.explains(S + 1, SequenceGap(PID, 0, 3, 9))  # another stream
    assert not holes.explains(S, SequenceGap(PID + 1, 0, 3, 9))  # another producer
    assert holes.explained == 2


def test_a_delivered_batch_fills_the_holes_up_to_its_last_sequence():
    holes = SequenceHoles()
    for seq in (3, 6, 9):
        holes.dropped(S, batch(seq))
    holes.delivered(S, batch(3, count=6))  # 3..8 appended
    assert not holes.explains(S, SequenceGap(PID, 0, 0, 9))
    assert holes.explains(S, SequenceGap(PID, 0, 9, 12))
    holes.delivered(S, batch(0, epoch=1))  # a newer epoch: the older one's holes are moot
    assert len(holes) == 0


def test_a_newer_epoch_replaces_the_holes_and_an_older_one_is_ignored():
    holes = SequenceHoles()
    holes.dropped(S, batch(6))
    holes.dropped(S, batch(0, epoch=1))
    assert holes.explains(S, SequenceGap(PID, 1, 0, 3))  # rule 7: a new epoch not at 0
    assert not holes.explains(S, SequenceGap(PID, 0, 3, 9))
    holes.dropped(S, batch(12, epoch=0))  # a zombie's: it gets INVALID_PRODUCER_EPOCH
    assert not holes.explains(S, SequenceGap(PID, 0, 3, 15))


def test_a_hand_off_names_the_newest_hole_before_its_batch():
    holes = SequenceHoles()
    assert holes.hole_before(S, batch(9)) == -1
    for seq in (3, 6, 12):
        holes.dropped(S, batch(seq))
    assert holes.hole_before(S, batch(9)) == 6
    assert holes.hole_before(S, batch(6)) == 3  # its own drop is not before it
    assert holes.hole_before(S, batch(9, epoch=1)) == -1
    assert holes.hole_before(S, None) == -1
    wrapped = SequenceHoles()
    wrapped.dropped(S, batch(INT32_MAX - 2))
    assert wrapped.hole_before(S, batch(4)) == INT32_MAX - 2


def test_answers_are_recorded_by_code():
    holes = SequenceHoles()
    for code in (6, 7, 56):
        holes.observe(S, batch(3 * code), code)
    for code in (45, 47, 87, 42, 10):  # the client's own errors: no retry of the same batch
        holes.observe(S, batch(1000 + code), code)
    assert holes.hole_before(S, batch(2000)) == 168
    holes.observe(S, batch(168), 0)
    assert len(holes) == 0


def test_the_table_is_bounded():
    holes = SequenceHoles(per_producer=2, max_producers=3)
    for seq in (3, 6, 9):
        holes.dropped(S, batch(seq))
    assert holes.hole_before(S, batch(100)) == 9
    assert not holes.explains(S, SequenceGap(PID, 0, 0, 6))  # 3 was forgotten
    for pid in range(10):
        holes.dropped(pid, batch(1))
    assert len(holes) == 3
    with pytest.raises(ValueError):
        SequenceHoles(per_producer=0)


def test_the_sequencer_says_which_sequences_are_missing():
    sequencer = PartitionSequencer(0)
    pending = sequencer.append(records(0), NOW)
    sequencer.commit(pending)
    gap = sequencer.append(records(6), NOW)
    assert isinstance(gap, Rejected) and gap.error_code == ErrorCode.out_of_order_sequence_number
    assert gap.gap == SequenceGap(PID, 0, 3, 6)
    new_epoch = sequencer.append(records(3, epoch=1), NOW)
    assert isinstance(new_epoch, Rejected) and new_epoch.gap == SequenceGap(PID, 1, 0, 3)
    assert not isinstance(sequencer.append(records(3), NOW), Rejected)  # in sequence


def test_refusal_answers_a_proxy_gap_not_leader_and_a_client_gap_45():
    rejected = Rejected(ErrorCode.out_of_order_sequence_number, "gap", SequenceGap(PID, 0, 3, 9))
    holes = SequenceHoles()
    assert refusal(rejected, S, holes).error_code == 45
    assert refusal(rejected, S, None).error_code == 45
    holes.dropped(S, batch(3))
    answer = refusal(rejected, S, holes)
    assert answer.error_code == ErrorCode.not_leader_or_follower
    assert "a batch before this one was not appended (gap)" in answer.error_message
    epoch = Rejected(ErrorCode.invalid_producer_epoch, "zombie")
    assert refusal(epoch, S, holes).error_code == 47


def test_a_producer_not_known_here_is_not_taken_past_its_dropped_batch():
    holes = SequenceHoles()
    sequencer = PartitionSequencer(0)
    assert not isinstance(sequence(sequencer, records(3), NOW, holes, S), Rejected)  # KIP-360
    other = PartitionSequencer(0)
    holes.dropped(S, batch(0))  # its first batch was dropped on the way
    refused = sequence(other, records(3), NOW, holes, S)
    assert isinstance(refused, Rejected) and refused.gap == SequenceGap(PID, 0, 0, 3)
    assert refusal(refused, S, holes).error_code == ErrorCode.not_leader_or_follower
    assert other.log_end_offset == 0
    assert not isinstance(sequence(other, records(0), NOW, holes, S), Rejected)  # the retry
