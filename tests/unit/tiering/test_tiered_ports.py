"""The tiered service's parts seen through their ports (proxy/tiered/ports.py,
proxy/upkeep/ports.py): each takes a small twin of the few capabilities it uses, with no
Kafka, store or peer behind it. And the start's stack undoes in the reverse order."""

from __future__ import annotations

import asyncio
import uuid
from contextlib import AsyncExitStack
from types import SimpleNamespace

from kio.schema.errors import ErrorCode

from proxy.metadata.records import TopicMode
from proxy.metadata.streams import shard_of
from proxy.peer.messages import TrimRequest
from proxy.tiered import shards
from proxy.tiered.startup import run_task
from proxy.tiered.uploads import UploadLoop
from proxy.upkeep.ports import owner_or_peer
from proxy.upkeep.trims import trim_stream
from proxy.wal.types import WalEntry, WalPosition


class Peers:
    def __init__(self) -> None:
        self.trims: list[tuple] = []

    async def trim(self, address, stream_id, offset, timeout_ms):
        self.trims.append((address, stream_id, offset, timeout_ms))
        return 0, offset, "trimmed by the owner"


class Reader:
    """This proxy's reader of the shard: counts the reads to the shard's end."""

    def __init__(self) -> None:
        self.state = SimpleNamespace(owner="p2")
        self.reads_to_end = 0

    async def read_to_end(self) -> int:
        self.reads_to_end += 1
        return 0


def trim_host(owner_address):
    """A TrimHost whose one shard is owned by `p2`, reachable at `owner_address`."""
    return SimpleNamespace(
        config=SimpleNamespace(shard_count=1),
        readers=[Reader()],
        shard_owner=lambda shard: None,
        peer_address=lambda member: owner_address if member == "p2" else None,
        peers=Peers(),
        partitions=None,
        uploader=None,
    )


async def test_a_trim_of_a_stream_owned_elsewhere_goes_to_its_owner():
    host = trim_host(("10.0.0.2", 9000))
    answer = await trim_stream(host, TrimRequest(0, 7, 50, 1000))
    assert answer == (0, 50, "trimmed by the owner")
    assert host.peers.trims == [(("10.0.0.2", 9000), 7, 50, 1000)]
    assert host.readers[0].reads_to_end == 1  # the trim read here before the answer


async def test_a_trim_with_no_live_owner_is_retriable():
    host = trim_host(None)
    code, log_start, message = await trim_stream(host, TrimRequest(0, 7, 50, 1000))
    assert (code, log_start) == (ErrorCode.not_leader_or_follower, -1)
    assert "no live owner" in message
    assert host.peers.trims == []


def test_a_shard_is_served_by_its_owner_here_else_at_its_owners_address_else_nowhere():
    assert owner_or_peer(trim_host(("10.0.0.2", 9000)), 0) == ("10.0.0.2", 9000)
    assert owner_or_peer(trim_host(None), 0) is None
    owned_here = trim_host(None)
    owned_here.shard_owner = lambda shard: "the owner"
    assert owner_or_peer(owned_here, 0) == "the owner"


class Uploader:
    def __init__(self, error: BaseException | None = None, failed=None) -> None:
        self.error, self.failed, self.flushed = error, failed, 0

    async def flush(self) -> None:
        self.flushed += 1
        if self.error is not None:
            raise self.error


def uploads_with(uploader) -> UploadLoop:
    host = SimpleNamespace(config=SimpleNamespace(session_timeout_ms=1000))
    loop = UploadLoop(host, wal=None, store=None, allocate=None)
    loop.uploader = uploader
    return loop


async def test_a_shard_is_released_cleanly_only_once_its_uploads_are_committed():
    assert await uploads_with(None).release(0) is False  # no uploader (yet)
    assert await uploads_with(Uploader(failed="broken")).release(0) is False
    failing = Uploader(error=OSError("store down"))
    assert await uploads_with(failing).release(0) is False
    assert failing.flushed == 1
    working = Uploader()
    assert await uploads_with(working).release(0) is True
    assert working.flushed == 1


class Started:
    """A recovered partition: its log start, whether a transaction open below it began."""

    def __init__(self, log_start_offset: int, open_below: bool) -> None:
        self.log_start_offset, self.open_below = log_start_offset, open_below
        self.noted: list[tuple[int, int]] = []

    def opened_below(self, offset: int) -> bool:
        return self.open_below and offset == self.log_start_offset

    def note_start_batch(self, log_start: int, base: int) -> None:
        self.noted.append((log_start, base))


class Partitions:
    def __init__(self) -> None:
        self.recovered: list[list[int]] = []
        # stream 3: a DeleteRecords cut an open transaction's batch before the restart
        self.started = {1: Started(0, False), 3: Started(120, True)}

    async def recover(self, streams, state, *, read_committed, read_upstream, may_start) -> None:
        self.recovered.append(list(streams))
        self.may_start = may_start

    def get(self, stream: int) -> Started | None:
        return self.started.get(stream)


