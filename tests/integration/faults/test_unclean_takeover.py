"""Three proxies: a third member killed, and an unclean takeover after
`unclean_takeover_after_s` (issue 18; docs/reliability.md, "A member killed, and an
unclean takeover (three proxies)").

A fleet of three `tierproxy run` processes (zone-a, zone-b, zone-c; four metadata shards;
the fault suite's tiering settings) on the session's Kafka and a MinIO of its own, all
three started, under the fault suite's steady load (faultsteps.steady_load: a producer
per zone, a consumer through the fleet).

1. `kill -9` of the member owning most of the topic's partitions, started again (same
   fleet.name, same WAL) after a short delay: the two others fence it and wait; its
   shards come back to it at a newer epoch; the fault suite's end checks (nothing
   acknowledged lost, nothing twice, committed == consumed, nothing left behind, no
   ERROR line).
2. With `tiering.unclean_takeover_after_s` set (UNCLEAN_AFTER_S), `kill -9` of a member
   (the one the shard group will give a shard of its own back: `_victim`), the load
   stopped with it, not started again until the two others have claimed its shards at
   a newer epoch; a record to each of its partitions must then be acknowledged at the
   committed end the takeover found (read from the metadata: the commits written before
   the takeover's claim). What Kafka's unclean leader election allows, and nothing more:
   the records missing are exactly those the dead member acknowledged for its shards'
   partitions at or past that end; every other acknowledged record is in the log, once,
   at its offset; offsets stay contiguous, those past the end taken again by new
   records. Then the dead member starts again with its old WAL: it must not bring back
   its stale records, must take shards again and serve (a new load); a fresh read of
   every partition from the earliest offset, through it, shows each record once.
"""

from __future__ import annotations

import time
import uuid
from collections import Counter

import pytest
from confluent_kafka import Producer
from cutover_load import LoadProducer
from faultchecks import TIERING, assert_nothing_lost, finish, fleet_run, read_back, stop_load
from faultload import Figures, Progress, start_load
from faultsteps import DELIVERY_GRACE_S, claims, steady_load
from tieredfleet import TieredFleet, parse_value, wal_backlog

from proxy.metadata.assignor import MemberClaims, assign_shards
from proxy.metadata.records import ObjectCommit, ShardClaim
from proxy.metadata.streams import shard_of, stream_id
from tests.support.clients import read_from_earliest
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.faults, pytest.mark.timeout(600)]

PARTITIONS = 4
# the unclean takeover's topic: more partitions, so that shard 3 (the one the killed
# member is given back, `_victim`) very likely holds one
UNCLEAN_PARTITIONS = 8
ZONES = ("zone-a", "zone-b", "zone-c")
UNCLEAN_AFTER_S = 3.0
TAKEOVER_BOUND_S = 60.0  # the session timeout (6 s), the bound, the claim, on a loaded machine
RECOVERY_S = 30.0  # faultsteps.RECOVERY_BOUND_S


def _busiest(fleet: TieredFleet, topic_id: uuid.UUID) -> str:
    """The zone of the member owning most of the topic's partitions."""
    owners = Counter(fleet.stream_owner(topic_id, p) for p in range(PARTITIONS))
    return fleet.by_name(owners.most_common(1)[0][0]).zone


def _shards_of(fleet: TieredFleet, topic_id: uuid.UUID, partitions: int) -> dict[int, int]:
    """partition -> the metadata shard of its stream."""
    return {p: shard_of(stream_id(topic_id, p), fleet.shard_count) for p in range(partitions)}


