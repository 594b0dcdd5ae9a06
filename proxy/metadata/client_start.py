"""Starting an aiokafka client from a task that may be cancelled (a shard revoked while its
owner starts, a proxy stopping).

aiokafka's bootstrap opens a connection, asks it for metadata and then closes it; a
cancellation that lands while it waits for that answer leaves the connection open and
known to nobody (not in the client's connection table, so `stop()` cannot close it). So
a cancelled start here lets the start finish first, for at most `settle_s`, and the
caller's `stop()` then closes everything the client opened. Past `settle_s` (Kafka not
answering) the start is cancelled after all: a stuck start must not hold a revoke up.

The proxy's own aiokafka clients never create a topic. aiokafka asks Kafka for a topic's
metadata with `allow_auto_topic_creation` true, and has no setting for it (Kafka's Java
clients have `allow.auto.create.topics`, and its admin client never creates): with the
broker's `auto.create.topics.enable` (true by default), the marker follower's metadata
refresh after a tiered topic was deleted created it again at once, with the broker's
default configs, though no client of the operator's asked for it. So aiokafka's client
and admin client build their metadata requests with this module's MetadataRequest,
which asks with it false in the tasks of a proxy (`forbid_topic_auto_creation`, called
first thing when a proxy starts: its tasks inherit it) and as aiokafka does anywhere
else (a test's own aiokafka clients, in the same process as a proxy it runs, are
users' clients and create topics as users' do). A topic Kafka does not know is then
answered UNKNOWN_TOPIC_OR_PARTITION, which aiokafka retries. An aiokafka release that
builds its metadata requests in another module would bring the re-creation back:
tests/unit/tiering/test_client_start.py reads the installed aiokafka's sources for every
module that builds one and fails unless it holds this class.
"""

from __future__ import annotations

import asyncio
import contextlib
from contextvars import ContextVar
from typing import Protocol

import aiokafka.admin.client
import aiokafka.client
from aiokafka.protocol.metadata import MetadataRequest

SETTLE_S = 10.0


class _Startable(Protocol):
    async def start(self) -> None: ...


async def start_client(client: _Startable, settle_s: float = SETTLE_S) -> None:
    """`await client.start()`; cancelled, it waits up to `settle_s` for the start to end,
    then raises CancelledError."""
    starting = asyncio.ensure_future(client.start())
    try:
        await asyncio.shield(starting)
    except asyncio.CancelledError:
        if not starting.done():
            with contextlib.suppress(TimeoutError, Exception):
                async with asyncio.timeout(settle_s):
                    await asyncio.shield(starting)
            if not starting.done():
                starting.cancel()
        if starting.done() and not starting.cancelled():
            starting.exception()  # retrieved: the caller's close deals with the client
        raise


_CREATES_TOPICS: ContextVar[bool] = ContextVar("tierproxy_creates_topics", default=True)


class _MetadataRequest(MetadataRequest):
    """aiokafka's MetadataRequest, asking Kafka not to create the topics it names in the
    tasks of a proxy."""

    def __init__(
        self, topics: list[str] | None = None, allow_auto_topic_creation: bool | None = None
    ) -> None:
        super().__init__(topics, allow_auto_topic_creation if _CREATES_TOPICS.get() else False)


aiokafka.client.MetadataRequest = _MetadataRequest
aiokafka.admin.client.MetadataRequest = _MetadataRequest


def forbid_topic_auto_creation() -> None:
    """From here on, in this task and every task it starts, aiokafka creates no topic."""
    _CREATES_TOPICS.set(False)
