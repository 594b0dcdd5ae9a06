"""Rebuilding a tiered partition's sequencer when its log start is inside a batch
(`partition_rules.rebuild_sequencer`), on every source a rebuild reads: a restart whose WAL
still holds the batch, a hand-over or a WAL gone (the objects alone), the objects and
the WAL together, and the metadata's view after a DeleteRecords (StreamTrim) and after
retention. Real batches from kafka-python's producer code, sequenced by the proxy's
sequencer; the metadata is applied from real records.

Kafka keeps a batch straddling its log start whole in its segment, and its producer's
last sequence with it: a retry of that batch is answered as a duplicate."""

from __future__ import annotations

from uuid import UUID

import pytest
from test_sequencer import PID, idem

from proxy.cleaner.clean import blocks
from proxy.metadata.codec import encode
from proxy.metadata.records import (
    ObjectCommit,
    OffsetRange,
    ProducerSnapshot,
    ShardClaim,
    StreamCutover,
    StreamTrim,
)
from proxy.metadata.state import MetadataState
from proxy.metadata.streams import stream_id
from proxy.objects.format_writer import ObjectWriter
from proxy.objects.keys import ObjectKind
from proxy.objects.local import LocalDirectoryStore
from proxy.partition.committed import committed_blocks
from proxy.partition.rules import (
    CommittedBlock,
    PartitionConfig,
    RecoveryError,
    RecoveryPoint,
    missing_committed,
    rebuild_sequencer,
)
from proxy.partition.sequencer import Duplicate, PartitionSequencer, PendingAppend
from proxy.records.batches import BatchHeader, iter_batches

TOPIC = UUID("0f3c5a0e-7b8d-4c1e-9a2b-3c4d5e6f7a8b")
STREAM = stream_id(TOPIC, 0)
CUTOVER = 1000
NOW = 1_700_000_000_000
CONFIG = PartitionConfig()


def written(counts: list[int]) -> tuple[list[bytes], list[BatchHeader]]:
    """The producer's batches (sequences from 0) and their headers as the owner wrote them
    from the cutover on."""
    sequencer = PartitionSequencer(CUTOVER)
    batches, headers, seq = [], [], 0
    for count in counts:
        records = idem(seq, count)
        pending = sequencer.append(records, NOW)
        assert isinstance(pending, PendingAppend)
        sequencer.commit(pending)
        batches.append(records)
        headers += [header for header, _ in iter_batches(pending.records)]
        seq += count
    return batches, headers


def point(log_start: int, end: int, *, snapshot: bytes | None = None, state: int | None = None):
    state_offset = max(CUTOVER, log_start) if state is None else state
    return RecoveryPoint(STREAM, log_start, end, state_offset, snapshot, CUTOVER)


def rebuilt(p: RecoveryPoint, committed, wal) -> PartitionSequencer:
    """`committed`: headers as the produce path's objects hold them (a block per batch,
    one record per offset), or CommittedBlocks as given."""
    if committed is not None:
        committed = [c if isinstance(c, CommittedBlock) else block(c) for c in committed]
    return rebuild_sequencer(p, committed, wal, NOW, CONFIG)


def block(*headers: BatchHeader, start: int | None = None, end: int | None = None):
    """An object block holding `headers`, over [start, end) (by default theirs)."""
    first = headers[0].base_offset if start is None else start
    last = headers[-1].next_offset if end is None else end
    return CommittedBlock(first, last, sum(h.record_count for h in headers), headers)


def test_restart_replays_the_wal_batch_holding_the_log_start_whole():
    batches, headers = written([100, 10])
    p = point(CUTOVER + 50, CUTOVER + 100)  # DeleteRecords to 50 of the first batch
    assert missing_committed(p, headers) is None  # the WAL has it: no object is read
    sequencer = rebuilt(p, None, headers)
    assert sequencer.high_watermark == sequencer.log_end_offset == CUTOVER + 110
    assert sequencer.producer_states[PID].last_seq == 109
    # retries of both batches are duplicates, the straddling one included
    assert sequencer.append(batches[0], NOW) == Duplicate(CUTOVER, CUTOVER + 99, -1, None)
    assert sequencer.append(batches[1], NOW) == Duplicate(CUTOVER + 100, CUTOVER + 109, -1, None)
    assert sequencer.append(idem(110, 5), NOW).base_offset == CUTOVER + 110


