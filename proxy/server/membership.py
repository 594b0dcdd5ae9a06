"""Fleet membership through the upstream Kafka: the asyncio adapter of `routing.fleet`.

Each proxy produces its heartbeat to a one-partition compacted topic every
`fleet.heartbeat_interval_s` and consumes the whole topic (no consumer group: every
member reads every record). At start it reads the topic to its end before serving, so
its first answers already know the fleet. Records read during that catch-up are aged
by their timestamp (the broker's LogAppendTime); records arriving afterwards count as
seen when they arrive, so a proxy whose clock is off does not misjudge its peers.
A clean stop writes a tombstone; a crash is noticed `member_timeout_s` later.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import KafkaError
from kio.schema.errors import ErrorCode

from proxy.config import ProxyConfig
from proxy.routing.fleet import FleetView, Heartbeat, HeartbeatError, decode_heartbeat
from proxy.routing.fleet import encode_heartbeat as encode

log = logging.getLogger("tierproxy.fleet")


class Membership:
    def __init__(
        self,
        config: ProxyConfig,
        view: FleetView,
        heartbeat: Callable[[], Heartbeat],
        on_change: Callable[[], None],
        ssl_context=None,
    ) -> None:
        self.config = config
        self.view = view
        self._heartbeat = heartbeat
        self._on_change = on_change
        self._kafka = kafka_settings(config, ssl_context)
        self._topic = TopicPartition(config.fleet.topic, 0)
        self._producer: AIOKafkaProducer | None = None
        self._consumer: AIOKafkaConsumer | None = None
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        """Join: create the topic if needed, read it to its end, send a first heartbeat.
        ConnectionError (an OSError, as for the proxy's other upstream failures) if the
        upstream cannot be used for membership."""
        try:
            await self._join()
        except (KafkaError, TimeoutError) as exc:
            await self._stop_joining()
            raise ConnectionError(
                f"fleet membership through topic {self._topic.topic}: {exc!r}"
            ) from None
        except BaseException:  # cancelled, or another failure: nothing is left running
            await self._stop_joining()
            raise

    async def _stop_joining(self) -> None:
        """Undo a join that failed: no leave is sent (the first heartbeat may not be)."""
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        await self._close_clients()

    async def _join(self) -> None:
        await self._create_topic()
        self._producer = AIOKafkaProducer(**self._kafka, acks=1, linger_ms=0)
        self._consumer = AIOKafkaConsumer(
            **self._kafka, group_id=None, enable_auto_commit=False, auto_offset_reset="earliest"
        )
        await self._producer.start()
        await self._consumer.start()
        self._consumer.assign([self._topic])
        await self._consumer.seek_to_beginning(self._topic)
        await self._send_heartbeat()
        timeout = self.config.upstream.connect_timeout_s
        async with asyncio.timeout(timeout):
            await self._catch_up()
        self._tasks = [
            asyncio.create_task(self._beat_forever(), name="fleet-heartbeat"),
            asyncio.create_task(self._read_forever(), name="fleet-reader"),
        ]
        log.info(
            "fleet member %s in zone %s; live: %s",
            self.view.self_member.name,
            self.view.self_member.zone,
            ", ".join(f"{m.name} ({m.zone})" for m in self.view.live()),
        )

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._producer is not None:
            try:
                async with asyncio.timeout(self.config.upstream.connect_timeout_s):
                    await self._producer.send_and_wait(
                        self._topic.topic, key=self.view.self_member.name.encode(), value=None
                    )
            except (KafkaError, TimeoutError, OSError) as exc:
                log.warning("could not leave the fleet cleanly: %s", exc)
        await self._close_clients()

    async def _close_clients(self) -> None:
        for client in (self._consumer, self._producer):
            if client is not None:
                await client.stop()
        self._consumer = self._producer = None

    # -- the loops -----------------------------------------------------------------------

    async def _beat_forever(self) -> None:
        interval = self.config.fleet.heartbeat_interval_s
        forget_after = self.config.fleet.forget_after_s
        while True:
            await asyncio.sleep(interval)
            try:
                async with asyncio.timeout(max(interval, 1.0) * 5):
                    await self._send_heartbeat()
                    for name in self.view.forgettable(time.time(), forget_after):
                        log.info(
                            "forgetting fleet member %s, silent for %.0f s", name, forget_after
                        )
                        await self._producer.send_and_wait(
                            self._topic.topic, key=name.encode(), value=None
                        )
            except (KafkaError, TimeoutError, OSError) as exc:
                # Keep beating: others drop this proxy only if it stays silent.
                log.warning("fleet heartbeat failed: %r", exc)
            if self.view.expire(time.time()):
                self._changed()

    async def _read_forever(self) -> None:
        assert self._consumer is not None
        while True:
            try:
                batches = await self._consumer.getmany(timeout_ms=200)
            except KafkaError as exc:  # e.g. the topic's leader moving: try again
                log.warning("reading the fleet topic failed: %r", exc)
                await asyncio.sleep(self.config.fleet.heartbeat_interval_s)
                continue
            self._apply(batches, catching_up=False)

    async def _catch_up(self) -> None:
        assert self._consumer is not None
        end = (await self._consumer.end_offsets([self._topic]))[self._topic]
        while await self._consumer.position(self._topic) < end:
            batches = await self._consumer.getmany(self._topic, timeout_ms=200)
            self._apply(batches, catching_up=True)

    def _apply(self, batches: dict, catching_up: bool) -> None:
        changed_before = self.view.version
        now = time.time()
        for records in batches.values():
            for record in records:
                if record.key is None:
                    continue
                name = record.key.decode(errors="replace")
                sent_at = record.timestamp / 1000 if catching_up else now
                if record.value is None:
                    self.view.observe(name, None, sent_at, now)
                    continue
                try:
                    heartbeat = decode_heartbeat(record.value)
                except HeartbeatError as exc:
                    log.warning("ignoring fleet record %d of %s: %s", record.offset, name, exc)
                    continue
                self.view.observe(name, heartbeat, sent_at, now)
        if self.view.version != changed_before:
            self._changed()

    def _changed(self) -> None:
        log.info(
            "fleet changed; live: %s",
            ", ".join(f"{m.name} ({m.zone})" for m in self.view.live()),
        )
        self._on_change()

    async def _send_heartbeat(self) -> None:
        assert self._producer is not None
        heartbeat = self._heartbeat()
        await self._producer.send_and_wait(
            self._topic.topic, key=heartbeat.member.name.encode(), value=encode(heartbeat)
        )

    async def _create_topic(self) -> None:
        admin = AIOKafkaAdminClient(**self._kafka)
        try:
            await admin.start()  # inside: a start that fails leaves connections to close
            brokers = len((await admin.describe_cluster())["brokers"])
            topic = NewTopic(
                self._topic.topic,
                num_partitions=1,
                replication_factor=min(3, max(1, brokers)),
                topic_configs={
                    "cleanup.policy": "compact",
                    "message.timestamp.type": "LogAppendTime",
                    "min.compaction.lag.ms": "0",
                    "segment.ms": "3600000",
                },
            )
            response = await admin.create_topics([topic])
            for entry in getattr(response, "topic_errors", None) or response.topics:
                error_code = entry[1] if isinstance(entry, tuple) else entry.error_code
                if error_code not in (0, ErrorCode.topic_already_exists):
                    raise ConnectionError(
                        f"cannot create the fleet topic {self._topic.topic}: error {error_code}"
                    )
        finally:
            await admin.close()


def kafka_settings(config: ProxyConfig, ssl_context) -> dict:
    """aiokafka settings for the proxy's own clients: upstream bootstrap, TLS and SASL."""
    upstream = config.upstream
    settings: dict = {
        "bootstrap_servers": [f"{host}:{port}" for host, port in upstream.bootstrap],
        "client_id": f"tierproxy-fleet,tierproxy_az={config.fleet.zone}",
        "request_timeout_ms": int(upstream.connect_timeout_s * 1000) + 5000,
    }
    tls = ssl_context is not None
    if upstream.sasl is not None:
        settings.update(
            security_protocol="SASL_SSL" if tls else "SASL_PLAINTEXT",
            sasl_mechanism=upstream.sasl.mechanism,
            sasl_plain_username=upstream.sasl.username,
            sasl_plain_password=upstream.sasl.password,
        )
    elif tls:
        settings["security_protocol"] = "SSL"
    if tls:
        settings["ssl_context"] = ssl_context
    return settings
