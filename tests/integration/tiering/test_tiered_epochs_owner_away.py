"""OffsetForLeaderEpoch and ListOffsets LATEST on a tiered partition whose owner is away
(tiered_epochs.py, tiered_offsets.py).

A consumer that reconnects after a proxy died asks where its position's epoch ends. The
latest epoch of a tiered partition ends at the owner's high watermark; with the owner
dead, the other proxy does not know it, and the committed end it does know is below the
records the owner acknowledged, served from its WAL and the consumer already read. It
answered that committed end, and the consumer took it for a truncated log (the
fault-injection suite's consumer stopped on it with auto.offset.reset=error; with
earliest or latest it would have read records again or skipped them). The answer is now
NOT_LEADER_OR_FOLLOWER, and the client asks again later, as of a broker that is not the
leader. ListOffsets LATEST likewise (a consumer starting at "latest" would have read the
tail again). The owner's partitions are not committed at all here (uploads every 60 s).
"""

from __future__ import annotations

import pytest
from confluent_kafka import Producer
from kio.schema.list_offsets.v7.request import (
    ListOffsetsPartition,
    ListOffsetsRequest,
    ListOffsetsTopic,
)
from kio.schema.list_offsets.v7.response import ListOffsetsResponse
from kio.schema.types import BrokerId, TopicName
from kio.static.primitive import i8, i32, i64
from raw_kafka import call, epoch_ends, leaders
from tieredfleet import TieredFleet

pytestmark = [pytest.mark.kafka, pytest.mark.minio]

PARTITIONS = 4
RECORDS = 40  # per partition
NOT_LEADER_OR_FOLLOWER = 6
LATEST = -1


def _latest(address, topic: str, partition: int) -> tuple[int, int]:
    """(error code, offset) of ListOffsets LATEST for one partition."""
    request = ListOffsetsRequest(
        replica_id=BrokerId(-1),
        isolation_level=i8(0),
        topics=(
            ListOffsetsTopic(
                name=TopicName(topic),
                partitions=(
                    ListOffsetsPartition(
                        partition_index=i32(partition),
                        current_leader_epoch=i32(-1),
                        timestamp=i64(LATEST),
                    ),
                ),
            ),
        ),
    )
    [answer] = call(address, request, ListOffsetsResponse).topics[0].partitions
    return answer.error_code.value, int(answer.offset)


def test_latest_epoch_of_a_partition_whose_owner_is_away_is_not_answered(
    kafka_cluster, s3_server, tmp_path
):
    fleet = TieredFleet(
        kafka_cluster.bootstrap, s3_server, tmp_path, tiering={"upload_interval_s": 60.0}
    )
    try:
        fleet.start()
        fleet.wait_until_owned()
        topic, topic_id = fleet.tiered_spread_topic(PARTITIONS)
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
        found = leaders(("127.0.0.1", survivor.port), [topic])

        def ask() -> dict[int, tuple]:
            """partition -> (OffsetForLeaderEpoch's answer, ListOffsets LATEST's)."""
            answers = {}
            for p in range(PARTITIONS):
                leader, epoch = found[topic, p]
                address = ("127.0.0.1", survivor.base_port + leader)
                answers[p] = (
                    epoch_ends(address, {(topic, p): epoch})[topic, p],
                    _latest(address, topic, p),
                )
            return answers

        live = ask()
        assert live == {
            p: ((0, found[topic, p][1], RECORDS), (0, RECORDS)) for p in range(PARTITIONS)
        }
        fleet.kill(victim.zone)
        dead = ask()
        for p in range(PARTITIONS):
            if p in away:  # its WAL holds the records: the end is not known here
                assert dead[p] == ((NOT_LEADER_OR_FOLLOWER, -1, -1), (NOT_LEADER_OR_FOLLOWER, -1))
            else:
                assert dead[p] == live[p]
    finally:
        fleet.close()