def test_handover_and_a_lost_wal_rebuild_from_the_objects_batch_holding_the_log_start():
    batches, headers = written([100, 10])
    p = point(CUTOVER + 50, CUTOVER + 110)
    assert missing_committed(p, []) == (CUTOVER + 50, CUTOVER + 110)
    # what committed_headers yields for [50, 110): every batch ending past 50
    sequencer = rebuilt(p, headers, [])
    assert sequencer.high_watermark == CUTOVER + 110
    assert sequencer.append(batches[0], NOW) == Duplicate(CUTOVER, CUTOVER + 99, -1, None)


def test_objects_then_the_wal_when_the_log_start_is_inside_a_batch():
    _, headers = written([100, 10, 10])
    p = point(CUTOVER + 50, CUTOVER + 110)  # the third batch is in the WAL only
    wal = headers[2:]
    assert missing_committed(p, wal) == (CUTOVER + 50, CUTOVER + 110)
    sequencer = rebuilt(p, headers[:2], wal)
    assert sequencer.high_watermark == CUTOVER + 120
    assert sequencer.producer_states[PID].last_seq == 119


def test_a_log_start_at_the_batch_end_or_past_the_committed_end_still_works():
    _, headers = written([100, 10])
    assert rebuilt(point(CUTOVER + 100, CUTOVER + 110), None, headers).high_watermark == (
        CUTOVER + 110
    )
    # DeleteRecords to the high watermark: nothing to replay, the log continues there
    sequencer = rebuilt(point(CUTOVER + 110, CUTOVER + 110), [], [])
    assert sequencer.high_watermark == sequencer.log_end_offset == CUTOVER + 110
    with pytest.raises(RecoveryError, match=r"offsets \[1110, 1120\) are missing"):
        rebuilt(point(CUTOVER + 110, CUTOVER + 110), [], written([120, 10])[1][1:])


def test_a_batch_straddling_a_snapshot_above_the_log_start_or_the_cutover_is_refused():
    """Only a snapshot at the log start (the one written with the trim that put it
    there, which leaves the straddling batch's producer out) replays such a batch whole."""
    _, headers = written([100])
    snapshot = PartitionSequencer(CUTOVER + 50).snapshot()
    with pytest.raises(RecoveryError, match=r"offsets \[1050, 1000\) are missing"):
        rebuilt(
            point(CUTOVER + 10, CUTOVER + 100, snapshot=snapshot, state=CUTOVER + 50), None, headers
        )
    # below the cutover nothing is the proxy's: a batch reaching over it is a disagreement
    moved = [h.__class__(**{**_fields(h), "base_offset": CUTOVER - 5}) for h in headers]
    with pytest.raises(RecoveryError, match=r"offsets \[1000, 995\) are missing"):
        rebuilt(point(0, CUTOVER + 95), None, moved)


def _fields(header: BatchHeader) -> dict:
    return {name: getattr(header, name) for name in header.__slots__}


class Shard:
    def __init__(self) -> None:
        self.state = MetadataState(0, 1)
        self.write(ShardClaim(0, 1, "proxy-a", NOW))
        self.write(StreamCutover(0, STREAM, 1, 1, TOPIC, 0, 0, CUTOVER, CUTOVER, NOW))

    def write(self, record: object) -> None:
        verdict = self.state.apply(*encode(record), self.state.next_offset)
        assert verdict.accepted, verdict.reason

    def commit(self, object_id: int, start: int, end: int) -> None:
        ranges = (OffsetRange(STREAM, start, end),)
        self.write(ObjectCommit(0, object_id, ObjectKind.STREAM_SET, 100, 1, NOW, ranges))


