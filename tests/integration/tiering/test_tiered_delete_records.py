"""DeleteRecords through the proxy on a tiered topic (proxy/tiered/deletes.py).

One proxy owns both metadata shards. A two-partition topic has PER_ROUND records per
partition through Kafka, is tiered, then gets two rounds committed to objects and a tail
that only the owner's WAL holds; a plain topic passes through. One DeleteRecords from
librdkafka's admin client names all three kinds of partition:

- a tiered partition at an offset inside the objects: the stream's log start moves there
  (StreamTrim), Kafka's part is deleted to the cutover, EARLIEST is the new log start and
  a consumer reads exactly the records from it on; below it is OFFSET_OUT_OF_RANGE;
- a tiered partition at an offset below the cutover: Kafka deletes to it, the stream's log
  start follows, reads from the earliest offset are exact;
- a plain partition: Kafka's answer as it came.

Then -1 (the high watermark) on a tiered partition whose tail is only in the WAL: the
owner uploads it first, and nothing is left to read; an offset past the high watermark
is OFFSET_OUT_OF_RANGE, as Kafka answers it.
"""

from __future__ import annotations

import uuid

import pytest
from confluent_kafka import OFFSET_END, Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient
from cutover_load import create_topic, proxy_config, wait_owned, wait_until
from tiered_topic import TieredTopic, produce, read_all

from proxy.config import parse_config
from proxy.devstack.paths import free_port_block
from proxy.devstack.proxy_thread import ProxyThread

pytestmark = pytest.mark.kafka

PARTITIONS = 2
PER_ROUND = 30


def _delete(bootstrap: str, offsets: dict[tuple[str, int], int]) -> dict[tuple[str, int], object]:
    """(topic, partition) -> the low watermark, or the KafkaError of that partition."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    asked = [TopicPartition(t, p, o) for (t, p), o in offsets.items()]
    results = {}
    for tp, future in admin.delete_records(asked, request_timeout=60).items():
        try:
            results[tp.topic, tp.partition] = future.result().low_watermark
        except KafkaException as exc:
            results[tp.topic, tp.partition] = exc.args[0]
    return results


def _watermarks(bootstrap: str, topic: str, partition: int) -> tuple[int, int]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"w-{uuid.uuid4().hex}"})
    try:
        return consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=30)
    finally:
        consumer.close()


def _error_fetching(bootstrap: str, topic: str, partition: int, offset: int) -> int:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"e-{uuid.uuid4().hex}",
            "auto.offset.reset": "error",
        }
    )
    consumer.assign([TopicPartition(topic, partition, offset)])
    try:
        for _ in range(60):
            msg = consumer.poll(0.5)
            if msg is not None:
                assert msg.error() is not None, f"got offset {msg.offset()} fetching {offset}"
                return msg.error().code()
    finally:
        consumer.close()
    raise AssertionError(f"no answer fetching {topic}-{partition} at {offset}")


def test_delete_records_trims_tiered_partitions_and_passes_the_rest(kafka_cluster, tmp_path):
    suffix = uuid.uuid4().hex[:8]
    topic, plain = f"delete-{suffix}", f"plain-{suffix}"
    create_topic(kafka_cluster, topic, PARTITIONS)
    create_topic(kafka_cluster, plain, 1)
    config = proxy_config(
        kafka_cluster, tmp_path, f"delete-{suffix}", "zone-a", suffix, free_port_block(8),
        upload_interval_s=3600.0,
    )  # fmt: skip
    with ProxyThread(parse_config(config)) as proxy:
        wait_owned([proxy], 2)
        t = TieredTopic(proxy, topic, PARTITIONS, PER_ROUND)
        t.round("r0")
        t.round("r1")
        t.produce("tail")  # only in the owner's WAL and log cache
        plain_acked = produce(proxy.bootstrap, plain, 1, "plain", 10)[0]
        cutover = PER_ROUND
        inside = cutover + PER_ROUND + 5  # in the second object of partition 0
        below = 10  # in Kafka's part of partition 1
        low = _delete(proxy.bootstrap, {(topic, 0): inside, (topic, 1): below, (plain, 0): 4})
        assert low == {(topic, 0): inside, (topic, 1): below, (plain, 0): 4}

        s0, s1 = t.streams
        wait_until(lambda: t.tiering.state(s0).stream(s0).log_start_offset == inside, 30, "s0")
        wait_until(lambda: t.tiering.state(s1).stream(s1).log_start_offset == below, 30, "s1")
        # Kafka's own part: deleted to the cutover (partition 0) or to the offset (1)
        assert _watermarks(kafka_cluster.bootstrap, topic, 0) == (cutover, cutover)
        assert _watermarks(kafka_cluster.bootstrap, topic, 1)[0] == below
        ends = {p: t.acked[p][-1][0] + 1 for p in range(PARTITIONS)}
        assert _watermarks(proxy.bootstrap, topic, 0) == (inside, ends[0])
        assert _watermarks(proxy.bootstrap, topic, 1) == (below, ends[1])
        assert _watermarks(proxy.bootstrap, plain, 0) == (4, 10)

        got = read_all(proxy.bootstrap, topic, {0: ends[0] - inside, 1: ends[1] - below})
        assert got == {0: t.acked[0][inside:], 1: t.acked[1][below:]}
        assert read_all(proxy.bootstrap, plain, {0: 6}) == {0: plain_acked[4:]}
        for offset in (0, cutover + 1, inside - 1):
            code = _error_fetching(proxy.bootstrap, topic, 0, offset)
            assert code == KafkaError._AUTO_OFFSET_RESET, (offset, code)

        # -1: everything below the high watermark, the WAL's tail included (uploaded first)
        assert _delete(proxy.bootstrap, {(topic, 1): OFFSET_END}) == {(topic, 1): ends[1]}
        wait_until(lambda: t.tiering.state(s1).stream_end(s1) == ends[1], 30, "uploaded first")
        wait_until(lambda: t.tiering.state(s1).stream(s1).log_start_offset == ends[1], 30, "trim")
        assert _watermarks(proxy.bootstrap, topic, 1) == (ends[1], ends[1])
        past = _delete(proxy.bootstrap, {(topic, 0): ends[0] + 5})[topic, 0]
        assert isinstance(past, KafkaError) and past.code() == KafkaError.OFFSET_OUT_OF_RANGE
        # writes go on after the high watermark
        t.produce("after")
        assert read_all(proxy.bootstrap, topic, {1: PER_ROUND}) == {1: t.acked[1][ends[1] :]}
