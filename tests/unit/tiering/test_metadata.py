"""The metadata of tiered streams: the record codec byte by byte, stream ids and shards,
and every rule a shard's records are judged by, in concrete scenarios (docs/metadata.md).

Each scenario writes records to a `Partition` (a list standing in for one partition of the
metadata topic) whose reader applies them as they are written; `reread()` is a reader that
starts later and reads the whole partition, as a new owner does."""

from __future__ import annotations

import re
import struct
from pathlib import Path
from uuid import UUID

import pytest

from proxy.metadata.codec import decode, decode_key, encode
from proxy.metadata.records import (
    CheckpointEnd,
    MetadataRecordError,
    ObjectCommit,
    ObjectDelete,
    OffsetRange,
    ProducerSnapshot,
    RecordKey,
    RecordType,
    ShardClaim,
    ShardRelease,
    StreamCutover,
    StreamTrim,
    StreamUntier,
    Tombstone,
    TopicMode,
    TopicModeSet,
)
from proxy.metadata.rules import Outcome, Verdict
from proxy.metadata.state import (
    MetadataState,
    Refusal,
    check_commit,
    check_cutover,
    check_delete,
    check_release,
    check_trim,
    check_untier,
    topic_untier_refusal,
)
from proxy.metadata.streams import (
    offload_object_id,
    shard_of,
    stream_id,
    topic_shard,
    transactional_id,
)
from proxy.objects.keys import ObjectKind

DOC = Path(__file__).resolve().parents[3] / "docs" / "metadata.md"
TOPIC = UUID("6ba7b810-9dad-41d1-80b4-00c04fd430c8")
S = stream_id(TOPIC, 0)
S1 = stream_id(TOPIC, 1)
ACCEPTED = Verdict(Outcome.ACCEPT)


class Partition:
    """One partition of the metadata topic and a reader applying its records as written."""

    def __init__(self, shard: int = 0, shard_count: int = 1) -> None:
        self.shard, self.shard_count = shard, shard_count
        self.log: list[tuple[int, bytes, bytes | None]] = []
        self.state = MetadataState(shard, shard_count)

    def write(self, record) -> Verdict:
        return self.write_raw(*encode(record))

    def write_raw(self, key: bytes, value: bytes | None) -> Verdict:
        offset = len(self.log)
        self.log.append((offset, key, value))
        return self.state.apply(key, value, offset)

    def reread(self, log=None) -> MetadataState:
        fresh = MetadataState(self.shard, self.shard_count)
        for offset, key, value in self.log if log is None else log:
            fresh.apply(key, value, offset)
        return fresh


def claim(epoch=1, owner="proxy-a", generation=0) -> ShardClaim:
    return ShardClaim(generation, epoch, owner, 1_000)


def cutover(partition=0, *, at=500, log_start=100, epoch=1, incarnation=1, generation=0):
    return StreamCutover(
        generation,
        stream_id(TOPIC, partition),
        incarnation,
        epoch,
        TOPIC,
        partition,
        log_start,
        at,
        at,
        2_000,
    )


def commit(object_id, *ranges, epoch=1, kind=ObjectKind.STREAM_SET, replaces=(), generation=0):
    spans = tuple(OffsetRange(*r) for r in ranges)
    return ObjectCommit(generation, object_id, kind, 4096, epoch, 3_000, spans, replaces)


def spans(state: MetadataState, stream: int = S) -> list[tuple[int, int, int]]:
    return [(r.start_offset, r.end_offset, r.object_id) for r in state.committed_ranges(stream)]


def tiered(partitions=(0,)) -> Partition:
    """A shard owned at epoch 1 with the given partitions of TOPIC cut over at 500."""
    p = Partition()
    assert p.write(claim()) == ACCEPTED
    for partition in partitions:
        assert p.write(cutover(partition)) == ACCEPTED
    return p


def refused(verdict: Verdict | Refusal, *words: str) -> bool:
    if isinstance(verdict, Verdict) and verdict.outcome is not Outcome.REFUSE:
        return False
    return all(w in verdict.reason for w in words)


# -- the codec, byte by byte ------------------------------------------------------------


def test_an_object_commit_is_laid_out_as_documented():
    record = commit(0x2A, (S, 500, 600), (S1, 7, 9), replaces=(3, 4), epoch=2)
    key, value = encode(record)
    assert key == bytes([1, 6]) + struct.pack(">IQ", 0, 0x2A)
    assert value == (
        bytes([1])
        + struct.pack(">IBqq", 2, 1, 4096, 3_000)
        + struct.pack(">IQQ", 2, 3, 4)
        + struct.pack(">I", 2)
        + struct.pack(">Qqq", min(S, S1), *((500, 600) if S < S1 else (7, 9)))
        + struct.pack(">Qqq", max(S, S1), *((7, 9) if S < S1 else (500, 600)))
    )
    assert decode(key, value) == record


def doc_hex(marker: str) -> bytes:
    block = re.search(rf"<!-- {marker} -->\n```\n(.*?)```", DOC.read_text(), re.S)
    assert block is not None, marker
    return bytes.fromhex(block.group(1))