def test_the_metadata_after_delete_records_and_after_retention():
    _, headers = written([100, 10, 10])
    shard = Shard()
    shard.commit(1, CUTOVER, CUTOVER + 100)
    shard.commit(2, CUTOVER + 100, CUTOVER + 110)
    shard.write(ProducerSnapshot(0, STREAM, 1, CUTOVER + 100, NOW, _snapshot(headers[:1])))
    shard.write(StreamTrim(0, STREAM, 1, CUTOVER + 50, 1, NOW))  # DeleteRecords, mid-batch
    p = RecoveryPoint.from_metadata(shard.state, STREAM)
    assert (p.state_offset, p.snapshot is not None) == (CUTOVER + 100, True)  # kept: above
    assert rebuilt(p, headers[1:2], headers[2:]).high_watermark == CUTOVER + 120
    # a trim past the snapshot drops it: S is the log start, inside the second batch
    shard.write(StreamTrim(0, STREAM, 1, CUTOVER + 105, 1, NOW))
    p = RecoveryPoint.from_metadata(shard.state, STREAM)
    assert (p.state_offset, p.snapshot, p.starts_at_log_start) == (CUTOVER + 105, None, True)
    sequencer = rebuilt(p, headers[1:2], headers[2:])
    assert sequencer.high_watermark == CUTOVER + 120
    assert sequencer.producer_states[PID].last_seq == 119
    # retention moves the log start to a range's end (a batch boundary), past it all
    shard.write(StreamTrim(0, STREAM, 1, CUTOVER + 110, 1, NOW))
    p = RecoveryPoint.from_metadata(shard.state, STREAM)
    assert rebuilt(p, None, headers).high_watermark == CUTOVER + 120
    assert shard.state.committed_ranges(STREAM) == ()


def one(batch: bytes) -> tuple[BatchHeader, bytes]:
    [(header, _)] = iter_batches(batch)
    return header, batch


def _snapshot(headers: list[BatchHeader]) -> bytes:
    sequencer = PartitionSequencer(CUTOVER)
    for header in headers:
        sequencer.replay(header, NOW)
    return sequencer.snapshot()


def test_holes_a_log_cleaner_left_in_the_objects_are_rebuilt_over():
    """A compacted stream's objects hold batches with holes between them (the log
    cleaner drops batches, keeping each range's last one): its blocks count fewer
    records than offsets, so a rebuild from them takes the holes there; the WAL still
    may not have any."""
    batches, headers = written([10, 10, 10, 10])
    # as the cleaner writes them: the first block runs to the next one's first batch
    cleaned = [block(headers[0], end=CUTOVER + 30), block(headers[3])]
    sequencer = rebuilt(point(CUTOVER, CUTOVER + 40), cleaned, [])
    assert sequencer.high_watermark == sequencer.log_end_offset == CUTOVER + 40
    assert sequencer.producer_states[PID].last_seq == 39
    assert sequencer.append(batches[3], NOW) == Duplicate(CUTOVER + 30, CUTOVER + 39, -1, None)
    # one block of both, and a hole at a cleaned block's start (its first batch dropped)
    one = [block(headers[0], headers[3], start=CUTOVER, end=CUTOVER + 40)]
    assert rebuilt(point(CUTOVER, CUTOVER + 40), one, []).high_watermark == CUTOVER + 40
    late = [block(headers[1], headers[3], start=CUTOVER, end=CUTOVER + 40)]
    assert rebuilt(point(CUTOVER, CUTOVER + 40), late, []).producer_states[PID].last_seq == 39
    with pytest.raises(RecoveryError, match=r"offsets \[1010, 1030\) are missing"):
        rebuilt(point(CUTOVER, CUTOVER + 10), [headers[0]], headers[3:])


