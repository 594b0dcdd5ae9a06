"""The producer snapshot a trim writes (`PartitionSequencer.snapshot_at`, docs/sequencer.md,
"Producer state below the log start"): a rebuild from the new log start keeps the
producers whose batches the log start passed (Kafka keeps them, KIP-360), and the
marker follower's place, so that the markers the trim passed are not appended again.

Each test rebuilds twice from the same log: from the snapshot, and as before it (no
snapshot: the state starts empty at the log start), and shows what the snapshot changes.
Real batches (kafka-python's producer code), the real sequencer and rebuild rules."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from kio.schema.errors import ErrorCode
from test_rebuild_log_start import CUTOVER, STREAM, Shard
from test_sequencer import NOW, PID, appended, idem, rejected
from test_sequencer_txn import ended, headers_of, marker, txn

from proxy.metadata.codec import encode
from proxy.metadata.records import (
    ObjectCommit,
    OffsetRange,
    ProducerSnapshot,
    StreamTrim,
)
from proxy.objects.keys import ObjectKind
from proxy.partition.producer_snapshot import read_snapshot
from proxy.partition.rules import PartitionConfig, RecoveryPoint, rebuild_sequencer
from proxy.partition.sequencer import Duplicate, PartitionSequencer, PendingAppend
from proxy.peer.codec import TRIM_SNAPSHOT_PROTOCOL
from proxy.upkeep.retention import Retention, RetentionReport
from proxy.upkeep.retention_plan import TrimPlan
from proxy.upkeep.trims import write_trim

A, B = PID, PID + 1


def rebuilt(log_start: int, end: int, wal, snapshot: bytes | None) -> PartitionSequencer:
    """The sequencer a restart builds: the state from `snapshot` (at the log start) or
    empty there, then the WAL's batches `wal` (headers) from the log start on."""
    point = RecoveryPoint(STREAM, log_start, end, log_start, snapshot, CUTOVER)
    return rebuild_sequencer(point, None, wal, NOW, PartitionConfig())


def test_a_producer_whose_batches_the_log_start_passed_is_kept_and_answers_as_kafkas():
    live = PartitionSequencer(CUTOVER)
    a = appended(live, idem(0, 10, pid=A))  # [1000, 1010)
    b1 = appended(live, idem(0, 10, pid=B))  # [1010, 1020)
    b2 = appended(live, idem(10, 10, pid=B))  # [1020, 1030)
    trim = CUTOVER + 15  # DeleteRecords inside B's first batch
    snapshot = live.snapshot_at(trim)
    kept = read_snapshot(snapshot)
    batches = {e.producer_id: len(e.batches) for e in kept.entries}
    assert (kept.offset, batches) == (trim, {A: 1, B: 0})  # B's batches: the replay's
    wal = headers_of(b1, b2)  # what the WAL holds from the log start on

    after = rebuilt(trim, CUTOVER + 30, wal, snapshot)
    assert after.high_watermark == CUTOVER + 30
    assert after.producer_states[A] == live.producer_states[A]
    # A's retry is a duplicate, a gap after it is 45, its next batch follows on
    assert after.append(idem(0, 10, pid=A), NOW) == Duplicate(CUTOVER, CUTOVER + 9, -1, None)
    rejected(after, idem(20, 3, pid=A), ErrorCode.out_of_order_sequence_number)
    # B's batch holding the log start is replayed whole: its retry is a duplicate too
    assert after.append(idem(0, 10, pid=B), NOW) == Duplicate(CUTOVER + 10, CUTOVER + 19, -1, None)
    assert appended(after, idem(10, 3, pid=A)).base_offset == CUTOVER + 30

    before = rebuilt(trim, CUTOVER + 30, wal, None)  # without it, A was forgotten
    assert A not in before.producer_states
    assert isinstance(before.append(idem(20, 3, pid=A), NOW), PendingAppend)
    assert a.base_offset == CUTOVER


