"""A DeleteRecords on a tiered partition is answered once every live member has read the
owner's StreamTrim (proxy/tiered/shard_reads.py): who is asked, who is left out, and
what a member answers. A stand-in host and readers: pure scheduling (the integration
test `test_tiered_delete_checks.py` asks the other proxy right after each delete)."""

from __future__ import annotations

import asyncio

from kio.schema.errors import ErrorCode

from proxy.peer.clients import PeerUnavailable
from proxy.peer.codec import SHARD_READ_PROTOCOL
from proxy.peer.messages import ShardReadRequest
from proxy.tiered.shard_reads import read_everywhere, read_here


class _Peers:
    def __init__(self, answers: dict) -> None:
        self.answers = answers  # address -> (code, message), an exception, or None: silent
        self.asked: list[tuple[tuple[str, int], int, int]] = []

    async def read_shard(self, address, shard: int, offset: int, timeout_ms: int):
        self.asked.append((address, shard, offset))
        answer = self.answers[address]
        await asyncio.sleep(0)
        if answer is None:  # stopped (SIGSTOP): no answer, no error
            await asyncio.Event().wait()
        if isinstance(answer, BaseException):
            raise answer
        return answer


class _Reader:
    def __init__(self) -> None:
        self.applied = 0
        self.moved = asyncio.Event()

    async def read_to(self, offset: int) -> None:
        while self.applied < offset:
            await self.moved.wait()
            self.moved.clear()


class _Host:
    name = "a"

    def __init__(self, members: dict[str, int], answers: dict) -> None:
        self.members = members  # name -> peer protocol level
        self.peers = _Peers(answers)
        self.readers = [_Reader(), _Reader()]

    def live_peers(self) -> list[str]:
        return list(self.members)

    def peer_protocol(self, member: str) -> int:
        return self.members[member]

    def peer_address(self, member: str) -> tuple[str, int] | None:
        return None if member == "leaving" else (member, 9000)


async def test_every_live_member_that_reads_the_request_is_asked_and_the_late_ones_named():
    host = _Host(
        {
            "b": SHARD_READ_PROTOCOL,
            "late": SHARD_READ_PROTOCOL,
            "old": SHARD_READ_PROTOCOL - 1,  # not asked: it catches up on its own
            "gone": SHARD_READ_PROTOCOL,  # unreachable: left out, as a replica out of sync
            "broken": SHARD_READ_PROTOCOL,  # its reader stopped: left out
            "odd": SHARD_READ_PROTOCOL,  # an answer that cannot be read: left out
            "leaving": SHARD_READ_PROTOCOL,  # no address any more
        },
        {
            ("b", 9000): (0, ""),
            ("late", 9000): (ErrorCode.request_timed_out, "not read in time"),
            ("gone", 9000): PeerUnavailable("connection refused"),
            ("broken", 9000): (ErrorCode.kafka_storage_error, "the reader stopped"),
            ("odd", 9000): RuntimeError("closed"),
        },
    )
    host.readers[1].applied = 4242  # this proxy's own reader has read the trim
    assert await read_everywhere(host, 1, 4242, 5.0) == ["late"]
    asked = sorted(address[0] for address, _, _ in host.peers.asked)
    assert asked == ["b", "broken", "gone", "late", "odd"]
    assert {(shard, offset) for _, shard, offset in host.peers.asked} == {(1, 4242)}


async def test_this_proxys_own_reader_and_a_silent_member_are_waited_for_until_the_timeout():
    """The owner's writes are read back by a reader of their own: this proxy's reader of
    the shard, which serves its reads, is waited for too; a member that never answers
    (stopped) is late once the timeout passed, not later."""
    host = _Host({"stopped": SHARD_READ_PROTOCOL}, {("stopped", 9000): None})
    assert sorted(await read_everywhere(host, 1, 10, 0.05)) == ["a", "stopped"]
    host.readers[1].applied = 10
    host.members = {}
    assert await read_everywhere(host, 1, 10, 0.05) == []


async def test_a_member_answers_once_its_reader_applied_the_records_below_the_offset():
    host = _Host({}, {})
    reader = host.readers[1]
    waiting = asyncio.create_task(read_here(host, ShardReadRequest(1, 1, 10, 5000)))
    await asyncio.sleep(0.01)
    assert not waiting.done()
    reader.applied = 10
    reader.moved.set()
    assert await asyncio.wait_for(waiting, 5) == (0, "")
    code, message = await read_here(host, ShardReadRequest(2, 1, 11, 50))  # never gets there
    assert code == ErrorCode.request_timed_out and "not read to 11" in message
    code, message = await read_here(host, ShardReadRequest(3, 2, 1, 50))
    assert code == ErrorCode.invalid_request and "no metadata shard 2" in message
