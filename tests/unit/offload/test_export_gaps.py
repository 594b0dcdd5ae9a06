"""What a whole-topic export reads from Kafka: the offsets of its log no committed range
holds (before, between and after the objects), never a batch twice."""

from __future__ import annotations

from offload_jobs.export import kafka_gaps
from proxy.metadata.streams import StreamRange
from proxy.objects.keys import ObjectKind


def held(*spans: tuple[int, int]) -> tuple[StreamRange, ...]:
    return tuple(StreamRange(7, a, b, 100 + a, ObjectKind.STREAM, 1) for a, b in spans)


def test_kafka_fills_what_the_objects_do_not_hold():
    assert kafka_gaps(0, 100, ()) == ((0, 100),)  # nothing migrated or uploaded
    assert kafka_gaps(0, 100, held((50, 100), (100, 180))) == ((0, 50),)  # uploaded only
    assert kafka_gaps(0, 100, held((0, 40), (60, 100), (100, 150))) == ((40, 60),)
    assert kafka_gaps(0, 100, held((0, 100), (100, 150))) == ()  # migrated: all objects
    assert kafka_gaps(30, 100, held((0, 50), (50, 120))) == ()  # Kafka trimmed below
    assert kafka_gaps(30, 100, held((0, 20), (70, 80))) == ((30, 70), (80, 100))


def test_an_empty_or_dropped_kafka_log_reads_nothing_from_kafka():
    assert kafka_gaps(100, 100, held((0, 100))) == ()
    assert kafka_gaps(0, 0, ()) == ()
