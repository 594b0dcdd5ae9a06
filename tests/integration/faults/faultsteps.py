"""The faults the suite injects, one method each, and what "recovered" means after one.

Recovered, measured from the moment the faulted component is back (the proxy restarted,
the paused one resumed, the broker or MinIO started again):

1. every metadata shard is claimed, not released, by a running proxy; the shards the
   faulted proxy owned are claimed again at a newer epoch (the restarted or fenced owner
   rebuilt its state and claimed them);
2. produce acknowledges again: every partition has an acknowledgement that came after
   the fault ended;
3. the consumer reading through the fleet has caught up: in every partition it read past
   the highest offset acknowledged by then.

The recovery time is from the end of the fault to all three; the outage time from the
injection to all three. Each must come within a stated bound, else the suite fails; a
consumer still behind at the bound when 1 and 2 hold is examined before the failure (a
fresh consumer from its positions, every thread's native stack: `_stuck_consumer_evidence`).
"""

from __future__ import annotations

import os
import random
import subprocess
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka import TopicCollection
from confluent_kafka.admin import AdminClient
from cutover_load import Ack
from faultload import BurstProducer, Figures, FleetConsumer, Progress, start_load
from tieredfleet import TieredFleet, TieredProxy, wait_for_log, wal_backlog

from proxy.devstack import KafkaCluster, MinioServer
from proxy.devstack.toxiproxy import Link, Toxic

RECOVERY_BOUND_S = 30.0  # a proxy killed or paused, a broker restarted
OUTAGE_RECOVERY_BOUND_S = 60.0  # MinIO back: the full WAL drains, the queued produce lands


# After the WAL's last append was fsynced and counted, its answer reaches the client and
# its delivery report the test within this (a loaded machine included)
DELIVERY_GRACE_S = 3.0


def claims(fleet: TieredFleet) -> dict[int, list]:
    """shard -> [its last claim's owner, epoch], as the figures keep them."""
    return {shard: [owner, epoch] for shard, (owner, epoch, _) in fleet.owners().items()}


