"""The cleaner's pure rules (proxy/cleaner/): Kafka's LogCleaner on a list of batches.
Batches are built and read back with aiokafka's codec, an encoder independent of ours."""

from __future__ import annotations

import pytest
from aiokafka.record.default_records import DefaultRecordBatch
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.cleaner.batch_codec import delete_horizon
from proxy.cleaner.clean import LogClean, blocks, index_dirty
from proxy.cleaner.offset_map import OffsetMap
from proxy.cleaner.plan import (
    Checkpoint,
    CleanerConfig,
    Segment,
    cleanable_count,
    cleaner_config,
    first_dirty_index,
    groups,
    should_clean,
)
from proxy.cleaner.transactions import scan_log
from proxy.records.batches import iter_batches, read_batch_header, validate_batch
from proxy.records.transactions import ABORT, COMMIT
from tests.support.batches import NOW_MS, build_batch, control_batch, with_base_offset

RETENTION = 1000


def log_of(*batches: bytes) -> bytes:
    """Batches given consecutive offsets from 0."""
    return bytes(with_base_offset(b"".join(batches), 0))


def clean(
    log: bytes,
    now: int = NOW_MS,
    *,
    max_entries: int = 1000,
    first_dirty: int = 0,
    kafka_below: bool = False,
):
    """One clean of the whole log as one range; (the new log, the clean's stats)."""
    batches = list(iter_batches(log))
    scan = scan_log(batches)
    omap = OffsetMap(max_entries)
    assert index_dirty([batches], first_dirty, scan, omap) == 1
    end = batches[-1][0].next_offset
    run = LogClean(
        omap, end, scan, now_ms=now, delete_retention_ms=RETENTION, kafka_below=kafka_below
    )
    out = [run.clean_batch(h, b) for h, b in batches]
    return b"".join(bytes(x) for x in out if x is not None), run.stats


def records(log: bytes) -> list[tuple[int, bytes | None, bytes | None, int, tuple]]:
    """(offset, key, value, timestamp, headers) of every data record, read by aiokafka."""
    out = []
    for _, batch in iter_batches(log):
        validate_batch(batch)
        parsed = DefaultRecordBatch(bytes(batch))
        assert parsed.validate_crc()
        if parsed.is_control_batch:
            continue
        for r in parsed:
            out.append((r.offset, r.key, r.value, r.timestamp, tuple(r.headers)))
    return out


@pytest.mark.parametrize("codec", [0, 1, 2, 3, 4])
def test_latest_per_key_offsets_timestamps_headers_kept(codec: int) -> None:
    first = build_batch(
        [b"a1", b"b1", b"a2"],
        keys=[b"a", b"b", b"a"],
        timestamps=[NOW_MS - 30, NOW_MS - 20, NOW_MS - 10],
        record_headers=[[("h", b"1")], [("h", b"2")], [("h", b"3")]],
        codec=codec,
    )
    second = build_batch([b"b2", b"c1"], keys=[b"b", b"c"], codec=codec)
    log = log_of(first, second)
    out, stats = clean(log)
    got = records(out)
    assert [(o, k, v) for o, k, v, _, _ in got] == [
        (2, b"a", b"a2"),
        (3, b"b", b"b2"),
        (4, b"c", b"c1"),
    ]
    before = {r[0]: r for r in records(log)}
    assert all(before[r[0]] == r for r in got)  # timestamps and headers as they were
    headers = [read_batch_header(b) for _, b in iter_batches(out)]
    assert [(h.base_offset, h.last_offset) for h in headers] == [(0, 2), (3, 4)]
    assert headers[0].codec == codec and headers[0].record_count == 1
    assert stats.records_read == 5 and stats.records_kept == 3
    assert list(iter_batches(out))[1][1].tobytes() == list(iter_batches(log))[1][1].tobytes()


def test_tombstone_kept_with_a_horizon_then_removed() -> None:
    log = log_of(build_batch([b"v", None], keys=[b"k", b"k"]), build_batch([b"x"], keys=[b"y"]))
    once, _ = clean(log, NOW_MS)
    assert [(r[1], r[2]) for r in records(once)] == [(b"k", None), (b"y", b"x")]
    [(header, _), _] = list(iter_batches(once))
    assert delete_horizon(header) == NOW_MS + RETENTION
    again, _ = clean(once, NOW_MS + RETENTION - 1)  # before the horizon: kept, same bytes
    assert again == once
    gone, _ = clean(once, NOW_MS + RETENTION)
    assert [(r[1], r[2]) for r in records(gone)] == [(b"y", b"x")]