def test_the_worked_example_in_the_docs_is_what_the_code_writes():
    spans = (OffsetRange(7, 500, 600), OffsetRange(9, 0, 10))
    record = ObjectCommit(3, 42, ObjectKind.STREAM_SET, 4096, 2, 1_700_000_000_000, spans, (17,))
    assert encode(record) == (doc_hex("example-commit-key"), doc_hex("example-commit-value"))
    assert record.key == "a200/stream-set/000000000000002a"


def test_a_cutover_and_a_topic_mode_are_laid_out_as_documented():
    key, value = encode(cutover(epoch=3, incarnation=2, generation=5))
    assert key == bytes([1, 3]) + struct.pack(">IQI", 5, S, 2)
    assert value == bytes([1]) + struct.pack(">I", 3) + TOPIC.bytes + struct.pack(
        ">iqqqq", 0, 100, 500, 500, 2_000
    )
    key, value = encode(TopicModeSet(TOPIC, "orders", TopicMode.TIERED, 9))
    assert key == bytes([1, 1]) + TOPIC.bytes
    assert value == bytes([1, 1]) + struct.pack(">q", 9) + bytes([6]) + b"orders"


def test_a_shard_release_is_laid_out_as_documented():
    key, value = encode(ShardRelease(2, 7, "proxy-a", 1_700_000_000_000))
    assert key == bytes([1, 10]) + struct.pack(">II", 2, 7) + bytes([7]) + b"proxy-a"
    assert value == bytes([1]) + struct.pack(">q", 1_700_000_000_000)
    assert decode(key, value) == ShardRelease(2, 7, "proxy-a", 1_700_000_000_000)


def test_a_tombstone_decodes_to_what_its_key_names():
    key, _ = encode(commit(7, (S, 500, 600), generation=3))
    assert decode(key, None) == Tombstone(RecordKey(RecordType.OBJECT_COMMIT, 3, None))
    assert decode_key(encode(TopicModeSet(TOPIC, "t", 0, 0))[0]) == RecordKey(
        RecordType.TOPIC_MODE, None, TOPIC
    )


@pytest.mark.parametrize(
    ("key", "value", "what"),
    [
        (b"", b"\x01", "ends inside a field"),
        (bytes([2, 6]) + bytes(12), b"", "unsupported key version 2"),
        (bytes([1, 42]), b"\x01", "unknown record type 42"),
        (bytes([1, 6]) + bytes(13), b"\x01", "key has 1 bytes after its last field"),
        (encode(claim())[0], b"\x02" + bytes(8), "unsupported value version 2"),
        (encode(claim())[0], b"\x01" + bytes(7), "ends inside a field"),
        (encode(claim())[0], b"\x01" + bytes(9), "1 bytes after its last field"),
        (encode(claim())[0], b"\x01" + struct.pack(">q", -1), "claimed_at_ms = -1"),
        (bytes([1, 2, 0, 0, 0, 0, 0, 0, 0, 1, 2]) + b"\xff\xfe", b"\x01" + bytes(8), "UTF-8"),
        (bytes([1, 1]) + bytes(16), b"\x01\x00" + bytes(8) + b"\x01t", "not a topic id"),
        (bytes([1, 1]) + TOPIC.bytes, b"\x01\x07" + bytes(8) + b"\x01t", "is not a valid"),
        (
            encode(commit(1, (S, 1, 2)))[0],
            encode(commit(1, (S, 1, 2)))[1][:-24],
            "a count of 1 overruns",
        ),
    ],
)
def test_bytes_that_are_not_a_record_fail_with_the_reason(key, value, what):
    with pytest.raises(MetadataRecordError, match=what):
        decode(key, value)


def test_a_range_the_codec_cannot_hold_is_refused_when_read():
    key, value = encode(commit(1, (S, 10, 20)))
    bad = value[:-16] + struct.pack(">qq", 20, 10)  # start after end
    with pytest.raises(MetadataRecordError, match="end_offset = 10"):
        decode(key, bad)


@pytest.mark.parametrize(
    "make",
    [
        lambda: OffsetRange(S, 5, 5),
        lambda: OffsetRange(S, -1, 5),
        lambda: commit(1, (S1, 1, 2), (S, 1, 2)) if S1 > S else commit(1, (S, 1, 2), (S1, 1, 2)),
        lambda: commit(1, (S, 1, 2), (S, 2, 3)),
        lambda: commit(1, (S, 1, 2), (S1, 1, 2), kind=ObjectKind.STREAM),
        lambda: commit(1, (S, 1, 2), replaces=(1,)),
        lambda: commit(1, (S, 1, 2), replaces=(3, 2)),
        lambda: ShardClaim(0, 1, "", 0),
        lambda: ShardClaim(0, 1, "x" * 256, 0),
        lambda: ShardRelease(0, 1, "", 0),
        lambda: StreamCutover(0, S, 0, 1, TOPIC, 0, 0, 5, 5, 0),  # incarnation 0
        lambda: StreamCutover(0, S, 1, 1, TOPIC, 0, 6, 5, 5, 0),  # log start past end
        lambda: CheckpointEnd(0, 1, 0),
        lambda: TopicModeSet(UUID(int=0), "t", 0, 0),
        # fields of a later value version (OPTIONAL_FIELDS), checked as the others
        lambda: TopicModeSet(TOPIC, "t", 1, 0, kafka_cluster=""),
        lambda: StreamCutover(0, S, 1, 1, TOPIC, 0, 0, 5, 5, 0, last_stable_offset=-1),
        lambda: StreamUntier(0, S, 1, 1, 0, topic_deleted_ms=1 << 63),
    ],
)
def test_records_refuse_fields_out_of_their_domain(make):
    with pytest.raises(ValueError):
        make()


