"""The verification's comparison: equal sides are OK; a batch missing on either side, a
batch that differs, a problem met while reading objects, each named at its offset; the
range limits what is compared; the report reads as JSON and as a table."""

from __future__ import annotations

import json

from offload_jobs.verify_compare import (
    MAX_LISTED,
    BatchSummary,
    Mismatch,
    VerifyReport,
    compare,
)


def run(*spans: tuple[int, int]) -> list[BatchSummary]:
    return [BatchSummary(a, b, b - a + 1, 0x1000 + a, 100 + a) for a, b in spans]


KAFKA = run((0, 4), (5, 5), (6, 9), (10, 14))


def test_equal_sides_are_ok():
    report = compare("t", 1, 0, 15, KAFKA, list(KAFKA))
    assert report.ok and report.mismatch_count == 0
    assert (report.kafka_batches, report.kafka_records) == (4, 15)
    assert (report.object_batches, report.object_records) == (4, 15)
    assert report.kafka_bytes == sum(b.size for b in KAFKA)


def test_a_batch_missing_from_the_objects_is_named():
    report = compare("t", 1, 0, 15, KAFKA, [KAFKA[0], KAFKA[1], KAFKA[3]])
    assert not report.ok
    assert [(m.offset, m.what.split(" is ")[1]) for m in report.mismatches] == [
        (6, "in Kafka, not in the objects")
    ]
    assert "batch [6, 9] (4 records" in report.mismatches[0].what


def test_a_batch_only_in_the_objects_is_named():
    extra = run((15, 16))
    report = compare("t", 1, 0, 17, KAFKA, KAFKA + extra)
    assert [m.offset for m in report.mismatches] == [15]
    assert "in the objects, not in Kafka" in report.mismatches[0].what


def test_a_different_crc_or_count_is_named():
    tampered = list(KAFKA)
    tampered[2] = tampered[2]._replace(crc=0xDEAD)
    tampered[3] = tampered[3]._replace(record_count=1)
    report = compare("t", 1, 0, 15, KAFKA, tampered)
    assert [m.offset for m in report.mismatches] == [6, 10]
    assert "CRC 0x0000dead" in report.mismatches[0].what


def test_only_batches_overlapping_the_range_count():
    """Objects may hold more than Kafka still does (retention cut Kafka's log)."""
    objects = run((0, 4)) + KAFKA[1:]
    report = compare("t", 1, 5, 15, KAFKA[1:], objects)
    assert report.ok and report.object_batches == 3
    # a batch straddling the range start counts on both sides
    assert compare("t", 1, 3, 15, KAFKA, KAFKA[1:]).mismatches[0].offset == 0


def test_problems_met_reading_objects_are_mismatches_in_offset_order():
    problem = Mismatch(6, "object k: block CRC mismatch")
    report = compare("t", 1, 0, 15, KAFKA, [KAFKA[0], KAFKA[1], KAFKA[3]], [problem])
    assert [m.offset for m in report.mismatches] == [6, 6]
    assert report.mismatch_count == 2


def test_a_run_of_missing_batches_is_one_mismatch():
    report = compare("t", 1, 0, 15, KAFKA, KAFKA[:1])
    assert [(m.offset, m.what) for m in report.mismatches] == [
        (5, "batches [5, 14] (3 batches, 10 records) are in Kafka, not in the objects")
    ]
    both_ways = compare("t", 1, 0, 17, KAFKA[:2], KAFKA[:1] + run((15, 16)))
    assert [m.offset for m in both_ways.mismatches] == [5, 15]


def test_many_mismatches_are_counted_and_the_first_listed():
    kafka = run(*((i, i) for i in range(100)))
    objects = [b._replace(crc=0) for b in kafka]
    report = compare("t", 0, 0, 100, kafka, objects)
    assert report.mismatch_count == 100 and len(report.mismatches) == MAX_LISTED


def test_the_report_as_json_and_table():
    good = compare("orders", 0, 0, 15, KAFKA, KAFKA)
    bad = compare("orders", 1, 0, 15, KAFKA, KAFKA[:2])
    report = VerifyReport("orders", (good, bad), seconds=1.5)
    document = json.loads(report.to_json())
    assert document["ok"] is False
    assert [p["ok"] for p in document["partitions"]] == [True, False]
    assert document["partitions"][1]["mismatches"][0]["offset"] == 6
    table = report.table()
    assert table.splitlines()[0] == "verification of orders: FAILED"
    assert "orders-1 offset 6: batches [6, 14] (2 batches, 9 records) are in Kafka" in table
    assert "1 MISMATCH" in table and " OK" in table
    assert VerifyReport("orders", (good,)).table().splitlines()[0].endswith(": OK")
    assert report.line() == (
        "verified orders: 0.0 MiB, 8 batches, 30 records in 1.5 s (0.0 MiB/s): FAILED"
    )


def test_a_verify_after_kafkas_copy_is_gone_says_nothing_was_compared():
    # Kafka's log starts at the cutover (15): the range to compare is empty
    empty = compare("orders", 0, 15, 15, [], [])
    report = VerifyReport("orders", (empty,), seconds=0.4)
    assert report.line().startswith("verified orders: nothing was compared: Kafka holds no")
    assert "NOTHING TO COMPARE" in report.table()
