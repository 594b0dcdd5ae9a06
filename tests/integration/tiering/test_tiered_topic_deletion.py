"""A tiered topic deleted in Kafka is deleted in the fleet too (docs/tiering.md, "Deleting
a tiered topic"): Kafka is the oracle.

One proxy on the shared Kafka (test_tiered_retention's set-up: a one-partition topic with
BEFORE records through Kafka, tiered, then records committed in an object and more
acknowledged into the WAL only).

- Deleted through the proxy (DeleteTopics, librdkafka's admin client): the answer comes
  once the fleet dropped the topic, so the name is passthrough at once; the stream goes,
  its WAL entries are never uploaded (the uploader goes on), its object is deleted after
  the grace. Created again under the same name, the topic is Kafka's new one: records
  produced by name (librdkafka, kafka-python) start at offset 0, and the proxy answers
  exactly what Kafka answers. Before, a Produce by name reached the old topic's stream.
- Deleted in Kafka directly (not through the proxy): the owner's own check finds it, and
  the proxy's own clients never create the topic again (aiokafka asked for its metadata
  with auto-creation on: the marker follower created it again at once).
"""

from __future__ import annotations

import uuid
from dataclasses import replace

import pytest
from confluent_kafka.admin import AdminClient, NewTopic
from cutover_load import started, tiered_topic_id, topics_command
from test_tiered_below_log_start import _created_again
from test_tiered_retention import (
    GRACE_S,
    SHARDS,
    TieredTopic,
    _produce,
    _read_from_earliest,
    _start,
)

from proxy.metadata.records import TopicMode
from proxy.metadata.streams import shard_of, stream_id, topic_shard
from tests.support.clients import watermarks
from tests.support.kafka_python import KafkaProducer
from tests.support.waiting import wait_until

pytestmark = pytest.mark.kafka

WAL_ONLY = 10


def _deleted_with_data(
    kafka_cluster, tmp_path, proxy, topic: str, via: str
) -> tuple[TieredTopic, str, uuid.UUID]:
    """The topic tiered, an object committed and WAL_ONLY records in the WAL only, then
    deleted with DeleteTopics sent to `via`; the object's key and the topic's id."""
    t = TieredTopic(kafka_cluster, tmp_path, proxy, topic)
    t.upload("object")
    wal = _produce(proxy.bootstrap, topic, "wal", WAL_ONLY)
    assert wal[-1][0] + 1 == t.tiering.partitions.get(t.stream).log_end_offset
    [committed] = t.ranges()
    assert committed.end_offset == wal[0][0]  # the WAL's records are not in an object
    topic_id = t.state.stream(t.stream).topic_id
    admin = AdminClient({"bootstrap.servers": via})  # kept: its handle runs the request
    admin.delete_topics([topic])[topic].result(30)
    return t, committed.object_key, topic_id


def _mode(t: TieredTopic, topic_id: uuid.UUID) -> TopicMode | None:
    state = t.tiering.readers[topic_shard(topic_id, SHARDS)].state
    mode = state.topic(topic_id)
    return None if mode is None else mode.mode


def _check_dropped_whole(proxy, t: TieredTopic, key: str) -> None:
    """The stream gone from the metadata and the proxy; its WAL entries skipped, not
    uploaded (the uploader goes on); its object deleted after the grace, like any object
    no range refers to."""
    wait_until(lambda: t.state.stream(t.stream) is None, 30, "the stream dropped")
    assert t.tiering.partitions.get(t.stream) is None
    proxy.run(lambda: t.tiering.uploader.flush())
    assert t.tiering.uploader.failed is None
    owner = t.tiering.assignment.owner(shard_of(t.stream, SHARDS))
    wait_until(lambda: owner.state.garbage_objects() == [], 3 * GRACE_S, "deleted")
    assert not t.exists(key)


def _kafka_topics(bootstrap: str) -> set[str]:
    return set(AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=30).topics)


def test_a_tiered_topic_deleted_through_the_proxy_is_gone_and_its_name_is_free(
    kafka_cluster, tmp_path
):
    topic, thread = _start(kafka_cluster, tmp_path, "deleted")
    with thread as proxy:
        t, key, topic_id = _deleted_with_data(
            kafka_cluster, tmp_path, proxy, topic, proxy.bootstrap
        )

        # answered once the fleet dropped it: the name is nobody's here any more
        assert _mode(t, topic_id) is TopicMode.DELETED
        assert t.tiering.topics.topic(topic) is None
        wait_until(lambda: t.state.stream(t.stream) is None, 30, "the stream dropped")

        # the name free: created again, a new empty passthrough topic, as in Kafka
        admin = AdminClient({"bootstrap.servers": proxy.bootstrap})
        admin.create_topics([NewTopic(topic, 1, 3)])[topic].result(30)
        wait_until(lambda: topic in _kafka_topics(proxy.bootstrap), 30, "created again")
        records = [(o, v) for o, v, _ in _produce(proxy.bootstrap, topic, "new", 5)]
        producer = KafkaProducer(bootstrap_servers=proxy.bootstrap, acks="all")
        for n in range(5):
            meta = producer.send(topic, f"kp-{n}".encode(), partition=0).get(30)
            records.append((meta.offset, f"kp-{n}".encode()))
        producer.close()
        assert [o for o, _ in records] == list(range(10))
        assert watermarks(proxy.bootstrap, topic) == watermarks(kafka_cluster.bootstrap, topic)
        assert watermarks(proxy.bootstrap, topic) == (0, 10)
        assert _read_from_earliest(proxy.bootstrap, topic, 10) == records
        assert _read_from_earliest(kafka_cluster.bootstrap, topic, 10) == records
        _check_dropped_whole(proxy, t, key)


