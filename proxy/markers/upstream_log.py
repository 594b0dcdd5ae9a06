"""Kafka's log of a partition below its cutover, read raw: the batch headers a stream
that starts from its cutover seeds its producer state from (partition/carried.py;
docs/tiering.md, "Cutover").

Read by a rebuild of such a stream soon after its cutover, or whenever a transaction was
open there (until a producer snapshot past the cutover holds the state): a raw Fetch
(read_uncommitted, no wait) from the leader, headers kept and bytes dropped, of the
log's recent tail (`tail`), from the last stable offset the cutover recorded if that is
lower. Kafka's Fetch reads forward only, so the tail is found backwards, each chunk
read once: FIRST_SPAN offsets below the cutover, then up to GROWTH times as far back
(less when the bytes read so far say the next chunk would pass TAIL_BYTES), until what
was read begins at Kafka's log start, spans RECENT_MS of its batches' timestamps, or
weighs TAIL_BYTES (`tail_read`). Kafka's log start is the one each Fetch answer carries:
on a compacted topic a read from an offset whose batch was cleaned begins at a later
batch, which is no sign of the log start. A connection of its own (`UpstreamLog`, one per
rebuild, shared by the streams rebuilt together, connected on first use): the marker
follower's is not up yet when the group hands the proxy its shards at startup.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import NamedTuple

from aiokafka import AIOKafkaClient, TopicPartition
from aiokafka.errors import KafkaError
from aiokafka.protocol.fetch import FetchRequest
from aiokafka.protocol.offset import OffsetRequest

from proxy.markers.follow import Step, step_for
from proxy.metadata.client_start import start_client
from proxy.records.batches import BatchHeader, whole_batches

log = logging.getLogger("tierproxy.transactions")

PARTITION_MAX_BYTES = 1 << 20
READ_UNCOMMITTED = 0
EARLIEST = -2
TIMEOUT_S = 30.0  # a rebuild waits this long for Kafka's log at most
SEED_TIMEOUT_S = 5.0  # ... for only its idempotent producers, which it can go on without
RETRY_S = 0.2
# The tail of Kafka's log below a cutover a stream takes its producers from: at least the
# last RECENT_MS of it by its batches' max timestamps (a batch appended just before the
# cutover whose answer was lost is sent again within the client's request timeout, 30 s
# by default), at most TAIL_BYTES (about a second of a busy partition's writes).
RECENT_MS = 30_000
TAIL_BYTES = 8 << 20
FIRST_SPAN = 64  # offsets below the cutover read first (a record can weigh a megabyte)
GROWTH = 8  # each further read reaches at most this many times further back


def tail_read(
    found: list[BatchHeader],
    start: int,
    log_start: int = -1,
    recent_ms: int = RECENT_MS,
    most_bytes: int = TAIL_BYTES,
) -> bool:
    """Whether the headers read from `start` up to the cutover hold the tail wanted: they
    begin at Kafka's log start (offset 0, or `log_start`, what Kafka's answer said, at or
    past `start`; -1: not said, and the first batch found past `start` is taken for it),
    the first batch is older than the newest by more than `recent_ms`, or they weigh
    `most_bytes`."""
    if not found or start == 0:
        return True
    if start <= log_start or (log_start < 0 and found[0].base_offset > start):
        return True
    newest = max(header.max_timestamp for header in found)
    if found[0].max_timestamp < newest - recent_ms:
        return True
    return sum(header.size for header in found) >= most_bytes


class Span(NamedTuple):
    """What one read of Kafka's log found: the batch headers, and Kafka's log start as its
    last answer gave it (-1: not given)."""

    headers: list[BatchHeader]
    log_start: int = -1


class LeaderFetchRequest(FetchRequest):
    """aiokafka's FetchRequest, at version 10 at most: only the partition's leader answers
    it. From version 11 (KIP-392, fetch from the closest replica) Kafka serves a consumer's
    Fetch from a follower as well, up to the follower's own high watermark, which lags the
    leader's; a follower answers version 10 NOT_LEADER_OR_FOLLOWER. Reading Kafka's log of
    a tiered partition for its markers must see every marker the coordinator has written:
    after a leader moved, metadata that still names the old leader (a follower now) would
    read an old copy of the log, and a catch-up would say "done" without the marker that
    AddPartitionsToTxn waits for (docs/tiering.md, "Transactions")."""


LeaderFetchRequest._CLASSES = tuple(c for c in FetchRequest._CLASSES if c.API_VERSION <= 10)


class Bootstrap:
    """aiokafka's client, started as `start_client` starts one (cancel-safe)."""

    def __init__(self, client: AIOKafkaClient) -> None:
        self._client = client

    async def start(self) -> None:
        await self._client.bootstrap()


