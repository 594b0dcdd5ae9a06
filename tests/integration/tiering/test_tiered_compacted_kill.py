"""The owner of a compacted tiered topic killed with SIGKILL mid-clean (issue 20;
docs/tiering.md, "Compacted topics").

One `tierproxy run` proxy owns both metadata shards; it runs as cleaner_held.py, whose
log cleaner writes its new objects and then holds before their commit. The workload of
test_tiered_compacted.py goes to a compacted tiered topic through it and to a compacted
passthrough twin in Kafka. Once the clean holds, the proxy is killed with SIGKILL (its
WAL holds what it acknowledged and had not uploaded) and started again as `tierproxy
run`: it rebuilds the partition, and its cleaner (its checkpoint gone with the process)
cleans the whole log again. Then it is killed once more and started again: the
partition is rebuilt over the cleaned objects, and takes new records after them.

Checked: every record acknowledged is read back before the clean (nothing lost at the
kill); after it, the survivors below the last record are Kafka's (offset, key, value,
headers, timestamp); the objects the killed clean wrote are named by no shard (left to
the orphan sweep), and its commit never happened.
"""

from __future__ import annotations

import sys
import time
import uuid
from pathlib import Path

import pytest
from compacted_load import CODECS, SEGMENT_MS, create_compacted, produce, read_all, round_records
from tieredfleet import TieredFleet, wait_for_log

from tests.support.clients import watermarks
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.kafka, pytest.mark.minio, pytest.mark.timeout(600)]

HELD = "log cleaner holding before its commit: "


def _unique_below(records, last: int) -> bool:
    below = [r for r in records if r[0] < last]
    return len({r[1] for r in below}) == len(below)


def test_the_owner_killed_mid_clean_loses_nothing(kafka_cluster, s3_server, tmp_path):
    suffix = uuid.uuid4().hex[:8]
    plain, tiered = f"kill-compacted-kafka-{suffix}", f"kill-compacted-tiered-{suffix}"
    with TieredFleet(
        kafka_cluster.bootstrap,
        s3_server,
        tmp_path,
        zones=("zone-a",),
        shard_count=2,
        tiering={"log_cleaner_interval_s": 2},
    ) as fleet:
        proxy = fleet["zone-a"]
        normal = list(proxy.process.argv)
        fleet.stop("zone-a")
        held = [sys.executable, str(Path(__file__).parent / "cleaner_held.py")]
        proxy.process.argv = held + normal[3:]  # run --config ...
        fleet.start("zone-a")
        fleet.wait_until_owned()
        for topic in (plain, tiered):
            create_compacted(kafka_cluster.bootstrap, topic, "compact")
        fleet.tier(tiered)
        topic_id = next(
            mode.topic_id
            for state in fleet.states()
            for known in state.topic_ids()
            if (mode := state.topic(known)) is not None and mode.topic == tiered
        )
        fleet.wait_for_cutover(topic_id, 1)
        for n, codec in enumerate(CODECS):
            records = round_records(n)
            produce(kafka_cluster.bootstrap, plain, records, codec)
            produce(fleet.bootstrap(), tiered, records, codec)
        time.sleep(SEGMENT_MS / 1000 + 0.5)  # Kafka's roll rule (test_tiered_compacted.py)
        for bootstrap, topic in ((kafka_cluster.bootstrap, plain), (fleet.bootstrap(), tiered)):
            produce(bootstrap, topic, [(b"roll", b"roll", [], 0)], "none")
        last = watermarks(kafka_cluster.bootstrap, plain)[1] - 1
        assert watermarks(fleet.bootstrap(), tiered)[1] - 1 == last

        at = wait_for_log(proxy, HELD, 60)
        line = proxy.log(at).splitlines()[0]
        orphans = line.split(HELD, 1)[1].split()
        assert orphans, line
        before = read_all(fleet.bootstrap(), tiered, last)
        assert [r[0] for r in before] == list(range(last + 1))  # every record acknowledged
        fleet.kill("zone-a")
        proxy.process.argv = normal
        fleet.start("zone-a")
        fleet.wait_until_owned()

        def kafka_cleaned() -> bool:
            return _unique_below(read_all(kafka_cluster.bootstrap, plain, last), last)

        wait_for(kafka_cleaned, bool, "Kafka's cleaner cleaned the twin", 120, interval=2)
        cleaned = wait_for(
            lambda: read_all(fleet.bootstrap(), tiered, last),
            lambda got: _unique_below(got, last),
            "the restarted proxy cleaned the topic",
            120,
            interval=2,
        )
        expected = read_all(kafka_cluster.bootstrap, plain, last)
        assert cleaned[:-1] == expected[:-1]  # the last: the roll record, stamped by each client
        latest = {r[1]: r[2] for r in before}  # in offset order: last wins
        assert {r[1]: r[2] for r in cleaned} == latest
        named = {r.object_key for s in fleet.states() for i in s.stream_ids()
                 for r in s.committed_ranges(i)}  # fmt: skip
        assert named.isdisjoint(orphans), "the killed clean's objects were committed"
        sizes = fleet.object_sizes(orphans)
        print(f"killed clean left {len(orphans)} objects ({sizes}) for the orphan sweep")

        # killed again, after the clean: the partition is rebuilt over the cleaned
        # objects (holes inside their blocks) and takes new records after them
        fleet.kill("zone-a")
        fleet.start("zone-a")
        fleet.wait_until_owned()
        assert read_all(fleet.bootstrap(), tiered, last) == cleaned
        produce(fleet.bootstrap(), tiered, [(b"after", b"kill", [], 0)], "none")
        again = read_all(fleet.bootstrap(), tiered, last + 1)
        assert again[:-1] == cleaned and again[-1][1:3] == (b"after", b"kill")
