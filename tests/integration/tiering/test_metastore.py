"""The metadata's Kafka adapter against the real Kafka: the topic, readers, owners, the
fencing of a previous owner, the consumer group that assigns shards, and the hand-over of
a shard: at once after a release, held for a last owner that died without one
(docs/metadata.md, "The Kafka adapter").

Each test has a metadata topic and a group of its own. A group uses the shortest session
timeout a default broker allows (group.min.session.timeout.ms = 6 s).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from proxy.metadata.codec import encode
from proxy.metadata.group import MetadataTopicError, ShardAssignment, ensure_metadata_topic
from proxy.metadata.records import ObjectCommit, OffsetRange, StreamCutover
from proxy.metadata.rules import Outcome
from proxy.metadata.store import ShardFenced, ShardOwner, ShardReader
from proxy.metadata.streams import shard_of, stream_id, transactional_id
from proxy.objects.keys import ObjectKind
from tests.support.waiting import eventually

pytestmark = pytest.mark.kafka

SHARDS = 4
SESSION_MS = 6000  # the broker's default group.min.session.timeout.ms
CHILD = Path(__file__).with_name("shard_member.py")
TOPIC_ID = uuid.UUID("5f0c6b3e-8d1a-4c59-9a57-3c1de2b0a001")


@pytest.fixture
def kafka(kafka_cluster) -> dict:
    return {"bootstrap_servers": kafka_cluster.bootstrap, "request_timeout_ms": 15000}


@pytest.fixture
async def topic(kafka) -> str:
    name = f"meta-{uuid.uuid4().hex[:10]}"
    await ensure_metadata_topic(kafka, name, SHARDS)
    return name


def stream_in(shard: int) -> tuple[int, int]:
    """(partition, stream id) of the first partition of TOPIC_ID whose stream is in shard."""
    for partition in range(10_000):
        stream = stream_id(TOPIC_ID, partition)
        if shard_of(stream, SHARDS) == shard:
            return partition, stream
    raise AssertionError("no stream in that shard")


def cutover(owner: ShardOwner, at: int = 100) -> StreamCutover:
    partition, stream = stream_in(owner.shard)
    return StreamCutover(0, stream, 1, owner.epoch, TOPIC_ID, partition, 0, at, at, 1)


def commit(owner: ShardOwner, object_id: int, start: int, end: int) -> ObjectCommit:
    _, stream = stream_in(owner.shard)
    ranges = (OffsetRange(stream, start, end),)
    return ObjectCommit(0, object_id, ObjectKind.STREAM_SET, 4096, owner.epoch, 2, ranges)


async def started_owner(
    kafka: dict, topic: str, shard: int, name: str, **options: Any
) -> ShardOwner:
    owner = ShardOwner(kafka, topic, shard, SHARDS, name, **options)
    try:
        async with asyncio.timeout(60):
            await owner.start()
    except BaseException:
        await owner.close()
        raise
    return owner


def count_looks(owner: ShardOwner) -> Callable[[], int]:
    """How many times `owner` has read its partition to the end: each look at whether
    the last owner released the shard starts with one. Two more looks, still held, is
    what a waiting owner must show; a fixed sleep would only guess their pace."""
    reads = 0
    read_to_end = owner.reader.read_to_end

    async def counted(*args, **kwargs):
        nonlocal reads
        reads += 1
        return await read_to_end(*args, **kwargs)

    owner.reader.read_to_end = counted
    return lambda: reads


async def committed_keys(kafka: dict, topic: str) -> set[bytes]:
    """Every key in the topic, read with read_committed to the end."""
    consumer = AIOKafkaConsumer(
        **kafka, group_id=None, isolation_level="read_committed", auto_offset_reset="earliest"
    )
    await consumer.start()
    try:
        partitions = [TopicPartition(topic, k) for k in range(SHARDS)]
        consumer.assign(partitions)
        ends = await consumer.end_offsets(partitions)
        keys = set()
        async with asyncio.timeout(30):
            for tp in partitions:
                await consumer.seek_to_beginning(tp)
                while await consumer.position(tp) < ends[tp]:
                    batches = await consumer.getmany(tp, timeout_ms=200)
                    keys.update(r.key for r in batches.get(tp, ()))
    finally:
        await consumer.stop()
    return keys


async def test_the_metadata_topic_is_created_once_and_checked(kafka, topic):
    await ensure_metadata_topic(kafka, topic, SHARDS)  # exists already: checked only
    with pytest.raises(MetadataTopicError, match=rf"{topic} has 4 partitions.* shard count is 3"):
        await ensure_metadata_topic(kafka, topic, 3)
    deleting = f"meta-delete-{uuid.uuid4().hex[:8]}"
    admin = AIOKafkaAdminClient(**kafka)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(deleting, SHARDS, 1)])
    finally:
        await admin.close()
    with pytest.raises(MetadataTopicError, match=rf"{deleting} has cleanup.policy=delete"):
        await ensure_metadata_topic(kafka, deleting, SHARDS)


async def test_a_second_reader_rebuilds_the_owners_state(kafka, topic):
    owner = await started_owner(kafka, topic, 1, "proxy-a")
    reader = ShardReader(kafka, topic, 1, SHARDS)
    try:
        assert (owner.epoch, owner.state.owner) == (1, "proxy-a")
        # a cutover and a tail commit judged together, then one more tail commit
        verdicts = await owner.write([cutover(owner), commit(owner, 10, 100, 150)])
        assert [v.outcome for v in verdicts] == [Outcome.ACCEPT, Outcome.ACCEPT]
        [verdict] = await owner.write([commit(owner, 11, 150, 220)])
        assert verdict.outcome is Outcome.ACCEPT
        _, stream = stream_in(1)
        assert owner.state.stream_end(stream) == 220
        assert [r.object_id for r in owner.state.objects_for(stream, 120)] == [10, 11]

        await reader.start()
        async with asyncio.timeout(30):
            await reader.caught_up()
        assert reader.state.image() == owner.state.image()
        assert reader.state.refused_count == 0

        # a checkpoint rewrites the state as generation 1 and tombstones generation 0
        async with asyncio.timeout(30):
            assert await owner.checkpoint() == 1
            await reader.read_to_end()
        assert owner.state.generation == 1 and not owner.state.retired_keys()
        assert reader.state.image() == owner.state.image()
    finally:
        await reader.close()
        await owner.close()


async def test_a_commit_with_a_gap_is_refused_and_not_written(kafka, topic):
    owner = await started_owner(kafka, topic, 2, "proxy-a")
    try:
        await owner.write([cutover(owner), commit(owner, 20, 100, 150)])
        end = await owner.reader.read_to_end()
        [verdict] = await owner.write([commit(owner, 21, 160, 200)])
        assert verdict.outcome is Outcome.REFUSE
        assert "[160, 200) leaves a gap after the stream's end 150" in verdict.reason
        assert await owner.reader.read_to_end() == end  # nothing written

        # with a good commit in the same write: only the good one is written
        gap, good = commit(owner, 22, 151, 160), commit(owner, 23, 150, 170)
        verdicts = await owner.write([gap, good])
        assert [v.outcome for v in verdicts] == [Outcome.REFUSE, Outcome.ACCEPT]
        assert await owner.reader.read_to_end() == end + 2  # one record, one commit marker
        keys = await committed_keys(kafka, topic)
        assert encode(good)[0] in keys and encode(gap)[0] not in keys
    finally:
        await owner.close()


async def test_a_new_owner_fences_the_old_one_and_reads_what_it_committed(kafka, topic):
    a = await started_owner(kafka, topic, 0, "proxy-a")
    owners = [a]
    try:
        await a.write([cutover(a), commit(a, 30, 100, 130)])
        # Kafka's layer alone: a producer with the shard's transactional.id starts (its
        # InitProducerId bumps the epoch) and writes nothing, not even a claim
        fencer = AIOKafkaProducer(**kafka, transactional_id=transactional_id(0, topic))
        await fencer.start()
        await fencer.stop()
        late = commit(a, 31, 130, 160)
        with pytest.raises(ShardFenced, match="shard 0: no longer its owner") as fenced:
            await a.write([late])
        assert "Kafka fenced its producer (ProducerFenced)" in fenced.value.reason
        assert not a.owning
        with pytest.raises(ShardFenced):  # and it stays fenced
            await a.write([late])

        # a did not release the shard: the next owners take it over without waiting for it
        b = await started_owner(kafka, topic, 0, "proxy-b", unclean_takeover_after_s=0)
        owners.append(b)
        assert (b.epoch, b.state.owner) == (a.epoch + 1, "proxy-b")
        _, stream = stream_in(0)
        assert b.state.stream_end(stream) == 130  # what a committed, and not `late`
        [verdict] = await b.write([commit(b, 32, 130, 160)])
        assert verdict.outcome is Outcome.ACCEPT

        # a full owner start fences b: by Kafka, or by c's claim if b's reader read it
        c = await started_owner(kafka, topic, 0, "proxy-c", unclean_takeover_after_s=0)
        owners.append(c)
        later = commit(b, 33, 160, 190)
        with pytest.raises(ShardFenced, match="Kafka fenced|claimed at epoch 3 by proxy-c"):
            await b.write([later])
        assert c.state.stream_end(stream) == 160
        keys = await committed_keys(kafka, topic)
        assert encode(late)[0] not in keys and encode(later)[0] not in keys
    finally:
        for owner in owners:
            await owner.close()


async def test_the_group_splits_the_shards_and_moves_them_when_a_member_stops(kafka, topic):
    group = f"shards-{uuid.uuid4().hex[:8]}"
    members = [
        ShardAssignment(kafka, topic, SHARDS, name, group_id=group, session_timeout_ms=SESSION_MS)
        for name in ("proxy-a", "proxy-b")
    ]
    a, b = members
    try:
        await a.start()
        await eventually(lambda: a.owned() == [0, 1, 2, 3], 60, "a owns every shard")
        await b.start()
        await eventually(
            lambda: len(a.owned()) == len(b.owned()) == 2, 60, "a and b own two shards each"
        )
        assert sorted(a.owned() + b.owned()) == [0, 1, 2, 3]

        stop = time.monotonic()
        await a.close()
        await eventually(lambda: b.owned() == [0, 1, 2, 3], 60, "b owns every shard")
        took = time.monotonic() - stop
        print(f"b owned all shards {took:.1f} s after a stopped")
        assert took < SESSION_MS / 1000
        for shard in range(SHARDS):
            owner = b.owner(shard)
            assert owner is not None and owner.state.owner == "proxy-b"
    finally:
        for member in members:
            await member.close()


async def read_line(child: asyncio.subprocess.Process, wanted: Callable[[str], bool]) -> str:
    assert child.stdout is not None
    async with asyncio.timeout(60):
        while True:
            line = (await child.stdout.readline()).decode().strip()
            if not line:
                raise AssertionError("the child exited")
            if wanted(line):
                return line


async def spawn_member(
    kafka_cluster, topic: str, group: str, name: str, log: IO[str]
) -> asyncio.subprocess.Process:
    """A `shard_member.py` process: a member named `name` of `group`."""
    args = [kafka_cluster.bootstrap, topic, str(SHARDS), group, name, str(SESSION_MS)]
    return await asyncio.create_subprocess_exec(
        sys.executable,
        str(CHILD),
        *args,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=log,
    )


async def end(child: asyncio.subprocess.Process) -> None:
    """Kill the child and close its pipes: a pipe transport left open warns when it is
    collected, and pytest charges the warning to whichever test runs then."""
    if child.returncode is None:
        os.kill(child.pid, signal.SIGCONT)
        child.kill()
    if child.stdin is not None:
        child.stdin.close()
        with contextlib.suppress(ConnectionError):
            await child.stdin.wait_closed()
    if child.stdout is not None:
        await child.stdout.read()  # to EOF: the transport closes once every pipe has
    await child.wait()


async def test_a_paused_owner_is_fenced(kafka, kafka_cluster, topic, tmp_path):
    group = f"shards-{uuid.uuid4().hex[:8]}"
    log = (tmp_path / "child.log").open("w")
    child = await spawn_member(kafka_cluster, topic, group, "paused", log)
    assert child.stdin is not None
    # the paused member did not release its shards: take them over without waiting for it
    other = ShardAssignment(
        kafka,
        topic,
        SHARDS,
        "other",
        group_id=group,
        session_timeout_ms=SESSION_MS,
        unclean_takeover_after_s=0,
    )
    try:
        await read_line(child, lambda line: line == "owned 0 1 2 3")
        await other.start()
        await read_line(child, lambda line: line.startswith("owned") and len(line.split()) == 3)
        await eventually(lambda: len(other.owned()) == 2, 60, "the other member owns two shards")
        # a shard given to the child is held once its owner has started (fenced the last
        # one, read to the end): ask until the two members' owners cover every shard
        for _ in range(60):
            child.stdin.write(b"hold\n")
            line = await read_line(child, lambda line: line.startswith("held"))
            held = [int(s) for s in line.split()[1:]]
            if sorted(held + other.owned()) == [0, 1, 2, 3]:
                break
            await asyncio.sleep(0.5)
        assert sorted(held + other.owned()) == [0, 1, 2, 3]

        os.kill(child.pid, signal.SIGSTOP)
        took = await eventually(
            lambda: other.owned() == [0, 1, 2, 3], 60, "the other member owns every shard"
        )
        print(f"the other member owned every shard {took:.1f} s after the pause")
        child.stdin.write(b"write\n")  # read as soon as it runs again
        await child.stdin.drain()
        os.kill(child.pid, signal.SIGCONT)

        tried, outcomes = set(), []
        for _ in range(2 * len(held)):
            line = await read_line(
                child, lambda line: line.split()[0] in ("tried", "fenced", "wrote")
            )
            if line.startswith("tried"):
                tried.add(bytes.fromhex(line.split()[2]))
            else:
                outcomes.append(line)
        print("\n".join(outcomes))
        assert all(line.startswith("fenced") for line in outcomes), outcomes
        # fenced by Kafka, or by the other's claim if the reader read it first
        assert all("Kafka fenced" in line or "claimed at epoch" in line for line in outcomes)
        assert not tried & await committed_keys(kafka, topic)
        child.stdin.write(b"quit\n")
        await read_line(child, lambda line: line == "bye")
    finally:
        await end(child)
        log.close()
        await other.close()


# -- hand-over: released at once, held for a last owner that did not release --------------


async def test_an_owner_waits_for_a_last_owner_that_did_not_release_the_shard(kafka, topic):
    a = await started_owner(kafka, topic, 3, "proxy-a")
    await a.write([cutover(a)])
    await a.close()  # no release: as if it had died
    owners = []
    try:
        b = ShardOwner(kafka, topic, 3, SHARDS, "proxy-b")
        owners.append(b)
        looks = count_looks(b)
        starting = asyncio.create_task(b.start())
        await eventually(lambda: b.held_by == "proxy-a", 60, "b waits for proxy-a")
        seen = looks()
        await eventually(lambda: looks() >= seen + 3, 60, "two more looks at the partition")
        assert b.held_by == "proxy-a" and not b.owning and not starting.done()
        starting.cancel()  # as a revoke does
        with pytest.raises(asyncio.CancelledError):
            await starting
        async with asyncio.timeout(10):
            await b.close()

        c = ShardOwner(kafka, topic, 3, SHARDS, "proxy-c")
        owners.append(c)
        starting = asyncio.create_task(c.start())
        await eventually(lambda: c.held_by == "proxy-a", 60, "c waits for proxy-a")
        await c.close()
        with pytest.raises(ShardFenced, match="closed before it claimed"):
            await starting

        # the same member, restarted: it claims at once, then hands the shard over
        again = await started_owner(kafka, topic, 3, "proxy-a")
        owners.append(again)
        assert again.epoch == 2 and again.held_by is None
        await again.release()
        assert not again.owning and again.state.released and again.state.owner == "proxy-a"
        with pytest.raises(ShardFenced, match="released"):
            await again.write([commit(again, 40, 100, 110)])

        d = await started_owner(kafka, topic, 3, "proxy-d")  # released: no wait
        owners.append(d)
        assert (d.epoch, d.state.owner, d.state.released) == (3, "proxy-d", False)
        _, stream = stream_in(3)
        assert d.state.stream_end(stream) == 100
    finally:
        for owner in owners:
            await owner.close()


class Hooks:
    """ShardAssignment's hooks, recording what they were called for, in order."""

    def __init__(self, release: bool, delay_s: float = 0.0) -> None:
        self.release = release
        self.delay_s = delay_s  # how long a hand-over's upload takes
        self.events: list[tuple[str, int]] = []

    async def on_owned(self, shard: int, owner: ShardOwner) -> None:
        assert owner.owning and owner.state.owner == owner.name
        self.events.append(("owned", shard))

    async def on_lost(self, shard: int) -> None:
        self.events.append(("lost", shard))

    async def on_release(self, shard: int) -> bool:
        await asyncio.sleep(self.delay_s)
        self.events.append(("release", shard))
        return self.release

    def options(self) -> dict:
        return {"on_owned": self.on_owned, "on_lost": self.on_lost, "on_release": self.on_release}