def test_a_producer_with_batches_on_both_sides_of_the_trim_keeps_them_all():
    """Kafka keeps a producer's last five batches whatever the log start (KIP-360): a
    retry of one below it, in flight across the trim and a restart, is a duplicate. The
    snapshot keeps the batches below the trim, the replay adds the others after them."""
    live = PartitionSequencer(CUTOVER)
    appended(live, idem(0, 10, pid=B))  # [1000, 1010)
    later = appended(live, idem(10, 10, pid=B))  # [1010, 1020)
    trim = CUTOVER + 10
    [kept] = read_snapshot(live.snapshot_at(trim)).entries
    assert kept.batches == live.producer_states[B].batches[:1]
    after = rebuilt(trim, CUTOVER + 20, headers_of(later), live.snapshot_at(trim))
    assert after.producer_states[B] == live.producer_states[B]
    assert after.append(idem(0, 10, pid=B), NOW) == Duplicate(CUTOVER, CUTOVER + 9, -1, None)
    assert after.append(idem(10, 10, pid=B), NOW) == Duplicate(CUTOVER + 10, CUTOVER + 19, -1, None)
    assert appended(after, idem(20, 3, pid=B)).base_offset == CUTOVER + 20


def test_a_snapshot_at_a_batch_boundary_and_at_the_end():
    live = PartitionSequencer(CUTOVER)
    appended(live, idem(0, 10, pid=A))
    b = appended(live, idem(0, 10, pid=B))
    for trim, kept in ((CUTOVER + 10, {A: 1, B: 0}), (CUTOVER + 20, {A: 1, B: 1})):
        snapshot = live.snapshot_at(trim)
        assert {e.producer_id: len(e.batches) for e in read_snapshot(snapshot).entries} == kept
        wal = headers_of(b) if trim < CUTOVER + 20 else []
        after = rebuilt(trim, CUTOVER + 20, wal, snapshot)
        assert after.producer_states == live.producer_states
    assert read_snapshot(live.snapshot_at(CUTOVER + 20)) == read_snapshot(live.snapshot())


def test_markers_the_trim_passed_are_not_expected_again():
    """A transaction committed (its marker at stream offset 1003, upstream 2000), then an
    idempotent batch; DeleteRecords to 1004. Rebuilt from the trim's snapshot, the
    follower resumes past the marker with nothing to meet: Kafka's log of the
    partition still holds it, and before, with no snapshot, the follower began at the
    cutover with nothing expected, so it appended that marker again (an offset Kafka's
    log does not have)."""
    live = PartitionSequencer(CUTOVER)
    appends = [appended(live, txn(0)), ended(live, marker()), appended(live, idem(0, pid=B))]
    assert live.marker_position == 2001
    trim = CUTOVER + 4
    after = rebuilt(trim, CUTOVER + 7, headers_of(appends[2]), live.snapshot_at(trim))
    assert (after.marker_position, after.replayed_markers) == (2001, ())
    before = rebuilt(trim, CUTOVER + 7, headers_of(appends[2]), None)
    assert (before.marker_position, before.replayed_markers) == (None, ())
    # a trim below the marker: the replay meets it again, as one accounted for
    below = rebuilt(CUTOVER + 3, CUTOVER + 7, headers_of(*appends[1:]), live.snapshot_at(1003))
    assert (below.marker_position, below.replayed_markers) == (2001, ())
    assert below.open_transactions == {}
    # a marker appended after the snapshot is still to be met upstream
    snapshot = live.snapshot_at(trim)
    later = ended(live, marker(pid=B, at=5))  # B had no transaction: appended all the same
    again = rebuilt(trim, CUTOVER + 8, headers_of(appends[2], later), snapshot)
    assert (again.marker_position, again.replayed_markers) == (2001, ((B, 0, NOW + 5),))