def test_holes_where_no_cleaner_ran_are_still_refused():
    """Blocks the produce path wrote count one record per offset: a hole between their
    batches, or a block whose batches miss records its index counts, is a damaged object
    on any topic, never taken for a cleaner's hole."""
    _, headers = written([10, 10, 10, 10])
    missing = r"offsets \[1010, 1030\) are missing before the objects batch at 1030"
    # batches missing between two uncleaned blocks (an object or a block lost)
    with pytest.raises(RecoveryError, match=missing):
        rebuilt(point(CUTOVER, CUTOVER + 40), [headers[0], headers[3]], [])
    # a block whose index counts the lost batches' records
    lost = CommittedBlock(CUTOVER, CUTOVER + 40, 40, (headers[0], headers[3]))
    with pytest.raises(
        RecoveryError, match=r"\[1000, 1040\) holds 20 records, its index counts 40"
    ):
        rebuilt(point(CUTOVER, CUTOVER + 40), [lost], [])
    # a cleaned block, then offsets in no block read: only the cleaned block's part of
    # the hole is declared
    half = [block(headers[0], end=CUTOVER + 20), block(headers[3])]
    with pytest.raises(RecoveryError, match=missing):
        rebuilt(point(CUTOVER, CUTOVER + 40), half, [])
    # a batch outside its block's offsets
    with pytest.raises(RecoveryError, match=r"\[1000, 1005\) holds a batch at offsets 1000..1009"):
        rebuilt(
            point(CUTOVER, CUTOVER + 10),
            [CommittedBlock(CUTOVER, CUTOVER + 5, 10, headers[:1])],
            [],
        )


async def test_the_cleaners_objects_read_back_declare_their_holes(tmp_path):
    """The log cleaner's blocks (`cleaner.clean.blocks`), written as a stream object and
    read back by the rebuild's reader (`committed_blocks`), count fewer records than
    offsets: the rebuild takes their holes. The produce path's blocks of the same
    stream count one record per offset."""
    sequencer = PartitionSequencer(CUTOVER)
    sequenced = []
    for seq in range(0, 40, 10):
        pending = sequencer.append(idem(seq, 10), NOW)
        assert isinstance(pending, PendingAppend)
        sequencer.commit(pending)
        sequenced.append(bytes(pending.records))
    kept = [sequenced[0], sequenced[3]]  # the two middle batches cleaned away
    pieces = [(h.base_offset, h.next_offset, h.record_count, b) for h, b in map(one, kept)]
    shard = Shard()
    async with LocalDirectoryStore(tmp_path) as store:
        for object_id, start, end, data in (
            (1, CUTOVER, CUTOVER + 40, blocks(pieces, CUTOVER, CUTOVER + 40, 1 << 20)),
            (2, CUTOVER + 40, CUTOVER + 80, None),
        ):
            writer = ObjectWriter(object_id, ObjectKind.STREAM)
            if data is None:  # the produce path: the same batches, sequenced again
                again = PartitionSequencer(CUTOVER + 40)
                for seq in range(40, 80, 10):
                    pending = again.append(idem(seq, 10), NOW)
                    assert isinstance(pending, PendingAppend)
                    writer.add_batches(STREAM, pending.records)
            else:
                for first, last, count, block_data in data:
                    writer.add_block(STREAM, block_data, first, last, count)
            built = writer.build()
            await store.create(built.key, built.to_bytes())
            ranges = (OffsetRange(STREAM, start, end),)
            shard.write(ObjectCommit(0, object_id, ObjectKind.STREAM, built.size, 1, NOW, ranges))
        read = [
            b async for b in committed_blocks(store, shard.state, STREAM, CUTOVER, CUTOVER + 80)
        ]
    assert [b.declares_holes for b in read] == [True] + [False] * 4  # one block per add
    sequencer = rebuilt(point(CUTOVER, CUTOVER + 80), read, [])
    assert sequencer.high_watermark == CUTOVER + 80
    assert sequencer.producer_states[PID].last_seq == 79
