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
import struct
import time
import uuid
from collections.abc import Callable, Iterable

from kio.schema.api_versions.v3.request import ApiVersionsRequest
from kio.schema.metadata.v12.request import MetadataRequest, MetadataRequestTopic
from kio.schema.sasl_authenticate.v2.request import SaslAuthenticateRequest
from kio.schema.sasl_handshake.v1.request import SaslHandshakeRequest

from proxy.admin.api import AdminServer
from proxy.apis.api03_metadata import read_brokers, read_partition_leaders, read_topics
from proxy.apis.api18_api_versions import (
    ApiVersionsError,
    common_ranges,
    encode_api_versions_response,
    intersect,
    parse_api_versions_response,
    proxy_supported_ranges,
)
from proxy.config import ProxyConfig
from proxy.kafka.frames import FrameError
from proxy.kafka.headers import response_header_size
from proxy.kafka.messages import encode_request
from proxy.kafka.sasl import (
    SaslError,
    ScramClient,
    parse_authenticate_response,
    parse_handshake_response,
    plain_message,
)
from proxy.metrics import ProxyMetrics, serve_metrics
from proxy.peer.codec import PROTOCOL as PEER_PROTOCOL
from proxy.routing.brokers import BrokerDirectory, UpstreamBroker
from proxy.routing.fleet import FleetView, Heartbeat, Member
from proxy.routing.router import ZoneRouter
from proxy.routing.zones import CidrZones
from proxy.server.connection import ClientConnection
from proxy.server.lifecycle import start_or_undo
from proxy.server.membership import Membership, kafka_settings
from proxy.server.tls import client_context, server_context
from proxy.tiered.metrics import TieringMetrics
from proxy.tiered.service import TieringService

log = logging.getLogger("tierproxy.proxy")
# No cap: Fetch v16+ answers stream through, walked for their trailing node endpoints
# (fetch_stream.py); Produce answers are small, read whole and rewritten.
_VERSION_CAPS: dict[int, int] = {}
_SIZE = struct.Struct(">i")