def test_replayed_markers_a_trim_cuts_off_stay_expected():
    """A rebuild replayed a marker the follower has not met upstream yet (it moves past
    it only with a live marker); a trim past it before that: the next rebuild must still
    expect it first, or every marker from the cutover on would look new."""
    live = PartitionSequencer(CUTOVER)
    appends = [appended(live, txn(0)), ended(live, marker()), appended(live, idem(0, pid=B))]
    restarted = rebuilt(CUTOVER, CUTOVER + 7, headers_of(*appends), None)
    assert restarted.replayed_markers == ((A, 0, NOW),)
    trim = CUTOVER + 4
    snapshot = restarted.snapshot_at(trim)
    assert read_snapshot(snapshot).expected == ((A, 0, NOW),)
    after = rebuilt(trim, CUTOVER + 7, headers_of(appends[2]), snapshot)
    assert (after.marker_position, after.replayed_markers) == (None, ((A, 0, NOW),))
    # and again, from the rebuilt one, with a further trim
    end = CUTOVER + 7
    further = rebuilt(end, end, [], after.snapshot_at(end))
    assert further.replayed_markers == ((A, 0, NOW),)
    # once a live marker moves the position, nothing is expected any more
    ended(after, marker(pid=B, at=7))
    assert read_snapshot(after.snapshot_at(end)).expected == ()


def test_the_follower_place_is_the_one_as_of_the_committed_end():
    """A marker appended past the stream's committed end E is in the owner's WAL only: a
    takeover without that WAL (an unclean one) rebuilds to E, and the follower must meet
    the marker upstream again. The snapshot keeps the place as of E, not the live one."""
    live = PartitionSequencer(CUTOVER)
    data = appended(live, txn(0))  # [1000, 1003), committed to objects: E = 1003
    ended(live, marker())  # at 1003, upstream 2000: in the WAL only
    assert live.marker_position == 2001
    snapshot = live.snapshot_at(CUTOVER + 3, CUTOVER + 3)
    assert snapshot is not None
    kept = read_snapshot(snapshot)
    assert (kept.marker_position, kept.markers_end) == (None, CUTOVER + 3)
    # the WAL lost: the follower meets the marker upstream again and appends it (its
    # producer, whose batches all lie below the trim, is kept as the live state has it)
    lost = rebuilt(CUTOVER + 3, CUTOVER + 3, [], snapshot)
    assert (lost.marker_position, lost.replayed_markers) == (None, ())
    assert isinstance(lost.append_marker(marker(), NOW), PendingAppend)
    # the WAL kept: its marker replayed is expected, so the follower does not append it again
    wal = headers_of(ended(PartitionSequencer(CUTOVER + 3), marker()))
    kept_wal = rebuilt(CUTOVER + 3, CUTOVER + 4, wal, snapshot)
    assert kept_wal.replayed_markers == ((A, 0, NOW),) and kept_wal.open_transactions == {}
    assert data.base_offset == CUTOVER


def test_a_transaction_begun_below_the_trim_is_kept_open_from_where_it_began():
    """Its producer has a batch past the trim, so the replay brings its batches back; the
    snapshot keeps its epoch, its coordinator epoch and that its transaction began below
    the trim (the last stable offset Kafka answers: the log start, not the producer's
    first batch past it)."""
    live = PartitionSequencer(CUTOVER)
    appended(live, txn(0))  # [1000, 1003), the transaction's first batch
    appended(live, idem(0, pid=B))  # [1003, 1006)
    later = appended(live, txn(3))  # [1006, 1009), the same transaction
    trim = CUTOVER + 6
    stub, b = sorted(read_snapshot(live.snapshot_at(trim)).entries, key=lambda e: e.producer_id)
    assert (stub.producer_id, stub.current_txn_first_offset) == (A, CUTOVER)
    assert stub.batches == live.producer_states[A].batches[:1]  # the one below the trim
    assert b == live.producer_states[B]
    after = rebuilt(trim, CUTOVER + 9, headers_of(later), live.snapshot_at(trim))
    assert after.open_transactions == {A: CUTOVER} and after.last_stable_offset == CUTOVER
    assert after.producer_states[A].batches == live.producer_states[A].batches
    assert after.producer_states[A].producer_epoch == 0
    before = rebuilt(trim, CUTOVER + 9, headers_of(later), None)
    assert before.open_transactions == {A: CUTOVER + 6}  # as if it began at its batch past T


