"""The partition sequencer against a model of its producers, on random interleavings of
new batches, retries of the last five, gaps, epoch bumps, zombies and pipelined commits.

Whatever happens: offsets are contiguous and never given twice, a duplicate or a refusal
never moves the log, a retry of any of the last five gets its original offsets, a
sequencer restored from a snapshot answers exactly as the original, and replaying the
written batches rebuilds the same producer state."""

from __future__ import annotations

import functools
import struct
from collections import deque
from dataclasses import dataclass, field

import crc32c
from hypothesis import given, settings
from hypothesis import strategies as st
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
from proxy.records.batches import iter_batches
from tests.support.batches import build_batch

NOW = 1_700_000_000_000
PIDS = (11, 12, 13)


@functools.lru_cache(maxsize=4096)
def build(pid: int, epoch: int, seq: int, count: int) -> bytes:
    return build_batch(
        [b"v%d" % seq] * count, producer_id=pid, producer_epoch=epoch, base_sequence=seq
    )


def after(seq: int, count: int) -> int:
    return (seq + count) % (INT32_MAX + 1)


@dataclass
class Producer:
    epoch: int  # the client's epoch
    next_seq: int  # the client's next sequence
    known_epoch: int | None = None  # the sequencer's epoch for it, pending appends included
    retained: list[tuple[int, int, int, int, int]] = field(default_factory=list)
    # ^ the sequencer's last five: (epoch, first seq, count, base offset, last offset)


def outcome(result):
    """What a producer is told, comparable across two sequencers."""
    if isinstance(result, PendingAppend):
        return ("append", result.base_offset, result.last_offset, bytes(result.records))
    if isinstance(result, Duplicate):
        waits = result.awaiting and (result.awaiting.base_offset, result.awaiting.last_offset)
        return ("duplicate", result.base_offset, result.last_offset, waits)
    assert isinstance(result, Rejected)
    return ("rejected", result.error_code)