class SaslFailed(ConnectionError):
    """The proxy's own credentials (`upstream.sasl`) were refused: a configuration error."""


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
        self.admin: AdminServer | None = None  # admin_api.py, when admin.port is set
        self.upstream_error: str | None = None  # why the last upstream refresh failed
        self._stopped = False

    # -- lifecycle ---------------------------------------------------------------------

    async def start(self) -> None:
        """Start the parts in order: listeners per broker, tiering, the bootstrap
        listener, membership, metrics and admin servers. A step that fails (or a cancel)
        stops what was started before it (`stop()` undoes any prefix of the start) and
        the error is raised."""
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
            self.admin = AdminServer(self)
            await self.admin.start()
        self._refresh_task = asyncio.create_task(self._refresh_forever())

    def heartbeat(self) -> Heartbeat:
        """What this proxy tells the fleet about itself."""
        tiering = self.tiering
        return Heartbeat(
            self.fleet.self_member,
            self.started_at,
            self.metrics.zone_bytes_totals(),
            peer_port=tiering.peer_port if tiering is not None else 0,
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
        try:
            await self.start()
        except BaseException:  # start undid itself; stopping again is a no-op
            await self.stop()
            raise
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

        def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            # A plain callback, not a coroutine: the connection is registered as it is
            # accepted, so stop() cancels it even if its task never got to run (a task
            # cancelled before its first step runs no `finally`: the abort below).
            writer.transport.set_write_buffer_limits(high=limits.buffer_bytes)
            connection = ClientConnection(self, reader, writer, node_id, name)
            task = asyncio.get_running_loop().create_task(serve(connection))
            self._connections.add(task)

            def done(task: asyncio.Task[None]) -> None:
                self._connections.discard(task)
                if not writer.transport.is_closing():
                    writer.transport.abort()

            task.add_done_callback(done)

        self._servers[node_id] = await asyncio.start_server(
            accept,
            self.config.listeners.bind_host,
            port,
            ssl=self._server_ssl,
            limit=limits.buffer_bytes,
            reuse_address=True,
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

    async def open_upstream(
        self, host: str, port: int
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        limits = self.config.limits
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(
                host,
                port,
                ssl=self._upstream_ssl,
                server_hostname=host if self._upstream_ssl else None,
                limit=limits.buffer_bytes,
            ),
            self.config.upstream.connect_timeout_s,
        )
        writer.transport.set_write_buffer_limits(high=limits.buffer_bytes)
        return reader, writer

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
        for host, port in self._bootstrap_candidates():
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

    def _bootstrap_candidates(self) -> Iterable[tuple[str, int]]:
        seen = [(b.host, b.port) for b in self.brokers.brokers()]
        return seen + [a for a in self.config.upstream.bootstrap if a not in seen]

    async def _query_upstream(self, host: str, port: int) -> None:
        reader, writer = await self.open_upstream(host, port)
        try:
            ranges = [await self._api_versions(reader, writer)]
            if self.config.upstream.sasl is not None:
                await asyncio.wait_for(
                    self._authenticate(reader, writer), self.config.upstream.connect_timeout_s
                )
            try:
                metadata = await asyncio.wait_for(
                    _call(reader, writer, _METADATA_REQUEST),
                    self.config.upstream.connect_timeout_s,
                )
            except (asyncio.IncompleteReadError, ConnectionError):
                log.info("upstream %s:%d refused Metadata (authentication needed?)", host, port)
                metadata = None
        finally:
            await _close_stream(writer, self.config.upstream.connect_timeout_s)
        if metadata is not None:
            # Read by hand (kio's reader is kept off network bytes), racks included: a
            # broker's rack is its zone, for the byte accounting and the bootstrap choice.
            try:
                brokers = read_brokers(_METADATA_REQUEST.__version__, metadata)
            except FrameError as exc:
                raise OSError(f"upstream Metadata: {exc}") from None
            for node_id, broker_host, broker_port, rack in brokers:
                self.brokers.learn(node_id, broker_host, broker_port, rack)
            self.router.set_brokers({node_id for node_id, *_ in brokers})
        others = [b for b in self.brokers.brokers() if (b.host, b.port) != (host, port)]
        answers = await asyncio.gather(
            *(self._api_versions_of(b.host, b.port) for b in others), return_exceptions=True
        )
        ranges += [answer for answer in answers if isinstance(answer, dict)]
        self._set_upstream_ranges(common_ranges(ranges))

    async def _api_versions_of(self, host: str, port: int) -> dict[int, tuple[int, int]]:
        reader, writer = await self.open_upstream(host, port)
        try:
            return await self._api_versions(reader, writer)
        finally:
            await _close_stream(writer, self.config.upstream.connect_timeout_s)

    async def _api_versions(self, reader, writer) -> dict[int, tuple[int, int]]:
        body = await asyncio.wait_for(
            _call(reader, writer, _API_VERSIONS_REQUEST), self.config.upstream.connect_timeout_s
        )
        try:
            return parse_api_versions_response(_API_VERSIONS_REQUEST.__version__, body)
        except (ApiVersionsError, FrameError) as exc:
            raise OSError(f"upstream ApiVersions: {exc}") from None

    async def _authenticate(self, reader, writer) -> None:
        """SASL on the proxy's own control connection (`upstream.sasl`); SaslFailed names
        the mechanism and the broker's message, never the password."""
        sasl = self.config.upstream.sasl
        assert sasl is not None
        answer = await _call(reader, writer, SaslHandshakeRequest(mechanism=sasl.mechanism))
        error_code, enabled = parse_handshake_response(answer)
        if error_code != 0:
            raise SaslFailed(
                f"upstream does not enable {sasl.mechanism} (it offers {', '.join(enabled)})"
            )

        async def authenticate(token: bytes) -> bytes:
            body = await _call(reader, writer, SaslAuthenticateRequest(auth_bytes=token))
            code, message, auth_bytes = parse_authenticate_response(body)
            if code != 0:
                raise SaslFailed(f"{sasl.mechanism} as {sasl.username!r} refused: {message}")
            return auth_bytes

        if sasl.mechanism == "PLAIN":
            await authenticate(plain_message(sasl.username, sasl.password))
            return
        scram = ScramClient(sasl.mechanism, sasl.username, sasl.password)
        try:
            server_first = await authenticate(scram.first_message())
            scram.verify(await authenticate(scram.final_message(server_first)))
        except SaslError as exc:
            raise SaslFailed(f"{sasl.mechanism} as {sasl.username!r}: {exc}") from None

    async def describe_topic(self, name: str) -> tuple[uuid.UUID, int]:
        """(topic id, partition count) of an upstream topic; LookupError if Kafka does
        not know it."""
        request = _metadata_request(name)
        body = await self._control_call(request)
        for error_code, topic, topic_id, partitions in read_topics(request.__version__, body):
            if topic == name and error_code == 0 and topic_id is not None and partitions:
                return topic_id, partitions
            if topic == name:
                raise LookupError(f"topic {name}: Kafka answers error code {error_code}")
        raise LookupError(f"topic {name} is not in Kafka's answer")

    async def partition_leader_epochs(self, name: str) -> dict[int, int]:
        """{partition: leader epoch} of an upstream topic, as Kafka's Metadata answers it
        now (the epoch a leader answers in ListOffsets); LookupError if Kafka does not
        know the topic."""
        request = _metadata_request(name)
        body = await self._control_call(request)
        try:
            error_code, leaders = read_partition_leaders(request.__version__, body, name)
        except FrameError as exc:
            raise OSError(f"upstream Metadata: {exc}") from None
        if error_code != 0:
            raise LookupError(f"topic {name}: Kafka answers error code {error_code}")
        return {partition: epoch for partition, (_, _, epoch) in leaders.items()}

    async def _control_call(self, request) -> memoryview:
        """One request on a connection of the proxy's own to a known broker."""
        host, port = next(iter(self._bootstrap_candidates()))
        reader, writer = await self.open_upstream(host, port)
        try:
            if self.config.upstream.sasl is not None:
                await self._authenticate(reader, writer)
            return await asyncio.wait_for(
                _call(reader, writer, request), self.config.upstream.connect_timeout_s
            )
        finally:
            await _close_stream(writer, self.config.upstream.connect_timeout_s)

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


_API_VERSIONS_REQUEST = ApiVersionsRequest(
    client_software_name="tierproxy", client_software_version="0.1.0"
)
_METADATA_REQUEST = MetadataRequest(
    topics=(), allow_auto_topic_creation=False, include_topic_authorized_operations=False
)


def _metadata_request(name: str) -> MetadataRequest:
    return MetadataRequest(
        topics=(MetadataRequestTopic(topic_id=uuid.UUID(int=0), name=name),),
        allow_auto_topic_creation=False,
        include_topic_authorized_operations=False,
    )


async def _call(reader, writer, request) -> memoryview:
    """Send one request of the proxy's own; the body of its answer."""
    writer.write(encode_request(request, correlation_id=0))
    await writer.drain()
    (size,) = _SIZE.unpack(await reader.readexactly(4))
    frame = memoryview(await reader.readexactly(size))
    return frame[response_header_size(request.__api_key__, request.__version__, frame) :]


async def _close_stream(writer: asyncio.StreamWriter, grace_s: float) -> None:
    """Close and wait for it: a TLS close is an exchange with the peer, and one still
    under way when the proxy stops outlives the event loop. A peer that does not take
    part within `grace_s`, an error or a cancellation cuts the connection at once."""
    writer.close()
    try:
        async with asyncio.timeout(grace_s):
            await writer.wait_closed()
    except (OSError, TimeoutError):
        writer.transport.abort()
    except asyncio.CancelledError:
        writer.transport.abort()
        raise