def test_a_third_member_killed_gets_its_shards_back(kafka_cluster, tmp_path):
    figures = Figures(seed=0)  # the injector's RNG (seed 0): how long the member stays down
    began = time.monotonic()
    with fleet_run(kafka_cluster.bootstrap, tmp_path, "third-killed", figures, ZONES) as run:
        fleet = run.fleet
        fleet.start(*ZONES)
        fleet.wait_until_owned()
        topic_id, injector = steady_load(fleet, PARTITIONS, run.producers, tmp_path, figures)
        run.consumers.append(injector.consumer)
        figures.notes["setup_s"] = round(time.monotonic() - began, 1)
        victim = fleet[_busiest(fleet, topic_id)]
        before = claims(fleet)
        injector.kill_and_restart(victim.zone)
        after = claims(fleet)
        figures.notes["victim"] = victim.name
        figures.notes["shards"] = {"before_kill": before, "after_restart": after}
        figures.notes["waited_for_it"] = [
            line[:300]
            for proxy in fleet.proxies.values()
            for line in proxy.log().splitlines()
            if f"waits for {victim.name} to come back" in line
        ]
        finish(
            fleet,
            run.minio,
            topic_id,
            run.producers,
            injector.progress,
            injector.consumer,
            figures,
        )

    shards = figures.notes["shards"]
    mine = [s for s, (owner, _) in shards["before_kill"].items() if owner == victim.name]
    assert mine, shards
    for shard in mine:  # its shards came back to it, at a newer epoch (no takeover)
        owner, epoch = shards["after_restart"][shard]
        assert owner == victim.name and epoch > shards["before_kill"][shard][1], shards
    assert figures.faults == {"kill -9 proxy": 1}
    assert figures.records_acknowledged > 2_000
    assert_nothing_lost(figures)
    assert figures.notes["proxy_errors"] == [], "the proxies logged errors (see their logs)"


def _committed_at_takeover(
    fleet: TieredFleet, topic_id: uuid.UUID, partitions: list[int], before: dict, cutovers
) -> dict[int, int]:
    """partition -> its stream's committed end when the takeover claimed its shard: the
    end of the ranges the commits written before that claim name (of the older epochs),
    else the cutover. The records of the metadata topic, read from its start."""
    ends = dict(cutovers)
    by_shard = _shards_of(fleet, topic_id, UNCLEAN_PARTITIONS)
    for shard in {by_shard[p] for p in partitions}:
        streams = {stream_id(topic_id, p): p for p in partitions if by_shard[p] == shard}
        for _, record in fleet.records(shard):
            if isinstance(record, ShardClaim) and record.epoch > before[shard][1]:
                break  # the takeover's claim: what it found committed is above
            if isinstance(record, ObjectCommit):
                for r in record.ranges:
                    if r.stream_id in streams:
                        p = streams[r.stream_id]
                        ends[p] = max(ends[p], r.end_offset)
    return ends


def _contiguous(read: dict[int, list[tuple[int, bytes]]]) -> dict[int, int]:
    """partition -> how many offsets of its read do not follow the one before."""
    return {
        p: sum(1 for (a, _), (b, _) in zip(records, records[1:], strict=False) if b != a + 1)
        for p, records in read.items()
    }


def _wait_for_produce(progress: Progress, since: float, what: str) -> float:
    """Until every partition has an acknowledgement after `since`; when."""
    wait_for(lambda: progress.acked_since(since), bool, what, RECOVERY_S)
    return time.monotonic()


def _replaced(producers: list[LoadProducer]) -> dict[str, object]:
    """The first load's producers, stopped at the kill (what they had in flight may be in
    the log, unanswered), and what they were told. Were they to go on, the takeover
    would lose records they had acknowledged, and librdkafka's idempotent producer
    raises a fatal error when a partition then answers OUT_OF_ORDER_SEQUENCE_NUMBER
    (sequence desynchronization), as after Kafka's unclean leader election: the first
    runs saw it in each producer (LoadProducer's thread then dies of it)."""
    for producer in producers:
        producer.stop(flush_timeout_s=2)
    return {
        p.name: {
            "errors": len(p.errors),
            "sent": p.sent,
            "acked": len(p.acks),
            "unanswered_at_stop": p.flushed,
        }
        for p in producers
    }


def _probe(bootstrap: str, topic: str, partitions: list[int]) -> dict[bytes, tuple[int, int]]:
    """One record to each of `partitions` (an idempotent producer, acks=all): value ->
    (partition, offset) acknowledged."""
    reports: list = []  # (error, message) of each delivery report
    settings = {"enable.idempotence": True, "acks": "all", "client.id": "probe"}
    producer = Producer({"bootstrap.servers": bootstrap, **settings})
    for p in partitions:
        value = f"probe:{p}:".encode()
        producer.produce(topic, value, partition=p, on_delivery=lambda *r: reports.append(r))
    assert producer.flush(RECOVERY_S + 10) == 0
    assert all(err is None for err, _ in reports), reports
    return {msg.value(): (msg.partition(), msg.offset()) for _, msg in reports}


