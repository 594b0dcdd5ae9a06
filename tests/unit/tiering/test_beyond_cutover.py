"""BeyondCutover: every clamped answer counted by kind, one warning per partition."""

from __future__ import annotations

import logging

from proxy.tiered.beyond_cutover import BeyondCutover


def test_counts_every_clamped_answer_and_warns_once_per_partition(caplog):
    beyond = BeyondCutover()
    with caplog.at_level(logging.WARNING, logger="tierproxy.reads"):
        beyond.note("fetch", "t", 0, 10, 11)
        beyond.note("fetch", "t", 0, 10, 12)
        beyond.note("list_offsets", "t", 0, 10, 11)
        beyond.note("fetch", "t", 1, 5, 6)
    assert beyond.counts == {"fetch": 3, "list_offsets": 1}
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2
    assert "t-0" in warnings[0] and "cutover 10" in warnings[0]
    assert "t-1" in warnings[1]