def broker_roles(bootstrap: str, topic: str, group: str) -> tuple[int, Counter[int], int]:
    """The coordinator of `group`, how many of `topic`'s partitions each broker leads, and
    the node the cluster names its controller (every node is a KRaft voter too)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    described = admin.describe_topics(TopicCollection([topic]))[topic].result(timeout=30)
    leaders = Counter(p.leader.id for p in described.partitions if p.leader is not None)
    groups = admin.describe_consumer_groups([group])[group].result(timeout=30)
    cluster = admin.describe_cluster().result(timeout=30)
    controller = cluster.controller.id if cluster.controller is not None else -1
    return groups.coordinator.id, leaders, controller


@dataclass
class WalFill:
    """What the owner with the small WAL did while MinIO was down, from its files and its
    `tierproxy_wal_appends_total` (counted once an append is fsynced) sampled every
    0.25 s. An append is counted before it is acknowledged, so once neither the backlog
    nor the count moved again (`full_after_s`), an acknowledgement later than the
    delivery grace and before MinIO's start, of a record handed to the client after the
    WAL stopped growing, is one the WAL never took: a bug. (The files
    alone are not enough: their size grows at the write, and the fsync after it took 4 s
    on a loaded machine.) Before,
    "full" was 7/8 of the bound (room was left for appends) and the window ran to when
    the suite saw MinIO ready, seconds after it served the first PUT that let the WAL
    drain: a CI run counted 1 acknowledgement "while full"."""

    capacity: int
    peak: int  # the most WAL bytes past the trim point seen
    room: int  # what was left below the bound once the WAL stopped growing
    full_after_s: float  # from MinIO's stop to the WAL's last growth before MinIO's start
    held_s: float  # from then to MinIO's start
    acks_while_full: int  # acknowledgements for that owner's partitions meanwhile
    acks_while_full_examples: list[str]
    # from MinIO's start to its readiness seen by the suite (the WAL may drain meanwhile;
    # before, such acknowledgements counted as "while full")
    acks_before_ready: int
    burst_sent: int


def _last_change(samples: list[tuple[float, object]]) -> float:
    """When the last run of equal values in `samples` (time, value) began."""
    at = len(samples) - 1
    while at > 0 and samples[at - 1][1] == samples[-1][1]:
        at -= 1
    return samples[at][0]


def wal_fill(
    capacity: int,
    samples: list[tuple[float, int, float | None]],
    acks: list[Ack],
    partitions: list[int],
    injected: float,
    resumed: float,
    ready: float,
    burst_sent: int,
) -> WalFill:
    """`samples`: (time, WAL backlog, appends counted or None if the scrape failed) from
    MinIO's stop to `resumed`, the moment MinIO was started again, not `ready`, when the
    suite saw it answer: the WAL may drain from its first PUT, and on a loaded machine
    MinIO was seen ready 9 s after its start."""
    last = samples[-1][1]
    counted = [(at, appends) for at, _, appends in samples if appends is not None]
    full_at = _last_change([(at, backlog) for at, backlog, _ in samples])
    if counted:
        full_at = max(full_at, _last_change(counted))
    # handed to the client after the WAL stopped growing: appended later or never, so
    # not to be acknowledged before MinIO's start. One handed over before may be: its
    # append came first (any later one would have moved `full_at`), and its answer waits
    # for the other partitions of the same Produce request, which the full WAL or the S3
    # outage may hold until they time out (a fresh-clone run saw 7 acks 20.9 s after
    # `full_at` of records the zone-b load handed over 0.4 s before it). The burst
    # producer's acks carry no hand-over time: for them the window alone counts.
    late = [
        a
        for a in acks
        if a.partition in partitions
        and full_at + DELIVERY_GRACE_S < a.acked_at < resumed
        and (not a.sent_at or a.sent_at > full_at)
    ]
    examples = [
        f"{a.value[:12]!r} at {a.partition}/{a.offset}, acknowledged "
        f"{a.acked_at - full_at:.2f} s after the WAL stopped growing"
        + (f", sent {a.acked_at - a.sent_at:.2f} s before" if a.sent_at else "")
        for a in late[:5]
    ]
    return WalFill(
        capacity,
        max(backlog for _, backlog, _ in samples),
        capacity - last,
        round(full_at - injected, 2),
        round(resumed - full_at, 2),
        len(late),
        examples,
        sum(1 for a in acks if a.partition in partitions and resumed <= a.acked_at < ready),
        burst_sent,
    )


def _appends(proxy: TieredProxy) -> float | None:
    """The WAL appends the proxy counted (fsynced); None if its metrics did not answer."""
    try:
        return proxy.metric("tierproxy_wal_appends_total")
    except OSError:
        return None


class Injector:
    def __init__(
        self,
        fleet: TieredFleet,
        topic: str,
        topic_id: uuid.UUID,
        progress: Progress,
        consumer: FleetConsumer,
        figures: Figures,
        rng: random.Random,
    ) -> None:
        self.fleet, self.topic, self.topic_id = fleet, topic, topic_id
        self.progress, self.consumer, self.figures, self.rng = progress, consumer, figures, rng
        self.burst: BurstProducer | None = None

    # -- recovery ------------------------------------------------------------------------

    def _not_yet(self, since: float, victim: str | None, before: dict) -> str | None:
        """Why the fleet has not recovered yet, or None."""
        if not self.progress.acked_since(since):
            stale = [
                p
                for p in range(self.progress.partitions)
                if self.progress.last_ack_at.get(p, 0.0) <= since
            ]
            return f"no acknowledgement since the fault on partitions {stale}"
        running = {p.name for p in self.fleet.proxies.values() if p.process.running()}
        owners = self.fleet.owners()
        for shard, (owner, epoch, released) in owners.items():
            if released or owner not in running:
                return f"shard {shard}: {owner} (released {released}), running {running}"
            if victim is not None and before[shard][0] == victim and epoch <= before[shard][1]:
                return f"shard {shard} not claimed again since the fault: epoch {epoch}"
        return self._consumer_behind()

    def _consumer_behind(self) -> str | None:
        ends = {p: offset + 1 for p, offset in self.progress.max_offset.items()}
        if not self.consumer.caught_up(ends):
            behind = {p: (self.consumer.position[p], end) for p, end in ends.items()}
            log = self.consumer.client_log[-5:]
            # whether produce still flows: a partition stalled again since it recovered
            # (its shard handed over once more) holds its consumer back too
            now = time.monotonic()
            acked = {p: round(now - at, 1) for p, at in sorted(self.progress.last_ack_at.items())}
            return (
                f"consumer behind: (position, acknowledged end) {behind}; last "
                f"acknowledgement (s ago) {acked}; shard owners {self.fleet.owners()}; "
                f"{self.consumer.state()}; its errors {dict(self.consumer.errors)} (the latest "
                f"per partition {self.consumer.last_error}), last "
                f"log lines {log}"
            )
        return None

    def _stuck_consumer_evidence(self) -> str:
        """Whether the consumer or the fleet holds it back: a fresh consumer, same settings
        and zone, reads on from the stuck one's positions for up to 20 s (it reaches the
        acknowledged ends: the fleet serves, the old client is wedged); and every thread's
        native stack of this process (librdkafka's own threads included) by gdb, to a file
        beside the consumer's log (how librdkafka's deadlock #5476 was found: FleetConsumer).
        gdb writes to the file itself: it stops this process while it works, so this
        process could not empty a pipe for it."""
        ends = {p: offset + 1 for p, offset in self.progress.max_offset.items()}
        probe = FleetConsumer(
            self.consumer.bootstrap, self.topic, dict(self.consumer.position), self.consumer.zone
        ).start()
        began = time.monotonic()
        while not probe.caught_up(ends) and time.monotonic() - began < 20.0:
            time.sleep(0.2)
        verdict = (
            f"a fresh consumer from its positions read to the acknowledged ends in "
            f"{time.monotonic() - began:.1f} s"
            if probe.caught_up(ends)
            else f"a fresh consumer from its positions got no further than {probe.position} "
            f"in 20 s ({probe.state()})"
        )
        probe.stop()
        folder = (
            self.consumer.log_path.parent if self.consumer.log_path else Path(tempfile.gettempdir())
        )
        stacks = folder / f"consumer-stuck-stacks-{int(time.time())}.txt"
        try:
            with stacks.open("w") as out:
                subprocess.run(
                    ["gdb", "-p", str(os.getpid()), "-batch", "-nx", "-ex", "info threads",
                     "-ex", "thread apply all bt 40"],
                    stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                    timeout=120, check=False,
                )  # fmt: skip
            where = f"native stacks in {stacks}"
        except (OSError, subprocess.TimeoutExpired) as exc:
            where = f"no native stacks ({exc!r})"
        return f"{verdict}; {where}"

    def _warnings(self, lines: int = 12) -> str:
        """Each proxy's last WARNING and ERROR lines: in the assertion itself, since a CI
        summary may keep only that of a failure."""
        out = []
        for proxy in self.fleet.proxies.values():
            tail = proxy.process.tail(400).splitlines()
            worst = [line[:300] for line in tail if " WARNING " in line or " ERROR " in line]
            out.append(f"-- {proxy.name}: " + ("\n".join(worst[-lines:]) or "(none)"))
        return "\n".join(out)

    def settled(self, since: float, bound: float) -> None:
        """Until the fleet is as `recovered` wants it, not counted as a fault."""
        deadline = since + bound
        while (why := self._not_yet(since, None, {})) is not None:
            if time.monotonic() > deadline:
                raise AssertionError(f"not settled {bound} s after it started: {why}")
            time.sleep(0.2)

    def recovered(
        self,
        kind: str,
        injected: float,
        ended: float,
        bound: float,
        victim: str | None = None,
        before: dict | None = None,
    ) -> float:
        deadline = ended + bound
        while (why := self._not_yet(ended, victim, before or {})) is not None:
            if time.monotonic() > deadline:
                if why.startswith("consumer behind"):  # the rest has recovered
                    why += f"\n{self._stuck_consumer_evidence()}"
                raise AssertionError(
                    f"{kind}: not recovered {bound} s after it ended: {why}\n{self._warnings()}"
                )
            time.sleep(0.2)
        done = time.monotonic()
        self.figures.fault(kind, injected, ended, done)
        return done - ended

    # -- the faults ----------------------------------------------------------------------

    def kill_proxies(self, count: int) -> None:
        """`count` times: a random proxy killed with SIGKILL at a random moment of the
        load, started again (same fleet.name, same WAL) after a short random delay."""
        zones = sorted(self.fleet.proxies)
        for _ in range(count):
            time.sleep(self.rng.uniform(0.2, 2.0))
            self.kill_and_restart(self.rng.choice(zones))

    def kill_and_restart(
        self, zone: str, kind: str = "kill -9 proxy", while_down: Callable[[], None] | None = None
    ) -> float:
        """The proxy of `zone` killed with SIGKILL, started again (same fleet.name, same
        WAL) after a short random delay (`while_down` called first, if given), until
        "recovered": its shards claimed again at a newer epoch. The recovery time."""
        victim = self.fleet[zone]
        before = self.fleet.owners()
        injected = time.monotonic()
        self.fleet.kill(zone)
        if while_down is not None:
            while_down()
        time.sleep(self.rng.uniform(0.1, 1.5))  # how long it stays down, not a wait
        self.fleet.start(zone)
        ended = time.monotonic()
        took = self.recovered(kind, injected, ended, RECOVERY_BOUND_S, victim.name, before)
        # when, to read beside the proxies' and the consumer's logs (wall clock)
        at = time.strftime("%H:%M:%S", time.gmtime(time.time() - (time.monotonic() - ended)))
        self.figures.notes.setdefault("kills", []).append(f"{zone} back at {at}, {took:.2f} s")
        return took

    def pause_owner(self) -> None:
        """SIGSTOP the proxy owning most of the topic's partitions, past its session
        timeout: the other is given its shards, fences it and waits for it. Then SIGCONT:
        its late commits are refused, it learns it lost its shards and claims them again."""
        owners = Counter(self.fleet.stream_owner(self.topic_id, p) for p in self._partitions())
        victim = self.fleet.by_name(owners.most_common(1)[0][0])
        other = next(p for p in self.fleet.proxies.values() if p is not victim)
        before = self.fleet.owners()
        mark = other.log_size()
        injected = time.monotonic()
        self.fleet.pause(victim.zone)
        wait_for_log(other, f"waits for {victim.name} to come back", RECOVERY_BOUND_S, mark)
        self.fleet.resume(victim.zone)
        ended = time.monotonic()
        self.figures.notes["pause_s"] = round(ended - injected, 2)
        self.recovered("SIGSTOP owner", injected, ended, RECOVERY_BOUND_S, victim.name, before)

    def restart_broker(self, kafka: KafkaCluster) -> None:
        """A broker stopped (SIGTERM) and started again a few seconds later."""
        node = self.rng.choice([n.node_id for n in kafka.nodes])
        injected = time.monotonic()
        kafka.stop_node(node)
        time.sleep(self.rng.uniform(2.0, 5.0))
        kafka.start_node(node)
        ended = time.monotonic()
        self.figures.notes["broker_restarted"] = node
        self.recovered("Kafka broker restart", injected, ended, RECOVERY_BOUND_S)

    def kill_brokers(self, kafka: KafkaCluster) -> None:
        """kill -9 of a Kafka broker, twice: the shards' group coordinator, then the broker
        leading the most of the metadata topic's partitions (each looked up just before
        its kill: after the first, leaders and coordinator may have moved; one broker may
        be both), started again 2-5 s later. No clean shutdown: no leadership handed
        over, no log flushed, the group's coordinator found dead by its clients."""
        group = f"{self.fleet.metadata_topic}.owners"  # the shard group (tiering.py default)
        for role in ("group coordinator", "metadata leader"):
            coordinator, leaders, controller = broker_roles(
                kafka.bootstrap, self.fleet.metadata_topic, group
            )
            node = coordinator if role == "group coordinator" else leaders.most_common(1)[0][0]
            injected = time.monotonic()
            kafka.kill_node(node)
            time.sleep(self.rng.uniform(2.0, 5.0))
            kafka.start_node(node)
            ended = time.monotonic()
            self.figures.notes.setdefault("brokers_killed", []).append(
                {
                    "for": role,
                    "node": node,
                    "coordinator": coordinator == node,
                    "metadata_partitions_led": leaders[node],
                    "controller": controller == node,
                }
            )
            self.recovered("Kafka broker kill -9", injected, ended, RECOVERY_BOUND_S)

    def object_store_outage(
        self, minio: MinioServer, owner: TieredProxy, capacity: int, down_s: float
    ) -> WalFill:
        """MinIO stopped for `down_s`. Meanwhile a burst producer writes to the partitions
        of `owner` (the proxy with a WAL of `capacity` bytes) until MinIO is back: its WAL
        fills to the bound, then its appends wait; nothing fails."""
        partitions = [
            p for p in self._partitions() if self.fleet.stream_owner(self.topic_id, p) == owner.name
        ]
        assert partitions, f"{owner.name} owns none of the topic's partitions"
        injected = time.monotonic()
        minio.pause_service()
        burst = BurstProducer("burst", owner.bootstrap, self.topic, partitions, owner.zone, 1000)
        self.burst = burst
        self.progress.watch(burst)
        burst.start()
        samples: list[tuple[float, int, float | None]] = []
        while (now := time.monotonic()) < injected + down_s:
            samples.append((now, wal_backlog(owner.wal_dir), _appends(owner)))
            time.sleep(0.25)
        burst.stop_sending()
        samples.append((now := time.monotonic(), wal_backlog(owner.wal_dir), _appends(owner)))
        resumed = now
        minio.resume_service()
        ended = time.monotonic()
        self.recovered("MinIO down 60 s", injected, ended, OUTAGE_RECOVERY_BOUND_S)
        burst.stop(120)
        self.figures.notes["minio_ready_after_start_s"] = round(ended - resumed, 2)
        acks = list(self.progress.acks())
        return wal_fill(capacity, samples, acks, partitions, injected, resumed, ended, burst.sent)

    def network_fault(
        self, kind: str, links: list[Link], toxics: list[Toxic], hold_s: float
    ) -> None:
        """`toxics` on each of `links` (toxiproxy) for `hold_s`, then removed. The figures
        keep how many records were acknowledged meanwhile, per partition: a slow network
        should slow produce, not stop it (a cut or half-open one may)."""
        injected = time.monotonic()
        for link in links:
            link.add(*toxics)
        try:
            time.sleep(hold_s)  # how long the fault lasts, not a wait for an event
        finally:
            for link in links:
                link.remove(*toxics)
        ended = time.monotonic()
        self.recovered(kind, injected, ended, RECOVERY_BOUND_S)
        during = Counter(
            a.partition for a in self.progress.acks() if injected <= a.acked_at < ended
        )
        acked = self.figures.notes.setdefault("acknowledged_during_fault", {})
        acked[kind] = {p: during[p] for p in self._partitions()}

    def _partitions(self) -> range:
        return range(self.progress.partitions)


