"""`tierproxy run` whose log cleaner holds before its commit, for a test to kill it there.

Run as a script with `run`'s arguments. It replaces the log cleaner's metadata write
with a step that prints "log cleaner holding before its commit: KEY ..." (the keys of
the new objects, written to the store already and named by no shard) and waits for
ever; everything else runs as `tierproxy run` runs it
(tests/integration/tiering/test_tiered_compacted_kill.py). The hold lives here, not in
the product, which has no test hooks.
"""

from __future__ import annotations

import asyncio
import sys

import proxy.upkeep.log_cleaner as log_cleaner
from proxy.cli import main


async def hold(owner, records) -> list:
    keys = " ".join(record.key for record in records)
    print(f"log cleaner holding before its commit: {keys}", flush=True)
    await asyncio.get_running_loop().create_future()  # until the test kills this process
    raise AssertionError("unreachable")


if __name__ == "__main__":
    log_cleaner.write_through = hold  # type: ignore[assignment]
    sys.exit(main(sys.argv[1:]))