async def test_a_shard_given_starts_its_streams_except_the_sealed_and_the_deleted_ones():
    """Stream 2 is sealed (an untier under way), stream 4's topic was deleted in Kafka
    (its StreamUntier not written yet): neither is started. Rebuilding stream 4 may need
    Kafka's log of a topic that is gone, and its failure kept the shard from being owned."""
    partitions, woken, asked = Partitions(), [], []
    tiered, deleted = uuid.UUID(int=1), uuid.UUID(int=2)
    modes = {
        tiered: SimpleNamespace(topic="t", mode=TopicMode.TIERED),
        deleted: SimpleNamespace(topic="gone", mode=TopicMode.DELETED),
    }
    # the owner's state has the streams; the service's readers, the topics' modes (a
    # reader may not have read a cutover the owner just wrote)
    state = SimpleNamespace(
        stream=lambda s: SimpleNamespace(topic_id=deleted if s == 4 else tiered, partition=0),
    )
    reader_state = SimpleNamespace(stream=lambda s: None, topic=modes.get)

    async def batch_base(stream: int, offset: int) -> int:
        asked.append((stream, offset))
        return offset - 3

    host = SimpleNamespace(
        name="proxy-a",
        readers=[SimpleNamespace(state=reader_state)] * 2,  # streams 1 and 3: shard 1
        partitions=partitions,
        store=object(),
        kafka_settings={},  # Kafka's log is read only by a rebuild that seeds from it
        topics=None,
        is_sealed=lambda stream: stream == 2,
        notify=lambda: woken.append(True),
        claimed_epochs={},
        losing={1},  # given up before, claimed again now
        batch_base=batch_base,
    )
    # the last claim before this one was this member's: its WAL entries are its log
    owner = SimpleNamespace(
        state=SimpleNamespace(stream_ids=lambda: [1, 2, 3, 4], stream=state.stream),
        previous_owner="",
        shard=1,
        epoch=4,
    )
    await shards.owned(host, owner)
    assert partitions.recovered == [[1, 3]]
    # the batch holding stream 3's log start is read again; stream 1 has nothing open
    assert asked == [(3, 120)]
    assert partitions.started[3].noted == [(120, 117)] and not partitions.started[1].noted
    assert woken == [True]
    assert host.claimed_epochs == {1: 4}  # the claim this process made, kept for the shard
    assert host.losing == set()  # claimed: its streams may start again
    may_start = partitions.may_start
    assert may_start(1)
    host.losing.add(0)  # another shard given up: not stream 1's
    assert may_start(1)
    host.losing.add(1)  # being given up: a rebuild ending now starts nothing
    assert not may_start(1)
    await shards.recover_streams(host, owner.state, [1, 3])  # nor does one begun now
    assert partitions.recovered[-1] == []
    host.losing.clear()
    host.claimed_epochs[1] = 5  # claimed again since the rebuild began: the retry's
    assert not may_start(1)


async def test_the_start_stack_undoes_in_the_reverse_order_tasks_cancelled_and_awaited():
    done: list[str] = []

    async def forever() -> None:
        try:
            await asyncio.Event().wait()
        finally:
            done.append("task")

    stack = AsyncExitStack()
    stack.callback(done.append, "first")
    task = run_task(stack, forever(), "t")
    await asyncio.sleep(0)
    stack.callback(done.append, "last")
    await stack.aclose()
    assert done == ["last", "task", "first"]
    assert task.cancelled()


async def test_a_background_task_that_fails_says_so_at_once(caplog):
    """A task that ends with an exception is logged as it ends (the cutover loop's death
    was silent until the proxy stopped); a cancelled one, at the stack's undo, is not."""

    async def broken() -> None:
        raise RuntimeError("a bug")

    async with AsyncExitStack() as stack:
        failed = run_task(stack, broken(), "cutover")
        await asyncio.gather(failed, return_exceptions=True)
        await asyncio.sleep(0)  # the done callbacks run
        assert "background task cutover ended: RuntimeError('a bug')" in caplog.text
        assert "a bug" in caplog.records[-1].exc_text
        run_task(stack, asyncio.Event().wait(), "waiting")
    assert len([r for r in caplog.records if r.levelname == "ERROR"]) == 1


def test_the_uploader_skips_entries_of_streams_the_owned_shards_no_longer_have():
    """A stream dropped (its topic deleted in Kafka, or untiered) leaves its WAL entries
    past the committed end behind: the owner refuses their commit, and an uploader that
    tried would stop on it after every restart. Entries of a shard not owned here, or
    stale ones, are judged as before."""
    by_shard: dict[int, list[int]] = {0: [], 1: []}
    for stream in range(1, 100):
        by_shard[shard_of(stream, 2)].append(stream)
    kept, dropped, other = by_shard[0][0], by_shard[0][1], by_shard[1][0]
    tiered = {kept, other}  # the streams the metadata has
    owned = {0}
    host = SimpleNamespace(
        config=SimpleNamespace(shard_count=2),
        shard_owner=lambda shard: (
            SimpleNamespace(state=SimpleNamespace(stream=lambda s: "info" if s in tiered else None))
            if shard in owned
            else None
        ),
    )
    stale_below = {kept: 100}
    loop = UploadLoop(
        host,
        wal=None,
        store=None,
        allocate=None,
        stale=lambda e: e.position.start < stale_below.get(e.stream_id, 0),
    )

    def entry(stream: int, start: int = 500) -> WalEntry:
        return WalEntry(WalPosition(start, start + 10), stream, 0, memoryview(b""))

    assert not loop._skipped(entry(kept))  # tiered in a shard owned here
    assert loop._skipped(entry(kept, start=50))  # stale (PartitionSet.stale)
    assert loop._skipped(entry(dropped))  # shard 0's metadata no longer has it
    tiered.discard(other)
    assert not loop._skipped(entry(other))  # shard 1 is not owned here: its owner judges
    owned.add(1)
    assert loop._skipped(entry(other))
