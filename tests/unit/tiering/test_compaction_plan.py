"""Compaction planning (proxy/upkeep/compaction_plan.py) on real metadata states: which small
stream set objects a pass takes, which stream objects their ranges become, and that the
commits a plan makes are exactly what the metadata rules accept (each new object's
`replaces` names the objects whose ranges it takes over; afterwards every replaced object
holds no range of the shard). Also: the block layout of the new objects and the config."""

from __future__ import annotations

from uuid import UUID

import pytest

from proxy.config import ConfigError, parse_config
from proxy.metadata.codec import encode
from proxy.metadata.records import (
    ObjectCommit,
    OffsetRange,
    ShardClaim,
    StreamCutover,
    StreamTrim,
)
from proxy.metadata.rules import Outcome
from proxy.metadata.state import MetadataState
from proxy.metadata.streams import StreamRange, shard_of, stream_id
from proxy.objects.format import ObjectWriter, read_block, read_object
from proxy.objects.keys import ObjectKind
from proxy.upkeep.compaction_plan import (
    CompactionPlan,
    CompactionSettings,
    add_blocks,
    blocks_for,
    object_stats,
    pick_sources,
    plan_compaction,
)

TOPIC = UUID("6ba7b810-9dad-41d1-80b4-00c04fd430c8")
KiB = 1024
SMALL = CompactionSettings(
    small_object_bytes=32 * KiB, stream_object_bytes=64 * KiB, min_objects=2, max_pass_bytes=1 << 30
)


class Shard:
    """A shard's partition as a list of records, applied by a real MetadataState."""

    def __init__(self, shard: int = 0, shard_count: int = 1, partitions: int = 2) -> None:
        self.state = MetadataState(shard, shard_count)
        assert self.write(ShardClaim(0, 1, "proxy-a", 1)).accepted
        self.streams: list[int] = []
        partition = 0
        while len(self.streams) < partitions:  # the first partitions of TOPIC in this shard
            s = stream_id(TOPIC, partition)
            if shard_of(s, shard_count) == shard:
                record = StreamCutover(0, s, 1, 1, TOPIC, partition, 0, 0, 0, 1)
                assert self.write(record).accepted
                self.streams.append(s)
            partition += 1
        self.streams.sort()

    def write(self, record):
        return self.state.apply(*encode(record), self.state.next_offset)

    def commit(self, number, *ranges, size=4 * KiB, kind=ObjectKind.STREAM_SET, at=None):
        spans = tuple(sorted((OffsetRange(*r) for r in ranges), key=lambda r: r.stream_id))
        record = ObjectCommit(0, number, kind, size, 1, at or number, spans)
        assert self.write(record).accepted
        return record


def tail(shard: Shard, count: int, *, span: int = 10, size: int = 4 * KiB, first: int = 1):
    """`count` stream set objects, each holding the next `span` offsets of every stream."""
    for n in range(count):
        ranges = []
        for s in shard.streams:
            end = shard.state.stream_end(s)
            ranges.append((s, end, end + span))
        shard.commit(first + n, *ranges, size=size)


def commits_of(shard: Shard, plan: CompactionPlan, first_id: int = 1000) -> list[ObjectCommit]:
    return [
        ObjectCommit(
            0,
            first_id + n,
            ObjectKind.STREAM,
            new.data_bytes + 100,
            1,
            99,
            (OffsetRange(new.stream_id, new.start_offset, new.end_offset),),
            new.replaces,
        )
        for n, new in enumerate(plan.objects)
    ]


def apply_plan(shard: Shard, plan: CompactionPlan, first_id: int = 1000) -> list:
    """Write the plan's commits as the compactor does (each judged after the ones before)."""
    return [shard.write(c) for c in commits_of(shard, plan, first_id)]


def per_range(size: int):
    return lambda r: size


def spans(state: MetadataState, stream: int) -> list[tuple[int, int, int]]:
    return [(r.start_offset, r.end_offset, r.object_id) for r in state.committed_ranges(stream)]


# -- the plan and the rules ------------------------------------------------------------------


def test_small_stream_set_objects_become_one_stream_object_per_stream():
    shard = Shard(partitions=2)
    tail(shard, 10)
    before, _ = object_stats(shard.state)
    sources = pick_sources(shard.state, SMALL)
    assert sources == list(range(1, 11))
    plan = plan_compaction(shard.state, SMALL, sources, per_range(1000))
    assert plan is not None and plan.replaces == tuple(range(1, 11))
    assert [(o.stream_id, o.start_offset, o.end_offset) for o in plan.objects] == [
        (s, 0, 100) for s in shard.streams
    ]
    assert all(o.replaces == tuple(range(1, 11)) for o in plan.objects)
    assert all(v.outcome is Outcome.ACCEPT for v in apply_plan(shard, plan))
    # every replaced object holds nothing now; the ranges are continuous, in new objects
    assert [c.object_id for c in shard.state.garbage_objects()] == list(range(1, 11))
    for n, s in enumerate(shard.streams):
        assert spans(shard.state, s) == [(0, 100, 1000 + n)]
        assert shard.state.stream_end(s) == 100
    assert object_stats(shard.state)[0] == 2 < before == 10