class Run:
    def __init__(self, start: int, first: dict[int, tuple[int, int]]) -> None:
        self.start = start
        self.sequencer = PartitionSequencer(start)
        self.twin: PartitionSequencer | None = None
        self.producers = {pid: Producer(epoch, seq) for pid, (epoch, seq) in first.items()}
        self.now = NOW
        self.pending: deque[tuple[PendingAppend, PendingAppend | None, int]] = deque()
        self.committed: list[tuple[PendingAppend, int]] = []
        self.next_offset = start

    def send(self, records: bytes):
        self.now += 1
        end = self.sequencer.log_end_offset
        result = self.sequencer.append(records, self.now)
        twin_result = None
        if self.twin is not None:
            twin_result = self.twin.append(records, self.now)
            assert outcome(twin_result) == outcome(result)
        if isinstance(result, PendingAppend):
            assert result.base_offset == end == self.next_offset  # contiguous, never reused
            self.next_offset = result.next_offset
            self.pending.append((result, twin_result, self.now))
        else:
            assert self.sequencer.log_end_offset == end
        return result

    def commit_oldest(self) -> None:
        if not self.pending:
            return
        pending, twin_pending, now = self.pending.popleft()
        assert self.sequencer.commit(pending) is ErrorCode.none
        if self.twin is not None:
            assert twin_pending is not None and self.twin.commit(twin_pending) is ErrorCode.none
        self.committed.append((pending, now))
        assert self.sequencer.high_watermark == pending.next_offset

    def accepted(self, pid: int, epoch: int, batches: list[tuple[int, int]], result) -> None:
        assert isinstance(result, PendingAppend), outcome(result)
        producer = self.producers[pid]
        if producer.known_epoch != epoch:
            producer.retained = []
        producer.known_epoch = producer.epoch = epoch
        offset = result.base_offset
        for seq, count in batches:
            producer.retained = [
                *producer.retained,
                (epoch, seq, count, offset, offset + count - 1),
            ][-5:]
            offset += count
            producer.next_seq = after(seq, count)
        assert offset == result.next_offset

    def refused(self, result, code: ErrorCode) -> None:
        assert isinstance(result, Rejected) and result.error_code is code, outcome(result)

    def step(self, op: tuple) -> None:
        kind, *args = op
        if kind == "commit":
            self.commit_oldest()
        elif kind == "plain":
            builder_batch = build(-1, -1, -1, args[0])
            assert isinstance(self.send(builder_batch), PendingAppend)
        elif kind in ("new", "multi"):
            pid, count = args
            producer = self.producers[pid]
            batches, seq = [], producer.next_seq
            for _ in range(count if kind == "multi" else 1):
                size = 1 + (seq % 3) if kind == "multi" else count
                batches.append((seq, size))
                seq = after(seq, size)
            records = b"".join(build(pid, producer.epoch, s, c) for s, c in batches)
            self.accepted(pid, producer.epoch, batches, self.send(records))
        elif kind == "retry":
            pid, index = args
            producer = self.producers[pid]
            if not producer.retained:
                return
            epoch, seq, count, base, last = producer.retained[index % len(producer.retained)]
            result = self.send(build(pid, epoch, seq, count))
            assert isinstance(result, Duplicate), outcome(result)
            assert (result.base_offset, result.last_offset) == (base, last)
            if last < self.sequencer.high_watermark:
                assert result.awaiting is None
            else:
                assert result.awaiting is not None
                assert result.awaiting.base_offset <= last <= result.awaiting.last_offset
        elif kind == "gap":
            pid, skip = args
            producer = self.producers[pid]
            seq = after(producer.next_seq, skip)
            result = self.send(build(pid, producer.epoch, seq, 2))
            if producer.known_epoch is None:  # no state: any sequence (KIP-360)
                self.accepted(pid, producer.epoch, [(seq, 2)], result)
            else:
                self.refused(result, ErrorCode.out_of_order_sequence_number)
        elif kind == "bump":
            producer = self.producers[args[0]]
            producer.epoch += 1
            producer.next_seq = 0
        elif kind == "bad_bump":
            pid, seq = args
            producer = self.producers[pid]
            if producer.known_epoch is not None:
                result = self.send(build(pid, producer.epoch + 1, seq, 1))
                self.refused(result, ErrorCode.out_of_order_sequence_number)
        elif kind == "zombie":
            producer = self.producers[args[0]]
            if producer.known_epoch is not None and producer.known_epoch > 0:
                result = self.send(build(args[0], producer.known_epoch - 1, 0, 1))
                self.refused(result, ErrorCode.invalid_producer_epoch)

    def start_twin(self) -> None:
        """Commit what is pending, then restore a second sequencer from a snapshot."""
        while self.pending:
            self.commit_oldest()
        self.twin = PartitionSequencer.restore(
            self.sequencer.snapshot(), self.sequencer.high_watermark
        )


PID = st.sampled_from(PIDS)
OPS = st.one_of(
    st.tuples(st.just("new"), PID, st.integers(1, 4)),
    st.tuples(st.just("multi"), PID, st.integers(2, 3)),
    st.tuples(st.just("retry"), PID, st.integers(0, 4)),
    st.tuples(st.just("retry"), PID, st.integers(0, 4)),
    st.tuples(st.just("gap"), PID, st.integers(1, 3)),
    st.tuples(st.just("bump"), PID),
    st.tuples(st.just("bad_bump"), PID, st.integers(1, 3)),
    st.tuples(st.just("zombie"), PID),
    st.tuples(st.just("plain"), st.integers(1, 3)),
    st.tuples(st.just("commit")),
    st.tuples(st.just("commit")),
)


