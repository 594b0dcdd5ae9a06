"""Transactions and idempotent producers carried across the cutover (docs/tiering.md,
"Cutover"): the last stable offset the cutover records (StreamCutover, value version 2),
and the producer state a stream starting from its cutover is seeded with, from the batch
headers of Kafka's log below it (partition/carried.py, partition/rules.py)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from kio.schema.errors import ErrorCode
from test_metadata import ACCEPTED, S, cutover, tiered
from test_sequencer import NOW, PID, appended, idem, rejected
from test_sequencer_txn import ended, marker, txn

from proxy.metadata.codec import decode, encode
from proxy.metadata.records import MetadataRecordError
from proxy.partition.carried import producers_at_cutover
from proxy.partition.producer_state import INT32_MAX, NUM_BATCHES_TO_RETAIN
from proxy.partition.rules import SEED_FOR_MS, PartitionConfig, RecoveryPoint, rebuild_sequencer
from proxy.partition.sequencer import Duplicate
from proxy.records.batches import BatchHeader, read_batch_header, with_base_offset
from proxy.records.markers import Marker, marker_batch

A, B, C = PID, PID + 1, PID + 2
LSO, CUT = 10, 23


def at(offset: int, records: bytes) -> BatchHeader:
    """The header of `records` as Kafka's log holds it, at `offset`."""
    return read_batch_header(with_base_offset(records, offset))


def kafka_marker(offset: int, pid: int, *, commit: bool = True, epoch: int = 0) -> BatchHeader:
    return read_batch_header(marker_batch(Marker(pid, epoch, 5, commit, NOW, offset), offset))


def kafka_log() -> list[BatchHeader]:
    """Kafka's log from its last stable offset (A's transaction, open at the cutover) to
    past the cutover: B's transaction commits below the cutover, C is idempotent."""
    return [
        at(10, txn(0, pid=A)),  # A opens at 10: the last stable offset
        at(13, txn(3, pid=A)),
        at(16, txn(0, pid=B)),
        kafka_marker(19, B),  # B's transaction ends below the cutover
        at(20, idem(7, pid=C)),
        kafka_marker(CUT, A),  # past the cutover: the follower's
    ]


# -- seeding from Kafka's batch headers ---------------------------------------------------


def carried(headers: list[BatchHeader], lowest: int, now: int = NOW) -> list:
    """The producers seeded with a transaction open at the cutover, from the headers read
    from the batch holding `lowest` (the last stable offset the cutover recorded)."""
    seeded = producers_at_cutover(headers, CUT, now, lowest)
    return [entry for entry in seeded if entry.current_txn_first_offset is not None]


def test_only_the_producers_open_at_the_cutover_are_carried_with_their_batches():
    [entry] = carried(kafka_log(), LSO, NOW + 1)
    assert (entry.producer_id, entry.producer_epoch) == (A, 0)
    assert entry.current_txn_first_offset == 10
    assert entry.last_seq == 5 and [b.first_offset for b in entry.batches] == [10, 13]
    assert entry.last_timestamp == NOW + 1


def test_a_producer_fenced_below_the_cutover_is_not_carried_and_an_older_epoch_changes_nothing():
    log = [
        at(10, txn(0, pid=A)),
        kafka_marker(13, A, commit=False, epoch=1),  # the coordinator aborts, fencing epoch 0
        at(14, txn(3, pid=A)),  # a zombie's batch Kafka would have refused: no effect
    ]
    assert carried(log, LSO) == []


def test_nothing_read_or_nothing_open_carries_nothing():
    assert carried([], LSO) == []
    assert carried(kafka_log()[2:5], 16) == []


def test_the_batch_holding_the_start_counts_whole_and_overlaps_are_refused():
    log = kafka_log()
    [entry] = carried(log, 11)  # Kafka's Fetch answers from the batch at 10
    assert entry.current_txn_first_offset == 10
    with pytest.raises(ValueError, match="overlaps"):
        carried([log[0], at(12, txn(3, pid=A))], LSO)


# -- the rebuild: seeded, then the stream's own batches and the marker ---------------------