def test_moves_kept_are_bounded_and_a_place_no_longer_known_writes_no_snapshot(monkeypatch):
    monkeypatch.setattr("proxy.partition.marker_follow.MAX_MOVES", 3)
    live = PartitionSequencer(CUTOVER)
    for n in range(5):  # markers at 1000..1004, each a move
        ended(live, marker(pid=A + n, at=n))
    assert live.snapshot_at(CUTOVER, CUTOVER + 1) is None  # the first two moves forgotten
    place = read_snapshot(live.snapshot_at(CUTOVER + 2, CUTOVER + 2))
    assert (place.marker_position, place.markers_end) == (2002, CUTOVER + 2)
    # the moves at or below an end asked for are forgotten: it only grows
    assert live.snapshot_at(CUTOVER + 1, CUTOVER + 1) is None
    assert read_snapshot(live.snapshot()).marker_position == 2005


def test_the_full_snapshot_forgets_no_move():
    """`snapshot()` is at the live end: taking it keeps a later trim's snapshot as of a
    committed end below it possible (only a trim's snapshot forgets the moves)."""
    live = PartitionSequencer(CUTOVER)
    for n in range(3):  # markers at 1000..1002, each a move
        ended(live, marker(pid=A + n, at=n))
    assert read_snapshot(live.snapshot()).marker_position == 2003
    place = read_snapshot(live.snapshot_at(CUTOVER + 1, CUTOVER + 1))
    assert (place.marker_position, place.markers_end) == (2001, CUTOVER + 1)


def test_the_snapshot_is_version_2_unless_its_markers_need_3():
    live = PartitionSequencer(CUTOVER)
    appended(live, idem(0, pid=A))
    assert live.snapshot_at(CUTOVER + 3)[:2] == b"\x00\x02"
    ended(live, marker(pid=B))
    assert live.snapshot_at(CUTOVER + 3)[:2] == b"\x00\x03"  # the marker at 1003 accounted
    assert live.snapshot_at(CUTOVER + 4)[:2] == b"\x00\x02"
    assert read_snapshot(live.snapshot_at(CUTOVER + 3)).markers_end == CUTOVER + 4


def _committed(end: int) -> Shard:
    """The shard with the stream's offsets [CUTOVER, end) committed in one object."""
    shard = Shard()
    shard.write(ObjectCommit(0, 1, ObjectKind.STREAM_SET, 100, 1, NOW, (
        OffsetRange(STREAM, CUTOVER, end),
    )))  # fmt: skip
    return shard


def test_the_metadata_keeps_the_snapshot_written_after_its_trim():
    """As `trims.write_trim` writes them: the trim, then the snapshot at the new log start
    (the trim drops the snapshot before it). A rebuild starts from it, at the log start,
    inside a batch."""
    live = PartitionSequencer(CUTOVER)
    appended(live, idem(0, 10, pid=A))
    b = appended(live, idem(0, 10, pid=B))
    shard = _committed(CUTOVER + 20)
    for trim in (CUTOVER + 5, CUTOVER + 15):
        shard.write(StreamTrim(0, STREAM, 1, trim, 1, NOW))
        shard.write(ProducerSnapshot(0, STREAM, 1, trim, NOW, live.snapshot_at(trim)))
    point = RecoveryPoint.from_metadata(shard.state, STREAM)
    assert (point.state_offset, point.starts_at_log_start) == (CUTOVER + 15, True)
    after = rebuild_sequencer(point, None, headers_of(b), NOW, PartitionConfig())
    assert after.producer_states == live.producer_states