def member(kafka, topic, group, name, **options) -> ShardAssignment:
    return ShardAssignment(
        kafka, topic, SHARDS, name, group_id=group, session_timeout_ms=SESSION_MS, **options
    )


# The slow case: a hand-over that outlasts the session timeout, as an upload of a full WAL
# to a slow object store may (it is bounded by the session timeout, plus the
# ShardRelease's write). Such a member was put out of the group at the rebalance timeout:
# the other member was given its shards and fenced it, its release failed, the shards
# waited for it, and the group rebalanced again and again (the fault suite's kill -9 step
# on a busy machine).
@pytest.mark.parametrize("hand_over_s", [0.0, SESSION_MS / 1000 + 2.0], ids=["quick", "slow"])
async def test_a_shard_released_on_revoke_is_claimed_at_once(kafka, topic, hand_over_s):
    group = f"shards-{uuid.uuid4().hex[:8]}"
    hooks = Hooks(release=True, delay_s=hand_over_s)
    a = member(kafka, topic, group, "proxy-a", **hooks.options())
    b = member(kafka, topic, group, "proxy-b")
    held: list[dict] = []
    try:
        await a.start()
        await eventually(lambda: a.owned() == [0, 1, 2, 3], 60, "a owns every shard")
        assert sorted(hooks.events) == [("owned", k) for k in range(SHARDS)]
        await b.start()  # the rebalance revokes a's shards: released, so b waits for no one
        await eventually(
            lambda: held.append(b.held()) or len(a.owned()) == len(b.owned()) == 2,
            90,
            "a and b own two shards each",
        )
        assert not any(held), f"b waited for a released shard: {[h for h in held if h]}"
        kept = a.owned()
        for shard in range(SHARDS):  # a's hooks: on_lost, then on_release, then owned again
            mine = [event for event, k in hooks.events if k == shard]
            assert mine[:3] == ["owned", "lost", "release"], (shard, mine)
            assert mine[3:] == (["owned"] if shard in kept else []), (shard, mine)

        hooks.delay_s = 0.0
        stop = time.monotonic()
        await a.close()
        took = await eventually(
            lambda: held.append(b.held()) or b.owned() == [0, 1, 2, 3], 60, "b owns every shard"
        )
        print(f"b owned a's released shards {took:.1f} s after a closed")
        assert time.monotonic() - stop < SESSION_MS / 1000
        assert not any(held), "b waited for a shard that was released"
        for shard in kept:
            assert [event for event, k in hooks.events if k == shard][-2:] == ["lost", "release"]
            owner = b.owner(shard)
            assert owner is not None and owner.state.owner == "proxy-b"
            assert not owner.state.released and owner.state.epoch == 3  # a, a again, b
    finally:
        await a.close()
        await b.close()


