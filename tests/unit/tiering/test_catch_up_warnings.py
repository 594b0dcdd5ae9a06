"""Failed catch-ups are logged once per stream per interval, with the count left out."""

from __future__ import annotations

import logging

from proxy.tiered import catch_up


def test_a_stream_s_failures_are_logged_once_per_interval(monkeypatch, caplog):
    now = [100.0]
    monkeypatch.setattr(catch_up.time, "monotonic", lambda: now[0])
    warnings = catch_up._Warnings(interval_s=10)
    with caplog.at_level(logging.WARNING, logger="tierproxy.transactions"):
        warnings.warn([7], "no live owner")
        for _ in range(12):  # a client retrying while the owner is away
            now[0] += 0.5
            warnings.warn([7], "no live owner")
        warnings.warn([8], "no live owner")  # another stream is logged at once
        now[0] += 5
        warnings.warn([7], "no live owner")
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "catch-up of streams [7] failed: no live owner",
        "catch-up of streams [8] failed: no live owner",
        "catch-up of streams [7] failed: no live owner (12 more failures not logged in the"
        " last 10 s)",
    ]