def _victim(fleet: TieredFleet, topic_id: uuid.UUID) -> str:
    """The zone of the member to kill: one that the shard group's assignor gives back,
    when it restarts after the takeover, a shard of its own holding a partition of the
    topic, so that it rebuilds that partition over its stale WAL entries (the path of
    the bug docs/reliability.md names). Worked out with the assignor itself
    (`assign_shards`), the group's member ids in zone order (each starts with its
    client.id, which names the zone). Else the owner of the highest-numbered such shard."""
    held: dict[str, frozenset[int]] = {}
    for shard, (owner, _, _) in fleet.owners().items():
        zone = fleet.by_name(owner).zone
        held[zone] = held.get(zone, frozenset()) | {shard}
    wanted = set(_shards_of(fleet, topic_id, UNCLEAN_PARTITIONS).values())
    shards = range(fleet.shard_count)
    for zone in sorted(held):
        after = assign_shards(
            shards, {z: MemberClaims(previous=s) for z, s in held.items() if z != zone}
        )
        members = {z: MemberClaims(previous=frozenset(s)) for z, s in after.items()}
        back = assign_shards(shards, {**members, zone: MemberClaims()})
        if set(back[zone]) & held[zone] & wanted:
            return zone
    return fleet.by_name(fleet.owners()[max(wanted)][0]).zone