# -- stream ids and shards ----------------------------------------------------------------


def test_stream_ids_are_63_bit_hashes_of_topic_id_and_partition():
    # pinned: a change would orphan every stream already tiered
    assert S == 0x2368818102304F9D
    assert stream_id(TOPIC, 0) == S and S1 != S and 0 <= S1 < 1 << 63
    assert stream_id(UUID(int=1), 0) != S
    with pytest.raises(ValueError):
        stream_id(TOPIC, -1)


def test_shards_and_transactional_ids():
    assert shard_of(S, 16) == S % 16 and shard_of(S, 1) == 0
    assert topic_shard(TOPIC, 16) == 12
    assert transactional_id(3, "__meta") == "tierproxy-__meta-shard-3"
    assert transactional_id(3, "fleet-a") != transactional_id(3, "fleet-b")
    with pytest.raises(ValueError):
        shard_of(S, 0)


def test_offload_object_ids_are_deterministic_and_apart_from_upload_ids():
    first = offload_object_id(S, 0, 100)
    assert first == offload_object_id(S, 0, 100) == 0xADF3A223EF1646E2
    assert first >> 63 == 1
    assert offload_object_id(S, 0, 101) != first


# -- cutover and the tail -------------------------------------------------------------------


def test_cutover_then_tail_commits_continue_the_stream():
    p = tiered()
    assert p.state.cutover(S) == 500 and p.state.stream_end(S) == 500
    assert p.write(commit(1, (S, 500, 600))) == ACCEPTED
    assert p.write(commit(2, (S, 600, 650), kind=ObjectKind.STREAM)) == ACCEPTED
    assert p.state.stream_end(S) == 650
    assert spans(p.state) == [(500, 600, 1), (600, 650, 2)]
    info = p.state.stream(S)
    assert (info.topic_id, info.partition, info.log_start_offset) == (TOPIC, 0, 100)
    assert p.reread().image() == p.state.image()


def test_a_gap_after_the_stream_end_is_refused():
    p = tiered()
    p.write(commit(1, (S, 500, 600)))
    verdict = p.write(commit(2, (S, 601, 700)))
    assert refused(verdict, "leaves a gap after the stream's end 600")
    assert p.state.stream_end(S) == 600 and spans(p.state) == [(500, 600, 1)]


def test_an_overlap_with_the_tail_is_refused():
    p = tiered()
    p.write(commit(1, (S, 500, 600)))
    assert refused(p.write(commit(2, (S, 550, 700))), "overlaps [500, 600) of object 1")
    assert refused(p.write(commit(3, (S, 500, 600))), "overlaps")
    assert p.state.stream_end(S) == 600


def test_a_commit_is_accepted_or_refused_whole():
    p = tiered(partitions=(0, 1))
    verdict = p.write(commit(1, (S, 500, 600), (S1, 499, 600)))
    assert refused(verdict, "object 1:", "[499, 600)")
    assert p.state.stream_end(S) == 500 and p.state.stream_end(S1) == 500
    assert p.write(commit(2, (S, 500, 600), (S1, 500, 510))) == ACCEPTED
    assert p.state.object_ranges(2)[0].object_id == 2 and len(p.state.object_ranges(2)) == 2


def test_a_stale_epoch_is_refused_once_a_new_owner_claimed():
    p = tiered()
    p.write(commit(1, (S, 500, 600)))
    assert p.write(claim(epoch=2, owner="proxy-b")) == ACCEPTED
    assert (p.state.epoch, p.state.owner) == (2, "proxy-b")
    verdict = p.write(commit(2, (S, 600, 700), epoch=1))
    assert refused(verdict, "stale owner epoch 1", "epoch 2 (owner proxy-b)", "fenced")
    assert p.write(commit(3, (S, 600, 700), epoch=2)) == ACCEPTED


def test_a_newer_epoch_counts_without_a_claim_and_fences_the_older():
    p = tiered()
    assert p.write(commit(1, (S, 500, 600), epoch=4)) == ACCEPTED
    assert p.state.epoch == 4
    assert refused(p.write(commit(2, (S, 600, 700), epoch=3)), "stale owner epoch 3")


def test_a_claim_must_be_newer_than_the_shard_epoch():
    p = tiered()
    assert refused(p.write(claim(epoch=1, owner="proxy-b")), "at epoch 1 (owner proxy-a)")
    assert p.state.owner == "proxy-a"