def steady_load(
    fleet: TieredFleet,
    partitions: int,
    producers: list,
    log_dir: Path,
    figures: Figures,
    settings: dict | None = None,
) -> tuple[uuid.UUID, Injector]:
    """A spread topic tiered (every partition cut over), the steady load on it (a
    producer per zone of a running proxy: start_load, into `producers`, with the client
    `settings` if given) and a consumer (zone-a, `injector.consumer`) through the fleet,
    settled: the start of the tests that inject one kind of fault (flaky network, disk
    full, members joining and leaving, admin operations). The caller stops the producers
    and the consumer."""
    began = time.monotonic()
    topic, topic_id = fleet.create_spread_topic(partitions)
    fleet.tier(topic)
    starts = fleet.wait_for_cutover(topic_id, partitions)
    zones = [zone for zone, proxy in fleet.proxies.items() if proxy.process.running()]
    progress = start_load(fleet.bootstrap(), zones, topic, partitions, producers, settings=settings)
    consumer = FleetConsumer(
        fleet.bootstrap(), topic, starts, "zone-a", log_path=log_dir / "consumer.log"
    ).start()
    try:
        injector = Injector(fleet, topic, topic_id, progress, consumer, figures, random.Random(0))
        injector.settled(time.monotonic(), 60)
    except BaseException:
        consumer.stop()
        raise
    figures.notes["load_setup_s"] = round(time.monotonic() - began, 1)
    return topic_id, injector
