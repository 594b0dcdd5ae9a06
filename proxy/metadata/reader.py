"""Follows one partition of the fleet's metadata topic (docs/metadata.md, "The Kafka
adapter"): a `ShardReader` reads it with read_committed into a `MetadataState`. Every proxy
runs one per shard; every `ShardOwner` (metastore.py) has its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import KafkaError

from proxy.metadata.client_start import start_client
from proxy.metadata.rules import Outcome, Verdict
from proxy.metadata.state import MetadataState

log = logging.getLogger("tierproxy.metadata")


class ShardReader:
    """Partition `shard` of the metadata topic, followed with read_committed into `state`.

    One task reads and applies; `state` holds every record below the consumer's position.
    Any number of callers may wait in `caught_up`, `read_to_end` or `read_to`."""

    def __init__(
        self,
        kafka_settings: dict,
        topic: str,
        shard: int,
        shard_count: int,
        *,
        on_record: Callable[[int, Verdict], None] | None = None,
        recheck_s: float = 0.05,
        fetch_max_wait_ms: int = 500,
    ) -> None:
        self.state = MetadataState(shard, shard_count)
        self.topic = topic
        self.shard = shard
        self._kafka = kafka_settings
        self._tp = TopicPartition(topic, shard)
        self._on_record = on_record
        self._recheck_s = recheck_s
        self._fetch_max_wait_ms = fetch_max_wait_ms
        self._consumer: AIOKafkaConsumer | None = None
        self._task: asyncio.Task[None] | None = None
        self._progress = asyncio.Event()
        self._end_at_start = 0

    async def start(self) -> None:
        consumer = AIOKafkaConsumer(
            **self._kafka,
            group_id=None,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            isolation_level="read_committed",
            fetch_max_wait_ms=self._fetch_max_wait_ms,
        )
        self._consumer = consumer
        await start_client(consumer)
        consumer.assign([self._tp])
        await consumer.seek_to_beginning(self._tp)
        self._end_at_start = await self._end()
        self._task = asyncio.create_task(self._follow(), name=f"metadata-reader-{self.shard}")

    async def caught_up(self) -> None:
        """Wait until the state holds everything committed when the reader started."""
        await self.read_to(self._end_at_start)

    async def read_to_end(self) -> int:
        """Wait until the state holds everything committed now; returns that end offset
        (the last stable offset: no open transaction is below it)."""
        end = await self._end()
        await self.read_to(end)
        return end

    async def read_to(self, offset: int) -> None:
        """Wait until every record below `offset` is applied, or skipped (aborted, a
        transaction marker, compacted away)."""
        assert self._consumer is not None, "start the reader first"
        while self.state.next_offset < offset:
            if self._task is None or self._task.done():
                raise RuntimeError(f"the reader of metadata shard {self.shard} stopped")
            if await self._consumer.position(self._tp) >= offset:
                return
            progress = self._progress  # set by the next getmany; markers move no state
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._recheck_s):
                    await progress.wait()

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if self._consumer is not None:
            await self._consumer.stop()

    async def _end(self) -> int:
        assert self._consumer is not None
        return (await self._consumer.end_offsets([self._tp]))[self._tp]

    async def _follow(self) -> None:
        assert self._consumer is not None
        while True:
            try:
                batches = await self._consumer.getmany(self._tp, timeout_ms=1000)
            except KafkaError as exc:
                log.warning("reading metadata shard %d: %s; retrying", self.shard, exc)
                await asyncio.sleep(1.0)
                continue
            # applied in the step that moved the consumer's position: `read_to` relies on it
            for record in batches.get(self._tp, ()):
                verdict = self.state.apply(record.key or b"", record.value, record.offset)
                if verdict.outcome is Outcome.REFUSE:
                    log.info(
                        "metadata shard %d offset %d refused: %s",
                        self.shard,
                        record.offset,
                        verdict.reason,
                    )
                if self._on_record is not None:
                    self._on_record(record.offset, verdict)
            self._progress.set()
            self._progress = asyncio.Event()