def test_a_stream_is_cut_over_once_per_incarnation():
    p = tiered()
    assert refused(p.write(cutover(at=600, incarnation=2)), "tiered already, since offset 500")
    other = StreamCutover(0, S, 1, 1, UUID(int=5), 0, 0, 0, 0, 0)
    assert refused(p.write(other), "is not topic id")
    ahead = StreamCutover(0, S1, 1, 1, TOPIC, 1, 100, 500, 600, 0)  # only a checkpoint has this
    assert refused(p.write(ahead), "a cutover starts the stream at its cutover offset 500")
    assert refused(p.write(cutover(1, epoch=0)), "stale owner epoch 0")
    assert check_cutover(p.state, cutover(1)) == ACCEPTED


def test_records_of_a_stream_not_tiered_are_refused():
    p = tiered()
    assert refused(p.write(commit(1, (S1, 0, 10))), f"stream {S1} is not tiered")
    snapshot = ProducerSnapshot(0, S1, 1, 0, 0, b"")
    assert refused(p.write(snapshot), "not tiered")


def test_records_of_another_shard_are_refused():
    home = shard_of(S, 4)
    p = Partition(shard=(home + 1) % 4, shard_count=4)
    p.write(claim())
    assert refused(p.write(cutover()), f"belongs to shard {home}, not {(home + 1) % 4}")
    elsewhere = topic_shard(TOPIC, 4)
    q = Partition(shard=(elsewhere + 1) % 4, shard_count=4)
    assert refused(q.write(TopicModeSet(TOPIC, "t", 1, 0)), f"belongs to shard {elsewhere}")


# -- backfill below the cutover ------------------------------------------------------------


def test_backfill_below_the_cutover_in_any_order():
    p = tiered()
    p.write(commit(10, (S, 500, 520)))
    assert p.state.backfill_gaps(S) == [(100, 500)]
    for number, start, end in [(1, 300, 500), (2, 100, 200), (3, 200, 300)]:
        backfill = commit(number, (S, start, end), kind=ObjectKind.STREAM)
        assert check_commit(p.state, backfill) == ACCEPTED
        assert p.write(backfill) == ACCEPTED
    assert p.state.backfill_gaps(S) == []
    assert spans(p.state) == [(100, 200, 2), (200, 300, 3), (300, 500, 1), (500, 520, 10)]
    assert p.state.stream_end(S) == 520


def test_backfill_gaps_are_what_no_object_holds_yet():
    p = tiered()
    p.write(commit(1, (S, 150, 200)))
    p.write(commit(2, (S, 300, 350)))
    assert p.state.backfill_gaps(S) == [(100, 150), (200, 300), (350, 500)]


def test_backfill_that_overlaps_or_leaves_its_bounds_is_refused():
    p = tiered()
    p.write(commit(1, (S, 200, 300)))
    assert refused(p.write(commit(2, (S, 250, 350))), "overlaps [200, 300) of object 1")
    assert refused(p.write(commit(3, (S, 50, 150))), "starts below the log start 100")
    verdict = p.write(commit(4, (S, 400, 550)))
    assert refused(verdict, "neither continues the stream's end 500 nor lies below its cutover")


def test_recommitting_the_same_object_is_a_no_op():
    p = tiered()
    backfill = commit(offload_object_id(S, 100, 200), (S, 100, 200), kind=ObjectKind.STREAM)
    assert p.write(backfill) == ACCEPTED
    image = p.state.image()
    again = ObjectCommit(**{**{f: getattr(backfill, f) for f in backfill.__slots__}, "epoch": 1})
    assert check_commit(p.state, again).outcome is Outcome.NO_OP
    assert p.write(again).outcome is Outcome.NO_OP
    assert p.state.image() == image and p.state.refused_count == 0
    other = commit(backfill.object_id, (S, 200, 300), kind=ObjectKind.STREAM)
    assert refused(p.write(other), "committed already, with other ranges")


# -- reads ------------------------------------------------------------------------------------


def test_objects_for_finds_the_range_holding_an_offset_at_its_boundaries():
    p = tiered()
    p.write(commit(1, (S, 200, 300)))
    p.write(commit(2, (S, 500, 600)))
    p.write(commit(3, (S, 600, 610)))

    def first(offset):
        found = p.state.objects_for(S, offset)
        return found[0].object_id if found else None

    assert [first(o) for o in (199, 200, 299, 300, 499, 500, 599, 600, 609, 610)] == [
        None,
        1,
        1,
        None,  # below the cutover, not offloaded: still read from Kafka
        None,
        2,
        2,
        3,
        3,
        None,  # the stream's end: nothing committed yet
    ]
    assert [r.object_id for r in p.state.objects_for(S, 550)] == [2, 3]
    assert [r.object_id for r in p.state.objects_for(S, 550, limit=1)] == [2]
    held = p.state.objects_for(S, 200)[0]
    assert held.object_key == "1000/stream-set/0000000000000001" and held.object_size == 4096
    assert p.state.objects_for(S1, 0) == ()


