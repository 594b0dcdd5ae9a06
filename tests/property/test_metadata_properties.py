"""Metadata records and the shard state machine, for any input (docs/metadata.md).

- Every record type round-trips through the codec; any other bytes fail with
  MetadataRecordError and nothing else, and the reader turns them into a refusal.
- Any sequence of records (valid, invalid, stale, racing, garbage) read by two independent
  readers gives the same state and the same refusals, and the writer's check of a record
  always predicts what the readers decide.
- Whatever the records, a stream's ranges never overlap and its tail is contiguous from
  the cutover (or the log start) to its end.
- A partition an honest owner wrote (checks before writing, checkpoints, tombstones for
  retired keys) reads back to the same state after Kafka compacts it.
"""

from __future__ import annotations

from dataclasses import replace
from itertools import pairwise
from uuid import UUID

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.metadata.codec import decode, encode
from proxy.metadata.records import (
    I64_MAX,
    U32_MAX,
    CheckpointEnd,
    MetadataRecordError,
    ObjectCommit,
    ObjectDelete,
    OffsetRange,
    ProducerSnapshot,
    Record,
    ShardClaim,
    ShardRelease,
    StreamCutover,
    StreamTrim,
    StreamUntier,
    Tombstone,
    TopicMode,
    TopicModeSet,
)
from proxy.metadata.rules import Outcome
from proxy.metadata.state import MetadataState
from proxy.metadata.streams import stream_id
from proxy.objects.keys import U64_MAX, ObjectKind

PROPERTY = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])

U32 = st.integers(0, U32_MAX)
U64 = st.integers(0, U64_MAX)
OFFSET = st.integers(0, I64_MAX)
NAME = st.text(min_size=1, max_size=40).filter(lambda s: len(s.encode()) <= 255)
TOPIC_ID = st.uuids().filter(lambda u: u.int != 0)


@st.composite
def offset_ranges(draw) -> OffsetRange:
    start = draw(st.integers(0, I64_MAX - 1))
    return OffsetRange(draw(U64), start, draw(st.integers(start + 1, I64_MAX)))


@st.composite
def cutovers(draw) -> StreamCutover:
    end = draw(OFFSET)
    log_start, cutover = draw(st.integers(0, end)), draw(st.integers(0, end))
    return StreamCutover(
        draw(U32),
        draw(U64),
        draw(st.integers(1, U32_MAX)),
        draw(U32),
        draw(TOPIC_ID),
        draw(st.integers(0, (1 << 31) - 1)),
        log_start,
        cutover,
        end,
        draw(OFFSET),
    )


@st.composite
def commits(draw) -> ObjectCommit:
    kind = draw(st.sampled_from(ObjectKind))
    ranges = draw(st.lists(offset_ranges(), max_size=1 if kind is ObjectKind.STREAM else 6))
    ranges = sorted({r.stream_id: r for r in ranges}.values(), key=lambda r: r.stream_id)
    number = draw(U64)
    replaces = sorted(set(draw(st.lists(U64, max_size=5))) - {number})
    return ObjectCommit(
        draw(U32),
        number,
        kind,
        draw(st.integers(1, I64_MAX)),
        draw(U32),
        draw(OFFSET),
        tuple(ranges),
        tuple(replaces),
    )


RECORDS = st.one_of(
    st.builds(TopicModeSet, TOPIC_ID, NAME, st.sampled_from(TopicMode), OFFSET, st.none() | NAME),
    st.builds(ShardClaim, U32, U32, NAME, OFFSET),
    cutovers(),
    st.builds(StreamUntier, U32, U64, st.integers(1, U32_MAX), U32, OFFSET, st.none() | OFFSET),
    st.builds(StreamTrim, U32, U64, st.integers(1, U32_MAX), OFFSET, U32, OFFSET),
    commits(),
    st.builds(ObjectDelete, U32, U64, U32, OFFSET),
    st.builds(ProducerSnapshot, U32, U64, U32, OFFSET, OFFSET, st.binary(max_size=64)),
    st.builds(CheckpointEnd, st.integers(1, U32_MAX), U32, OFFSET),
    st.builds(ShardRelease, U32, U32, NAME, OFFSET),
)


@PROPERTY
@given(record=RECORDS)
def test_every_record_round_trips(record):
    key, value = encode(record)
    assert decode(key, value) == record
    assert decode(bytearray(key), memoryview(value)) == record
    assert isinstance(decode(key, None), Tombstone)


def decodes_or_refuses(key, value) -> None:
    try:
        decode(key, value)
    except MetadataRecordError:
        pass
    verdict = MetadataState().apply(key, value, 0)  # the reader never raises on content
    assert verdict.outcome in set(Outcome)


@PROPERTY
@given(record=RECORDS, value=st.binary(max_size=300))
def test_any_value_decodes_or_fails_with_metadata_record_error(record, value):
    key, _ = encode(record)
    decodes_or_refuses(key, value)


@PROPERTY
@given(key=st.binary(max_size=40), value=st.none() | st.binary(max_size=100))
def test_any_key_decodes_or_fails_with_metadata_record_error(key, value):
    decodes_or_refuses(key, value)