def point(**changes) -> RecoveryPoint:
    base = RecoveryPoint(S, 0, CUT, CUT, None, CUT, LSO)
    return replace(base, **changes)


def test_the_rebuild_reads_kafkas_log_only_when_it_starts_at_a_cutover_with_a_transaction_open():
    assert point().carried_from == LSO
    assert point(cutover_stable_offset=None).carried_from is None
    assert point(cutover_stable_offset=CUT).carried_from is None  # nothing was open
    assert point(snapshot=b"x").carried_from is None  # the snapshot holds the state
    # a log start past the cutover: its batches up to there (and the markers) are gone
    assert point(log_start_offset=30, state_offset=30, committed_end=30).carried_from is None


def test_a_seeded_stream_goes_on_with_the_transaction_and_its_marker_ends_it():
    seeded = producers_at_cutover(kafka_log(), CUT, NOW, LSO)  # A open, B and C too
    sequencer = rebuild_sequencer(point(), None, [], NOW, PartitionConfig(), seeded)
    assert sequencer.high_watermark == CUT
    assert sequencer.last_stable_offset == LSO  # Kafka's, below the cutover
    assert sequencer.open_transactions == {A: LSO}
    rejected(sequencer, txn(9), ErrorCode.out_of_order_sequence_number)  # a gap after 5
    rejected(sequencer, idem(6), ErrorCode.invalid_txn_state)
    assert appended(sequencer, txn(6)).base_offset == CUT
    assert sequencer.last_stable_offset == LSO
    done = ended(sequencer, marker(commit=False, epoch=1))  # a new instance fenced it
    assert done.completed is not None and done.completed.first_offset == LSO
    assert sequencer.last_stable_offset == sequencer.high_watermark == CUT + 4
    rejected(sequencer, txn(9), ErrorCode.invalid_producer_epoch)  # the zombie
    # the snapshot carries it from then on
    restored = type(sequencer).restore(sequencer.snapshot(), sequencer.high_watermark)
    assert restored.producer_states == sequencer.producer_states


def test_producers_carried_for_a_rebuild_that_takes_none_are_a_bug():
    seeded = producers_at_cutover(kafka_log(), CUT, NOW, LSO)  # A open, B and C too
    past = point(log_start_offset=30, state_offset=30, committed_end=30)  # S: the log start
    with pytest.raises(ValueError, match="carried across"):
        rebuild_sequencer(past, None, [], NOW, PartitionConfig(), seeded)


# -- idempotent producers across the cutover ------------------------------------------------


def test_every_producer_of_the_tail_is_kafkas_state_at_the_cutover():
    by_pid = {e.producer_id: e for e in producers_at_cutover(kafka_log(), CUT, NOW, LSO)}
    assert sorted(by_pid) == [A, B, C]
    assert by_pid[A].current_txn_first_offset == 10  # open at the cutover: carried
    assert by_pid[B].current_txn_first_offset is None  # its marker is below the cutover
    assert [(b.first_seq, b.last_seq, b.first_offset) for b in by_pid[C].batches] == [(7, 9, 20)]
    assert all(e.last_timestamp == NOW for e in by_pid.values())


def test_a_producer_the_tail_shows_only_a_marker_of_stays_unknown():
    """B's batches lie before the tail, its commit marker in it: its last sequence is not
    known, so it is not seeded (seeded with no batch, its next batch was refused 45)."""
    tail = kafka_log()[3:5]  # B's marker at 19, C's batch at 20
    assert [e.producer_id for e in producers_at_cutover(tail, CUT, NOW, None)] == [C]


def test_without_a_transaction_recorded_open_the_tail_opens_none():
    """The tail starts inside B's transaction (its marker at 19 is read, its start not);
    with no last stable offset recorded, nothing was open at the cutover."""
    tail = [at(13, txn(3, pid=A)), *kafka_log()[2:5]]  # A's batch, its start unread
    entries = producers_at_cutover(tail, CUT, NOW, None)
    assert sorted(e.producer_id for e in entries) == [A, B, C]
    assert all(e.current_txn_first_offset is None for e in entries)