def test_with_part_of_the_log_in_kafka_alone_tombstones_and_markers_outlive_their_horizon():
    """A backfill gap below the cutover: Kafka's log there may hold an older record of
    the tombstone's key, which this clean never sees. Dropped at its horizon, the key
    came back for a consumer reading from the start (Kafka's own value below the
    cutover, no tombstone after it); Kafka's one log drops a tombstone only after every
    older record of its key went. Once migrated (no gap), they go."""
    pid, epoch = 7, 0
    txn = {"producer_id": pid, "producer_epoch": epoch, "transactional": True}
    log = log_of(
        build_batch([b"v", None], keys=[b"k", b"k"]),
        build_batch([b"t"], keys=[b"j"], **txn),
        control_batch(pid, epoch, ABORT),
        build_batch([b"x"], keys=[b"y"], **txn),
        control_batch(pid, epoch, COMMIT),
    )
    once, _ = clean(log, NOW_MS, kafka_below=True)  # the tombstone's horizon: + RETENTION
    later = NOW_MS + 10 * RETENTION
    second, _ = clean(once, later, kafka_below=True)  # the ABORT's horizon: later + RETENTION
    past = later + RETENTION + 1  # both horizons passed
    held, _ = clean(second, past, kafka_below=True)
    assert [(r[1], r[2]) for r in records(held)] == [(b"k", None), (b"y", b"x")]
    horizons = {h.base_offset: delete_horizon(h) for h, _ in iter_batches(held)}
    assert horizons[0] and horizons[3]  # the tombstone's and the ABORT's, both passed
    migrated, _ = clean(held, past)
    assert [(r[1], r[2]) for r in records(migrated)] == [(b"y", b"x")]
    assert 3 not in {h.base_offset for h, _ in iter_batches(migrated)}


def test_aborted_transaction_removed_markers_kept_then_removed() -> None:
    pid, epoch = 7, 0
    log = log_of(
        build_batch(
            [b"t1"], keys=[b"k"], producer_id=pid, producer_epoch=epoch, transactional=True
        ),
        control_batch(pid, epoch, ABORT),
        build_batch(
            [b"t2"], keys=[b"k"], producer_id=pid, producer_epoch=epoch, transactional=True
        ),
        control_batch(pid, epoch, COMMIT),
        build_batch([b"plain"], keys=[b"j"]),
    )
    out, _ = clean(log)
    assert [(r[0], r[2]) for r in records(out)] == [(2, b"t2"), (4, b"plain")]
    kinds = [(h.base_offset, h.is_control, delete_horizon(h)) for h, _ in iter_batches(out)]
    # the ABORT stays (its transaction's batch went in this clean), the COMMIT too (its
    # transaction's batch is still there)
    assert kinds == [(1, True, None), (2, False, None), (3, True, None), (4, False, None)]
    # the next clean saw no batch of the aborted transaction: the ABORT gets a horizon
    second, _ = clean(out, NOW_MS + 1)
    horizons = {h.base_offset: delete_horizon(h) for h, _ in iter_batches(second)}
    assert horizons[1] == NOW_MS + 1 + RETENTION
    third, _ = clean(second, NOW_MS + 2 + RETENTION)
    assert 1 not in {h.base_offset for h, _ in iter_batches(third)}
    assert [(r[0], r[2]) for r in records(third)] == [(2, b"t2"), (4, b"plain")]


def test_open_transaction_is_not_cleanable() -> None:
    log = log_of(
        build_batch([b"v"], keys=[b"k"]),
        build_batch([b"t"], keys=[b"k"], producer_id=3, producer_epoch=0, transactional=True),
    )
    scan = scan_log(list(iter_batches(log)))
    assert scan.open_from == 1
    segments = [Segment(0, 1, 10, NOW_MS), Segment(1, 2, 10, NOW_MS)]
    assert cleanable_count(segments, NOW_MS, CleanerConfig(compact=True), scan.open_from) == 1


def test_producer_last_batch_kept_as_an_empty_header() -> None:
    pid = 11
    log = log_of(
        build_batch([b"1"], keys=[b"k"], producer_id=pid, producer_epoch=2, base_sequence=0),
        build_batch([b"2"], keys=[b"k"], producer_id=pid, producer_epoch=2, base_sequence=1),
        build_batch([b"3"], keys=[b"k"]),
    )
    out, _ = clean(log)
    headers = [h for h, _ in iter_batches(out)]
    assert [(h.base_offset, h.record_count, h.producer_id, h.base_sequence) for h in headers] == [
        (1, 0, pid, 1),
        (2, 1, -1, -1),
    ]
    assert [r[2] for r in records(out)] == [b"3"]


def test_full_map_stops_at_the_last_range_indexed_whole() -> None:
    ranges = [
        list(iter_batches(build_batch([b"v"] * 3, keys=[b"a", b"b", b"c"]))),
        list(iter_batches(build_batch([b"v"] * 3, keys=[b"d", b"e", b"f"], base_offset=3))),
    ]
    scan = scan_log([b for r in ranges for b in r])
    assert index_dirty(ranges, 0, scan, OffsetMap(4)) == 1