@PROPERTY
@given(record=RECORDS, data=st.data())
def test_a_damaged_record_decodes_or_fails_with_metadata_record_error(record, data):
    key, value = encode(record)
    which = data.draw(st.sampled_from(["key", "value"]))
    raw = bytearray(key if which == "key" else value)
    at = data.draw(st.integers(0, len(raw) - 1))
    if data.draw(st.booleans()):
        raw[at] ^= data.draw(st.integers(1, 255))
    else:
        del raw[at:]
    decodes_or_refuses(raw if which == "key" else key, raw if which == "value" else value)


# -- the state machine -----------------------------------------------------------------------

TOPIC = UUID(int=0x5EED)
STREAMS = [stream_id(TOPIC, partition) for partition in range(3)]
OPS = ["tail"] * 5 + ["backfill"] * 2 + ["replace"] * 2 + ["claim", "cutover", "cutover"]
OPS += ["untier", "trim", "delete", "snapshot", "checkpoint", "topic", "tombstone", "junk"]
OPS += ["recommit", "release"]
OPS += ["other generation"]

Written = tuple[Record | None, bytes, bytes | None]


def near(data, value: int, steps=(0, 0, 0, 0, 1, -1, -5, 3)) -> int:
    return max(0, value + data.draw(st.sampled_from(steps)))


def step(data, state: MetadataState, log: list, honest: bool) -> list[Written]:
    """Records to write next: a likely-valid operation, sometimes bent out of shape."""
    op = data.draw(st.sampled_from(OPS))
    partition = data.draw(st.integers(0, len(STREAMS) - 1))
    s = STREAMS[partition]
    info = state.stream(s)
    gen = state.generation
    epoch = near(data, state.epoch, (0, 0, 0, 0, 0, 1, -1))
    number = data.draw(st.integers(1, 40))
    record: Record | None = None
    if op in ("tail", "other generation"):
        start = near(data, state.stream_end(s) or 0)
        ranges = [OffsetRange(s, start, start + data.draw(st.integers(1, 20)))]
        other = STREAMS[(partition + 1) % len(STREAMS)]
        if data.draw(st.booleans()) and state.stream_end(other) is not None:
            at = near(data, state.stream_end(other) or 0)
            ranges.append(OffsetRange(other, at, at + data.draw(st.integers(1, 5))))
        ranges.sort(key=lambda r: r.stream_id)
        if op == "other generation":
            gen = max(0, gen + data.draw(st.sampled_from([-1, 1, 2])))
        record = ObjectCommit(gen, number, ObjectKind.STREAM_SET, 100, epoch, 1, tuple(ranges))
    elif op == "backfill":
        low, high = (info.log_start_offset, info.cutover_offset) if info else (0, 30)
        start = data.draw(st.integers(max(0, low - 2), max(low, high) + 2))
        end = start + data.draw(st.integers(1, 30))
        spans = (OffsetRange(s, start, end),)
        record = ObjectCommit(gen, number, ObjectKind.STREAM, 100, epoch, 1, spans)
    elif op == "replace":
        ranges = state.committed_ranges(s)
        if not ranges:
            return []
        i = data.draw(st.integers(0, len(ranges) - 1))
        chosen = ranges[i : data.draw(st.integers(i + 1, min(len(ranges), i + 3)))]
        start, end = chosen[0].start_offset, near(data, chosen[-1].end_offset, (0, 0, 0, 1, -1))
        replaces = sorted({r.object_id for r in chosen} - {number})
        if data.draw(st.integers(0, 9)) == 0:
            replaces = replaces[1:]
        spans = (OffsetRange(s, start, max(start + 1, end)),)
        record = ObjectCommit(gen, number, ObjectKind.STREAM, 100, epoch, 1, spans, tuple(replaces))
    elif op == "claim":
        owner = data.draw(st.sampled_from(["proxy-a", "proxy-b"]))
        record = ShardClaim(gen, near(data, state.epoch, (1, 1, 1, 0, -1)), owner, 1)
    elif op == "release":
        owner = data.draw(st.sampled_from([state.owner or "proxy-a", "proxy-b"]))
        record = ShardRelease(gen, near(data, state.epoch, (0, 0, 0, 1, -1)), owner, 1)
    elif op == "cutover":
        incarnation = info.incarnation + 1 if info else data.draw(st.integers(1, 3))
        log_start = data.draw(st.integers(0, 30))
        at = log_start + data.draw(st.integers(0, 30))
        args = (TOPIC, partition, log_start, at, at, 1)
        record = StreamCutover(gen, s, incarnation, epoch, *args)
    elif op in ("untier", "trim"):
        incarnation = info.incarnation if info else data.draw(st.integers(1, 3))
        if op == "untier":
            record = StreamUntier(gen, s, incarnation, epoch, 1)
        else:
            low, high = (info.log_start_offset, info.end_offset) if info else (0, 40)
            to = data.draw(st.integers(max(0, low - 1), high + 1))
            record = StreamTrim(gen, s, incarnation, to, epoch, 1)
    elif op == "recommit":  # the same object again: a no-op, or refused if it changed
        known = [r.object_id for r in state.committed_ranges(s)]
        if not known:
            return []
        again = state.object_commit(data.draw(st.sampled_from(known)))
        assert again is not None
        record = replace(again, generation=gen, epoch=epoch, committed_at_ms=2)
    elif op == "delete":
        garbage = [c.object_id for c in state.garbage_objects()]
        if garbage and data.draw(st.booleans()):
            number = data.draw(st.sampled_from(garbage))
        record = ObjectDelete(gen, number, epoch, 1)
    elif op == "snapshot":
        offset = near(data, state.stream_end(s) or 0, (0, -1, -10, -30, 1))
        record = ProducerSnapshot(gen, s, epoch, offset, 1, data.draw(st.binary(max_size=8)))
    elif op == "topic":
        topic = data.draw(st.sampled_from([TOPIC, UUID(int=2)]))
        mode = data.draw(st.sampled_from(TopicMode))
        if data.draw(st.integers(0, 3)) == 0:
            return [(None, encode(TopicModeSet(topic, "t", mode, 1))[0], None)]
        record = TopicModeSet(topic, "t", mode, 1)
    elif op == "checkpoint":
        written = state.checkpoint_records("proxy-a", max(state.epoch, 1), 5)
        cut = 0 if honest else data.draw(st.sampled_from([0, 0, 0, 1, 2]))
        return [(None, key, value) for key, value in written[: len(written) - cut]]
    elif op == "tombstone":
        keys = sorted(state.retired_keys()) if honest else [key for _, key, _ in log]
        return [(None, data.draw(st.sampled_from(keys)), None)] if keys else []
    else:  # junk
        if honest:
            return []
        return [(None, data.draw(st.binary(max_size=20)), data.draw(st.binary(max_size=20)))]
    assert record is not None
    if honest and not (
        getattr(record, "generation", gen) == state.generation and state.check(record).accepted
    ):
        return []
    return [(record, *encode(record))]