def test_a_tail_kafkas_retention_cut_past_the_last_stable_offset_is_taken_as_it_is():
    """Retention took A's first batch (the read logs it): A is open from its next one, as
    before this seed, when the carried transactions were read from the last stable offset
    and Kafka's log started past it."""
    by_pid = {e.producer_id: e for e in producers_at_cutover(kafka_log()[1:], CUT, NOW, LSO)}
    assert by_pid[A].current_txn_first_offset == 13
    assert producers_at_cutover([], CUT, NOW, LSO) == []


def test_a_retry_of_a_batch_kafka_appended_is_a_duplicate_and_a_gap_is_45():
    """C's batch at 20 (sequences 7-9) was appended by Kafka and its answer lost: sent
    again after the cutover, the stream answers it with Kafka's offsets, as Kafka would;
    a batch after a gap is refused as Kafka refuses it; the next batch is taken."""
    carried = producers_at_cutover(kafka_log(), CUT, NOW, None)
    sequencer = rebuild_sequencer(
        point(cutover_stable_offset=None), None, [], NOW, PartitionConfig(), carried
    )
    assert sequencer.append(idem(7, pid=C), NOW) == Duplicate(20, 22, -1, None)
    rejected(sequencer, idem(11, pid=C), ErrorCode.out_of_order_sequence_number)
    assert appended(sequencer, idem(10, pid=C)).base_offset == CUT
    assert sequencer.append(idem(7, pid=C), NOW) == Duplicate(20, 22, -1, None)  # still


def test_a_retry_from_before_the_tail_is_a_duplicate_while_fewer_than_5_batches_are_known():
    """C's batch 4-6 was appended by Kafka before the tail read (cut by time or size), its
    answer lost: Kafka still has it among C's last 5 and answers its offset. The stream
    knows C from 7 on only; 4-6 came before, so it was written (Kafka appends a producer
    in sequence order): DUPLICATE_SEQUENCE_NUMBER, which the clients take as success, not
    45 (fatal to them). Not for a batch that is not all below, another epoch, a producer
    whose history the tail holds whole (5 batches), or one the stream alone knows."""
    carried = producers_at_cutover(kafka_log(), CUT, NOW, None)
    sequencer = rebuild_sequencer(
        point(cutover_stable_offset=None), None, [], NOW, PartitionConfig(), carried
    )
    rejected(sequencer, idem(4, pid=C), ErrorCode.duplicate_sequence_number)
    rejected(sequencer, idem(0, count=7, pid=C), ErrorCode.duplicate_sequence_number)
    rejected(sequencer, idem(5, pid=C), ErrorCode.out_of_order_sequence_number)  # overlaps 7
    assert appended(sequencer, idem(10, pid=C)).base_offset == CUT
    rejected(sequencer, idem(4, pid=C), ErrorCode.duplicate_sequence_number)  # still
    assert appended(sequencer, idem(0, pid=C, epoch=1)).base_offset == CUT + 3  # new epoch
    rejected(sequencer, idem(4, pid=C, epoch=1), ErrorCode.out_of_order_sequence_number)
    full = [at(20 + 3 * i, idem(3 + 3 * i, pid=C)) for i in range(NUM_BATCHES_TO_RETAIN)]
    whole = producers_at_cutover(full, 35, NOW, None)
    assert not whole[0].history_cut
    at35 = point(cutover_stable_offset=None, committed_end=35, state_offset=35, cutover_offset=35)
    sequencer = rebuild_sequencer(at35, None, [], NOW, PartitionConfig(), whole)
    rejected(sequencer, idem(0, pid=C), ErrorCode.out_of_order_sequence_number)  # as Kafka
    fresh = rebuild_sequencer(point(cutover_stable_offset=None), None, [], NOW, PartitionConfig())
    assert appended(fresh, idem(7, pid=C)).base_offset == CUT  # unknown: any sequence
    rejected(fresh, idem(4, pid=C), ErrorCode.out_of_order_sequence_number)  # as Kafka


