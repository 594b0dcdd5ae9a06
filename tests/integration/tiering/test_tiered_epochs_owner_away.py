"""OffsetForLeaderEpoch on a tiered partition whose owner is away (tiered_epochs.py).

A consumer that reconnects after a proxy died asks where its position's epoch ends. The
latest epoch of a tiered partition ends at the owner's high watermark; with the owner
dead, the other proxy does not know it, and the committed end it does know is below the
records the owner acknowledged, served from its WAL and the consumer already read. It
answered that committed end, and the consumer took it for a truncated log (the
fault-injection suite's consumer stopped on it with auto.offset.reset=error; with
earliest or latest it would have read records again or skipped them). The answer is now
NOT_LEADER_OR_FOLLOWER, and the client asks again later, as of a broker that is not the
leader. The owner's partitions are not committed at all here (uploads every 60 s).
"""

from __future__ import annotations

import pytest
from confluent_kafka import Producer
from test_tiered_leader_epochs import _epoch_ends, _leaders
from tieredfleet import TieredFleet

pytestmark = [pytest.mark.kafka, pytest.mark.minio]

PARTITIONS = 4
RECORDS = 40  # per partition
NOT_LEADER_OR_FOLLOWER = 6


def test_latest_epoch_of_a_partition_whose_owner_is_away_is_not_answered(
    kafka_cluster, s3_server, tmp_path
):
    fleet = TieredFleet(
        kafka_cluster.bootstrap, s3_server, tmp_path, tiering={"upload_interval_s": 60.0}
    )
    try:
        fleet.start()
        fleet.wait_until_owned()
        topic, topic_id = fleet.create_spread_topic(PARTITIONS)
        fleet.tier(topic)
        fleet.wait_for_cutover(topic_id, PARTITIONS)
        producer = Producer(
            {"bootstrap.servers": fleet.bootstrap(), "enable.idempotence": True, "acks": "all"}
        )
        for n in range(RECORDS * PARTITIONS):
            producer.produce(topic, b"v%d" % n, partition=n % PARTITIONS)
        assert producer.flush(60) == 0

        owners = {p: fleet.stream_owner(topic_id, p) for p in range(PARTITIONS)}
        victim = fleet["zone-a"]
        survivor = fleet["zone-b"]
        away = [p for p in range(PARTITIONS) if owners[p] == victim.name]
        assert away and len(away) < PARTITIONS, owners  # a spread topic
        leaders = _leaders(("127.0.0.1", survivor.port), [topic])

        def ask() -> dict[int, tuple]:
            return {
                p: _epoch_ends(
                    ("127.0.0.1", survivor.base_port + leaders[topic, p][0]),
                    {(topic, p): leaders[topic, p][1]},
                )[topic, p]
                for p in range(PARTITIONS)
            }

        live = ask()
        assert live == {p: (0, leaders[topic, p][1], RECORDS) for p in range(PARTITIONS)}
        fleet.kill(victim.zone)
        dead = ask()
        for p in range(PARTITIONS):
            if p in away:  # its WAL holds the records: the end is not known here
                assert dead[p] == (NOT_LEADER_OR_FOLLOWER, -1, -1), (p, dead[p])
            else:
                assert dead[p] == live[p]
    finally:
        fleet.close()