def assert_invariants(state: MetadataState) -> None:
    for s in state.stream_ids():
        info = state.stream(s)
        ranges = state.committed_ranges(s)
        for earlier, later in pairwise(ranges):
            assert earlier.end_offset <= later.start_offset
        position = max(info.cutover_offset, info.log_start_offset)
        for r in ranges:
            assert info.log_start_offset < r.end_offset <= info.end_offset
            assert r in state.object_ranges(r.object_id)
            if r.end_offset > position:
                assert r.start_offset <= position, f"gap before {r}"
                position = r.end_offset
        assert position == info.end_offset, "the tail does not reach the stream's end"
    for garbage in state.garbage_objects():
        assert state.object_ranges(garbage.object_id) == ()


def run(data, honest: bool) -> tuple[MetadataState, list]:
    state = MetadataState()
    log: list[tuple[int, bytes, bytes | None]] = []
    offset = -1
    for _ in range(data.draw(st.integers(1, 60))):
        for record, key, value in step(data, state, log, honest):
            offset += data.draw(st.sampled_from([1, 1, 1, 4]))  # compaction leaves holes
            expected = None
            if isinstance(record, Record) and not isinstance(record, CheckpointEnd):
                if getattr(record, "generation", state.generation) == state.generation:
                    expected = state.check(record)
            log.append((offset, key, value))
            verdict = state.apply(key, value, offset)
            if expected is not None:
                assert verdict == expected, record
            if honest:
                assert verdict.outcome is not Outcome.REFUSE, verdict
            assert_invariants(state)
    return state, log


def read(log, copy=bytes) -> MetadataState:
    state = MetadataState()
    for offset, key, value in log:
        state.apply(copy(key), None if value is None else copy(value), offset)
    return state


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_two_readers_of_any_records_agree_and_the_invariants_hold(data):
    state, log = run(data, honest=False)
    other = read(log, copy=bytearray)
    assert other.image() == state.image()
    assert list(other.refusals) == list(state.refusals)
    assert other.refused_count == state.refused_count
    assert_invariants(other)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), drop_tombstones=st.booleans())
def test_an_honest_owners_partition_reads_the_same_after_compaction(data, drop_tombstones):
    state, log = run(data, honest=True)
    last = {key: offset for offset, key, _ in log}
    compacted = [
        (offset, key, value)
        for offset, key, value in log
        if last[key] == offset and not (drop_tombstones and value is None)
    ]
    assert read(compacted).image() == state.image()


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_a_checkpoint_keeps_the_state_it_rewrites(data):
    state, log = run(data, honest=True)
    offset = log[-1][0] if log else -1
    if not state.owner:  # a checkpoint is written by an owner: one that claimed
        offset += 1
        claim = ShardClaim(state.generation, state.epoch + 1, "proxy-a", 1)
        assert state.apply(*encode(claim), offset).accepted
    before = state.image()
    for key, value in state.checkpoint_records(state.owner, state.epoch, 9):
        offset += 1
        assert state.apply(key, value, offset).accepted
    ignored = ("generation", "retired", "deleted")  # deleted ids are kept per generation
    after = state.image()
    assert {k: after[k] for k in after if k not in ignored} == {
        k: before[k] for k in before if k not in ignored
    }
