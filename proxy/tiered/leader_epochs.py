"""The current leader epoch of tiered partitions, for the ListOffsets answers the proxy
makes (docs/tiering.md, "Reading a tiered topic").

Kafka answers ListOffsets with a leader epoch from its epoch cache: the epoch of the entry
covering the offset answered (LATEST: the partition's current leader epoch). A tiered
partition's Kafka log ends at the cutover, and every epoch a leader took since starts
there, so for any offset at or past the cutover Kafka's answer would be the current
leader epoch. The proxy learns it from a Metadata answer of Kafka's (asked on a
connection of its own, in parallel with the stream's search), kept for `MAX_AGE_S` so a
client polling ListOffsets (a lag monitor) costs one Metadata a second per topic, and
shared by the lookups in flight. After a leader election the epoch answered may be the
previous one for that long: a client that validates its position with it (Kafka's
OffsetForLeaderEpoch for that epoch ends at the cutover) is answered the stream's high
watermark (tiered_epochs.py), so it is neither truncated nor reset.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

log = logging.getLogger("tierproxy.reads")

MAX_AGE_S = 1.0
NO_EPOCH = -1

Lookup = Callable[[str], Awaitable[dict[int, int]]]  # topic -> {partition: leader epoch}


class LeaderEpochs:
    def __init__(self, lookup: Lookup, clock: Callable[[], float] = time.monotonic) -> None:
        self._lookup = lookup
        self._clock = clock
        self._known: dict[str, tuple[float, dict[int, int]]] = {}
        self._asking: dict[str, asyncio.Future[dict[int, int]]] = {}

    async def epoch(self, topic: str, partition: int) -> int:
        """The partition's current leader epoch; -1 when Kafka cannot be asked (the
        answer then carries no epoch, and clients skip their epoch checks)."""
        return (await self._epochs(topic)).get(partition, NO_EPOCH)

    async def _epochs(self, topic: str) -> dict[int, int]:
        known = self._known.get(topic)
        if known is not None and self._clock() - known[0] < MAX_AGE_S:
            return known[1]
        asking = self._asking.get(topic)
        if asking is None:
            asking = asyncio.ensure_future(self._ask(topic))
            self._asking[topic] = asking
            asking.add_done_callback(lambda _: self._asking.pop(topic, None))
        return await asyncio.shield(asking)

    async def _ask(self, topic: str) -> dict[int, int]:
        asked_at = self._clock()
        try:
            epochs = await self._lookup(topic)
        except (OSError, LookupError, TimeoutError, ConnectionError) as exc:
            log.warning("leader epochs of %s: %r; answering epoch -1", topic, exc)
            return {}
        self._known[topic] = (asked_at, epochs)
        return epochs