# -- compaction, trimming, deleting ---------------------------------------------------------


def test_a_compaction_commit_replaces_exactly_the_ranges_it_covers():
    p = tiered(partitions=(0, 1))
    p.write(commit(1, (S, 500, 600), (S1, 500, 510)))
    p.write(commit(2, (S, 600, 700), (S1, 510, 520)))
    merged = commit(3, (S, 500, 700), kind=ObjectKind.STREAM, replaces=(1, 2))
    assert p.write(merged) == ACCEPTED
    assert spans(p.state) == [(500, 700, 3)]
    assert spans(p.state, S1) == [(500, 510, 1), (510, 520, 2)]  # their other stream stays
    assert [c.object_id for c in p.state.garbage_objects()] == []
    p.write(commit(4, (S1, 500, 520), kind=ObjectKind.STREAM, replaces=(1, 2)))
    assert [c.object_id for c in p.state.garbage_objects()] == [1, 2]


def test_a_compaction_commit_that_does_not_cover_exactly_is_refused():
    p = tiered()
    p.write(commit(1, (S, 500, 600)))
    p.write(commit(2, (S, 600, 700)))
    part = commit(3, (S, 500, 650), kind=ObjectKind.STREAM, replaces=(1, 2))
    assert refused(p.write(part), "does not cover exactly the ranges it replaces")
    unnamed = commit(4, (S, 500, 700), kind=ObjectKind.STREAM, replaces=(1,))
    assert refused(p.write(unnamed), "overlaps [600, 700) of object 2")
    stranger = commit(5, (S, 700, 710), kind=ObjectKind.STREAM, replaces=(1,))
    assert refused(p.write(stranger), "replaces object 1 but none of its ranges")


def test_a_trim_moves_the_log_start_and_drops_the_ranges_below_it():
    p = tiered()
    p.write(commit(1, (S, 100, 300)))
    p.write(commit(2, (S, 500, 600)))
    p.write(commit(3, (S, 600, 700)))
    trim = StreamTrim(0, S, 1, 600, 1, 5_000)
    assert check_trim(p.state, trim) == ACCEPTED and p.write(trim) == ACCEPTED
    assert p.state.stream(S).log_start_offset == 600 and p.state.backfill_gaps(S) == []
    assert spans(p.state) == [(600, 700, 3)]
    assert [c.object_id for c in p.state.garbage_objects()] == [1, 2]
    assert p.write(StreamTrim(0, S, 1, 600, 1, 5_001)).outcome is Outcome.NO_OP
    assert refused(p.write(StreamTrim(0, S, 1, 550, 1, 5_002)), "only moves up")
    assert refused(p.write(StreamTrim(0, S, 1, 701, 1, 5_003)), "to the end at most")


def test_only_an_object_no_range_uses_can_be_deleted():
    p = tiered()
    p.write(commit(1, (S, 500, 600)))
    p.write(commit(2, (S, 600, 700)))
    delete = ObjectDelete(0, 1, 1, 9_000)
    assert refused(check_delete(p.state, delete), f"still holds stream {S} [500, 600)")
    p.write(commit(3, (S, 500, 700), kind=ObjectKind.STREAM, replaces=(1, 2)))
    assert p.write(delete) == ACCEPTED
    assert p.state.object_commit(1) is None and 1 not in [
        c.object_id for c in p.state.garbage_objects()
    ]
    assert p.write(ObjectDelete(0, 1, 1, 9_001)).outcome is Outcome.NO_OP
    assert refused(p.write(ObjectDelete(0, 99, 1, 9_002)), "object 99 is not known")
    assert refused(p.write(commit(1, (S, 700, 800))), "object 1 was deleted")


def test_a_refused_commit_leaves_its_object_as_garbage():
    p = tiered()
    assert refused(p.write(commit(5, (S, 900, 950))), "gap")
    assert [c.object_id for c in p.state.garbage_objects()] == [5]
    assert refused(p.write(commit(5, (S, 500, 550))), "object 5 was refused before")
    assert p.write(ObjectDelete(0, 5, 1, 1)) == ACCEPTED


# -- untier ----------------------------------------------------------------------------------


def test_untier_is_refused_with_the_reason_once_only_objects_hold_data():
    p = tiered()
    p.write(commit(1, (S, 500, 600)))
    untier = StreamUntier(0, S, 1, 1, 7_000)
    verdict = check_untier(p.state, untier)
    assert refused(verdict, "offsets [500, 600) written after its cutover", "only in objects")
    assert refused(p.write(untier), "untier would lose them")
    assert p.state.cutover(S) == 500


def test_untier_right_after_cutover_returns_the_partition_to_kafka():
    p = tiered()
    p.write(commit(1, (S, 100, 500), kind=ObjectKind.STREAM))  # offloaded: Kafka has it too
    p.write(ProducerSnapshot(0, S, 1, 500, 1, b"state"))
    assert p.write(StreamUntier(0, S, 1, 1, 7_000)) == ACCEPTED
    assert p.state.stream(S) is None and p.state.producer_snapshot(S) is None
    assert [c.object_id for c in p.state.garbage_objects()] == [1]
    assert refused(p.write(commit(2, (S, 500, 600))), "not tiered")
    assert refused(p.write(cutover(at=500, incarnation=1)), "incarnation 1 of stream")
    assert p.write(cutover(at=500, incarnation=2)) == ACCEPTED
    assert refused(p.write(StreamUntier(0, S, 1, 1, 7_001)), "incarnation 1 of stream")


