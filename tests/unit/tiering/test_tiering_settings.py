"""The `tiering` config section, the topic index and the heartbeat's tiering fields."""

from __future__ import annotations

import base64
import uuid

import pytest

from proxy.config import ConfigError, parse_config
from proxy.metadata.codec import encode
from proxy.metadata.records import TopicMode, TopicModeSet
from proxy.metadata.state import MetadataState
from proxy.metadata.streams import stream_id, topic_shard
from proxy.metadata.topic_index import TieredTopic, TopicIndex, cutover_ready, drained_topics
from proxy.objects.s3 import _s3_options, body_checksum
from proxy.routing.fleet import (
    Heartbeat,
    HeartbeatError,
    Member,
    decode_heartbeat,
    encode_heartbeat,
)

BASE = {"upstream": {"bootstrap": "127.0.0.1:9092"}}


def _parse(tiering):
    return parse_config({**BASE, "tiering": tiering}).tiering


def test_tiering_is_off_without_a_section_and_on_with_one():
    assert not parse_config(BASE).tiering.enabled
    config = _parse({"shard_count": 4, "notify": "direct"})
    assert config.enabled and config.shard_count == 4 and config.notify == "direct"
    assert config.group == "__tierproxy_metadata.owners"
    assert not _parse({"enabled": False}).enabled


def test_s3_object_store_is_read():
    store = _parse(
        {"object_store": {"kind": "s3", "bucket": "b", "endpoint_url": "http://x:9000"}}
    ).object_store
    assert store.kind == "s3" and store.s3.bucket == "b"
    assert store.s3.sign_payload is None  # absent: over http only (objects/s3.py)


@pytest.mark.parametrize(
    ("endpoint", "sign_payload", "signed"),
    [
        ("http://x:9000", None, True),
        ("HTTP://x:9000", None, True),
        ("https://s3.example", None, False),
        (None, None, False),  # AWS's endpoint: https
        ("http://x:9000", False, False),
        ("https://s3.example", True, True),
    ],
)
def test_the_payload_is_signed_over_http_unless_told_not_to(endpoint, sign_payload, signed):
    section = {"kind": "s3", "bucket": "b", "endpoint_url": endpoint}
    if sign_payload is not None:
        section["sign_payload"] = sign_payload
    store = _parse({"object_store": section}).object_store
    assert store.s3.sign_payload is sign_payload
    assert _s3_options(store.s3, endpoint, checksums=True)["payload_signing_enabled"] is signed
    # a client that sends no checksum (botocore told `when_required`): botocore's own rule,
    # unless the setting says
    unchecked = _s3_options(store.s3, endpoint, checksums=False)
    assert unchecked.get("payload_signing_enabled") is sign_payload


def test_a_put_carries_the_crc32c_s3_checks():
    # RFC 3720's check value for "123456789", split anywhere
    expected = base64.b64encode((0xE3069283).to_bytes(4, "big")).decode()
    assert body_checksum([memoryview(b"123456789")]) == expected
    assert body_checksum([memoryview(b"1234"), memoryview(b""), memoryview(b"56789")]) == expected
    assert body_checksum([]) == "AAAAAA=="


@pytest.mark.parametrize(
    ("tiering", "key"),
    [
        ({"notify": "carrier-pigeon"}, "tiering.notify"),
        ({"shard_count": 0}, "tiering.shard_count"),
        ({"metadata_topic": "bad topic"}, "tiering.metadata_topic"),
        ({"session_timeout_ms": 10}, "tiering.session_timeout_ms"),
        ({"object_store": {"kind": "s3"}}, "tiering.object_store.bucket"),
        ({"object_store": {"bucket": "b"}}, "tiering.object_store.bucket"),
        (
            {"object_store": {"kind": "s3", "bucket": "b", "sign_payload": "no"}},
            "tiering.object_store.sign_payload",
        ),
        (
            {"wal": {"segment_bytes": 64 << 20, "capacity_bytes": 8 << 20}},
            "tiering.wal.segment_bytes",
        ),
        ({"wal": {"dir": "x"}}, "tiering.wal.dir"),
        ({"upload_every": 1}, "tiering.upload_every"),
    ],
)
def test_bad_tiering_config_names_the_key(tiering, key):
    with pytest.raises(ConfigError) as caught:
        _parse(tiering)
    assert caught.value.key == key


def _state_with(topic_id: uuid.UUID, name: str, mode: TopicMode, shard_count: int) -> list:
    states = [MetadataState(k, shard_count) for k in range(shard_count)]
    state = states[topic_shard(topic_id, shard_count)]
    key, value = encode(TopicModeSet(topic_id, name, mode, 1))
    assert state.apply(key, value, 0).accepted
    return states


def test_topic_index_finds_tiered_topics_by_name_and_id():
    topic_id = uuid.uuid4()
    states = _state_with(topic_id, "orders", TopicMode.TIERED, 4)
    index = TopicIndex(states)
    assert index.any()
    assert index.topic("orders").topic_id == topic_id
    assert index.topic(topic_id).name == "orders"
    assert index.topic("other") is None
    stream = stream_id(topic_id, 3)
    assert index.state_of(stream).shard == stream % 4


def test_topic_index_ignores_passthrough_topics():
    states = _state_with(uuid.uuid4(), "orders", TopicMode.PASSTHROUGH, 2)
    assert not TopicIndex(states).any()


def test_a_topic_is_drained_when_no_produce_is_in_flight_by_name_or_id():
    topic = TieredTopic(uuid.uuid4(), "orders", 1)
    assert drained_topics([topic], {}) == {str(topic.topic_id)}
    assert drained_topics([topic], {"orders": 1}) == frozenset()
    assert drained_topics([topic], {topic.topic_id: 2}) == frozenset()
    assert cutover_ready(topic, [frozenset({str(topic.topic_id)})] * 3)
    assert not cutover_ready(topic, [frozenset({str(topic.topic_id)}), frozenset()])


def test_heartbeat_carries_the_peer_port_and_drained_topics():
    member = Member("p1", "zone-a", "127.0.0.1", 19092, 19100)
    beat = Heartbeat(member, 1.5, {}, peer_port=4000, drained=frozenset({"a", "b"}))
    assert decode_heartbeat(encode_heartbeat(beat)) == beat
    old = encode_heartbeat(Heartbeat(member, 1.5)).replace(b',"peer_port":0,"drained":[]', b"")
    assert decode_heartbeat(old).peer_port == 0  # a heartbeat of a proxy without tiering
    with pytest.raises(HeartbeatError, match="drained"):
        decode_heartbeat(encode_heartbeat(beat).replace(b'["a","b"]', b'"a"'))


def test_an_s3_notification_carries_no_record_byte():
    """The owner hop of S3 mode: a location, not the records (the accounting counts the
    frames with peer_codec.frame_size, tested against the encoder in test_peer_codec)."""
    from proxy.handoff.objects import S3WalLocation
    from proxy.peer.codec import encode_frame, frame_size
    from proxy.peer.messages import AppendRequest

    records = b"x" * 1000
    direct = AppendRequest(1, 5, -1, 1000, records, None)
    assert frame_size(direct) == len(encode_frame(direct)) > len(records)
    location = S3WalLocation("wal/ab/writer-1/0000000000000001", 0, 1000, 5, 7)
    s3 = AppendRequest(1, 5, -1, 1000, None, location)
    assert frame_size(s3) == len(encode_frame(s3)) < 100
