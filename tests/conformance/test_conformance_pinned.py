"""Scenarios an exploration found (derandomized off, a seed of its own), pinned with fixed
data so that every run checks them, on the session's conformance fleet.

MAX_TIMESTAMP hidden by Kafka's own answer (seed 31337, tier midway): records an hour old
in Kafka, the cutover, records written straight to Kafka past it with "now" timestamps.
Kafka's answer for the tiered topic's partition is one of those strays, past the
cutover, which the proxy never passes on; its part's largest below the cutover must
still be the answer where the stream holds nothing newer (before the fix: -1, while
Kafka's twin answers the record an hour old).
"""

from __future__ import annotations

import pytest
from compare import assert_conforms
from ops import DeleteRecords, ListOffsets, Produce, Rec, StrayKafkaWrite, Tier

pytestmark = [pytest.mark.kafka, pytest.mark.minio]

HOUR_MS = 3_600_000


def _records(tag: bytes, first_ts: int, count: int, step_ms: int) -> tuple[Rec, ...]:
    return tuple(
        Rec(b"%s-%d" % (tag, n), b"v-%d" % n, first_ts + n * step_ms) for n in range(count)
    )


def _hidden_max_scenario() -> list:
    z = "zone-a"
    kafkas = _records(b"old", -HOUR_MS, 7, 10)  # its largest, -HOUR_MS + 60, at offset 6
    largest = kafkas[-1].ts
    return [
        Produce(kafkas, "gzip", "librdkafka", z),
        Tier(),
        StrayKafkaWrite(3, "none"),
        ListOffsets("max_timestamp", "java", z),  # the stream holds nothing: offset 6
        Produce(_records(b"older", -2 * HOUR_MS, 5, 1000), "lz4", "java", z),
        ListOffsets("max_timestamp", "librdkafka", z),  # the stream's are older: still 6
        Produce((Rec(b"tie", b"t", largest),), "none", "librdkafka", z),
        ListOffsets("max_timestamp", "java", z),  # a tie: Kafka's part first, still 6
        DeleteRecords(5, "librdkafka", z),  # Kafka's part keeps 5 and 6
        ListOffsets("max_timestamp", "librdkafka", z),
        ListOffsets("max_timestamp", "java", z, isolation="read_committed"),
        Produce(_records(b"new", -60_000, 3, 10), "zstd", "java", z),
        ListOffsets("max_timestamp", "librdkafka", z),  # the stream's newest now
    ]


def test_max_timestamp_below_the_cutover_is_kafkas_parts_when_kafka_answers_past_it(
    conformance,
):
    scenario = conformance.run(_hidden_max_scenario(), tag="hmax")
    assert_conforms(scenario.rows, scenario.title)
    answered = [row for row in scenario.rows if "max_timestamp" in row.op]
    assert len(answered) == 6 and all(row.compared for row in answered)