def test_the_untier_of_a_deleted_topic_lets_a_stream_go_whatever_it_holds():
    p = tiered()
    p.write(commit(1, (S, 500, 600)))
    p.write(commit(2, (S, 600, 700)))
    p.write(ProducerSnapshot(0, S, 1, 650, 1, b"state"))
    untier = StreamUntier(0, S, 1, 1, 7_000, topic_deleted_ms=6_000)
    assert check_untier(p.state, untier) == ACCEPTED
    assert p.write(untier) == ACCEPTED
    assert p.state.stream(S) is None and p.state.producer_snapshot(S) is None
    assert sorted(c.object_id for c in p.state.garbage_objects()) == [1, 2]
    assert refused(p.write(commit(3, (S, 700, 800))), "not tiered")
    # still fenced by epoch and incarnation like any untier
    q = tiered()
    assert refused(q.write(StreamUntier(0, S, 2, 1, 7_000, topic_deleted_ms=1)), "incarnation")


def test_a_deleted_topics_untier_is_value_version_2_and_an_untier_stays_version_1():
    plain_key, plain = encode(StreamUntier(0, S, 1, 1, 7_000))
    deleted_key, deleted = encode(StreamUntier(0, S, 1, 1, 7_000, topic_deleted_ms=6_000))
    assert plain_key == deleted_key and plain[0] == 1 and deleted[0] == 2
    assert decode(deleted_key, deleted) == StreamUntier(0, S, 1, 1, 7_000, topic_deleted_ms=6_000)
    assert decode(plain_key, plain).topic_deleted_ms is None
    with pytest.raises(ValueError, match="topic_deleted_ms"):
        StreamUntier(0, S, 1, 1, 7_000, topic_deleted_ms=-1)


def test_a_topic_mode_names_its_kafka_cluster_in_value_version_2():
    plain_key, plain = encode(TopicModeSet(TOPIC, "t", TopicMode.TIERED, 5))
    named = TopicModeSet(TOPIC, "t", TopicMode.TIERED, 5, kafka_cluster="MkU3OEVBNTcwNTJENDM2Qk")
    named_key, value = encode(named)
    assert plain_key == named_key and plain[0] == 1 and value[0] == 2
    assert decode(named_key, value) == named
    assert decode(plain_key, plain).kafka_cluster is None  # written before the field
    for bad in ("", "x" * 256, 7):
        with pytest.raises(ValueError, match="kafka_cluster"):
            TopicModeSet(TOPIC, "t", TopicMode.TIERED, 5, kafka_cluster=bad)


def test_a_topic_untier_is_refused_naming_every_partition_that_holds_data():
    shards = [Partition(k, 2) for k in range(2)]
    for partition in range(3):
        stream = stream_id(TOPIC, partition)
        shard = shards[shard_of(stream, 2)]
        if shard.state.epoch == 0:
            shard.write(claim())
        assert shard.write(cutover(partition)) == ACCEPTED
    states = [shard.state for shard in shards]
    assert topic_untier_refusal(states, TOPIC, 3) is None
    shards[shard_of(S1, 2)].write(commit(1, (S1, 500, 501)))
    reason = topic_untier_refusal(states, TOPIC, 3)
    assert reason is not None and f"stream {S1} (topic id {TOPIC} partition 1)" in reason
    assert f"stream {S} " not in reason
    with pytest.raises(ValueError):
        topic_untier_refusal(states[::-1], TOPIC, 3)


# -- snapshots and topic modes -------------------------------------------------------------


def test_the_last_producer_snapshot_record_of_a_stream_decides():
    p = tiered()
    p.write(commit(1, (S, 500, 600)))
    first = ProducerSnapshot(0, S, 1, 600, 10, b"producers")
    assert p.write(first) == ACCEPTED and p.state.producer_snapshot(S) == first
    assert refused(p.write(ProducerSnapshot(0, S, 1, 601, 11, b"x")), "outside [100, 600]")
    assert p.state.producer_snapshot(S) is None  # as a reader after compaction would see


def test_topic_modes_last_one_wins_and_a_tombstone_forgets():
    p = Partition()
    assert p.state.topic_mode(TOPIC) is TopicMode.PASSTHROUGH
    p.write(TopicModeSet(TOPIC, "orders", TopicMode.TIERED, 1))
    assert p.state.topic_mode(TOPIC) is TopicMode.TIERED and p.state.topic(TOPIC).topic == "orders"
    p.write(TopicModeSet(TOPIC, "orders", TopicMode.PASSTHROUGH, 2))
    assert p.state.topic_mode(TOPIC) is TopicMode.PASSTHROUGH
    p.write_raw(encode(TopicModeSet(TOPIC, "orders", 1, 3))[0], None)
    assert p.state.topic(TOPIC) is None and p.state.topic_ids() == []


