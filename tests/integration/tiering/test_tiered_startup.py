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

A connection accepted even earlier, while the upstream refresh that opened the listeners
goes on and before the service exists, must be served as any other once it is: until
this test, the relay (which forwards requests needing nothing else from the readers'
callbacks) took the set of APIs it leaves to the tiered service from `proxy.tiering` as
it was when the connection was accepted, and relayed every later Fetch and Produce of
tiered partitions on such a connection to Kafka. The fault-injection suite's consumers
met it as OFFSET_OUT_OF_RANGE right after a proxy's restart (Kafka's log of the
partition ends at the cutover), and a producer as OUT_OF_ORDER_SEQUENCE_NUMBER.
"""

from __future__ import annotations

import asyncio
import datetime
import struct
import uuid

import pytest
from confluent_kafka import Producer
from cutover_load import create_topic, proxy_config, tiered_topic_id, topics_command, wait_owned
from kio.schema.fetch.v12.request import FetchPartition, FetchRequest, FetchTopic
from kio.schema.fetch.v12.response import FetchResponse
from kio.schema.metadata.v12.request import MetadataRequest, MetadataRequestTopic
from kio.static.primitive import i32, i64

from proxy.config import parse_config
from proxy.devstack.kafka import describe_brokers
from proxy.devstack.paths import free_port_block
from proxy.devstack.proxy_thread import ProxyThread
from proxy.kafka.messages import decode_response, encode_request
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


RECORDS = 20
CLIENT_ID = "early-client,tierproxy_az=zone-a"  # a zone: the relay takes its Fetches


def _tier_and_fill(config, topic: str) -> None:
    """A first life of the proxy: `topic` tiered from offset 0 and RECORDS records
    acknowledged into it; then a clean stop (its shards handed over, all uploaded)."""
    with ProxyThread(config) as first:
        wait_owned([first], 2)
        assert topics_command("tier", topic, first.proxy.tiering.peer_port).returncode == 0
        tiered_topic_id(first, topic)
        producer = Producer({"bootstrap.servers": first.proxy.bootstrap, "acks": "all"})
        for n in range(RECORDS):
            producer.produce(topic, value=b"v%d" % n, partition=0)
        assert producer.flush(30) == 0


async def _answer(reader, correlation_id: int) -> bytes:
    (size,) = struct.unpack(">i", await asyncio.wait_for(reader.readexactly(4), 30))
    frame = await asyncio.wait_for(reader.readexactly(size), 30)
    assert struct.unpack_from(">i", frame)[0] == correlation_id
    return frame


async def _metadata(reader, writer, topic: str, correlation_id: int) -> None:
    """A Metadata request, as every client sends first: forwarded to Kafka, so the
    connection has its upstream connection (the relay forwards only where it has one)."""
    message = MetadataRequest(
        topics=(MetadataRequestTopic(topic_id=None, name=topic),),
        allow_auto_topic_creation=False,
        include_topic_authorized_operations=False,
    )
    writer.write(encode_request(message, correlation_id, CLIENT_ID))
    await _answer(reader, correlation_id)


async def _fetch(reader, writer, topic: str, offset: int, correlation_id: int) -> tuple[int, int]:
    """(error code, high watermark) of partition 0 of `topic` from `offset`."""
    partition = FetchPartition(
        partition=i32(0), fetch_offset=i64(offset), partition_max_bytes=i32(1 << 20)
    )
    message = FetchRequest(
        max_wait=datetime.timedelta(0),
        min_bytes=i32(0),
        max_bytes=i32(1 << 20),
        topics=(FetchTopic(topic=topic, partitions=(partition,)),),
        forgotten_topics_data=(),
        rack_id="",
    )
    writer.write(encode_request(message, correlation_id, CLIENT_ID))
    _, answer = decode_response(await _answer(reader, correlation_id), FetchResponse)
    (data,) = answer.responses[0].partitions
    return int(data.error_code), int(data.high_watermark)


async def test_a_connection_accepted_before_the_tiered_service_exists_is_served_by_it(
    kafka_cluster, tmp_path
):
    suffix = uuid.uuid4().hex[:8]
    topic = f"early-{suffix}"
    create_topic(kafka_cluster, topic, 1)
    config = parse_config(
        proxy_config(kafka_cluster, tmp_path, "p", "zone-a", suffix, free_port_block(8))
    )
    await asyncio.to_thread(_tier_and_fill, config, topic)

    proxy = app.Proxy(config)
    refreshed, release = asyncio.Event(), asyncio.Event()
    refresh = proxy.refresh_upstream

    async def held_refresh() -> None:  # the listeners are open, the service not made yet
        await refresh()
        refreshed.set()
        await release.wait()

    proxy.refresh_upstream = held_refresh  # type: ignore[method-assign]
    starting = asyncio.create_task(proxy.start())
    writer = None
    try:
        await asyncio.wait_for(refreshed.wait(), 60)
        assert proxy.tiering is None
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy.bound_port(1))
        for _ in range(100):  # accepted (the accept callback runs on this loop)
            if proxy._connections:
                break
            await asyncio.sleep(0.01)
        assert proxy._connections
        release.set()
        await asyncio.wait_for(starting, 60)
        await _metadata(reader, writer, topic, 999)
        # Every Fetch from here is the relay's to forward if it takes it: the Metadata
        # answer gave the connection its upstream connection, and the client id is read.
        # Kafka's log of the partition ends at the cutover (0): relayed, Kafka answers 1
        # (OFFSET_OUT_OF_RANGE) where the proxy answers the records, once the shard is
        # claimed and the partition rebuilt.
        answer = (-1, -1)
        for n in range(300):
            answer = await _fetch(reader, writer, topic, RECORDS - 1, n)
            if answer == (0, RECORDS) or answer[0] == 1:
                break
            await asyncio.sleep(0.1)
        assert answer == (0, RECORDS)
        for n in range(1000, 1005):  # and it stays so
            assert await _fetch(reader, writer, topic, RECORDS - 1, n) == (0, RECORDS)
    finally:
        release.set()
        if writer is not None:
            writer.close()
        if not starting.done():
            await asyncio.wait_for(starting, 60)
        await proxy.stop()