@settings(max_examples=300, deadline=None)
@given(
    ops=st.lists(OPS, min_size=10, max_size=60),
    data=st.data(),
    start=st.integers(0, 1 << 40),
    first=st.fixed_dictionaries(
        {
            pid: st.tuples(st.sampled_from([0, 5]), st.sampled_from([0, 17, INT32_MAX - 4]))
            for pid in PIDS
        }
    ),
)
def test_random_producers_against_the_model(ops, data, start, first):
    run = Run(start, first)
    split = data.draw(st.integers(0, len(ops)), label="snapshot after op")
    for index, op in enumerate(ops):
        if index == split:
            run.start_twin()
        run.step(op)
    while run.pending:
        run.commit_oldest()
    sequencer = run.sequencer
    assert sequencer.high_watermark == sequencer.log_end_offset == run.next_offset
    if run.twin is not None:
        assert run.twin.producer_states == sequencer.producer_states
        assert run.twin.snapshot() == sequencer.snapshot()

    # the written batches tile the log from the start, and replaying them rebuilds the state
    rebuilt = PartitionSequencer(start)
    offset = start
    for pending, now in run.committed:
        for header, _ in iter_batches(pending.records):
            assert header.base_offset == offset
            offset = header.next_offset
            assert rebuilt.replay(header, now)
    assert offset == sequencer.high_watermark
    assert rebuilt.producer_states == sequencer.producer_states
    assert rebuilt.snapshot() == sequencer.snapshot()

    # a trim anywhere: its snapshot, restored, and the batches from the one holding the
    # trim's offset replayed, gives every producer's last batch back, and the whole
    # state of those the trim passed
    trim = data.draw(st.integers(start, sequencer.high_watermark), label="trim at")
    headers = [h for pending, _ in run.committed for h, _ in iter_batches(pending.records)]
    kept = [h for h in headers if h.next_offset > trim]
    replay_from = kept[0].base_offset if kept else trim
    after = PartitionSequencer.restore(sequencer.snapshot_at(trim), trim, replay_from=replay_from)
    for header in kept:
        assert after.replay(header, NOW)
    assert after.high_watermark == sequencer.high_watermark
    assert after.producer_states.keys() == sequencer.producer_states.keys()
    for pid, entry in sequencer.producer_states.items():
        again = after.producer_states[pid]
        if not entry.batches or entry.batches[-1].last_offset < trim:
            assert again == entry
        else:  # kept without its batches; the replay's added
            assert (again.producer_epoch, again.batches[-1]) == (
                entry.producer_epoch,
                entry.batches[-1],
            )
            assert again.coordinator_epoch == entry.coordinator_epoch


@settings(max_examples=500, deadline=None)
@given(data=st.binary(max_size=120))
def test_random_snapshot_bytes_only_ever_raise_corrupt_snapshot_error(data):
    try:
        decode_snapshot(data)
    except CorruptSnapshotError:
        pass


I16 = st.integers(-(1 << 15), (1 << 15) - 1)
I32 = st.integers(-(1 << 31), (1 << 31) - 1)
I64 = st.integers(-(1 << 63), (1 << 63) - 1)
ENTRY = st.builds(
    ProducerStateEntry,
    producer_id=I64,
    producer_epoch=I16,
    last_timestamp=I64,
    batches=st.lists(st.builds(BatchMetadata, I32, I64, I32, I64), max_size=5).map(tuple),
)


@settings(max_examples=300, deadline=None)
@given(
    offset=st.integers(0, (1 << 63) - 1),
    entries=st.lists(ENTRY, max_size=6, unique_by=lambda entry: entry.producer_id),
)
def test_snapshot_round_trip(offset, entries):
    decoded_offset, decoded = decode_snapshot(encode_snapshot(offset, entries))
    assert decoded_offset == offset
    assert sorted(decoded, key=lambda e: e.producer_id) == sorted(
        entries, key=lambda e: e.producer_id
    )


IDENTITY = st.tuples(I64, I16, I64)


@settings(max_examples=300, deadline=None)
@given(
    offset=st.integers(0, 1 << 62),
    past=st.integers(0, 1 << 40),
    position=st.none() | st.integers(0, 1 << 62),
    entries=st.lists(ENTRY, max_size=4, unique_by=lambda entry: entry.producer_id),
    expected=st.lists(IDENTITY, max_size=4).map(tuple),
)
def test_snapshot_round_trip_with_markers(offset, past, position, entries, expected):
    data = encode_snapshot(offset, entries, position, markers_end=offset + past, expected=expected)
    snapshot = read_snapshot(data)
    assert (snapshot.offset, snapshot.marker_position) == (offset, position)
    assert (snapshot.markers_end, snapshot.expected) == (offset + past, expected)
    assert sorted(snapshot.entries, key=lambda e: e.producer_id) == sorted(
        entries, key=lambda e: e.producer_id
    )
    assert data[1] == (3 if past or expected else 2)


@settings(max_examples=500, deadline=None)
@given(body=st.binary(max_size=160), version=st.sampled_from([1, 2, 3]))
def test_snapshot_bytes_with_a_valid_crc_only_ever_raise_corrupt_snapshot_error(body, version):
    data = struct.pack(">hI", version, crc32c.crc32c(body)) + body
    try:
        decode_snapshot(data)
    except CorruptSnapshotError:
        pass