async def test_a_released_shard_is_not_reported_dirty_by_a_reader_that_lags(kafka, topic):
    # `dirty_shards` is read from the proxy's own readers, not the owners': one that has
    # not read the ShardRelease yet still shows this member's claim as the last. Here it
    # never catches up. a must still report no dirty shard once it released them, or the
    # group gives all four back to a and b gets none until the next rebalance.
    group = f"shards-{uuid.uuid4().hex[:8]}"
    hooks = Hooks(release=True)
    claimed: set[int] = set()

    async def on_owned(shard: int, owner: ShardOwner) -> None:
        claimed.add(shard)
        await hooks.on_owned(shard, owner)

    options = hooks.options() | {"on_owned": on_owned, "dirty_shards": lambda: sorted(claimed)}
    a = member(kafka, topic, group, "proxy-a", **options)
    b = member(kafka, topic, group, "proxy-b")
    try:
        await a.start()
        await eventually(lambda: a.owned() == [0, 1, 2, 3], 60, "a owns every shard")
        await b.start()  # a releases all four on the revoke; its lagging view says dirty
        await eventually(
            lambda: len(a.owned()) == len(b.owned()) == 2, 60, "a and b own two shards each"
        )
        assert [event for event, _ in hooks.events].count("release") == SHARDS
        assert not b.held()
    finally:
        await a.close()
        await b.close()


