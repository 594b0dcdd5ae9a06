"""Where the batch holding an offset begins (timestamps._base_holding): the LSO past a
DeleteRecords inside an open transaction's batch is that base, as Kafka's."""

from __future__ import annotations

from proxy.tiered.timestamps import _base_holding
from tests.support.batches import build_batch


def run() -> memoryview:
    """Batches [100, 103), [103, 104), [104, 109): compressed and not."""
    return memoryview(
        build_batch([b"a", b"b", b"c"], base_offset=100)
        + build_batch([b"d"], base_offset=103)
        + build_batch([b"e"] * 5, base_offset=104, codec=1)
    )


def test_an_offset_inside_a_batch_answers_its_base_and_a_batch_start_itself():
    batches = run()
    assert [_base_holding(batches, n) for n in (100, 101, 102, 103, 104, 106, 108)] == [
        100, 100, 100, 103, 104, 104, 104,
    ]  # fmt: skip


def test_before_the_run_or_past_its_end_the_offset_itself():
    batches = run()
    assert _base_holding(batches, 99) == 99  # the first batch begins past it
    assert _base_holding(batches, 109) == 109  # the log end: no batch holds it
    assert _base_holding(memoryview(b""), 5) == 5
