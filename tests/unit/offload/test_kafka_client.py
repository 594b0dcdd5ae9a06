"""The cluster reader's settings and bootstrap list: misuse is refused by name."""

from __future__ import annotations

import pytest

from offload_jobs.kafka_client import ReaderSettings, parse_bootstrap


def test_bootstrap_lists_parse():
    assert parse_bootstrap("a:1, b:2,[::1]:3") == [("a", 1), ("b", 2), ("::1", 3)]
    for bad in ("", "a", "a:x", ":9"):
        with pytest.raises(ValueError, match="bootstrap"):
            parse_bootstrap(bad)


def test_settings_are_checked_by_name():
    assert ReaderSettings.of({"fetch_max_bytes": 512}).fetch_max_bytes == 512
    with pytest.raises(ValueError, match="setting 'max_bytes': unknown \\(known: allow_gaps, "):
        ReaderSettings.of({"max_bytes": 1})
    with pytest.raises(ValueError, match="must be > 0"):
        ReaderSettings.of({"timeout_s": 0})
