"""The proxy process: its listeners, its view of the upstream cluster, its metrics.

A bootstrap listener plus one listener per upstream broker (`broker_port_base + id`).
A client connection on broker N's listener is served by its own connection to broker N,
so per-connection state that Kafka keeps (SASL authentication, in-flight ordering,
throttling) is the client's own. The bootstrap listener picks any live broker.

Every proxy listens for every broker; which proxy a client is sent to for broker N is
the fleet's decision (`routing.router`): one of the live proxies of the client's zone,
the same answer from every member (`server.membership` keeps the fleet view).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import random
import time
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager

from proxy.admin.api import AdminServer
from proxy.apis.api03_metadata import TopicsAnswer
from proxy.apis.api18_api_versions import (
    common_ranges,
    encode_api_versions_response,
    intersect,
    proxy_supported_ranges,
)
from proxy.config import ProxyConfig
from proxy.lifecycle import run_connection, start_or_undo
from proxy.metadata.client_start import forbid_topic_auto_creation
from proxy.metrics import ProxyMetrics, serve_metrics
from proxy.peer.codec import PROTOCOL as PEER_PROTOCOL
from proxy.routing.brokers import BrokerDirectory, UpstreamBroker
from proxy.routing.fleet import FleetView, Heartbeat, Member
from proxy.routing.router import ZoneRouter
from proxy.routing.zones import CidrZones
from proxy.server.connection import ClientConnection
from proxy.server.control import ControlConnection, FrameStreams, SaslFailed, Send
from proxy.server.frame_reader import BufferedFrameReader, FrameProtocol
from proxy.server.membership import Membership, kafka_settings
from proxy.server.tls import client_context, server_context
from proxy.tiered.metrics import TieringMetrics
from proxy.tiered.service import TieringService

log = logging.getLogger("tierproxy.proxy")
# No cap: Fetch v16+ answers stream through, walked for their trailing node endpoints
# (fetch_stream.py); Produce answers are small, read whole and rewritten.
_VERSION_CAPS: dict[int, int] = {}


class Proxy:
    def __init__(self, config: ProxyConfig) -> None:
        self.config = config
        self.metrics = ProxyMetrics()
        # Sees every byte sent to clients (tests use it to prove no upstream address leaks).
        self.tap: Callable[[bytes], None] | None = None
        self.brokers = BrokerDirectory(
            config.listeners.broker_port_base,
            on_new_broker=self._on_new_broker,
        )

        self._upstream_ranges: dict[int, tuple[int, int]] | None = None
        self._api_ranges: dict[int, tuple[int, int]] = {}
        self._api_versions_bodies: dict[int, bytes] = {}  # version -> encoded answer body
        self._servers: dict[int | None, asyncio.Server] = {}
        self._listening: dict[int | None, asyncio.Task[None]] = {}
        self._connections: set[asyncio.Task[None]] = set()
        self._refresh_task: asyncio.Task[None] | None = None
        # Broker listeners open while start() runs (refresh_upstream); a client served
        # before tiering has started would have a tiered topic's Produce forwarded to
        # Kafka, where no tiered reader sees it. Accepted connections wait for this.
        self._serving = asyncio.Event()
        self._server_ssl = server_context(config.listeners.tls)
        self._upstream_ssl = client_context(config.upstream.tls)
        self.control = ControlConnection(
            config.upstream, config.limits.buffer_bytes, self.brokers, self._upstream_ssl
        )
        listeners, fleet = config.listeners, config.fleet
        self.fleet = FleetView(
            Member(
                fleet.name,
                fleet.zone,
                listeners.advertised_host,
                listeners.bootstrap_port or 1,  # the bound port, once bound
                listeners.broker_port_base,
            ),
            fleet.member_timeout_s,
        )
        self.router = ZoneRouter(self.fleet, config.routing.placement_epsilon)
        cidr_zones = config.routing.cidr_zones
        self.cidr_zones = CidrZones(cidr_zones) if cidr_zones else None
        self.started_at = time.time()
        self._membership: Membership | None = None
        self._metrics_server = None
        self.tiering: TieringService | None = None  # set when config.tiering.enabled
        self._tiering_metrics: TieringMetrics | None = None
        self.admin: AdminServer | None = None  # admin/api.py, when admin.port is set
        self.upstream_error: str | None = None  # why the last upstream refresh failed
        self._stopped = False

    # -- lifecycle ---------------------------------------------------------------------

    async def start(self) -> None:
        """Start the parts in order: listeners per broker, tiering, the bootstrap
        listener, membership, metrics and admin servers. A step that fails (or a cancel)
        stops what was started before it (`stop()` undoes any prefix of the start) and
        the error is raised. Its tasks' aiokafka clients create no topic (client_start.py)."""
        forbid_topic_auto_creation()
        await start_or_undo(self._start, self.stop)

    async def _start(self) -> None:
        await self.refresh_upstream()  # opens a listener per broker it learns of
        if self.config.tiering.enabled:  # before clients come: it counts their Produce
            self.tiering = TieringService(self, kafka_settings(self.config, self._upstream_ssl))
            await self.tiering.start()
            self._tiering_metrics = TieringMetrics(self.metrics.registry)
            self._tiering_metrics.attach(self.tiering)
        self._serving.set()
        await self._listen(None, self.config.listeners.bootstrap_port)
        await asyncio.gather(*self._listening.values())
        self._set_self_port(self.bound_port(None))
        if self.config.fleet.membership == "kafka":
            self._membership = Membership(
                self.config, self.fleet, self.heartbeat, self._fleet_changed, self._upstream_ssl
            )
            await self._membership.start()
        self._fleet_changed()
        if self.config.metrics.port:
            self._metrics_server = serve_metrics(
                self.metrics, self.config.metrics.bind_host, self.config.metrics.port
            )
        if self.config.admin.enabled:
            self.admin = AdminServer(self, self.control.topics)
            await self.admin.start()
        self._refresh_task = asyncio.create_task(self._refresh_forever())

    def heartbeat(self) -> Heartbeat:
        """What this proxy tells the fleet about itself."""
        tiering = self.tiering
        return Heartbeat(
            self.fleet.self_member,
            self.started_at,
            self.metrics.zone_bytes_totals(),
            peer_port=tiering.advertised_peer_port if tiering is not None else 0,
            drained=tiering.drained() if tiering is not None else frozenset(),
            uploader_lag=tiering.uploader_lag() if tiering is not None else None,
            peer_protocol=PEER_PROTOCOL,
        )

    def _set_self_port(self, port: int) -> None:
        member = self.fleet.self_member
        if member.bootstrap_port != port:
            self.fleet.self_member = dataclasses.replace(member, bootstrap_port=port)
            self.fleet.expire(time.time())

    def _fleet_changed(self) -> None:
        zones: dict[str, int] = {}
        for member in self.fleet.live():
            zones[member.zone] = zones.get(member.zone, 0) + 1
        self.metrics.fleet_members.clear()
        for zone, count in zones.items():
            self.metrics.fleet_members.labels(zone).set(count)

    async def stop(self) -> None:
        """Stop what `start` started, each part only if it got that far (so it undoes a
        start that failed midway); once: a second call does nothing. The order is the
        start's reversed, but the listeners close last and the metrics server after
        tiering: clients are served, and watched, while tiering hands its shards over."""
        if self._stopped:
            return
        self._stopped = True
        if self.admin is not None:
            await self.admin.close()
        if self._membership is not None:  # leave first, so peers stop sending clients here
            await self._membership.stop()
        if self.tiering is not None:  # hands its shards over, everything uploaded
            await self.tiering.stop()
        if self._tiering_metrics is not None:
            self._tiering_metrics.close()
        if self._metrics_server is not None:
            await asyncio.to_thread(self._metrics_server.shutdown)
            self._metrics_server.server_close()
        for server in self._servers.values():
            server.close()
        # Every accepted connection is in _connections from the moment it is accepted.
        refresh = [self._refresh_task] if self._refresh_task is not None else []
        tasks = refresh + list(self._listening.values()) + list(self._connections)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for server in list(self._servers.values()):
            server.close()  # again: a listener may have opened while the tasks ended
            await server.wait_closed()  # uvloop's waits for every accepted connection

    async def __aenter__(self) -> Proxy:
        await self.start()  # a start that fails undoes itself before it raises
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    @property
    def bootstrap(self) -> str:
        host = self.config.listeners.advertised_host
        return f"{host}:{self.bound_port(None)}"

    def bound_port(self, node_id: int | None) -> int:
        return self._servers[node_id].sockets[0].getsockname()[1]

    # -- listeners -----------------------------------------------------------------------

    async def _listen(self, node_id: int | None, port: int) -> None:
        if node_id in self._servers:
            return
        name = "bootstrap" if node_id is None else f"broker-{node_id}"
        limits = self.config.limits

        async def serve(connection: ClientConnection) -> None:
            try:
                await self._serving.wait()
                await connection.serve()
            except asyncio.CancelledError:
                pass  # the proxy is stopping; ending quietly keeps asyncio from logging it

        def accept(reader: BufferedFrameReader, writer: asyncio.StreamWriter) -> None:
            # A plain callback, not a coroutine: stop() cancels the connection even if its
            # task never got to run (proxy.lifecycle.run_connection).
            writer.transport.set_write_buffer_limits(high=limits.buffer_bytes)
            connection = ClientConnection(self, reader, writer, node_id, name)
            run_connection(self._connections, writer, serve(connection))

        self._servers[node_id] = await asyncio.get_running_loop().create_server(
            lambda: FrameProtocol(limits.buffer_bytes, accept),
            self.config.listeners.bind_host,
            port,
            ssl=self._server_ssl,
            reuse_address=True,
            # workers: N, every worker binds the same client ports (config/workers.py)
            reuse_port=self.config.workers > 1,
        )
        log.info("listening for %s on %s:%d", name, self.config.listeners.bind_host, port)

    def _on_new_broker(self, broker: UpstreamBroker) -> None:
        """A broker first heard of in a response: open its listener before clients come."""
        self.router.add_broker(broker.node_id)
        if broker.node_id in self._servers or broker.node_id in self._listening:
            return
        port = self.brokers.proxy_port(broker.node_id)
        task = asyncio.get_running_loop().create_task(self._listen(broker.node_id, port))
        self._listening[broker.node_id] = task

        def done(task: asyncio.Task[None]) -> None:
            self._listening.pop(broker.node_id, None)
            if not task.cancelled() and task.exception() is not None:
                log.error("cannot listen for broker %d: %s", broker.node_id, task.exception())

        task.add_done_callback(done)

    # -- upstream --------------------------------------------------------------------------

    def upstream_address_for(self, node_id: int | None) -> tuple[int | None, str, int]:
        """(node id, host, port) of the broker to serve a connection for `node_id`; for
        the bootstrap listener (None) a broker of the proxy's own zone if there is one, so
        a client's first requests do not cross zones either."""
        if node_id is not None:
            broker = self.brokers.upstream(node_id)
            if broker is None:
                raise OSError(f"upstream broker {node_id} is not known (yet)")
            return broker.node_id, broker.host, broker.port
        known = self.brokers.brokers()
        local = [b for b in known if b.rack == self.fleet.self_member.zone]
        if local or known:
            broker = random.choice(local or known)
            return broker.node_id, broker.host, broker.port
        host, port = random.choice(self.config.upstream.bootstrap)
        return None, host, port

    async def open_upstream(self, host: str, port: int) -> FrameStreams:
        """A connection to a broker, for a client connection (tests wrap this to count
        the connections clients cause)."""
        return await self.control.open_frames(host, port)

    def api_ranges(self) -> dict[int, tuple[int, int]]:
        return self._api_ranges

    def api_versions_body(self, api_version: int) -> bytes:
        """The body of the proxy's ApiVersions answer, encoded once per upstream refresh:
        every client asks first thing, and encoding it costs about half a millisecond."""
        body = self._api_versions_bodies.get(api_version)
        if body is None:
            body = encode_api_versions_response(api_version, self._api_ranges)
            self._api_versions_bodies[api_version] = body
        return body

    async def refresh_upstream(self) -> None:
        """Ask upstream for its API versions and brokers, through each bootstrap address
        in turn until one answers. On a SASL listener the proxy authenticates with
        `upstream.sasl`; without it, Metadata is refused and brokers are learnt from
        client traffic instead. Refused credentials raise SaslFailed at once."""
        errors = []
        for host, port in self.control.candidates():
            try:
                await self._query_upstream(host, port)
                self.upstream_error = None
                return
            except SaslFailed:
                raise
            except (TimeoutError, OSError, asyncio.IncompleteReadError) as exc:
                errors.append(f"{host}:{port}: {exc or exc.__class__.__name__}")
        self.upstream_error = "; ".join(errors)
        if self._upstream_ranges is None:
            raise ConnectionError("no upstream broker answered: " + "; ".join(errors))
        log.warning("upstream refresh failed: %s", "; ".join(errors))

    async def _query_upstream(self, host: str, port: int) -> None:
        first, brokers = await self.control.survey(host, port)
        if brokers is not None:
            for node_id, broker_host, broker_port, rack in brokers:
                self.brokers.learn(node_id, broker_host, broker_port, rack)
            self.router.set_brokers({node_id for node_id, *_ in brokers})
        others = [b for b in self.brokers.brokers() if (b.host, b.port) != (host, port)]
        answers = await asyncio.gather(
            *(self.control.api_versions_of(b.host, b.port) for b in others),
            return_exceptions=True,
        )
        ranges = [first] + [answer for answer in answers if isinstance(answer, dict)]
        self._set_upstream_ranges(common_ranges(ranges))

    async def describe_topics(self, names: list[str]) -> TopicsAnswer:
        """What Kafka says of upstream topics, and which cluster (`ControlConnection`)."""
        return await self.control.describe_topics(names)

    async def partition_leader_epochs(self, name: str) -> dict[int, int]:
        """{partition: leader epoch} of an upstream topic (`ControlConnection`)."""
        return await self.control.partition_leader_epochs(name)

    def at_leader(self, topic: str, partition: int) -> AbstractAsyncContextManager[Send]:
        """A connection of the proxy's own to a partition's leader (`ControlConnection`)."""
        return self.control.at_leader(topic, partition)

    def _set_upstream_ranges(self, upstream: dict[int, tuple[int, int]]) -> None:
        self._upstream_ranges = upstream
        self._api_ranges = intersect(upstream, proxy_supported_ranges(), _VERSION_CAPS)
        self._api_versions_bodies = {}

    async def _refresh_forever(self) -> None:
        while True:
            await asyncio.sleep(self.config.upstream.metadata_refresh_s)
            try:
                await self.refresh_upstream()
            except ConnectionError as exc:
                log.warning("%s", exc)