def test_plan_rules() -> None:
    config = cleaner_config(
        {
            "cleanup.policy": "compact,delete",
            "min.cleanable.dirty.ratio": "0.01",
            "min.compaction.lag.ms": "100",
            "delete.retention.ms": "5",
        }
    )
    assert config.compact and config.min_cleanable_dirty_ratio == 0.01
    assert not cleaner_config({"cleanup.policy": "delete"}).compact
    segments = [Segment(0, 10, 100, NOW_MS - 1000), Segment(10, 20, 100, NOW_MS - 50)]
    assert cleanable_count(segments, NOW_MS, config, None) == 1  # the second is too young
    assert first_dirty_index(segments, None) == 0 and first_dirty_index(segments, 10) == 1
    assert should_clean(segments, 0, 1, NOW_MS, config)
    assert not should_clean(segments, 1, 1, NOW_MS, config)
    assert groups([Segment(i, i + 1, 40, 0) for i in range(5)], 5, 100) == [(0, 2), (2, 4), (4, 5)]
    tiles = blocks([(2, 3, 1, b"xx"), (5, 6, 1, b"yy")], 0, 8, 2)
    assert [(a, b, n) for a, b, n, _ in tiles] == [(0, 5, 1), (5, 8, 1)]


KEYS = st.sampled_from([b"a", b"b", b"c", b"d", b"e"])
VALUES = st.one_of(st.none(), st.binary(min_size=1, max_size=8))
BATCHES = st.lists(
    st.tuples(
        st.lists(st.tuples(KEYS, VALUES), min_size=1, max_size=5), st.sampled_from([0, 1, 4])
    ),
    min_size=1,
    max_size=8,
)


@settings(max_examples=60, deadline=None)
@given(BATCHES)
def test_cleaned_log_is_the_latest_per_key(spec) -> None:
    log = log_of(
        *(
            build_batch([v for _, v in rs], keys=[k for k, _ in rs], codec=codec)
            for rs, codec in spec
        )
    )
    latest: dict[bytes, tuple[int, bytes | None]] = {}
    for offset, key, value, _, _ in records(log):
        latest[key] = (offset, value)
    expected = sorted((o, k, v) for k, (o, v) in latest.items())
    once, _ = clean(log)
    assert [(o, k, v) for o, k, v, _, _ in records(once)] == expected
    ends = [h.last_offset for h, _ in iter_batches(once)]
    assert ends == sorted(ends)
    later, _ = clean(once, NOW_MS + RETENTION)
    assert [(o, k, v) for o, k, v, _, _ in records(later)] == [
        e for e in expected if e[2] is not None
    ]


def test_marker_of_a_producer_with_no_data_is_kept_whole() -> None:
    """Kafka keeps such a marker as an empty control batch (the producer's epoch, for
    fencing); the read side here reads each marker's record, so it stays whole."""
    log = log_of(control_batch(5, 3, COMMIT), build_batch([b"v"], keys=[b"k"]))
    once, _ = clean(log)  # may go: its horizon is stamped
    later, _ = clean(once, NOW_MS + RETENTION)
    [(marker, batch), _] = list(iter_batches(later))
    assert marker.is_control and marker.record_count == 1 and marker.producer_epoch == 3
    assert bytes(batch) == bytes(list(iter_batches(once))[0][1])


def test_compact_delete_is_both_retention_and_cleaning() -> None:
    from proxy.upkeep.retention_plan import retention_config

    values = {"cleanup.policy": "compact,delete", "retention.ms": "1000"}
    assert retention_config(values).delete and cleaner_config(values).compact
    only = {"cleanup.policy": "compact"}
    assert not retention_config(only).delete and cleaner_config(only).compact


def test_a_group_ends_with_its_last_batch_even_when_cleaned_away() -> None:
    """The runner keeps a group's last batch as an empty header, so the new range ends
    with a batch (the producer-state rebuild takes holes inside ranges only)."""
    from proxy.cleaner.clean import clean_group

    log = log_of(build_batch([b"1"], keys=[b"a"]), build_batch([b"2"], keys=[b"b"]))
    later = build_batch([b"3"], keys=[b"b"], base_offset=2)
    ranges = [list(iter_batches(log)), list(iter_batches(later))]
    scan = scan_log([b for r in ranges for b in r])
    omap = OffsetMap(10)
    assert index_dirty(ranges, 0, scan, omap) == 2
    run = LogClean(omap, 3, scan, now_ms=NOW_MS, delete_retention_ms=RETENTION)
    pieces, changed = clean_group(run, ranges[:1])
    assert changed
    assert [(p[0], p[1], p[2]) for p in pieces] == [(0, 1, 1), (1, 2, 0)]
    assert read_batch_header(pieces[-1][3]).record_count == 0


def test_a_migration_below_the_checkpoint_makes_the_log_dirty_again() -> None:
    """An offload job's backfill puts ranges below where the last clean ended, never
    cleaned: the checkpoint no longer holds (Kafka's log only grows at its end)."""
    checkpoint = Checkpoint(500, ((0, 100),))
    assert checkpoint.dirty_from([(0, 100)]) == 500
    assert checkpoint.dirty_from([]) is None  # the gap migrated
    assert checkpoint.dirty_from([(40, 100)]) is None  # a part of it
    assert Checkpoint(500, ()).dirty_from([]) == 500
    segments = [Segment(0, 100, 10, 1), Segment(100, 500, 10, 1), Segment(500, 600, 10, 1)]
    assert first_dirty_index(segments, checkpoint.dirty_from([(0, 100)])) == 2
    assert first_dirty_index(segments, checkpoint.dirty_from([])) == 0
