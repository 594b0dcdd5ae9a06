"""An idempotent producer whose batches cross the cutover is answered as Kafka answers it
(partition/carried.py, `producers_at_cutover`; docs/tiering.md, "Cutover"): Kafka is the
oracle.

One proxy on the shared Kafka (test_tiered_retention's set-up), a one-partition topic and
a passthrough twin. A raw client with a producer id from InitProducerId writes the same
batches, with sequence numbers it chooses, to both through the proxy: two batches go to
Kafka (the tiered topic is not tiered yet), then the topic is tiered, then the client
sends the second batch again, as a producer does whose answer was lost (its connection
broke, or Kafka answered a retriable error after appending it), the first too, a batch
after a gap, and the next batch. Each answer (error code, base offset) must be the
twin's, and both topics must read the same records at the same offsets. Before, the
stream knew nothing of the producers of Kafka's part of the log: it wrote the retried
batches again (duplicates, at offsets past the cutover) and took the gap. Last, a Fetch
past the end answers as the twin's: OFFSET_OUT_OF_RANGE with every offset -1.
"""

from __future__ import annotations

import contextlib
import time

import pytest
from cutover_load import started, tiered_topic_id, topics_command, wait_owned
from kio.schema.errors import ErrorCode
from raw_kafka import fetch_v12, init_producer_id, leader_address, produce_v9
from test_tiered_retention import SHARDS, _create_topic, _read_from_earliest, _start

from proxy.metadata.streams import stream_id
from tests.support.batches import build_batch
from tests.support.clients import watermarks
from tests.support.waiting import wait_until

pytestmark = pytest.mark.kafka


@contextlib.contextmanager
def _tiered_and_twin(kafka_cluster, tmp_path, name: str):
    """A proxy owning every shard, a one-partition topic to tier and its passthrough twin."""
    topic, thread = _start(kafka_cluster, tmp_path, name)
    twin = f"{topic}-plain"
    _create_topic(kafka_cluster, twin)
    with thread as proxy:
        wait_owned([proxy], SHARDS)
        yield proxy, topic, twin


def _producer_id(proxy) -> tuple[int, int]:
    host, port = proxy.bootstrap.rsplit(":", 1)
    return init_producer_id((host, int(port)))


def test_an_idempotent_producer_across_the_cutover_is_answered_as_kafka_answers_it(
    kafka_cluster, tmp_path
):
    with _tiered_and_twin(kafka_cluster, tmp_path, "idem") as (proxy, topic, twin):
        tiering = proxy.proxy.tiering
        pid, epoch = _producer_id(proxy)
        values: dict[str, list[bytes]] = {}

        def send(seq: int, tag: str, count: int) -> dict[str, tuple[int, int]]:
            """The batch with sequences from `seq` to both topics: (error, base offset)."""
            values[tag] = [f"{tag}-{n}".encode() for n in range(count)]
            batch = build_batch(
                values[tag], producer_id=pid, producer_epoch=epoch, base_sequence=seq
            )
            answers = {}
            for name in (topic, twin):
                part = produce_v9(leader_address(proxy.bootstrap, name), name, 0, batch)
                answers[name] = (int(part.error_code), int(part.base_offset))
            return answers

        def both(error: int, offset: int) -> dict[str, tuple[int, int]]:
            return {topic: (error, offset), twin: (error, offset)}

        assert send(0, "a", 3) == both(0, 0)
        assert send(3, "b", 2) == both(0, 3)
        assert topics_command("tier", topic, tiering.peer_port).returncode == 0
        stream = stream_id(tiered_topic_id(proxy, topic), 0)
        wait_until(lambda: started(tiering, stream), 30, "cut over")
        assert tiering.state(stream).cutover(stream) == 5

        assert send(3, "b", 2) == both(0, 3)  # a retry: Kafka's offsets, nothing written
        assert send(0, "a", 3) == both(0, 0)  # one of the producer's last 5 batches
        gap = send(7, "gap", 1)
        assert gap[topic] == gap[twin] and gap[twin][0] == ErrorCode.out_of_order_sequence_number
        assert send(5, "c", 2) == both(0, 5)  # the next batch, past the cutover
        assert send(5, "c", 2) == both(0, 5)  # and its retry

        expected = [(o, v) for o, v in enumerate(values["a"] + values["b"] + values["c"])]
        for name in (topic, twin):
            assert watermarks(proxy.bootstrap, name) == (0, len(expected))  # no duplicate
            assert _read_from_earliest(proxy.bootstrap, name, len(expected)) == expected

        # a Fetch past the end: Kafka's error answer knows no offset (all -1); the tiered
        # one answered the partition's high watermark, last stable offset and log start
        def past_the_end(name: str) -> tuple[int, int, int, int]:
            data = fetch_v12(leader_address(proxy.bootstrap, name), name, 0, 100)
            return (
                int(data.error_code),
                int(data.high_watermark),
                int(data.last_stable_offset),
                int(data.log_start_offset),
            )

        assert (
            past_the_end(topic) == past_the_end(twin) == (ErrorCode.offset_out_of_range, -1, -1, -1)
        )


