"""A starting proxy serves no client before its tiering service has started.

The broker listeners open early in `Proxy.start()` (the upstream refresh learns the
brokers and opens one per broker), before the tiering service has read its metadata. A
client of a restarted proxy reconnects to them at once (the fault-injection suite's
producers and consumer do); served then, a Produce to a tiered topic would be forwarded
to Kafka as passthrough, acknowledged there and never seen by a tiered reader, and an
OffsetForLeaderEpoch failed on the service's missing reads. Accepted connections wait
until the service has started.

The service's start is held here by a subclass that waits for the test before the real
start: the proxy, Kafka and the client are real.
"""

from __future__ import annotations

import asyncio
import uuid

import pytest
from cutover_load import proxy_config

from proxy.config import parse_config
from proxy.devstack.kafka import describe_brokers
from proxy.devstack.paths import free_port_block
from proxy.server import app
from proxy.tiered.service import TieringService

pytestmark = [pytest.mark.kafka]


async def test_broker_listener_serves_clients_only_once_tiering_started(
    kafka_cluster, tmp_path, monkeypatch
):
    release = asyncio.Event()

    class HeldStart(TieringService):
        async def start(self) -> None:
            await release.wait()
            await super().start()

    monkeypatch.setattr(app, "TieringService", HeldStart)
    suffix = uuid.uuid4().hex[:8]
    base = free_port_block(8)
    config = parse_config(proxy_config(kafka_cluster, tmp_path, "p", "zone-a", suffix, base))
    proxy = app.Proxy(config)
    starting = asyncio.create_task(proxy.start())
    try:
        for _ in range(300):  # the upstream refresh opens a listener per broker
            if 1 in proxy._servers:
                break
            await asyncio.sleep(0.05)
        port = proxy.bound_port(1)
        assert not starting.done()
        # accepted, not answered, while the tiering service starts
        with pytest.raises(TimeoutError):
            await asyncio.to_thread(describe_brokers, "127.0.0.1", port, 1.0)
        release.set()
        await asyncio.wait_for(starting, 60)
        brokers = await asyncio.to_thread(describe_brokers, "127.0.0.1", port, 10.0)
        assert sorted(brokers) == [1, 2, 3]
        assert {port for _, port in brokers.values()} == {base + 1, base + 2, base + 3}
    finally:
        release.set()
        if not starting.done():
            await asyncio.wait_for(starting, 60)
        await proxy.stop()
