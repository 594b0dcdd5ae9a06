"""The CLI's tables of admin API answers (proxy/admin/client.py), pure."""

from __future__ import annotations

from proxy.admin.client import render_fleet, render_topic, render_topics, table

PARTITION = {
    "partition": 0, "stream_id": 99, "shard": 1, "owner": "proxy-a1", "cutover_offset": 40,
    "log_start_offset": 0, "committed_end_offset": 100, "high_watermark": 120, "objects": 2,
    "object_bytes": 5000, "offsets_only_in_kafka": 40,
}  # fmt: skip


def test_table_aligns_columns_and_right_aligns_numbers():
    text = table(["NAME", "N"], [["a", 5], ["long-name", 123]])
    assert text.splitlines() == ["NAME         N", "a            5", "long-name  123"]


def test_topics_and_topic_tables():
    report = {
        "topics": [
            {
                "topic": "orders",
                "mode": "tiered",
                "partitions": 1,
                "tiered_partitions": [PARTITION],
            },
            {"topic": "logs", "mode": "passthrough", "partitions": 6},
        ]
    }  # fmt: skip
    rows = render_topics(report).splitlines()
    assert rows[0].split()[:3] == ["TOPIC", "MODE", "PARTITIONS"]
    assert rows[1].split() == ["orders", "tiered", "1", "1", "2", "40"]
    assert rows[2].split() == ["logs", "passthrough", "6", "-", "-", "-"]
    one = render_topic({**report["topics"][0], "topic_id": "abc"})
    assert one.splitlines()[0] == "topic orders: tiered, 1 partitions, id abc"
    assert one.splitlines()[2].split() == [
        "0",
        "1",
        "proxy-a1",
        "0",
        "40",
        "100",
        "120",
        "2",
        "5000",
    ]
    assert render_topic(report["topics"][1]) == "topic logs: passthrough, 6 partitions"


def test_fleet_table_names_dead_members_and_unowned_shards():
    report = {
        "self": "a1",
        "zones": {"z1": 1},
        "members": [
            {"name": "a1", "zone": "z1", "address": "10.0.1.1:9092", "live": True,
             "last_heartbeat_s": 0.4, "shards": [0], "self": True,
             "uploader": {"lag_bytes": 2048, "lag_seconds": 0.5, "failed": None}},
            {"name": "b1", "zone": "z2", "address": "10.0.2.1:9092", "live": False,
             "last_heartbeat_s": 30.0, "shards": [], "self": False},
        ],
        "shards": [{"shard": 0, "owner": "a1", "epoch": 3, "owner_live": True},
                   {"shard": 1, "owner": "b1", "epoch": 2, "owner_live": False}],
    }  # fmt: skip
    text = render_fleet(report)
    lines = text.splitlines()
    assert lines[0] == "as seen by a1; live members by zone: z1: 1"
    assert lines[2].split() == ["a1", "z1", "10.0.1.1:9092", "live", "0.4", "0", "2048", "0.5"]
    assert lines[3].split() == ["b1", "z2", "10.0.2.1:9092", "DEAD", "30.0", "-", "-", "-"]
    assert lines[-1] == "shards: 2, without a live owner: [1]"
