"""A topic cut over from passthrough to tiered while producers write to it.

Two proxies in two zones; four idempotent producers (acks=all, two per proxy) write a
steady load over six partitions of a passthrough topic; mid-load the topic is tiered with
the admin command, and the load goes on. Put together, Kafka's log below each partition's
cutover offset and the committed objects from it on must hold every acknowledged record
exactly once, at the offset it was acknowledged with, with no gap at the cutover and each
producer's records in the order it sent them. Then `untier` is refused (the objects hold
data Kafka lacks), while a topic tiered and not written since goes back to Kafka.

The cutover hold (how long produce to the topic waited for its partitions' cutover) is
measured and printed: per proxy and partition, by polling the proxies, from the proxy
reading the topic's TopicModeSet to its reading the partition's StreamCutover with the
partition started on its owner; on the clients, per partition, from the last
acknowledgement from Kafka to the first from the fleet.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import time
import uuid
from collections import Counter

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewPartitions
from cutover_load import (
    LoadProducer,
    committed_records,
    create_topic,
    kafka_ends,
    kafka_records,
    metadata_states,
    parse_value,
    proxy_config,
    start_topics_command,
    tiered_topic_id,
    topics_command,
    wait_owned,
)
from tieredfleet import create_topic_over

from proxy.config import parse_config
from proxy.devstack.paths import free_port, free_port_block
from proxy.devstack.proxy_thread import ProxyThread
from proxy.metadata.streams import shard_of, stream_id, topic_shard
from proxy.objects.local import LocalDirectoryStore
from tests.support.leaders import partitions_seen_by_each_broker
from tests.support.waiting import wait_until

pytestmark = pytest.mark.kafka

PARTITIONS = 6
RATE = 250  # records a second per producer; four producers
BEFORE_S = 4.0  # passthrough load before the tier command
AFTER_S = 5.0  # tiered load after every partition is cut over
SHARDS = 2


def _streams(topic_id: uuid.UUID, partitions: int) -> list[int]:
    return [stream_id(topic_id, p) for p in range(partitions)]


def _two_proxies(stack, kafka_cluster, tmp_path, suffix: str, **tiering):
    """Proxies in zone-a and zone-b of one fleet. b starts once a owns every shard, so b's
    joining moves a shard by a clean release. Started together, the rebalance can cancel
    a's claim of a shard mid-commit, and b, given that shard, waits for a "to come back"
    for ever (ShardAssignment, not the subject here)."""
    base = free_port_block(16)
    proxies = []
    for n, zone in enumerate(("zone-a", "zone-b")):
        config = proxy_config(
            kafka_cluster, tmp_path, f"p{n}-{suffix}", zone, suffix, base + 8 * n, **tiering
        )
        proxies.append(stack.enter_context(ProxyThread(parse_config(config))))
        if n == 0:
            wait_owned(proxies, SHARDS)
    return proxies


def _cut_over(proxy: ProxyThread, topic_id: uuid.UUID, partitions: int) -> bool:
    tiering = proxy.proxy.tiering
    return all(tiering.state(s).stream(s) is not None for s in _streams(topic_id, partitions))


def _untiered(proxy: ProxyThread, topic: str, topic_id: uuid.UUID, partitions: int) -> bool:
    tiering = proxy.proxy.tiering
    streams = _streams(topic_id, partitions)
    return tiering.topics.topic(topic) is None and all(
        tiering.state(s).stream(s) is None for s in streams
    )


def _committed_to(proxy: ProxyThread, topic_id: uuid.UUID, ends: dict[int, int]) -> bool:
    tiering = proxy.proxy.tiering
    for partition, end in ends.items():
        s = stream_id(topic_id, partition)
        if (tiering.state(s).stream_end(s) or 0) < end:
            return False
    return True


def _latencies(acks, start: float, end: float) -> list[float]:
    return sorted(a.acked_at - a.sent_at for a in acks if start <= a.sent_at < end)


def _pct(values: list[float], q: float) -> float:
    return values[min(len(values) - 1, int(q * len(values)))] if values else float("nan")


def _summary(latencies: list[float]) -> str:
    if not latencies:
        return "-"
    return "/".join(f"{1000 * _pct(latencies, q):.0f}" for q in (0.5, 0.99, 1.0))


def _longest_ack_gaps(acks, start: float, end: float) -> int:
    """The longest time, in ms, between two consecutive acks of one partition."""
    longest = 0.0
    for partition in {x.partition for x in acks}:
        times = sorted(x.acked_at for x in acks if x.partition == partition)
        times = [t for t in times if start <= t < end]
        longest = max([longest] + [b - a for a, b in zip(times, times[1:], strict=False)])
    return round(1000 * longest)


def _reap(command) -> None:
    """Kill the command if it still runs and close its pipes: left to the garbage
    collector, they fail the next test with ResourceWarnings (unraisable exceptions)."""
    if command.poll() is None:
        command.kill()
    command.communicate()


def _not_ended(proxies, topic: str, mode_seen, cut_seen, started, command) -> str:
    """What the cutover still waited for at the deadline, per proxy: whether it read the
    topic's mode, its drained topics, the partitions whose cutover it had not read or
    not started, the machine's load, and the tier command's exit and output."""
    lines = [f"the cutover did not end (load average {os.getloadavg()})"]
    if command.poll() is None:
        lines.append("the tier command still runs")
    else:
        out, err = command.communicate()
        lines.append(f"the tier command exited {command.returncode}: {out!r} {err!r}")
    for n, proxy in enumerate(proxies):
        tiering = proxy.proxy.tiering
        lines.append(
            f"proxy {n}: mode read {n in mode_seen}, drained {sorted(tiering.drained())}, "
            f"cut seen {sorted(p for m, p in cut_seen if m == n)}, "
            f"started here {sorted(tiering.partitions.streams()) if tiering.partitions else None}"
        )
    lines.append(f"started anywhere: {sorted(started)}")
    return "\n".join(lines)


def _watch_cutover(proxies, topic: str, partitions: int, timeout_s: float, command) -> list[float]:
    """Polls the proxies (every ~5 ms) while a cutover runs; returns, per (proxy,
    partition), how long produce there was held: from the proxy reading the topic's
    TopicModeSet to it reading the partition's StreamCutover and the owner having started
    the partition, whichever is later."""
    deadline = time.monotonic() + timeout_s
    mode_seen: dict[int, float] = {}
    cut_seen: dict[tuple[int, int], float] = {}
    started: dict[int, float] = {}
    topic_id = None
    while len(cut_seen) < len(proxies) * partitions or len(started) < partitions:
        if time.monotonic() >= deadline:
            raise AssertionError(_not_ended(proxies, topic, mode_seen, cut_seen, started, command))
        now = time.monotonic()
        for n, proxy in enumerate(proxies):
            tiering = proxy.proxy.tiering
            found = tiering.topics.topic(topic)
            if n not in mode_seen and found is not None:
                mode_seen[n], topic_id = now, found.topic_id
            if n not in mode_seen:
                continue
            for p in range(partitions):
                s = stream_id(topic_id, p)
                if (n, p) not in cut_seen and tiering.state(s).stream(s) is not None:
                    cut_seen[(n, p)] = now
                if p not in started and tiering.partitions.get(s) is not None:
                    started[p] = now
        time.sleep(0.005)
    return [
        max(cut_seen[(n, p)], started[p]) - mode_seen[n]
        for n in range(len(proxies))
        for p in range(partitions)
    ]


def test_cutover_under_load_has_no_gap_and_no_duplicate(kafka_cluster, tmp_path):
    suffix = uuid.uuid4().hex[:8]
    topic, fresh = f"cut-{suffix}", f"fresh-{suffix}"
    create_topic(kafka_cluster, topic, PARTITIONS)
    with contextlib.ExitStack() as proxies:
        a, b = _two_proxies(proxies, kafka_cluster, tmp_path, suffix, cutover_hold_ms=20000)
        producers = [
            LoadProducer(f"w{n}", proxy.bootstrap, topic, PARTITIONS, RATE, zone).start()
            for n, (proxy, zone) in enumerate(
                [(a, "zone-a"), (b, "zone-b"), (a, "zone-a"), (b, "zone-b")]
            )
        ]
        try:
            wait_owned([a, b], SHARDS)
            wait_until(lambda: all(p.acked_count() > 0 for p in producers), 30, "passthrough acks")
            time.sleep(BEFORE_S)  # passthrough load, so the cutover meets a busy log
            tier_at = time.monotonic()
            command = start_topics_command("tier", topic, a.proxy.tiering.peer_port)
            proxies.callback(_reap, command)  # if the test fails before communicate()
            held = _watch_cutover([a, b], topic, PARTITIONS, 60, command)
            cut_at = time.monotonic()
            out, err = command.communicate(timeout=60)
            assert command.returncode == 0, out + err
            assert f"{topic} is tiered" in out
            topic_id = tiered_topic_id(a, topic)
            time.sleep(AFTER_S)
        finally:
            for producer in producers:
                producer.stop()
        stop_at = time.monotonic()
        for producer in producers:
            assert not producer.errors, (producer.name, producer.errors[:5])
            assert producer.flushed == 0, f"{producer.name}: {producer.flushed} never delivered"
            assert producer.sent == len(producer.acks)
        acks = [ack for producer in producers for ack in producer.acks]

        # untier is refused once the objects hold offsets Kafka lacks (committed first:
        # the refusal is judged on the metadata)
        tiered_ends = {}
        for ack in acks:
            tiered_ends[ack.partition] = max(tiered_ends.get(ack.partition, 0), ack.offset + 1)
        wait_until(lambda: _committed_to(a, topic_id, tiered_ends), 30, "uploads committed")
        refused = topics_command("untier", topic, b.proxy.tiering.peer_port)
        assert refused.returncode == 1, refused.stdout + refused.stderr
        assert f"cannot untier {topic}" in refused.stdout, refused.stdout
        assert "exist only in objects" in refused.stdout, refused.stdout
        assert "untier would lose them" in refused.stdout, refused.stdout
        assert a.proxy.tiering.topics.topic(topic) is not None

        # a topic tiered and not written since goes back to Kafka, and Kafka takes produce
        create_topic(kafka_cluster, fresh, 2)
        assert topics_command("tier", fresh, a.proxy.tiering.peer_port).returncode == 0
        fresh_id = tiered_topic_id(a, fresh)
        wait_until(lambda: _cut_over(b, fresh_id, 2), 30, "cutover of the fresh topic")
        back = topics_command("untier", fresh, b.proxy.tiering.peer_port)
        assert back.returncode == 0, back.stdout + back.stderr
        assert f"{fresh} is passthrough" in back.stdout
        for proxy in (a, b):
            wait_until(lambda p=proxy: _untiered(p, fresh, fresh_id, 2), 30, "untier of fresh")
        again = [
            LoadProducer(f"u{n}", proxy.bootstrap, fresh, 2, 200, zone)
            for n, (proxy, zone) in enumerate([(a, "zone-a"), (b, "zone-b")])
        ]
        for producer in again:
            producer.start()
        time.sleep(1.5)
        for producer in again:
            producer.stop()
            assert not producer.errors and producer.flushed == 0, producer.errors[:5]
    # both proxies stopped: each handed its shards over with everything uploaded

    fresh_acks = {(x.partition, x.offset): x.value for p in again for x in p.acks}
    fresh_ends = kafka_ends(kafka_cluster.bootstrap, fresh, 2)
    assert sum(end for _, end in fresh_ends.values()) == len(fresh_acks) > 100
    in_kafka = kafka_records(
        kafka_cluster.bootstrap, fresh, {p: e for p, (_, e) in fresh_ends.items()}
    )
    assert {(p, o): v for p, log in in_kafka.items() for o, v in log.items()} == fresh_acks

    states = asyncio.run(metadata_states(kafka_cluster.bootstrap, f"meta-{suffix}", SHARDS))
    infos = {
        p: states[shard_of(s, SHARDS)].stream(s)
        for p, s in enumerate(_streams(topic_id, PARTITIONS))
    }
    cutovers = {p: info.cutover_offset for p, info in infos.items()}

    async def read_objects():
        async with LocalDirectoryStore(tmp_path / "objects") as store:
            return await committed_records(store, states, topic_id, PARTITIONS)

    tiered = asyncio.run(read_objects())
    ends = kafka_ends(kafka_cluster.bootstrap, topic, PARTITIONS)
    for partition, (start, end) in ends.items():
        assert start == 0
        # nothing reached Kafka above the cutover: every later write went to the fleet
        assert end == cutovers[partition], (partition, end, cutovers[partition])
    below = kafka_records(kafka_cluster.bootstrap, topic, cutovers)

    log: dict[int, dict[int, bytes]] = {}
    for partition in range(PARTITIONS):
        assert all(o >= cutovers[partition] for o in tiered[partition])
        log[partition] = {**below[partition], **tiered[partition]}
        offsets = sorted(log[partition])
        assert offsets == list(range(len(offsets))), f"partition {partition}: a gap"
    acked = {(x.partition, x.offset): x.value for x in acks}
    assert len(acked) == len(acks), "an offset acknowledged twice"
    in_log = {(p, o): v for p, records in log.items() for o, v in records.items()}
    assert in_log == acked, "the log and the acknowledgements differ"
    assert max(Counter(in_log.values()).values()) == 1, "a record twice"
    for partition, records in log.items():
        last: dict[str, int] = {}
        for offset in sorted(records):
            name, sequence = parse_value(records[offset])
            assert sequence > last.get(name, -1), f"{name} out of order at {partition}/{offset}"
            last[name] = sequence
    below_count = sum(len(r) for r in below.values())
    tiered_count = sum(len(r) for r in tiered.values())
    assert below_count > 0 and tiered_count > 0

    # the hold: on the clients, per partition, the last acknowledgement from Kafka to the
    # first from the fleet; the metadata's timestamps for comparison
    mode = states[topic_shard(topic_id, SHARDS)].topic(topic_id)
    holds = [info.tiered_at_ms - mode.since_ms for info in infos.values()]
    gaps = []
    for partition, cutover in cutovers.items():
        mine = [x for x in acks if x.partition == partition]
        last_kafka = max(x.acked_wall_ms for x in mine if x.offset < cutover)
        first_tiered = min(x.acked_wall_ms for x in mine if x.offset >= cutover)
        gaps.append(first_tiered - last_kafka)
    baseline = _longest_ack_gaps(acks, tier_at - 3, tier_at)
    before = _latencies(acks, tier_at - 3, tier_at)
    during = _latencies(acks, tier_at, cut_at)
    after = _latencies(acks, cut_at + 0.5, stop_at)
    print(
        f"\ncutover under load: {len(acks)} records acknowledged, {below_count} in Kafka "
        f"below the cutover, {tiered_count} tiered; cutover offsets {cutovers}"
        f"\nhold per (proxy, partition), ms, from the proxy reading TopicModeSet to its "
        f"reading StreamCutover with the partition started: "
        f"{sorted(round(1000 * h) for h in held)}"
        f"\nStreamCutover timestamp - TopicModeSet timestamp (the latter taken before its "
        f"write), ms: {sorted(holds)}"
        f"\nclients, per partition, ms: last Kafka ack -> first tiered ack {sorted(gaps)}; "
        f"longest gap between two acks of a partition in the 3 s before the tier command "
        f"{baseline} ms"
        f"\nack latency ms p50/p99/max: passthrough (3 s before) {_summary(before)}; sent "
        f"during the cutover ({len(during)} records) {_summary(during)}; tiered {_summary(after)}"
    )
    assert max(held) < 20.0, "the hold reached cutover_hold_ms: produce timed out"


def test_untier_is_refused_while_a_wal_holds_writes_not_uploaded(kafka_cluster, tmp_path):
    """Acknowledged into a WAL and not uploaded yet (uploads every 30 s here) is past the
    cutover as much as committed data: untier must refuse it, or Kafka would hand the same
    offsets out again. Two proxies own a metadata shard each; the untier goes to the owner
    of the topic's shard, which must also ask the other proxy about the partitions it owns
    (sealing them). Refused, every partition goes on taking produce where it was."""
    suffix = uuid.uuid4().hex[:8]
    with contextlib.ExitStack() as proxies:
        a, b = _two_proxies(proxies, kafka_cluster, tmp_path, suffix, upload_interval_s=30.0)
        wait_until(lambda: all(_shards_owned(p) == 1 for p in (a, b)), 60, "a shard each")
        # a topic with a partition in each proxy's shard (4 partitions: nearly always)
        for attempt in range(5):
            topic = f"wal-only-{suffix}-{attempt}"
            create_topic(kafka_cluster, topic, 4)
            assert topics_command("tier", topic, a.proxy.tiering.peer_port).returncode == 0
            topic_id = tiered_topic_id(a, topic)
            shards = {shard_of(s, SHARDS) for s in _streams(topic_id, 4)}
            if len(shards) == SHARDS:
                break
        else:
            pytest.fail("five topics in a row had every partition in one shard")
        coordinator, other = sorted(
            (a, b),
            key=lambda p: p.proxy.tiering.assignment.owner(topic_shard(topic_id, SHARDS)) is None,
        )
        wait_until(lambda: _cut_over(a, topic_id, 4) and _cut_over(b, topic_id, 4), 30, "cutover")
        first = LoadProducer("w", a.bootstrap, topic, 4, 200, "zone-a").start()
        time.sleep(1.0)
        first.stop()
        assert not first.errors and first.flushed == 0
        ends = Counter(x.partition for x in first.acks)
        assert all(coordinator.proxy.tiering.state(s).stream_end(s) == 0
                   for s in _streams(topic_id, 4)), "uploaded already: too slow a run"  # fmt: skip
        refused = topics_command("untier", topic, coordinator.proxy.tiering.peer_port)
        assert refused.returncode == 1, refused.stdout + refused.stderr
        for partition, end in ends.items():
            s = stream_id(topic_id, partition)
            owner = coordinator if coordinator.proxy.tiering.owned_here(s) else other
            expected = (
                f"stream {s} (topic id {topic_id} partition {partition}) holds offsets "
                f"[0, {end}) written after its cutover and not all uploaded yet: they exist "
                f"only in the WAL and objects of {owner.proxy.tiering.name}"
            )
            assert expected in refused.stdout, (expected, refused.stdout)
        assert any(not coordinator.proxy.tiering.owned_here(stream_id(topic_id, p)) for p in ends)
        assert coordinator.proxy.tiering.topics.topic(topic) is not None
        for proxy in (a, b):  # started again everywhere
            wait_until(lambda p=proxy: not p.proxy.tiering.seals.streams_of(topic_id), 10, "unseal")
        second = LoadProducer("z", b.bootstrap, topic, 4, 200, "zone-b").start()
        time.sleep(1.0)
        second.stop()
        assert not second.errors and second.flushed == 0
    assert kafka_ends(kafka_cluster.bootstrap, topic, 4) == {p: (0, 0) for p in range(4)}
    states = asyncio.run(metadata_states(kafka_cluster.bootstrap, f"meta-{suffix}", SHARDS))

    async def read_objects():
        async with LocalDirectoryStore(tmp_path / "objects") as store:
            return await committed_records(store, states, topic_id, 4)

    committed = asyncio.run(read_objects())
    for partition in range(4):
        acked = {x.offset: x.value for x in first.acks + second.acks if x.partition == partition}
        assert committed[partition] == acked, partition
        assert sorted(committed[partition]) == list(range(len(acked)))


def test_an_untier_right_after_a_partition_was_added_counts_it(
    kafka_cluster, tmp_path, monkeypatch
):
    """A partition added to a tiered topic is cut over by the owner of its stream's
    shard, once that proxy's look at Kafka (every 5 s, or nudged by a produce) sees it.
    The owner of the topic's shard judged an untier by the count of its own last look:
    a partition added since, cut over and written on the other proxy, was neither
    checked nor sealed, the untier went through, and the records acknowledged there were
    lost (Kafka's log of the partition is empty). The untier reads the count from Kafka
    now: refused, and the records read back as acknowledged."""
    suffix = uuid.uuid4().hex[:8]
    with contextlib.ExitStack() as proxies:
        a, b = _two_proxies(proxies, kafka_cluster, tmp_path, suffix)
        wait_until(lambda: all(_shards_owned(p) == 1 for p in (a, b)), 60, "a shard each")
        admin = AdminClient({"bootstrap.servers": kafka_cluster.bootstrap})
        topic, topic_id = create_topic_over(  # partition 1's stream and the mode: apart
            admin,
            f"grown-{suffix}",
            1,
            lambda t: topic_shard(t, SHARDS) != shard_of(stream_id(t, 1), SHARDS),
        )
        assert topics_command("tier", topic, a.proxy.tiering.peer_port).returncode == 0
        wait_until(lambda: _cut_over(a, topic_id, 1) and _cut_over(b, topic_id, 1), 30, "cutover")
        added = stream_id(topic_id, 1)
        owner, coordinator = sorted((a, b), key=lambda p: not p.proxy.tiering.owned_here(added))
        monkeypatch.setattr("proxy.upkeep.cutover.TOPICS_CHECK_S", 3600.0)

        def far_off() -> bool:  # the looks under way when patched set the next in 5 s
            soon = time.monotonic() + 600
            return all(p.proxy.tiering.cutover._next_topics_check > soon for p in (a, b))  # noqa: SLF001

        wait_until(far_off, 30, "both proxies' next look an hour off")
        admin.create_partitions([NewPartitions(topic, 2)])[topic].result(30)
        wait_until(  # by every broker: a producer told one partition fails partition 1's records
            lambda: (
                set(partitions_seen_by_each_broker(kafka_cluster.bootstrap, topic).values()) == {2}
            ),
            30,
            "grown",
        )
        # the partition's owner looks at Kafka for the produce waiting for its cutover
        zone = owner.proxy.config.fleet.zone
        acked: list[tuple[int, bytes]] = []
        producer = Producer(
            {
                "bootstrap.servers": owner.bootstrap,
                "client.id": f"grown,tierproxy_az={zone}",
                "enable.idempotence": True,
                "acks": "all",
            }
        )
        for n in range(5):
            producer.produce(
                topic,
                b"added-%d" % n,
                partition=1,
                on_delivery=lambda err, msg: (
                    acked.append((msg.offset(), msg.value())) if err is None else None
                ),
            )
        assert producer.flush(60) == 0
        assert [o for o, _ in acked] == list(range(5))
        assert coordinator.proxy.tiering.cutover.known_partitions(topic_id) == 1  # not looked

        refused = topics_command("untier", topic, coordinator.proxy.tiering.peer_port)
        assert refused.returncode == 1, refused.stdout + refused.stderr
        assert "untier would lose them" in refused.stdout, refused.stdout
        assert coordinator.proxy.tiering.topics.topic(topic) is not None
        consumer = Consumer(
            {
                "bootstrap.servers": coordinator.bootstrap,
                "group.id": f"grown-{suffix}",
                "enable.auto.commit": False,
            }
        )
        consumer.assign([TopicPartition(topic, 1, 0)])
        read: list[tuple[int, bytes]] = []
        deadline = time.monotonic() + 30
        while len(read) < 5 and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None and msg.error() is None:
                read.append((msg.offset(), msg.value()))
        consumer.close()
        assert read == acked
    assert kafka_ends(kafka_cluster.bootstrap, topic, 2) == {0: (0, 0), 1: (0, 0)}


def _shards_owned(proxy: ProxyThread) -> int:
    assignment = proxy.proxy.tiering.assignment
    return sum(assignment.owner(k) is not None for k in range(SHARDS))


def test_the_tier_command_waits_for_a_proxy_and_a_shard_owner(kafka_cluster, tmp_path):
    """Like Kafka's admin tools, `topics tier` retries until its timeout while the proxy
    cannot be reached (a restart drops its connection, then refuses it) and while the
    topic's metadata shard has no owner (the proxy joining the shard group, or the group
    rebalancing): run before the proxy starts, it ends with the topic tiered."""
    suffix = uuid.uuid4().hex[:8]
    topic = f"early-{suffix}"
    create_topic(kafka_cluster, topic, 1)
    peer_port = free_port()
    config = proxy_config(
        kafka_cluster,
        tmp_path,
        f"p-{suffix}",
        "zone-a",
        suffix,
        free_port_block(8),
        peer_port=peer_port,
    )
    with socket.create_server(("127.0.0.1", peer_port)) as dying:  # a proxy going down
        command = start_topics_command("tier", topic, peer_port)
        dying.settimeout(60)
        connection, _ = dying.accept()
        connection.close()  # dropped before any answer
    try:
        with ProxyThread(parse_config(config)) as proxy:
            out, err = command.communicate(timeout=60)
            assert command.returncode == 0, out + err
            assert f"{topic} is tiered" in out
            assert "retrying" in err, err
            tiered_topic_id(proxy, topic)
    finally:
        _reap(command)