# -- the reader: deterministic, never raising -----------------------------------------------


def test_two_owners_racing_every_reader_keeps_the_first_valid_record():
    p = tiered()
    p.write(commit(1, (S, 500, 600)))
    # proxy-b takes over; proxy-a, paused, still writes what it had in flight
    p.write(claim(epoch=2, owner="proxy-b"))
    p.write(commit(2, (S, 600, 700), epoch=1))  # proxy-a: fenced
    p.write(commit(3, (S, 600, 650), epoch=2))  # proxy-b: first valid
    p.write(commit(4, (S, 600, 700), epoch=2))  # proxy-b retrying a stale plan: overlap
    for reader in (p.state, p.reread()):
        assert spans(reader) == [(500, 600, 1), (600, 650, 3)]
        assert [r.offset for r in reader.refusals] == [4, 6]
        assert [c.object_id for c in reader.garbage_objects()] == [2, 4]
    assert p.reread().image() == p.state.image()


def test_records_the_reader_cannot_read_are_reported_not_raised():
    p = tiered()
    before = p.state.image()
    for key, value in [(b"\x01", b""), (b"\x01\x06" + bytes(12), b"\x09"), (b"", None)]:
        assert p.write_raw(key, value).outcome is Outcome.REFUSE
    assert p.state.refused_count == 3 and p.state.image() == before


def test_offsets_are_applied_once_in_order():
    state = MetadataState()
    state.apply(*encode(claim()), 5)
    with pytest.raises(ValueError, match="offset 5 after 5"):
        state.apply(*encode(claim(epoch=2)), 5)
    with pytest.raises(ValueError):
        MetadataState(shard=2, shard_count=2)


# -- checkpoints: a new generation, the old one tombstoned ---------------------------------


def busy_shard() -> Partition:
    p = tiered(partitions=(0, 1))
    p.write(TopicModeSet(TOPIC, "orders", TopicMode.TIERED, 1))
    p.write(commit(1, (S, 500, 600), (S1, 500, 520)))
    p.write(commit(2, (S, 600, 700)))
    p.write(commit(3, (S, 150, 300), kind=ObjectKind.STREAM))
    p.write(commit(4, (S, 500, 700), kind=ObjectKind.STREAM, replaces=(1, 2)))
    p.write(ObjectDelete(0, 2, 1, 1))
    p.write(StreamTrim(0, S, 1, 200, 1, 2))
    p.write(ProducerSnapshot(0, S1, 1, 520, 3, b"p"))
    p.write(commit(5, (S, 800, 900)))  # refused: garbage
    return p


def without(image: dict, *names: str) -> dict:
    return {k: v for k, v in image.items() if k not in names}


def test_a_checkpoint_rewrites_the_state_as_a_new_generation():
    p = busy_shard()
    before = p.state.image()
    old_keys = {key for _, key, _ in p.log if decode_key(key).generation == 0}
    for key, value in p.state.checkpoint_records("proxy-a", 1, 10_000):
        assert p.write_raw(key, value) == ACCEPTED
    assert p.state.generation == 1
    assert set(p.state.retired_keys()) == old_keys
    after = p.state.image()
    # deleted ids are remembered within a generation only; refused commits become garbage
    assert without(after, "generation", "retired", "deleted") == without(
        before, "generation", "retired", "deleted"
    )
    assert after["deleted"] == [] and before["deleted"] == [2]
    assert p.reread().image() == after
    # records for the retired generation no longer count; tombstones clear it
    assert refused(p.write(commit(6, (S, 700, 800))), "generation 0 is retired")
    assert p.write(commit(6, (S, 700, 800), generation=1)) == ACCEPTED
    for key in sorted(p.state.retired_keys()):
        assert p.write_raw(key, None).outcome is Outcome.NO_OP
    assert p.state.retired_keys() == frozenset()


def test_compaction_after_a_checkpoint_leaves_the_same_state():
    p = busy_shard()
    for key, value in p.state.checkpoint_records("proxy-a", 1, 10_000):
        p.write_raw(key, value)
    p.write(commit(6, (S, 700, 800), generation=1))
    for key in sorted(p.state.retired_keys()):
        p.write_raw(key, None)
    last = {key: offset for offset, key, _ in p.log}
    compacted = [(o, k, v) for o, k, v in p.log if last[k] == o and v is not None]
    assert len(compacted) < len(p.log) / 2
    assert p.reread(compacted).image() == p.state.image()


def test_a_tombstone_for_a_live_key_is_refused():
    p = tiered()
    key, _ = encode(commit(1, (S, 500, 600)))
    p.write(commit(1, (S, 500, 600)))
    assert refused(p.write_raw(key, None), "live generation 0")
    assert spans(p.state) == [(500, 600, 1)]


