"""A tiered topic whose proxy restarts between the operations and the reads (issue 15,
bug 3): records in Kafka, the cutover, one large batch through the fleet,
DeleteRecords to an offset inside that batch, a clean stop and a start under the same
fleet name, then every kind of read. Kafka's partition answers through all of it; the
tiered one must too, with the same answers.

One scenario, not one per example (a restart costs seconds): its data are generated
once from a fixed seed, its shape is the issue's.
"""

from __future__ import annotations

import random

import pytest
from compare import assert_conforms
from ops import (
    CODECS,
    Commit,
    DeleteRecords,
    EpochEnd,
    Fetch,
    ListOffsets,
    Produce,
    Rec,
    Restart,
    Resume,
    Tier,
    TxnProduce,
)
from scenario import Runner
from tieredfleet import TieredFleet

pytestmark = [pytest.mark.kafka, pytest.mark.minio]

BEFORE, BATCH, DELETE_AT, TAIL = 40, 100, 50, 15  # DELETE_AT: inside the tiered batch


def _batch(rng: random.Random, count: int, start_ts: int) -> tuple[Rec, ...]:
    records = []
    for n in range(count):
        key = rng.choice([None, b"k1", b"k2", b"key-%d" % n])
        value = rng.choice([b"", None, b"v%d-" % n + rng.randbytes(rng.randint(0, 30))])
        records.append(
            Rec(
                key if key is not None or value is not None else b"k",
                value,
                start_ts + rng.randint(-2000, 2000),  # out of order within the batch
                tuple(("h", rng.randbytes(3)) for _ in range(rng.randint(0, 2))),
            )
        )
    return tuple(records)


def _scenario(rng: random.Random) -> list:
    codecs = [c for c in CODECS if c != "none"]
    before = _batch(rng, BEFORE, -600_000)
    tiered = _batch(rng, BATCH, -300_000)
    tail = _batch(rng, TAIL, -60_000)
    cutover = BEFORE
    inside = cutover + DELETE_AT
    z = "zone-a"
    return [
        Produce(before, rng.choice(codecs), "librdkafka", z),
        Tier(),
        Produce(tiered, rng.choice(codecs), "java", z),
        DeleteRecords(inside, "librdkafka", z),
        Produce(tail, rng.choice(codecs), "aiokafka", z),
        Commit(0, inside + 5, "librdkafka", z),
        Restart(),
        Fetch(0, "librdkafka", z),
        Fetch(inside - 1, "java", z),
        Fetch(inside, "aiokafka", z),
        Fetch(inside + 7, "librdkafka", z),
        ListOffsets("earliest", "java", z),
        ListOffsets("latest", "librdkafka", z),
        ListOffsets("max_timestamp", "java", z),
        ListOffsets("earliest_local", "java", z),
        *(
            ListOffsets("timestamp", client, z, r.ts)
            for client, r in [
                ("librdkafka", tiered[DELETE_AT - 10]),  # a record deleted since
                ("java", tiered[DELETE_AT]),
                ("aiokafka", tiered[DELETE_AT + 20]),
                ("librdkafka", before[5]),
            ]
        ),
        EpochEnd(0, z),
        Resume(0, "earliest", "java", z),
        Produce(_batch(rng, 5, 0), "none", "librdkafka", z),
        Fetch(inside + BATCH // 2, "librdkafka", z),
    ]


@pytest.fixture
def restart_fleet(kafka_cluster, s3_server, tmp_path):
    with TieredFleet(
        kafka_cluster.bootstrap, s3_server, tmp_path, zones=("zone-a",), shard_count=2
    ) as fleet:
        yield fleet


def test_a_restarted_proxy_answers_as_kafka_after_a_mid_batch_delete(
    restart_fleet, conformance_clients, kafka_cluster
):
    runner = Runner(restart_fleet, kafka_cluster.bootstrap, conformance_clients)
    scenario = runner.run(_scenario(random.Random(15)), tag="restart")
    assert_conforms(scenario.rows, scenario.title)


def _open_txn_scenario(rng: random.Random) -> list:
    """A transaction open across a DeleteRecords inside its batch and a restart: Kafka's
    LSO is then the base offset of that batch, below the log start; the rebuilt owner
    must find it again (tiered/shards.recover_streams)."""
    before, tiered = _batch(rng, 10, -600_000), _batch(rng, 10, -300_000)
    opened = _batch(rng, 8, -60_000)
    first = len(before) + len(tiered)  # the transaction's first offset
    z = "zone-a"
    codec = rng.choice([c for c in CODECS if c != "none"])

    def committed(client: str) -> list:
        return [
            ListOffsets("latest", client, z, isolation="read_committed"),
            Fetch(first + 3, client, z, "read_committed"),
        ]

    return [
        Produce(before, codec, "librdkafka", z),
        Tier(),
        Produce(tiered, codec, "aiokafka", z),
        TxnProduce(0, opened, "open", codec, "java", z),
        DeleteRecords(first + 3, "librdkafka", z),
        *committed("aiokafka"),
        Restart(),
        *committed("librdkafka"),
        ListOffsets("earliest", "java", z),
        TxnProduce(0, (), "abort", codec, "java", z),
        *committed("java"),
    ]


def test_a_restarted_owner_keeps_kafkas_lso_past_a_delete_inside_an_open_transaction(
    restart_fleet, conformance_clients, kafka_cluster
):
    runner = Runner(restart_fleet, kafka_cluster.bootstrap, conformance_clients)
    scenario = runner.run(_open_txn_scenario(random.Random(16)), tag="rtxn")
    assert_conforms(scenario.rows, scenario.title)