def test_a_tiered_topic_deleted_in_kafka_is_found_and_never_created_again(kafka_cluster, tmp_path):
    topic, thread = _start(kafka_cluster, tmp_path, "gone")
    with thread as proxy:
        direct = kafka_cluster.bootstrap
        t, key, topic_id = _deleted_with_data(kafka_cluster, tmp_path, proxy, topic, direct)

        # two checks of Kafka that find no such topic (cutover.py, TOPICS_CHECK_S)
        wait_until(lambda: _mode(t, topic_id) is TopicMode.DELETED, 30, "found deleted")
        assert t.tiering.topics.topic(topic) is None
        _check_dropped_whole(proxy, t, key)
        # the proxy's clients followed the topic (markers, offsets): none created it again
        assert topic not in _kafka_topics(kafka_cluster.bootstrap)


def test_a_deletion_is_judged_only_from_the_kafka_cluster_the_topic_was_tiered_in(
    kafka_cluster, tmp_path
):
    """The topic's mode record names Kafka's cluster id. A fleet that finds the topic gone
    in another cluster (pointed at a copy of its cluster: its metadata topic mirrored,
    the names with other ids or none) drops nothing; a record written before the field
    gets its cluster from the first answer with the topic's own id."""
    topic, thread = _start(kafka_cluster, tmp_path, "elsewhere")
    with thread as proxy:
        t = TieredTopic(kafka_cluster, tmp_path, proxy, topic)
        t.upload("object")
        [committed] = t.ranges()
        topic_id = t.state.stream(t.stream).topic_id
        cluster = (
            AdminClient({"bootstrap.servers": kafka_cluster.bootstrap})
            .list_topics(timeout=30)
            .cluster_id
        )
        owner = t.tiering.assignment.owner(topic_shard(topic_id, SHARDS))
        record = owner.state.topic(topic_id)
        assert record.kafka_cluster == cluster  # recorded at the tier

        def rewrite(kafka_cluster: str | None) -> None:
            proxy.run(lambda: owner.write([replace(record, kafka_cluster=kafka_cluster)]))

        # written before records named a cluster: stamped by the next look
        rewrite(None)
        assert owner.state.topic(topic_id).kafka_cluster is None
        wait_until(lambda: owner.state.topic(topic_id).kafka_cluster == cluster, 30, "stamped")

        # the fleet's records say another cluster: gone here says nothing of the topic
        rewrite("c2Vjb25kLWNsdXN0ZXItaWQ")
        admin = AdminClient({"bootstrap.servers": kafka_cluster.bootstrap})
        admin.delete_topics([topic])[topic].result(30)
        looks = t.tiering.cutover.looks
        wait_until(lambda: t.tiering.cutover.looks >= looks + 3, 60, "three more looks")
        assert _mode(t, topic_id) is TopicMode.TIERED
        assert list(t.ranges()) == [committed] and t.exists(committed.object_key)
        assert t.tiering.partitions.get(t.stream) is not None

        # named this cluster again: judged deleted, dropped whole
        rewrite(cluster)
        wait_until(lambda: _mode(t, topic_id) is TopicMode.DELETED, 30, "found deleted")
        _check_dropped_whole(proxy, t, committed.object_key)


def test_tiering_a_name_again_marks_its_previous_topic_deleted_first(
    kafka_cluster, tmp_path, monkeypatch
):
    """The name's topic deleted in Kafka directly and created again, then tiered before the
    look at Kafka found the deletion (held off here): the tier marks the old topic first,
    so one tiered topic holds the name, and a Produce by name reaches the new one."""
    topic, thread = _start(kafka_cluster, tmp_path, "again")
    with thread as proxy:
        t = TieredTopic(kafka_cluster, tmp_path, proxy, topic)
        old_id = t.state.stream(t.stream).topic_id

        async def not_yet() -> None:
            return None

        monkeypatch.setattr(t.tiering.cutover, "_check_topics", not_yet)
        _created_again(kafka_cluster, topic)
        assert _mode(t, old_id) is TopicMode.TIERED  # the look has not found it

        assert topics_command("tier", topic, t.tiering.peer_port).returncode == 0
        assert _mode(t, old_id) is TopicMode.DELETED
        new_id = tiered_topic_id(proxy, topic)
        assert new_id != old_id and _mode(t, new_id) is TopicMode.TIERED
        new_stream = stream_id(new_id, 0)
        wait_until(lambda: started(t.tiering, new_stream), 30, "the new topic cut over")
        assert t.tiering.state(new_stream).cutover(new_stream) == 0

        records = [(o, v) for o, v, _ in _produce(proxy.bootstrap, topic, "new", 5)]
        assert [o for o, _ in records] == list(range(5))
        assert _read_from_earliest(proxy.bootstrap, topic, 5) == records
        assert watermarks(proxy.bootstrap, topic) == (0, 5)
        wait_until(lambda: t.state.stream(t.stream) is None, 30, "the old stream dropped")