def test_a_checkpoint_whose_tail_does_not_add_up_is_refused():
    p = busy_shard()
    records = p.state.checkpoint_records("proxy-a", 1, 10_000)
    tail = encode(commit(4, (S, 500, 700), kind=ObjectKind.STREAM, generation=1))[0]
    for key, value in records:
        if key != tail:  # the object holding [500, 700) of S lost
            p.write_raw(key, value)
    assert refused(
        p.state.refusals[-1], "checkpoint of generation 1", "[500, 700) are in no object"
    )
    assert p.state.generation == 0
    # the owner starts again at the next generation; the abandoned one is retired
    for key, value in p.state.checkpoint_records("proxy-a", 1, 10_001):
        assert p.write_raw(key, value) == ACCEPTED
    assert p.state.generation == 2
    assert all(decode_key(k).generation in (0, 1) for k in p.state.retired_keys())


def test_a_checkpoint_of_a_stale_owner_is_refused():
    p = busy_shard()
    stale = p.state.checkpoint_records("proxy-a", 1, 10_000)
    p.write(claim(epoch=2, owner="proxy-b"))
    for key, value in stale:
        p.write_raw(key, value)
    assert p.state.generation == 0 and refused(p.state.refusals[-1], "stale owner epoch 1")
    with pytest.raises(ValueError):
        p.state.checkpoint_records("proxy-a", 1, 10_000)


def test_a_checkpoint_holds_no_steps():
    p = tiered()
    restored_trim = StreamTrim(1, S, 1, 200, 1, 0)
    p.write(claim(generation=1))
    p.write(cutover(generation=1))
    assert refused(p.write(restored_trim), "a checkpoint holds no StreamTrim records")
    assert refused(p.write(CheckpointEnd(1, 1, 0)), "holds a refused record")


# -- releasing the shard ----------------------------------------------------------------------


def release(epoch=1, owner="proxy-a", generation=0) -> ShardRelease:
    return ShardRelease(generation, epoch, owner, 4_000)


def test_a_shard_never_claimed_is_released_and_a_claim_holds_it():
    p = Partition()
    assert p.state.released and (p.state.epoch, p.state.owner) == (0, "")
    p.write(claim())
    assert not p.state.released and p.state.owner == "proxy-a"


def test_the_owner_of_the_current_epoch_releases_the_shard_and_keeps_its_name():
    p = tiered()
    assert check_release(p.state, release()) == ACCEPTED
    assert p.write(release()) == ACCEPTED
    assert p.state.released and (p.state.epoch, p.state.owner) == (1, "proxy-a")
    assert p.write(release()).outcome is Outcome.NO_OP
    assert p.reread().image() == p.state.image()
    assert p.write(claim(epoch=2, owner="proxy-b")) == ACCEPTED
    assert not p.state.released and p.state.owner == "proxy-b"


def test_a_release_by_anyone_but_the_current_owner_is_refused():
    p = tiered()
    p.write(claim(epoch=2, owner="proxy-b"))
    assert refused(p.write(release(epoch=1)), "stale owner epoch 1", "fenced")
    assert refused(p.write(release(epoch=2, owner="proxy-a")), "only the owner of the current")
    assert refused(p.write(release(epoch=3, owner="proxy-b")), "at epoch 2 (owner proxy-b)")
    assert refused(Partition().write(release()), "at epoch 0 (owner unknown)")
    assert not p.state.released and p.state.epoch == 2


def test_records_of_a_released_epoch_are_refused_until_a_newer_claim():
    p = tiered()
    p.write(commit(1, (S, 500, 600)))
    p.write(release())
    assert refused(p.write(commit(2, (S, 600, 700))), "epoch 1 is over", "released the shard")
    assert refused(p.write(cutover(1)), "a record needs a newer claim")
    assert p.write(claim(epoch=2, owner="proxy-b")) == ACCEPTED
    assert p.write(commit(3, (S, 600, 700), epoch=2)) == ACCEPTED
    # a newer epoch without a claim counts too, and that writer has released nothing
    p.write(release(epoch=2, owner="proxy-b"))
    assert p.write(commit(4, (S, 700, 800), epoch=3)) == ACCEPTED and not p.state.released


def test_a_checkpoint_keeps_the_released_flag():
    p = busy_shard()
    p.write(release())
    records = p.state.checkpoint_records("proxy-a", 1, 10_000)
    assert decode(*records[-2]) == ShardRelease(1, 1, "proxy-a", 10_000)
    for key, value in records:
        assert p.write_raw(key, value) == ACCEPTED
    assert p.state.generation == 1 and p.state.released and p.state.owner == "proxy-a"
    assert p.reread().image() == p.state.image()
    unreleased = busy_shard()
    tail = unreleased.state.checkpoint_records("proxy-a", 1, 10_000)[-2]
    assert not isinstance(decode(*tail), ShardRelease)


def test_a_checkpoint_holds_a_release_only_after_its_claim():
    p = tiered()
    p.write(release(generation=1))  # a checkpoint's release before its claim
    p.write(claim(generation=1))
    assert refused(p.state.refusals[-1], "release of epoch 1", "epoch 0 (owner unknown)")
    assert refused(p.write(CheckpointEnd(1, 1, 0)), "holds a refused record")