def test_an_unclean_takeover_loses_only_what_the_dead_member_had_not_committed(
    kafka_cluster, tmp_path
):
    figures = Figures(seed=0)  # nothing random is chosen here
    began = time.monotonic()
    tiering_settings = {"unclean_takeover_after_s": UNCLEAN_AFTER_S}
    with fleet_run(
        kafka_cluster.bootstrap,
        tmp_path,
        "unclean",
        figures,
        ZONES,
        tiering={**TIERING, **tiering_settings},
    ) as run:
        fleet = run.fleet
        # zone-a first, then the two others: the shard group settles on zone-a 0-1,
        # zone-b 2, zone-c 3 (the assignor keeps a member's lowest shards, member ids in
        # zone order), the layout where `_victim` finds a member given a shard back
        fleet.start("zone-a")
        fleet.wait_until_owned()
        fleet.start("zone-b", "zone-c")
        fleet.wait_until_owned()
        topic_id, injector = steady_load(
            fleet, UNCLEAN_PARTITIONS, run.producers, tmp_path, figures
        )
        progress, consumer = injector.progress, injector.consumer
        run.consumers.append(consumer)
        figures.notes["setup_s"] = round(time.monotonic() - began, 1)
        victim = fleet[_victim(fleet, topic_id)]
        others = [p for p in fleet.proxies.values() if p is not victim]
        before = claims(fleet)
        taken = sorted(s for s, (owner, _) in before.items() if owner == victim.name)
        by_shard = _shards_of(fleet, topic_id, UNCLEAN_PARTITIONS)
        partitions = [p for p, s in by_shard.items() if s in taken]
        marks = {p.name: p.log_size() for p in others}

        injected = time.monotonic()
        fleet.kill(victim.zone)
        killed = time.monotonic()
        backlog = wal_backlog(victim.wal_dir)  # its WAL as the kill left it
        first_load = list(run.producers)
        figures.notes["first_load"] = _replaced(first_load)
        fleet.wait_until_owned({p.name for p in others}, timeout=TAKEOVER_BOUND_S)
        claimed = time.monotonic()
        ends = _committed_at_takeover(fleet, topic_id, partitions, before, consumer.starts)
        # the new owners serve: one record a partition of the dead member's, at the
        # committed end (the first offset it had given a record now lost)
        probes = _probe(fleet.bootstrap(), injector.topic, partitions)
        figures.fault("unclean takeover", injected, claimed, time.monotonic())
        after_takeover = claims(fleet)
        takeovers = [
            line[:300]
            for p in others
            for line in p.log(marks[p.name]).splitlines()
            if "uncleanly after" in line
        ]

        injected = time.monotonic()
        fleet.start(victim.zone)  # its old WAL, stale past `ends`
        fleet.wait_until_owned(timeout=RECOVERY_S)
        started = time.monotonic()
        zones = list(fleet.proxies)
        after = start_load(
            fleet.bootstrap(),
            zones,
            injector.topic,
            UNCLEAN_PARTITIONS,
            run.producers,
            prefix="after",
        )
        ended = _wait_for_produce(after, started, "produce after the restart")
        figures.fault("stale member restarts", injected, started, ended)
        after_restart = claims(fleet)
        ended_load = time.monotonic()
        stop_load([p for p in run.producers if p not in first_load])
        consumer.stop()
        # it serves: the fresh read of every partition goes through it
        read = read_from_earliest(victim.bootstrap, injector.topic, UNCLEAN_PARTITIONS)
        acks = list(progress.acks()) + list(after.acks())

        # what was acknowledged, by whom: the dead member answered for its shards'
        # partitions until the kill (its last answers reach the producers within the
        # grace; nobody answers for them again before the session timeout and the bound
        # have passed, and the first load was stopped by then); past the committed end its
        # takeover found, that is what Kafka's unclean election would lose
        assert claimed - killed > DELIVERY_GRACE_S
        acked = {a.value: (a.partition, a.offset) for a in acks} | probes
        lost = {
            a.value
            for a in acks
            if a.partition in partitions
            and a.acked_at <= killed + DELIVERY_GRACE_S
            and a.offset is not None
            and a.offset >= ends[a.partition]
        }
        kept = {value: at for value, at in acked.items() if value not in lost}
        at = {(p, offset): value for p, records in read.items() for offset, value in records}
        figures.notes.update(
            {
                "victim": victim.name,
                "unclean_after_s": UNCLEAN_AFTER_S,
                "shards": {
                    "before_kill": before,
                    "after_takeover": after_takeover,
                    "after_restart": after_restart,
                },
                "takeovers": takeovers,
                "victim_partitions": partitions,
                "victim_wal_backlog_bytes": backlog,
                "committed_at_takeover": {p: ends[p] for p in partitions},
                "probes": {value.decode(): at for value, at in probes.items()},
                "regained_own_shard": sorted(
                    s for s in taken if after_restart[s][0] == victim.name
                ),
                "load_s": round(ended_load - began, 1),
                "lost_as_allowed": len(lost),
                "lost_as_allowed_by_partition": dict(Counter(acked[value][0] for value in lost)),
                "lost_records_read_back": sum(1 for v in at.values() if v in lost),
                # read, never acknowledged: records the first load's producers had in
                # flight when they were stopped
                "read_never_acknowledged": Counter(
                    parse_value(v)[0] for v in at.values() if v not in acked
                ),
                "read_back": read_back(read, kept, {}),
                "gaps_in_offsets": _contiguous(read),
                "consumer_errors": dict(consumer.errors),
                # what the consumer through the fleet read from the dead member and the
                # log no longer holds at that offset (a Kafka consumer would too)
                "consumer_read_then_lost": sum(
                    1
                    for p, records in consumer.records.items()
                    for offset, value in records
                    if at.get((p, offset)) != value
                ),
                "victim_lines": [
                    line[:300]
                    for line in victim.log().splitlines()
                    if " WARNING " in line or " ERROR " in line
                ][-20:],
            }
        )
        figures.records_acknowledged = len(acked)
        figures.lost = sum(1 for value, where in kept.items() if at.get(where) != value)

    notes = figures.notes
    assert len(notes["takeovers"]) >= len(taken), "no unclean takeover logged"
    for shard in taken:  # claimed by another member at a newer epoch
        owner, epoch = notes["shards"]["after_takeover"][shard]
        assert owner != victim.name and epoch > before[shard][1], notes["shards"]
    assert victim.name in {owner for owner, _ in notes["shards"]["after_restart"].values()}
    # the first record after the takeover took the first offset lost (Kafka's rule)
    ends = notes["committed_at_takeover"]
    assert sorted(notes["probes"].values()) == [(p, ends[p]) for p in sorted(ends)], ends
    counts = notes["read_back"]
    # every record acknowledged but the allowed ones read once at its offset, no other
    assert counts["missing"] == 0, counts
    assert counts["read_twice"] == 0 and counts["acknowledged_without_offset"] == 0, counts
    # the lost ones nowhere in the log (not brought back by the restarted member's WAL)
    assert notes["lost_records_read_back"] == 0
    unanswered = notes["read_never_acknowledged"]
    # read, never answered: only the first load's, sent before it was stopped
    assert set(unanswered) <= {p.name for p in first_load}, unanswered
    assert counts["read"] == len(kept) + sum(unanswered.values()), counts
    assert set(notes["gaps_in_offsets"].values()) == {0}, notes["gaps_in_offsets"]
    assert figures.records_acknowledged > 1_000  # the load stopped at the kill
    assert notes["left_running"] == [], "processes left behind"
    assert notes["proxy_errors"] == [], "the proxies logged errors (see their logs)"
