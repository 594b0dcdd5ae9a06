"""Three proxies: a member joins and another leaves under load (issue 18; docs/reliability.md,
"Members joining and leaving").

A fleet of three `tierproxy run` processes (zone-a, zone-b, zone-c; four metadata shards;
the fault suite's tiering settings) on the session's Kafka and a MinIO of its own. Zone-a
and zone-b start and take the shards; the fault suite's steady load runs (a producer per
zone, a consumer through the fleet: faultsteps.steady_load). Then:

1. zone-c joins: the shard group rebalances and zone-c is given shards that zone-a and
   zone-b, both running, hand over (a rebalance, not a fail-over);
2. zone-b leaves (SIGTERM): it hands its shards over to zone-a and zone-c as it stops.

After each, the fleet must recover (faultsteps.py's "recovered", 30 s: every shard
claimed by a running member, produce acknowledged in every partition, the consumer caught
up) with the shards spread as the membership says; the end checks are the fault suite's
(faultchecks.py): nothing acknowledged lost, nothing twice, committed == consumed, nothing
left behind, no ERROR line in the proxies' logs.
"""

from __future__ import annotations

import time

import pytest
from faultchecks import assert_nothing_lost, finish, fleet_run
from faultload import Figures
from faultsteps import claims, steady_load

pytestmark = [pytest.mark.faults, pytest.mark.timeout(600)]

PARTITIONS = 4
ZONES = ("zone-a", "zone-b", "zone-c")


def test_a_member_joining_and_one_leaving_under_load_lose_and_repeat_nothing(
    kafka_cluster, tmp_path
):
    figures = Figures(seed=0)  # nothing random is chosen here
    began = time.monotonic()
    with fleet_run(kafka_cluster.bootstrap, tmp_path, "membership", figures, ZONES) as run:
        fleet = run.fleet
        a, b, c = (fleet[zone] for zone in ZONES)
        fleet.start("zone-a", "zone-b")
        fleet.wait_until_owned()
        topic_id, injector = steady_load(fleet, PARTITIONS, run.producers, tmp_path, figures)
        progress, consumer = injector.progress, injector.consumer
        run.consumers.append(consumer)
        figures.notes["setup_s"] = round(time.monotonic() - began, 1)
        before_join = claims(fleet)

        injected = time.monotonic()
        fleet.start("zone-c")
        fleet.wait_until_owned({a.name, b.name, c.name}, timeout=30)
        injector.recovered("member joins", injected, time.monotonic(), 30)
        after_join = claims(fleet)

        injected = time.monotonic()
        fleet.stop("zone-b")
        fleet.wait_until_owned({a.name, c.name}, timeout=30)
        injector.recovered("member leaves", injected, time.monotonic(), 30)
        after_leave = claims(fleet)
        figures.notes["shards"] = {
            "before_join": before_join,
            "after_join": after_join,
            "after_leave": after_leave,
        }
        figures.notes["handed_over_uncleanly"] = [
            line[:300]
            for proxy in (a, b, c)
            for line in proxy.log().splitlines()
            if "handed over uncleanly" in line
        ]
        finish(fleet, run.minio, topic_id, run.producers, progress, consumer, figures)

    shards = figures.notes["shards"]
    names = (a.name, b.name, c.name)
    assert {owner for owner, _ in shards["before_join"].values()} == set(names[:2])
    # zone-c was given shards the others held and handed over while running: a rebalance
    moved = [s for s, (owner, _) in shards["after_join"].items() if owner == c.name]
    assert moved and all(shards["before_join"][s][0] in names[:2] for s in moved), shards
    # zone-b's shards went to the members left, each claimed at a newer epoch
    left = [s for s, (owner, _) in shards["after_join"].items() if owner == b.name]
    for shard in left:
        owner, epoch = shards["after_leave"][shard]
        assert owner in (a.name, c.name) and epoch > shards["after_join"][shard][1], shards
    assert figures.faults == {"member joins": 1, "member leaves": 1}
    assert figures.records_acknowledged > 2_000
    assert_nothing_lost(figures)
    assert figures.notes["proxy_errors"] == [], "the proxies logged errors (see their logs)"