async def test_a_shard_not_released_stays_with_its_owner_and_is_taken_over_after_the_limit(
    kafka, topic
):
    group = f"shards-{uuid.uuid4().hex[:8]}"
    hooks = Hooks(release=False)  # as if a's uploads had not caught up
    a = member(kafka, topic, group, "proxy-a", **hooks.options())
    b = member(kafka, topic, group, "proxy-b", unclean_takeover_after_s=1.0)
    held: list[dict] = []
    try:
        await a.start()
        await eventually(lambda: a.owned() == [0, 1, 2, 3], 60, "a owns every shard")
        await b.start()
        # a revoked its shards without releasing them: dirty, so the group gives them back
        await eventually(lambda: b.rebalances >= 1, 60, "b is a member")
        await eventually(lambda: a.owned() == [0, 1, 2, 3], 60, "a owns every shard again")
        assert b.assigned() == []
        assert ("release", 0) in hooks.events

        stop = time.monotonic()
        await a.close()
        took = await eventually(
            lambda: held.append(b.held()) or b.owned() == [0, 1, 2, 3], 60, "b owns every shard"
        )
        print(f"b took a's unreleased shards over {took:.1f} s after a closed (limit 1 s)")
        assert {"proxy-a"} == {name for seen in held for name in seen.values()}
        assert time.monotonic() - stop >= 1.0
        for shard in range(SHARDS):
            owner = b.owner(shard)
            assert owner is not None and owner.state.owner == "proxy-b"
    finally:
        await a.close()
        await b.close()