def test_a_retry_from_before_the_seeds_tail_is_taken_as_a_duplicate(kafka_cluster, tmp_path):
    """The producer's first batch lies before the tail of Kafka's log the seed reads: 70
    records of another writer, their timestamps older than 30 s before the producer's
    second batch, come between, so the read stops there (`tail_read`). Kafka still holds
    the first batch among the producer's last 5 and answers its retry with its offset; the
    stream knows the producer from its second batch on and answers the retry
    DUPLICATE_SEQUENCE_NUMBER, which the clients take as success (before: 45, which they
    take as fatal). Nothing is written twice and the producer goes on in both topics."""
    with _tiered_and_twin(kafka_cluster, tmp_path, "idemcut") as (proxy, topic, twin):
        tiering = proxy.proxy.tiering
        pid, epoch = _producer_id(proxy)
        now = int(time.time() * 1000)
        sent: list[bytes] = []

        def send(seq: int, tag: str, count: int, at_ms: int, *, idempotent: bool = True):
            values = [f"{tag}-{n}".encode() for n in range(count)]
            batch = build_batch(
                values,
                timestamps=[at_ms] * count,
                producer_id=pid if idempotent else -1,
                producer_epoch=epoch if idempotent else -1,
                base_sequence=seq if idempotent else -1,
            )
            answers = {}
            for name in (topic, twin):
                part = produce_v9(leader_address(proxy.bootstrap, name), name, 0, batch)
                answers[name] = (int(part.error_code), int(part.base_offset))
            return values, answers

        old = now - 120_000
        for tag, seq, count, at_ms, idem in (
            ("a", 0, 3, old, True),
            ("other", -1, 70, old, False),
            ("b", 3, 2, now, True),
        ):
            values, answers = send(seq, tag, count, at_ms, idempotent=idem)
            assert answers[topic] == answers[twin] == (0, len(sent))
            sent += values
        assert topics_command("tier", topic, tiering.peer_port).returncode == 0
        stream = stream_id(tiered_topic_id(proxy, topic), 0)
        wait_until(lambda: started(tiering, stream), 30, "cut over")
        assert tiering.state(stream).cutover(stream) == len(sent)

        _, retry = send(0, "a", 3, old)  # the first batch again: its answer was lost
        assert retry[twin] == (0, 0)  # Kafka's cached offset
        assert retry[topic][0] == ErrorCode.duplicate_sequence_number
        _, retry = send(3, "b", 2, now)  # the second is known: Kafka's offset, as the twin
        assert retry[topic] == retry[twin] == (0, 73)
        values, answers = send(5, "c", 2, now)
        assert answers[topic] == answers[twin] == (0, len(sent))
        sent += values

        expected = list(enumerate(sent))
        for name in (topic, twin):
            assert watermarks(proxy.bootstrap, name) == (0, len(expected))  # no duplicate
            assert _read_from_earliest(proxy.bootstrap, name, len(expected)) == expected
