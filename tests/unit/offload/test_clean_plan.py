"""The clean job's groups (offload_jobs/clean.py `group_tasks`): a stream's cleanable
ranges cut as the proxy's cleaner cuts them, each group with the transactions' state at
its first offset and an object id of the offload jobs' kind."""

from __future__ import annotations

import itertools

from offload_jobs.clean import StreamPlan, group_tasks
from proxy.cleaner.split import scan_entries, segment_of
from proxy.cleaner.transactions import scan_log
from proxy.metadata.streams import OFFLOAD_ID_BIT, StreamRange
from proxy.objects.keys import ObjectKind
from proxy.records.batches import iter_batches, with_base_offset
from proxy.records.transactions import COMMIT
from tests.support.batches import build_batch, control_batch

STREAM = 42


def _plan() -> StreamPlan:
    """Five ranges of one batch: a transaction's batch, two plain ones, its COMMIT, one
    more plain one."""
    log = with_base_offset(
        b"".join(
            [
                build_batch(
                    [b"t"], keys=[b"a"], producer_id=5, producer_epoch=0, transactional=True
                ),
                build_batch([b"1"], keys=[b"a"]),
                build_batch([b"2"], keys=[b"b"]),
                control_batch(5, 0, COMMIT),
                build_batch([b"3"], keys=[b"a"]),
            ]
        ),
        0,
    )
    batches = [[b] for b in iter_batches(bytes(log))]
    ranges = [
        StreamRange(STREAM, r[0][0].base_offset, r[0][0].next_offset, 100 + n, ObjectKind.STREAM, 1)
        for n, r in enumerate(batches)
    ]
    segments = [
        segment_of(x.start_offset, x.end_offset, r) for x, r in zip(ranges, batches, strict=True)
    ]
    entries = [e for r in batches for e in scan_entries(r)]
    plan = StreamPlan(STREAM, 0, ranges, segments, entries, gaps=False)
    plan.scan = scan_log((h, memoryview(b)) for h, b in entries)
    plan.count = len(ranges)
    return plan


def test_groups_carry_the_transactions_state_and_fresh_offload_ids() -> None:
    plan = _plan()
    counter = itertools.count(1)
    tasks = group_tasks(plan, 1, lambda bits: next(counter))
    assert [(t.start, t.end, [r.object_id for r in t.ranges]) for t in tasks] == [
        (n, n + 1, [100 + n]) for n in range(5)
    ]
    assert [t.object_id for t in tasks] == [OFFLOAD_ID_BIT | n for n in range(1, 6)]
    # the COMMIT's group (offset 3) knows its transaction's batch was read before it
    assert [t.seen for t in tasks] == [((), ())] + [((5,), ())] * 3 + [((), ())]
    [whole] = group_tasks(plan, 1 << 20, lambda bits: 7)
    assert (whole.start, whole.end, len(whole.ranges), whole.seen) == (0, 5, 5, ((), ()))