class UpstreamLog:
    """Reads Kafka's log of partitions below their cutover; `close()` when done."""

    def __init__(self, kafka_settings: dict) -> None:
        self._settings = kafka_settings
        self._client: AIOKafkaClient | None = None
        self._connecting = asyncio.Lock()  # the streams rebuilt together share it

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None

    async def tail(
        self,
        topic: str,
        partition: int,
        end: int,
        lowest: int | None = None,
        timeout_s: float = TIMEOUT_S,
    ) -> list[BatchHeader]:
        """The headers of the recent tail of `topic`-`partition` below `end` (module
        docstring), from the batch holding `lowest` if that is lower, in order (Kafka's
        log start past `lowest`: logged). Read backwards in chunks, each read once: the
        first FIRST_SPAN offsets (or from `lowest`), then each time GROWTH times as far
        back, less if the bytes read so far say the next chunk would pass TAIL_BYTES.
        The first read is needed (KafkaError or TimeoutError when Kafka does not answer
        within `timeout_s`); a later one that fails or is cut by the deadline ends the tail
        there (logged), and what was read is returned."""
        deadline = time.monotonic() + timeout_s
        found: list[BatchHeader] = []
        log_start = -1
        upper, reach = end, FIRST_SPAN
        while True:
            start = max(0, end - reach)
            if lowest is not None:
                start = min(start, lowest)
            try:  # bounded as a whole: a fetch under way when the deadline passes too
                async with asyncio.timeout(max(0.0, deadline - time.monotonic())):
                    chunk, log_start = await self.headers(
                        topic, partition, start, upper, deadline - time.monotonic()
                    )
            except (KafkaError, OSError, TimeoutError) as exc:
                if not found:
                    raise
                log.info("%s-%d: Kafka's log below %d not read further: %r",
                         topic, partition, found[0].base_offset, exc)  # fmt: skip
                break
            if found:  # the batch holding the last start is the first one found already
                chunk = [h for h in chunk if h.base_offset < found[0].base_offset]
            found = chunk + found
            if tail_read(found, start, log_start):
                break
            if not chunk and log_start < 0:  # else a compacted range: read further back
                break
            upper = found[0].base_offset
            size = sum(h.size for h in found)
            density = size / max(1, end - upper)  # bytes per offset so far
            more = min(reach * (GROWTH - 1), int((TAIL_BYTES - size) / density))
            if not chunk:  # a cleaned range read no bytes: reach further back regardless
                more = reach * (GROWTH - 1)
            reach = max(reach + more, end - upper + 1)  # at least the batch before
        past = log_start > lowest if log_start >= 0 and lowest is not None else None
        if lowest is not None and past is None:  # not said: the first batch found tells
            past = not found or found[0].base_offset > lowest
        if past:  # a compacted topic's cleaned batches are not a log start past it
            log.warning(
                "%s-%d: Kafka's log starts past %d: the transactions open at the cutover "
                "are read from %s",
                *(topic, partition, lowest, found[0].base_offset if found else end),
            )
        return found

    async def headers(
        self,
        topic: str,
        partition: int,
        start: int,
        end: int,
        timeout_s: float = TIMEOUT_S,
    ) -> Span:
        """The headers of the batches of `topic`-`partition` from the one holding `start`
        (or the first one past it, cleaned by compaction; or from Kafka's log start, if
        retention or DeleteRecords moved it past `start`) up to `end`, in order, and
        Kafka's log start as its last answer gave it. KafkaError when Kafka does not
        answer within `timeout_s`."""
        client = await self._connect()
        tp = TopicPartition(topic, partition)
        found: list[BatchHeader] = []
        position, log_start = start, -1
        deadline = time.monotonic() + timeout_s
        await client.add_topic(topic)
        while position < end:
            if time.monotonic() > deadline:
                raise KafkaError(f"{topic}-{partition}: Kafka's log [{position}, {end}) not read")
            leader = client.cluster.leader_for_partition(tp)
            if leader is None or leader < 0:
                await self._refresh(client, topic)
                continue
            request = LeaderFetchRequest(
                0, 1, PARTITION_MAX_BYTES, READ_UNCOMMITTED,
                [(topic, [(partition, position, PARTITION_MAX_BYTES)])],
            )  # fmt: skip
            try:
                response = await client.send(leader, request)
            except (KafkaError, OSError) as exc:
                log.info("%s-%d: reading Kafka's log below the cutover: %r", topic, partition, exc)
                await self._refresh(client, topic)
                continue
            [(_, [(_, error_code, _, *rest)])] = response.topics
            step = step_for(error_code)
            if step is Step.RESET:
                log_start = await list_offset(client, leader, topic, partition, EARLIEST)
                if log_start <= position:
                    raise KafkaError(f"{topic}-{partition}: offset {position} is out of range")
                position = log_start
                continue
            if step is not Step.READ:
                await self._refresh(client, topic)
                continue
            if len(rest) >= 4:  # version 5 on: (LSO, log start, aborted, records)
                log_start = int(rest[-3])
            batches, _ = whole_batches(rest[-1] or b"")
            if not batches:
                raise KafkaError(f"{topic}-{partition}: no batch at {position}, below {end}")
            for header, _batch in batches:
                if header.base_offset >= end:
                    return Span(found, log_start)
                if header.next_offset > position:
                    found.append(header)
            position = batches[-1][0].next_offset
        return Span(found, log_start)

    async def _connect(self) -> AIOKafkaClient:
        async with self._connecting:
            if self._client is None:
                settings = dict(self._settings)
                settings["client_id"] = f"{settings.get('client_id', 'tierproxy')},carried"
                client = AIOKafkaClient(**settings)
                try:
                    await start_client(Bootstrap(client))
                except BaseException:  # the next rebuild connects anew
                    with contextlib.suppress(Exception):
                        await client.close()
                    raise
                self._client = client
            return self._client

    @staticmethod
    async def _refresh(client: AIOKafkaClient, topic: str) -> None:
        await asyncio.sleep(RETRY_S)
        try:
            await client.add_topic(topic)
            await client.force_metadata_update()
        except KafkaError as exc:
            log.info("metadata of %s not refreshed: %r", topic, exc)


async def list_offset(
    client: AIOKafkaClient, leader: int, topic: str, partition: int, timestamp: int
) -> int:
    """ListOffsets (read_uncommitted) of one partition at its leader: EARLIEST (-2), LATEST
    (-1) or a timestamp. KafkaError for an error code or no answer."""
    request = OffsetRequest(-1, READ_UNCOMMITTED, [(topic, [(partition, timestamp)])])
    response = await client.send(leader, request)
    for _, partitions in response.topics:
        for _, error_code, _timestamp, offset, *_ in partitions:
            if error_code:
                raise KafkaError(f"ListOffsets of {topic}-{partition}: error {error_code}")
            return int(offset)
    raise KafkaError(f"ListOffsets of {topic}-{partition}: no answer")