class _Owner:
    """A shard owner over a real MetadataState: writes apply at once."""

    def __init__(self, shard: Shard) -> None:
        self.shard, self.state, self.epoch = shard, shard.state, 1
        self.written: list[type] = []

    async def write(self, records):
        verdicts = []
        for record in records:
            self.written.append(type(record))
            verdicts.append(self.state.apply(*encode(record), self.state.next_offset))
        return verdicts


class _Partition:
    def __init__(self, sequencer: PartitionSequencer) -> None:
        self.sequencer, self.log_start_offset = sequencer, CUTOVER

    def snapshot_at(self, offset: int, committed_end: int) -> bytes | None:
        return self.sequencer.snapshot_at(offset, committed_end)


class _Service:
    def __init__(self, partition: _Partition, fleet_level: int) -> None:
        self.partitions = {STREAM: partition}
        self.fleet_level = fleet_level

    def fleet_at(self, level: int) -> bool:
        return self.fleet_level >= level


@pytest.mark.parametrize("fleet_level", [TRIM_SNAPSHOT_PROTOCOL, TRIM_SNAPSHOT_PROTOCOL - 1])
async def test_write_trim_adds_the_snapshot_only_once_every_member_reads_it(fleet_level):
    live = PartitionSequencer(CUTOVER)
    appended(live, idem(0, 10, pid=A))
    shard = _committed(CUTOVER + 10)
    owner = _Owner(shard)
    partition = _Partition(live)
    info = shard.state.stream(STREAM)
    verdict = await write_trim(_Service(partition, fleet_level), owner, info, CUTOVER + 10, NOW)
    assert verdict.accepted and partition.log_start_offset == CUTOVER + 10
    point = RecoveryPoint.from_metadata(shard.state, STREAM)
    if fleet_level >= TRIM_SNAPSHOT_PROTOCOL:
        assert owner.written == [StreamTrim, ProducerSnapshot]
        assert rebuild_sequencer(point, None, [], NOW, PartitionConfig()).producer_states == (
            live.producer_states
        )
    else:  # a member before it would fail to rebuild from it: the trim goes alone
        assert owner.written == [StreamTrim] and point.snapshot is None


class _RetentionService(_Service):
    """What a retention pass asks of its host, as far as `Retention._trim` goes."""

    config = SimpleNamespace(retention_check_interval_s=3600.0)
    topic_configs = None

    async def describe_topics(self, names):
        raise LookupError("Kafka's copy is not this test's")


async def test_retention_waits_for_a_partition_being_started_when_a_snapshot_is_kept():
    """Retention trims every stream of the shards owned here, also one whose partition a
    claim is still rebuilding: that trim would go without a snapshot and drop the one
    there (its producers and the follower's place). It waits for the next pass."""
    live = PartitionSequencer(CUTOVER)
    appended(live, idem(0, 10, pid=A))
    appended(live, idem(0, 10, pid=B))
    shard = _committed(CUTOVER + 20)
    owner = _Owner(shard)
    service = _RetentionService(_Partition(live), TRIM_SNAPSHOT_PROTOCOL)
    retention = Retention(service)

    async def trim(to: int) -> RetentionReport:
        report = RetentionReport()
        plan = TrimPlan(1, 1, to)
        await retention._trim(owner, shard.state.stream(STREAM), "t", plan, NOW, report)  # noqa: SLF001
        return report

    assert (await trim(CUTOVER + 10)).trimmed == {STREAM: CUTOVER + 10}
    assert read_snapshot(shard.state.producer_snapshot(STREAM).state).offset == CUTOVER + 10
    partition = service.partitions.pop(STREAM)  # taken over and back: being rebuilt
    assert (await trim(CUTOVER + 20)).trimmed == {}
    assert shard.state.stream(STREAM).log_start_offset == CUTOVER + 10
    service.partitions[STREAM] = partition
    assert (await trim(CUTOVER + 20)).trimmed == {STREAM: CUTOVER + 20}
    assert shard.state.producer_snapshot(STREAM).offset == CUTOVER + 20
    assert owner.written == [StreamTrim, ProducerSnapshot] * 2
