"""The marker follower's pure decisions (proxy/markers/follow.py): the resume rule, which
batches of a Fetch answer are markers to append, where the next read starts, error
codes, and the grouping per leader broker."""

from __future__ import annotations

import pytest
from kio.schema.errors import ErrorCode

from proxy.markers.follow import (
    Resume,
    Step,
    control_batches,
    group_by_leader,
    reset_position,
    step_for,
)
from proxy.markers.upstream_log import LeaderFetchRequest
from proxy.records.batches import with_base_offset
from tests.support.batches import control_batch, seeded_batch


def at(batch: bytes, offset: int) -> bytes:
    return bytes(with_base_offset(batch, offset))


def log_of(*batches: tuple[bytes, int]) -> bytes:
    """Kafka's log of a tiered partition past its cutover, as a Fetch answers it."""
    return b"".join(at(batch, offset) for batch, offset in batches)


COMMIT, ABORT = 1, 0


def test_resume_with_nothing_expected_takes_every_marker() -> None:
    resume = Resume()
    assert all(resume.is_new((7, 0, t)) for t in range(5))


def test_resume_skips_what_the_stream_holds_and_what_was_skipped_before() -> None:
    # the stream holds markers a and c from past the committed position; b came between
    # them upstream and Kafka's rules refused it: it is not appended now either
    a, b, c, d = (1, 0, 100), (2, 0, 101), (1, 0, 102), (3, 0, 103)
    resume = Resume([a, c])
    assert [resume.is_new(m) for m in (a, b, c, d, b)] == [False, False, False, True, True]
    assert not resume.expected


def test_resume_never_takes_a_marker_before_the_expected_list_is_done() -> None:
    resume = Resume([(1, 0, 100)])
    assert not resume.is_new((9, 9, 9))
    assert list(resume.expected) == [(1, 0, 100)]


def test_resync_drops_the_expected_markers_kafka_no_longer_holds() -> None:
    # the stream holds a, c, e past the committed position; Kafka's retention dropped a
    # and b (refused before) while the follower was away: c is the first still in Kafka
    a, b, c, d, e, f = ((n, 0, 100 + n) for n in range(6))
    resume = Resume([a, c, e])
    assert resume.resync(c) == 1 and list(resume.expected) == [c, e]
    # from Kafka's new log start: c, d (refused before, between two expected), e, then f
    assert [resume.is_new(m) for m in (c, d, e, f)] == [False, False, False, True]


def test_resync_without_a_surviving_marker_expects_none() -> None:
    # every expected marker dropped from Kafka (or a cut log, where they all lay past the
    # position): what comes next is new, where the head would have waited for ever
    stuck = Resume([(1, 0, 100), (2, 0, 101)])
    assert not stuck.is_new((3, 0, 102))  # without resync: skipped, and every later one
    resume = Resume([(1, 0, 100), (2, 0, 101)])
    assert resume.resync(None) == 2 and not resume.expected
    assert resume.is_new((3, 0, 102))
    assert Resume([(1, 0, 100)]).resync((9, 9, 9)) == 1  # not in the list: as None


def test_control_batches_of_an_answer_and_the_next_position() -> None:
    records = log_of(
        (control_batch(5, 0, COMMIT), 40),
        (seeded_batch(3, 1), 41),  # written to Kafka directly past the cutover: passed over
        (control_batch(6, 0, ABORT), 44),
    )
    found, end = control_batches(records, 40)
    assert [h.base_offset for h, _ in found] == [40, 44]
    assert all(h.is_control for h, _ in found)
    assert bytes(found[1][1]) == at(control_batch(6, 0, ABORT), 44)
    assert end == 45


def test_control_batches_leaves_out_what_was_read_already() -> None:
    records = log_of((control_batch(5, 0, COMMIT), 40), (control_batch(6, 0, COMMIT), 41))
    found, end = control_batches(records, 41)
    assert [h.base_offset for h, _ in found] == [41]
    assert end == 42
    found, end = control_batches(records, 50)  # a catch-up moved further meanwhile
    assert found == [] and end == 50


def test_control_batches_of_an_empty_or_cut_answer() -> None:
    assert control_batches(b"", 12) == ([], 12)
    whole = log_of((control_batch(5, 0, COMMIT), 12))
    cut = whole + at(control_batch(6, 0, COMMIT), 13)[:30]  # the broker filled max_bytes
    found, end = control_batches(cut, 12)
    assert [h.base_offset for h, _ in found] == [12]
    assert end == 13  # the cut batch is read again next time


@pytest.mark.parametrize(
    ("code", "step"),
    [
        (0, Step.READ),
        (ErrorCode.not_leader_or_follower, Step.RELOCATE),
        (ErrorCode.unknown_topic_or_partition, Step.RELOCATE),
        (ErrorCode.leader_not_available, Step.RELOCATE),
        (ErrorCode.fenced_leader_epoch, Step.RELOCATE),
        (ErrorCode.kafka_storage_error, Step.RELOCATE),
        (ErrorCode.offset_out_of_range, Step.RESET),
        (ErrorCode.topic_authorization_failed, Step.WAIT),
        (ErrorCode.unknown_server_error, Step.WAIT),
    ],
)
def test_step_for_error_codes(code: int, step: Step) -> None:
    assert step_for(int(code)) is step


def test_reset_position_moves_into_kafkas_log() -> None:
    assert reset_position(10, 50, 90) == 50  # retention dropped 10..49: read from 50
    assert reset_position(120, 50, 90) == 90  # an unclean election cut the log: its end
    assert reset_position(60, 50, 90) == 60


def test_group_by_leader() -> None:
    leaders = {("t", 0): 1, ("t", 1): 2, ("u", 0): 1, ("u", 1): None, ("u", 2): -1}
    groups, unknown = group_by_leader(leaders, leaders.get)
    assert groups == {1: [("t", 0), ("u", 0)], 2: [("t", 1)]}
    assert unknown == [("u", 1), ("u", 2)]


def test_the_follow_fetches_at_a_version_only_the_leader_answers() -> None:
    """Fetch v11+ is served by followers too (KIP-392), up to their lagging high
    watermark: the follow asks v10 at most, which a follower refuses."""
    request = LeaderFetchRequest(0, 1, 1 << 20, 0, [("t", [(0, 5, 1 << 20)])])
    built = request.prepare({LeaderFetchRequest.API_KEY: (4, 17)})
    assert built.API_VERSION == 10
    assert request.prepare({LeaderFetchRequest.API_KEY: (4, 8)}).API_VERSION == 8