def test_across_the_sequence_wrap_the_next_batch_is_taken_and_an_older_one_is_a_duplicate():
    """Sequences wrap from 2**31-1 to 0: C's known batch ends 3 below the wrap, its next
    one (in sequence, its last sequence past 0) is taken, not answered 46 (which clients
    take as success: it would be lost); an older one from before the wrap is still a
    duplicate, and the batch after the wrap goes on."""
    top = INT32_MAX - 2
    log = [at(20, idem(top - 6, pid=C)), at(23, idem(top - 3, pid=C))]
    seeded = producers_at_cutover(log, 26, NOW, None)
    assert seeded[0].history_cut
    at26 = point(cutover_stable_offset=None, committed_end=26, state_offset=26, cutover_offset=26)
    sequencer = rebuild_sequencer(at26, None, [], NOW, PartitionConfig(), seeded)
    rejected(sequencer, idem(top - 9, pid=C), ErrorCode.duplicate_sequence_number)
    assert appended(sequencer, idem(top, count=5, pid=C)).base_offset == 26  # ends at 1
    rejected(sequencer, idem(top - 9, pid=C), ErrorCode.duplicate_sequence_number)
    assert appended(sequencer, idem(2, pid=C)).base_offset == 31


def test_the_rebuild_reads_kafkas_producers_soon_after_the_cutover_or_for_a_transaction():
    soon = point(cutover_stable_offset=None, tiered_at_ms=NOW)
    assert soon.seeds_from_kafka(NOW + SEED_FOR_MS - 1)
    assert not soon.seeds_from_kafka(NOW + SEED_FOR_MS)  # no client retries that late
    assert point(tiered_at_ms=NOW).seeds_from_kafka(NOW + 10 * SEED_FOR_MS)  # LSO: needed
    assert not replace(soon, snapshot=b"x").seeds_from_kafka(NOW)  # the snapshot holds it
    assert not replace(soon, log_start_offset=CUT).seeds_from_kafka(NOW)  # nothing below
    past = replace(soon, log_start_offset=30, state_offset=30, committed_end=30)
    assert not past.seeds_from_kafka(NOW)  # S is a log start past the cutover


# -- the metadata record -------------------------------------------------------------------


def test_the_last_stable_offset_round_trips_in_value_version_2():
    record = replace(cutover(at=500), last_stable_offset=420)
    key, value = encode(record)
    assert value[0] == 2 and len(value) == len(encode(cutover(at=500))[1]) + 8
    assert decode(key, value) == record
    assert record.stable_offset == 420


def test_without_a_transaction_open_the_record_is_version_1_as_before():
    record = cutover(at=500)
    key, value = encode(record)
    assert value[0] == 1
    old = decode(key, value)  # what a proxy of the previous release wrote, read
    assert old.last_stable_offset is None and old.stable_offset == 500
    # the cutover offset itself means nothing open: stored as version 1
    same = replace(record, last_stable_offset=500)
    assert same.last_stable_offset is None and encode(same) == encode(record)


def test_a_last_stable_offset_past_the_cutover_or_an_unknown_version_is_refused():
    with pytest.raises(ValueError, match="last_stable_offset"):
        replace(cutover(at=500), last_stable_offset=501)
    key, value = encode(replace(cutover(at=500), last_stable_offset=420))
    with pytest.raises(MetadataRecordError, match="unsupported value version 3"):
        decode(key, b"\x03" + value[1:])
    with pytest.raises(MetadataRecordError, match="ends inside a field"):
        decode(key, value[:-8])  # version 2 without its field


def test_the_state_and_a_checkpoint_keep_it():
    p = tiered(partitions=())
    assert p.write(replace(cutover(0), last_stable_offset=420)) == ACCEPTED
    assert p.state.stream(S).cutover_stable_offset == 420
    for key, value in p.state.checkpoint_records("proxy-a", 1, 10_000):
        assert p.write_raw(key, value) == ACCEPTED
    assert p.state.generation == 1
    assert p.reread().stream(S).cutover_stable_offset == 420
