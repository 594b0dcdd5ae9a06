"""The shard group member that `test_a_paused_owner_is_fenced` pauses (SIGSTOP).

    python shard_member.py BOOTSTRAP TOPIC SHARD_COUNT GROUP NAME SESSION_TIMEOUT_MS

It joins the group as a `ShardAssignment` and prints `owned <shard> ...` each time the
shards it owns change. Commands on stdin, one per line:

- `hold`: keep the owners it has now (even once the group takes them away); prints
  `held <shard> ...`.
- `write`: each held owner writes a cutover of a stream of its shard; prints
  `tried <shard> <key hex>` first, then `fenced <shard> <reason>` or
  `wrote <shard> <outcome>`.
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

from proxy.tiering.metacodec import encode  # noqa: E402
from proxy.tiering.metagroup import ShardAssignment  # noqa: E402
from proxy.tiering.metarecords import StreamCutover  # noqa: E402
from proxy.tiering.metastore import ShardFenced, ShardOwner  # noqa: E402
from proxy.tiering.metastreams import shard_of, stream_id  # noqa: E402


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
    assignment = ShardAssignment(
        kafka, topic, shard_count, name, group_id=group, session_timeout_ms=int(session_ms)
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
            elif line == "quit":
                break
    finally:
        watcher.cancel()
        await asyncio.gather(watcher, return_exceptions=True)
        await assignment.close()
    say("bye")


if __name__ == "__main__":
    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s %(message)s"
    )
    asyncio.run(main())