async def test_a_killed_owners_shards_wait_for_it_and_go_back_to_it(
    kafka, kafka_cluster, topic, tmp_path
):
    group = f"shards-{uuid.uuid4().hex[:8]}"
    logs = [(tmp_path / f"proxy-a-{n}.log").open("w") for n in (1, 2)]
    first = await spawn_member(kafka_cluster, topic, group, "proxy-a", logs[0])
    b = member(kafka, topic, group, "proxy-b")
    children = [first]
    try:
        assert await read_line(first, lambda line: line.startswith("dirty")) == "dirty"
        await read_line(first, lambda line: line == "owned 0 1 2 3")
        assert first.stdin is not None
        first.stdin.write(b"dangle\n")  # it dies inside a transaction on every shard
        dangling = set()
        for _ in range(SHARDS):
            line = await read_line(first, lambda line: line.startswith("dangling"))
            dangling.add(bytes.fromhex(line.split()[2]))
        first.kill()  # SIGKILL: no release, no LeaveGroup
        await first.wait()

        killed = time.monotonic()
        await b.start()
        await eventually(
            lambda: b.held() == dict.fromkeys(range(SHARDS), "proxy-a"),
            60,
            "b holds every shard for proxy-a",
        )
        took = time.monotonic() - killed
        print(f"b was given a's shards and holds them {took:.1f} s after the kill")
        # holding, b has fenced a: its InitProducerId aborted a's open transactions, long
        # before their 60 s timeout, or b's read to the end would still wait for them
        assert took < 30 and b.owned() == []
        assert not dangling & await committed_keys(kafka, topic)
        await asyncio.sleep(1.0)  # re-read twice: still held
        assert b.owned() == [] and len(b.held()) == SHARDS

        second = await spawn_member(kafka_cluster, topic, group, "proxy-a", logs[1])
        children.append(second)
        restarted = time.monotonic()
        assert await read_line(second, lambda line: line.startswith("dirty")) == "dirty 0 1 2 3"
        await read_line(second, lambda line: line == "owned 0 1 2 3")
        print(f"a restarted owns its shards again {time.monotonic() - restarted:.1f} s later")
        await eventually(lambda: b.assigned() == [] and not b.held(), 60, "b gave them up")
        for shard in range(SHARDS):
            reader = ShardReader(kafka, topic, shard, SHARDS)
            try:
                await reader.start()
                async with asyncio.timeout(30):
                    await reader.read_to_end()
                state = reader.state
                assert (state.owner, state.epoch, state.released) == ("proxy-a", 2, False)
            finally:
                await reader.close()

        # a leaves cleanly: its shards are released and b claims them at once
        assert second.stdin is not None
        left = time.monotonic()
        second.stdin.write(b"quit\n")
        await read_line(second, lambda line: line == "bye")
        await eventually(lambda: b.owned() == [0, 1, 2, 3], 60, "b owns every shard")
        print(f"b owned every shard {time.monotonic() - left:.1f} s after a quit")
    finally:
        for child in children:
            await end(child)
        for log in logs:
            log.close()
        await b.close()
