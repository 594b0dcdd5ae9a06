"""The offsets an Iceberg export's snapshot records: written and read back, found in the
newest snapshot that has them (a compaction's snapshot has none), advanced by a run only
for the partitions it read; unreadable ones are named."""

from __future__ import annotations

import pytest

from offload_jobs.export_records import Resume
from offload_jobs.iceberg_offsets import (
    OFFSETS_KEY,
    TOPIC_KEY,
    OffsetsError,
    advanced,
    decode,
    encode,
    last_offsets,
)


def test_written_and_read_back():
    offsets = {0: Resume(120, {7: 100}), 1: Resume(80)}
    summary = encode("orders", offsets)
    assert summary[TOPIC_KEY] == "orders"
    assert summary[OFFSETS_KEY] == '{"0":{"end":120,"open":{"7":100}},"1":{"end":80,"open":{}}}'
    assert decode(summary) == offsets
    assert decode({"operation": "append"}) is None


def test_the_newest_snapshot_with_offsets_counts():
    older, newer = encode("t", {0: Resume(5)}), encode("t", {0: Resume(9)})
    assert last_offsets([{"operation": "replace"}, newer, older]) == {0: Resume(9)}
    assert last_offsets([]) == {}


def test_a_run_advances_the_partitions_it_read():
    before = {0: Resume(10, {3: 8}), 1: Resume(4)}
    after = advanced(before, {0: (20, {}), 2: (7, {5: 6})})
    assert after == {0: Resume(20), 1: Resume(4), 2: Resume(7, {5: 6})}


def test_unreadable_offsets_are_named():
    with pytest.raises(OffsetsError, match=f"snapshot property {OFFSETS_KEY} unreadable"):
        decode({OFFSETS_KEY: '{"0": {"stop": 1}}'})
