"""Tiered topics' configs, read from Kafka: one reader for retention and produce.

Kafka stays the control plane: a tiered topic's `retention.ms`, `cleanup.policy` and the
log cleaner's configs, `message.timestamp.type`,
`max.message.bytes`... are the upstream topic's, as DescribeConfigs resolves them (the
topic's override, else the broker's default). Each proxy reads them with one admin
client and keeps them `max_age_s`:

- retention (`retention.py`) and the log cleaner (`log_cleaner.py`) ask for their topics
  on every pass (`get`, `cleaner`), refreshing the stale ones first;
- the produce path (`produce_rules`) must not wait for Kafka on every request: it takes
  the cached rules at once and refreshes stale ones in the background; only a topic's
  first produce on this proxy waits for one DescribeConfigs (shared by the requests that
  arrive meanwhile). A topic Kafka does not describe (an error) has no rules: its
  produce is answered with a retriable error rather than guessed.

A change made through the fleet (AlterConfigs or IncrementalAlterConfigs through any
proxy: `config_changes.py`) is not waited for a minute: `changed` forgets the topic's
configs (every topic's for a broker's default), so its next produce reads them first, as
Kafka's leader applies the change before its next produce, give or take its replay of the
metadata log. A read under way when the change came is not kept, and whoever waited for
it reads again (at most CHANGED_READS times). A KRaft broker applies the change from the
metadata log after the controller answered, so the one describing the configs may not
have it yet: those read since are read again CHANGE_REREADS_S later, in one
DescribeConfigs.

The same admin client deletes Kafka's copy below a log start retention moved
(`delete_below`: DeleteRecords; retention.py).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Collection
from dataclasses import dataclass

from aiokafka.admin import AIOKafkaAdminClient, RecordsToDelete
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import KafkaConnectionError, KafkaError
from aiokafka.structs import TopicPartition

from proxy.cleaner.plan import CONFIG_KEYS as CLEANER_KEYS
from proxy.cleaner.plan import CleanerConfig, cleaner_config
from proxy.partition.produce_rules import CONFIG_KEYS as PRODUCE_KEYS
from proxy.partition.produce_rules import ProduceRules, produce_rules
from proxy.tiered.in_order import InOrder
from proxy.upkeep.retention_plan import CONFIG_KEYS as RETENTION_KEYS
from proxy.upkeep.retention_plan import RetentionConfig, retention_config

log = logging.getLogger("tierproxy.topic_configs")

CONFIG_MAX_AGE_S = 60.0  # topic configs are read again after this long
CHANGE_REREADS_S = (0.5, 2.0)  # a changed topic's configs are read again this long after
CHANGED_READS = 3  # reads of a topic whose configs changed while it was read, at most
CONFIG_KEYS = tuple(dict.fromkeys(RETENTION_KEYS + PRODUCE_KEYS + CLEANER_KEYS))


@dataclass(frozen=True, slots=True)
class _Entry:
    read_at: float  # time.monotonic()
    retention: RetentionConfig
    produce: ProduceRules
    cleaner: CleanerConfig


class TopicConfigs:
    """Topics' configs read from Kafka with an admin client, kept `max_age_s`."""

    def __init__(self, kafka_settings: dict, max_age_s: float = CONFIG_MAX_AGE_S) -> None:
        self._kafka = kafka_settings
        self.max_age_s = max_age_s
        self._admin: AIOKafkaAdminClient | None = None
        self._admin_lock = asyncio.Lock()
        self._cache: dict[str, _Entry] = {}
        self._reading: dict[str, asyncio.Task[list[str]]] = {}  # topic -> its DescribeConfigs
        self._queue = InOrder()  # per topic, the callers waiting for its first read
        # changes through the fleet (`changed`): per topic, and of every topic; a read
        # that began before a change does not keep what it read
        self._changes: dict[str, int] = {}
        self._all_changes = 0
        self._rereads: set[asyncio.TimerHandle] = set()
        self._others: set[asyncio.Task[list[str]]] = set()  # reads `changed` let go, rereads
        self._closed = False

    async def get(
        self, topics: Collection[str], *, refresh: bool = False
    ) -> dict[str, RetentionConfig]:
        """Each topic's retention config; a topic Kafka does not describe is left out."""
        return {t: entry.retention for t, entry in (await self._fresh(topics, refresh)).items()}

    async def cleaner(
        self, topics: Collection[str], *, refresh: bool = False
    ) -> dict[str, CleanerConfig]:
        """Each topic's log cleaner config, read as `get` reads retention's."""
        return {t: entry.cleaner for t, entry in (await self._fresh(topics, refresh)).items()}

    async def _fresh(self, topics: Collection[str], refresh: bool) -> dict[str, _Entry]:
        """The topics' entries, the stale ones (all with `refresh`) read again first."""
        now = time.monotonic()
        stale = [t for t in topics if refresh or self._stale(t, now)]
        for _ in range(CHANGED_READS):
            if not stale:
                break
            stale = await self._describe(stale)  # again those changed while read
        return {t: self._cache[t] for t in topics if t in self._cache}

    async def produce_rules(self, topic: str) -> ProduceRules | None:
        """The topic's produce rules: cached ones at once (a stale entry is refreshed in
        the background), else read now. None: Kafka did not describe the topic.

        Callers go on in the order they called, also while a first read is waited for:
        a partition's requests must reach its sequencer in the order they came, and a
        caller that found the rules cached must not overtake one still waiting."""
        entry = self._cache.get(topic)
        if entry is not None and not self._queue.busy(topic):
            if self._stale(topic, time.monotonic()):
                self._read_soon(topic)
            return entry.produce
        async with self._queue.turn(topic):
            for _ in range(CHANGED_READS):
                if topic in self._cache:
                    break
                change = self._change(topic)
                try:
                    await asyncio.shield(self._read_soon(topic))
                except (KafkaError, OSError, TimeoutError):
                    break  # logged by _read_done; no rules: the caller answers retriable
                except asyncio.CancelledError:  # the shared read, by close(): no rules
                    task = asyncio.current_task()
                    if task is not None and task.cancelling():
                        raise  # this caller's own
                    break
                if self._change(topic) == change:
                    break  # read, or not described: what Kafka said
        entry = self._cache.get(topic)
        return None if entry is None else entry.produce

    def changed(self, topics: Collection[str] | None) -> None:
        """These topics' configs (None: every topic's, a broker's default) were changed:
        read them again before the next produce, and CHANGE_REREADS_S later if they were
        read again by then (module docstring)."""
        if self._closed:
            return
        if topics is None:
            self._all_changes += 1
            topics = list(dict.fromkeys([*self._cache, *self._reading]))  # each once
            self._cache.clear()
            reads = list(self._reading.values())
            self._reading.clear()
        else:
            topics = list(topics)
            reads = []
            for topic in topics:
                self._changes[topic] = self._changes.get(topic, 0) + 1
                self._cache.pop(topic, None)
                read = self._reading.pop(topic, None)
                if read is not None:
                    reads.append(read)
        for task in reads:  # what it reads is not kept (_describe); closed with the rest
            self._keep(task)
        loop = asyncio.get_running_loop()
        self._rereads = {h for h in self._rereads if h.when() > loop.time()}  # those to come
        for delay in CHANGE_REREADS_S:
            self._rereads.add(loop.call_later(delay, self._reread, topics))

    def _reread(self, topics: list[str]) -> None:
        cached = [t for t in topics if t in self._cache]  # else the next produce reads it
        if cached and not self._closed:
            task = asyncio.create_task(self._describe(cached), name="configs read again")
            task.add_done_callback(lambda done: self._read_done(", ".join(cached), done))
            self._keep(task)

    def _keep(self, task: asyncio.Task[list[str]]) -> None:
        self._others.add(task)
        task.add_done_callback(self._others.discard)

    def _change(self, topic: str) -> int:
        return self._changes.get(topic, 0) + self._all_changes

    def _stale(self, topic: str, now: float) -> bool:
        entry = self._cache.get(topic)
        return entry is None or now - entry.read_at > self.max_age_s

    def _read_soon(self, topic: str) -> asyncio.Task[list[str]]:
        task = self._reading.get(topic)
        if task is None:
            task = asyncio.create_task(self._describe([topic]), name=f"configs of {topic}")
            self._reading[topic] = task
            task.add_done_callback(lambda done: self._read_done(topic, done))
        return task

    def _read_done(self, topic: str, task: asyncio.Task[list[str]]) -> None:
        if self._reading.get(topic) is task:
            del self._reading[topic]
        if not task.cancelled() and task.exception() is not None:
            log.warning("the configs of %s could not be read: %r", topic, task.exception())

    async def _admin_client(self) -> AIOKafkaAdminClient:
        async with self._admin_lock:
            if self._closed:  # a delete_below after close(): no client left behind
                raise KafkaConnectionError("the topic configs reader is closed")
            if self._admin is None:
                admin = AIOKafkaAdminClient(**self._kafka)
                try:
                    await admin.start()
                except BaseException:  # failed or cancelled (the proxy stopping): no leak
                    await admin.close()
                    raise
                self._admin = admin
            return self._admin

    async def delete_below(self, topic: str, partition: int, offset: int) -> int:
        """Kafka's records of the partition below `offset` deleted (DeleteRecords, sent to
        its leader); Kafka's low watermark after it. Raises what the admin client raises
        (a KafkaError for an error code, OSError, TimeoutError)."""
        admin = await self._admin_client()
        answer = await admin.delete_records(
            {TopicPartition(topic, partition): RecordsToDelete(offset)}
        )
        return answer[TopicPartition(topic, partition)]

    async def _describe(self, topics: list[str]) -> list[str]:
        """The topics' configs read and kept; those changed while they were read (not
        kept: what was read may be older than the change)."""
        if self._closed:  # a produce after close(): nothing read, no client left behind
            raise KafkaConnectionError("the topic configs reader is closed")
        now = time.monotonic()
        change = {topic: self._change(topic) for topic in topics}
        changed: list[str] = []
        admin = await self._admin_client()
        wanted = dict.fromkeys(CONFIG_KEYS)
        resources = [ConfigResource(ConfigResourceType.TOPIC, t, wanted) for t in topics]
        for response in await admin.describe_configs(resources):
            for error_code, message, _, name, entries in response.resources:
                if change.get(name, -1) != self._change(name):
                    changed.append(name)  # changed since this read began
                    continue
                if error_code != 0:
                    log.warning("configs of %s: DescribeConfigs: %s %s", name, error_code, message)
                    self._cache.pop(name, None)
                    continue
                values = {entry[0]: entry[1] for entry in entries}
                self._cache[name] = _Entry(
                    now, retention_config(values), produce_rules(values), cleaner_config(values)
                )
        return changed

    async def close(self) -> None:
        self._closed = True
        for handle in self._rereads:
            handle.cancel()
        self._rereads.clear()
        reading, self._reading = [*self._reading.values(), *self._others], {}
        for task in reading:
            task.cancel()
        await asyncio.gather(*reading, return_exceptions=True)
        async with self._admin_lock:  # one being started is kept first, then closed here
            admin, self._admin = self._admin, None
        if admin is not None:
            await admin.close()
