"""A shard group member in a process of its own, for the tests that pause it (SIGSTOP) or
kill it (SIGKILL) and start it again.

    python shard_member.py BOOTSTRAP TOPIC SHARD_COUNT GROUP NAME SESSION_TIMEOUT_MS

It first reads every shard, as a proxy does, and prints `dirty <shard> ...`: the shards
whose last claim is NAME's and were not released, which it declares to the group. It then
joins the group as a `ShardAssignment` and prints `owned <shard> ...` each time the shards
it owns change. Commands on stdin, one per line:

- `hold`: keep the owners it has now (even once the group takes them away); prints
  `held <shard> ...`.
- `write`: each held owner writes a cutover of a stream of its shard; prints
  `tried <shard> <key hex>` first, then `fenced <shard> <reason>` or
  `wrote <shard> <outcome>`.
- `dangle`: each owner it owns now begins a transaction and sends a cutover in it, which it
  never commits; prints `dangling <shard> <key hex>` once the record is sent.
- `quit`: leave the group and exit.

Every line is flushed as it is printed. Logs go to stderr.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from proxy.metadata.assignor import dirty_shards  # noqa: E402
from proxy.metadata.codec import encode  # noqa: E402
from proxy.metadata.group import ShardAssignment  # noqa: E402
from proxy.metadata.records import StreamCutover  # noqa: E402
from proxy.metadata.store import ShardFenced, ShardOwner, ShardReader  # noqa: E402
from proxy.metadata.streams import shard_of, stream_id  # noqa: E402


def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def cutover_in(owner: ShardOwner, shard_count: int) -> StreamCutover:
    topic_id = uuid.uuid4()
    partition = next(
        p for p in range(10_000) if shard_of(stream_id(topic_id, p), shard_count) == owner.shard
    )
    state = owner.state
    return StreamCutover(
        generation=state.generation,
        stream_id=stream_id(topic_id, partition),
        incarnation=1,
        epoch=owner.epoch,
        topic_id=topic_id,
        partition=partition,
        log_start_offset=0,
        cutover_offset=0,
        end_offset=0,
        at_ms=1,
    )


async def write(owner: ShardOwner, shard_count: int) -> None:
    cutover = cutover_in(owner, shard_count)
    say(f"tried {owner.shard} {encode(cutover)[0].hex()}")
    try:
        [verdict] = await owner.write([cutover])
    except ShardFenced as exc:
        say(f"fenced {owner.shard} {exc.reason}")
    else:
        say(f"wrote {owner.shard} {verdict.outcome.value}")


async def dangle(owner: ShardOwner, shard_count: int) -> None:
    # an owner that dies inside a transaction: the next owner's InitProducerId aborts it
    producer = owner._producer
    assert producer is not None
    key, value = encode(cutover_in(owner, shard_count))
    await producer.begin_transaction()
    await (await producer.send(owner.topic, value, key, partition=owner.shard))
    say(f"dangling {owner.shard} {key.hex()}")


async def watch(assignment: ShardAssignment) -> None:
    last = None
    while True:
        owned = assignment.owned()
        if owned != last:
            say(" ".join(["owned", *map(str, owned)]))
            last = owned
        await asyncio.sleep(0.05)


async def main() -> None:
    bootstrap, topic, count, group, name, session_ms = sys.argv[1:7]
    shard_count = int(count)
    kafka = {"bootstrap_servers": bootstrap, "request_timeout_ms": 15000}
    readers = [ShardReader(kafka, topic, k, shard_count) for k in range(shard_count)]
    for reader in readers:
        await reader.start()
    for reader in readers:
        await reader.caught_up()
    states = [reader.state for reader in readers]
    say(" ".join(["dirty", *map(str, dirty_shards(states, name))]))
    assignment = ShardAssignment(
        kafka,
        topic,
        shard_count,
        name,
        group_id=group,
        session_timeout_ms=int(session_ms),
        dirty_shards=lambda: dirty_shards(states, name),
    )
    await assignment.start()
    watcher = asyncio.create_task(watch(assignment))
    stdin = asyncio.StreamReader()
    loop = asyncio.get_running_loop()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(stdin), sys.stdin)
    held: list[ShardOwner] = []
    try:
        while line := (await stdin.readline()).decode().strip():
            if line == "hold":
                held = [o for s in assignment.owned() if (o := assignment.owner(s)) is not None]
                say(" ".join(["held", *(str(o.shard) for o in held)]))
            elif line == "write":
                await asyncio.gather(*(write(owner, shard_count) for owner in held))
            elif line == "dangle":
                owners = [o for s in assignment.owned() if (o := assignment.owner(s)) is not None]
                await asyncio.gather(*(dangle(owner, shard_count) for owner in owners))
            elif line == "quit":
                break
    finally:
        watcher.cancel()
        await asyncio.gather(watcher, return_exceptions=True)
        await assignment.close()
        for reader in readers:
            await reader.close()
    say("bye")


if __name__ == "__main__":
    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s %(message)s"
    )
    asyncio.run(main())