def test_a_plan_made_stale_by_a_trim_is_refused_by_the_rules():
    shard = Shard(partitions=1)
    tail(shard, 4)
    plan = plan_compaction(shard.state, SMALL, pick_sources(shard.state, SMALL), per_range(100))
    assert plan is not None
    [s] = shard.streams
    assert shard.write(StreamTrim(0, s, 1, 10, 1, 5)).accepted  # drops object 1's range
    [verdict] = apply_plan(shard, plan)
    assert verdict.outcome is Outcome.REFUSE and "does not cover exactly" in verdict.reason


def test_fewer_small_objects_than_min_objects_is_nothing_to_do():
    shard = Shard()
    tail(shard, 3)
    settings = CompactionSettings(small_object_bytes=32 * KiB, stream_object_bytes=64 * KiB,
                                  min_objects=4)  # fmt: skip
    assert pick_sources(shard.state, settings) == []
    tail(shard, 1, first=4)
    assert pick_sources(shard.state, settings) == [1, 2, 3, 4]


def test_large_and_stream_objects_are_not_sources_and_cut_runs():
    shard = Shard(partitions=1)
    [s] = shard.streams
    tail(shard, 3)  # 1, 2, 3: [0, 30)
    shard.commit(4, (s, 30, 40), size=40 * KiB)  # a large stream set object
    tail(shard, 3, first=5)  # 5, 6, 7: [40, 70)
    sources = pick_sources(shard.state, SMALL)
    assert sources == [1, 2, 3, 5, 6, 7]
    plan = plan_compaction(shard.state, SMALL, sources, per_range(100))
    assert plan is not None
    assert [(o.start_offset, o.end_offset, o.replaces) for o in plan.objects] == [
        (0, 30, (1, 2, 3)),
        (40, 70, (5, 6, 7)),
    ]
    assert all(v.accepted for v in apply_plan(shard, plan))
    assert [r[2] for r in spans(shard.state, s)] == [1000, 4, 1001]


def test_a_run_is_cut_at_the_target_size():
    shard = Shard(partitions=1)
    tail(shard, 10)
    settings = CompactionSettings(small_object_bytes=1024, stream_object_bytes=1024,
                                  min_objects=2)  # fmt: skip
    plan = plan_compaction(shard.state, settings, list(range(1, 11)), per_range(300))
    assert plan is not None
    assert [len(o.sources) for o in plan.objects] == [3, 3, 3, 1]
    assert [o.data_bytes for o in plan.objects] == [900, 900, 900, 300]
    assert all(v.accepted for v in apply_plan(shard, plan))


def test_a_small_stream_object_is_taken_in_only_when_no_larger_than_the_new_data():
    shard = Shard(partitions=1)
    [s] = shard.streams
    shard.commit(1, (s, 0, 50), size=2000, kind=ObjectKind.STREAM)
    tail(shard, 4, first=2)  # 2..5: [50, 90), 400 bytes each
    sources = pick_sources(shard.state, SMALL)
    assert sources == [2, 3, 4, 5]
    plan = plan_compaction(shard.state, SMALL, sources, per_range(400))
    assert plan is not None and plan.replaces == (2, 3, 4, 5)  # 2000 > 1600: left alone
    tail(shard, 1, first=6)
    plan = plan_compaction(shard.state, SMALL, [2, 3, 4, 5, 6], per_range(400))
    assert plan is not None and plan.replaces == (1, 2, 3, 4, 5, 6)  # 2000 <= 2000
    [new] = plan.objects
    assert (new.start_offset, new.end_offset, new.data_bytes) == (0, 100, 4000)
    assert all(v.accepted for v in apply_plan(shard, plan))
    assert spans(shard.state, s) == [(0, 100, 1000)]


def test_no_plan_when_the_shard_would_not_hold_fewer_objects():
    shard = Shard(partitions=3)
    tail(shard, 2)  # two objects, three streams each: three new objects
    assert plan_compaction(shard.state, SMALL, [1, 2], per_range(100)) is None
    tail(shard, 2, first=3)
    plan = plan_compaction(shard.state, SMALL, [1, 2, 3, 4], per_range(100))
    assert plan is not None and len(plan.objects) == 3 and len(plan.replaces) == 4


def test_sources_are_the_oldest_commits_up_to_the_pass_bytes():
    shard = Shard(partitions=1)
    [s] = shard.streams
    for number, at in ((7, 30), (3, 10), (5, 20), (9, 40)):
        end = shard.state.stream_end(s)
        shard.commit(number, (s, end, end + 5), size=10 * KiB, at=at)
    settings = CompactionSettings(small_object_bytes=32 * KiB, stream_object_bytes=64 * KiB,
                                  min_objects=2, max_pass_bytes=30 * KiB)  # fmt: skip
    assert pick_sources(shard.state, settings) == [3, 5, 7]


def test_an_object_spanning_shards_is_replaced_in_this_shard_only():
    zero, one = Shard(0, 2, partitions=1), Shard(1, 2, partitions=1)
    [s0], [s1] = zero.streams, one.streams
    for n in range(1, 5):  # each upload: one object, one commit per shard naming its part
        zero.commit(n, (s0, 10 * (n - 1), 10 * n))
        one.commit(n, (s1, 10 * (n - 1), 10 * n))
    plan = plan_compaction(zero.state, SMALL, pick_sources(zero.state, SMALL), per_range(100))
    assert plan is not None and [o.stream_id for o in plan.objects] == [s0]
    assert all(v.accepted for v in apply_plan(zero, plan))
    assert [c.object_id for c in zero.state.garbage_objects()] == [1, 2, 3, 4]
    assert all(one.state.object_ranges(n) for n in range(1, 5))  # still used in shard 1
    # a commit in shard 0 cannot take over shard 1's ranges
    stranger = ObjectCommit(0, 2000, ObjectKind.STREAM, 100, 1, 1, (OffsetRange(s1, 0, 40),),
                            (1, 2, 3, 4))  # fmt: skip
    assert zero.state.check(stranger).outcome is Outcome.REFUSE


def test_settings_name_the_field_they_refuse():
    with pytest.raises(ValueError, match="min_objects"):
        CompactionSettings(min_objects=1)
    with pytest.raises(ValueError, match="stream_object_bytes"):
        CompactionSettings(small_object_bytes=10, stream_object_bytes=5)
    with pytest.raises(ValueError, match="max_pass_bytes"):
        CompactionSettings(max_pass_bytes=0)


# -- the new objects' blocks -------------------------------------------------------------------


def test_adjacent_blocks_are_joined_up_to_the_block_limit_bytes_unchanged():
    blocks = [(10 * n, 10 * n + 10, 3, memoryview(bytes([n]) * 100)) for n in range(7)]
    writer = ObjectWriter(5, ObjectKind.STREAM, version=1)  # the blocks are not batches
    add_blocks(writer, 42, blocks, max_block_bytes=250)
    data = writer.build().to_bytes()
    _, index = read_object(data, writer.key)
    assert [(e.start_offset, e.end_offset, e.record_count, e.size) for e in index] == [
        (0, 20, 6, 200),
        (20, 40, 6, 200),
        (40, 60, 6, 200),
        (60, 70, 3, 100),
    ]
    joined = b"".join(bytes(read_block(data, e, writer.key)) for e in index)
    assert joined == b"".join(bytes(b[3]) for b in blocks)


def test_blocks_for_a_range_must_tile_it_exactly():
    writer = ObjectWriter(6, ObjectKind.STREAM_SET, version=1)
    writer.add_block(1, b"a" * 10, 0, 10, 1)
    writer.add_block(1, b"b" * 10, 10, 20, 1)
    writer.add_block(2, b"c" * 10, 0, 5, 1)
    index = writer.build().index

    def r(stream, start, end):
        return StreamRange(stream, start, end, 6, ObjectKind.STREAM_SET, 999)

    assert [e.start_offset for e in blocks_for(index, r(1, 0, 20))] == [0, 10]
    assert [e.start_offset for e in blocks_for(index, r(2, 0, 5))] == [0]
    for wrong in (r(1, 0, 15), r(1, 10, 25), r(1, 5, 20), r(3, 0, 5)):
        with pytest.raises(ValueError, match="do not cover"):
            blocks_for(index, wrong)


# -- the config --------------------------------------------------------------------------------


def _tiering(**values):
    return parse_config({"upstream": {"bootstrap": "127.0.0.1:9092"}, "tiering": values}).tiering


def test_compaction_config_defaults_and_values():
    config = _tiering()
    assert (config.compaction_enabled, config.compaction_interval_s) == (True, 300.0)
    assert (config.object_delete_grace_s, config.stream_object_bytes) == (60.0, 64 << 20)
    assert config.compaction_small_object_bytes == 32 << 20
    config = _tiering(compaction_interval_s=5, object_delete_grace_s=0, compaction_min_objects=3)
    assert (config.compaction_interval_s, config.object_delete_grace_s) == (5.0, 0.0)
    assert config.compaction_min_objects == 3


@pytest.mark.parametrize(
    ("values", "key"),
    [
        ({"compaction_interval_s": 0}, "tiering.compaction_interval_s"),
        ({"object_delete_grace_s": -1}, "tiering.object_delete_grace_s"),
        ({"compaction_min_objects": 1}, "tiering.compaction_min_objects"),
        ({"compaction_enabled": "yes"}, "tiering.compaction_enabled"),
        ({"stream_object_bytes": 4096, "compaction_small_object_bytes": 8192},
         "tiering.stream_object_bytes"),
        ({"compaction_trigger_objects": 4, "compaction_min_objects": 8},
         "tiering.compaction_trigger_objects"),
        ({"compaction_max_bytes": 10}, "tiering.compaction_max_bytes"),
    ],
)  # fmt: skip
def test_bad_compaction_config_names_the_key(values, key):
    with pytest.raises(ConfigError) as caught:
        _tiering(**values)
    assert caught.value.key == key
