"""The proxy's own connections to Kafka: the control connection.

Apart from the connections that serve clients (each the client's own, `connection.py`),
the proxy talks to Kafka for itself: ApiVersions and Metadata when it refreshes its view
of the cluster (`app.Proxy.refresh_upstream`), a topic's id and leader epochs for the
tiered topics, the topic list for the admin API. Each is one short connection of its
own, authenticated as `upstream.sasl` when that is set (clients authenticate themselves,
through the proxy, with their own credentials).

Both the proxy and the admin API use this module; neither reaches into the other.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

from kio.schema.api_versions.v3.request import ApiVersionsRequest
from kio.schema.metadata.v12.request import MetadataRequest, MetadataRequestTopic
from kio.schema.sasl_authenticate.v2.request import SaslAuthenticateRequest
from kio.schema.sasl_handshake.v1.request import SaslHandshakeRequest
from kio.schema.types import TopicName

from proxy.apis.api03_metadata import (
    TopicsAnswer,
    read_brokers,
    read_partition_leaders,
    read_topics,
    read_topics_answer,
)
from proxy.apis.api18_api_versions import ApiVersionsError, parse_api_versions_response
from proxy.config import UpstreamConfig
from proxy.kafka.frames import FRAME_SIZE, FrameError
from proxy.kafka.headers import response_header_size
from proxy.kafka.messages import encode_request
from proxy.kafka.sasl import (
    SaslError,
    ScramClient,
    parse_authenticate_response,
    parse_handshake_response,
    plain_message,
)
from proxy.routing.brokers import BrokerDirectory
from proxy.server.frame_reader import BufferedFrameReader, open_frames

log = logging.getLogger("tierproxy.proxy")

Streams = tuple[asyncio.StreamReader, asyncio.StreamWriter]
Send = Callable[[object], Awaitable[memoryview]]  # a request -> the body of its answer
FrameStreams = tuple[BufferedFrameReader, asyncio.StreamWriter]
Ranges = dict[int, tuple[int, int]]  # api key -> (min version, max version)
# (node id, host, port, rack) of each broker a Metadata answer names
BrokerRows = list[tuple[int, str, int, str | None]]


class SaslFailed(ConnectionError):
    """The proxy's own credentials (`upstream.sasl`) were refused: a configuration error."""


class ControlConnection:
    """Requests of the proxy's own to Kafka, each on a short connection of its own.

    `open` is how every connection to a broker is opened (with the upstream TLS context,
    buffer limits and connect timeout), the client connections' too.
    """

    def __init__(
        self,
        config: UpstreamConfig,
        buffer_bytes: int,
        brokers: BrokerDirectory,
        upstream_ssl: ssl.SSLContext | None,
    ) -> None:
        self.config = config
        self.brokers = brokers
        self._buffer_bytes = buffer_bytes
        self._ssl = upstream_ssl

    async def open(self, host: str, port: int) -> Streams:
        # asyncio.timeout, not wait_for: Python 3.11's wait_for may return a connection
        # made as the caller is cancelled, its cancellation lost (bpo-42130)
        async with asyncio.timeout(self.config.connect_timeout_s):
            reader, writer = await asyncio.open_connection(
                host,
                port,
                ssl=self._ssl,
                server_hostname=host if self._ssl else None,
                limit=self._buffer_bytes,
            )
        writer.transport.set_write_buffer_limits(high=self._buffer_bytes)
        return reader, writer

    async def open_frames(self, host: str, port: int) -> FrameStreams:
        """As `open`, for a client connection's upstream: read into a buffer it owns."""
        async with asyncio.timeout(self.config.connect_timeout_s):  # as `open`
            reader, writer = await open_frames(
                host,
                port,
                self._buffer_bytes,
                ssl=self._ssl,
                server_hostname=host if self._ssl else None,
            )
        writer.transport.set_write_buffer_limits(high=self._buffer_bytes)
        return reader, writer

    def candidates(self) -> list[tuple[str, int]]:
        """Where to reach Kafka: the brokers known, then the bootstrap addresses."""
        seen = [(b.host, b.port) for b in self.brokers.brokers()]
        return seen + [a for a in self.config.bootstrap if a not in seen]

    async def survey(self, host: str, port: int) -> tuple[Ranges, BrokerRows | None]:
        """The API versions of the broker at host:port and the brokers its Metadata names
        (None if it refuses Metadata: a SASL listener without `upstream.sasl`)."""
        timeout = self.config.connect_timeout_s
        reader, writer = await self.open(host, port)
        try:
            ranges = await self._api_versions(reader, writer)
            if self.config.sasl is not None:
                await asyncio.wait_for(self.authenticate(reader, writer), timeout)
            try:
                metadata = await asyncio.wait_for(call(reader, writer, _METADATA_REQUEST), timeout)
            except (asyncio.IncompleteReadError, ConnectionError):
                log.info("upstream %s:%d refused Metadata (authentication needed?)", host, port)
                return ranges, None
        finally:
            await close_stream(writer, timeout)
        # Read by hand (kio's reader is kept off network bytes), racks included: a
        # broker's rack is its zone, for the byte accounting and the bootstrap choice.
        try:
            return ranges, read_brokers(_METADATA_REQUEST.__version__, metadata)
        except FrameError as exc:
            raise OSError(f"upstream Metadata: {exc}") from None

    async def api_versions_of(self, host: str, port: int) -> Ranges:
        reader, writer = await self.open(host, port)
        try:
            return await self._api_versions(reader, writer)
        finally:
            await close_stream(writer, self.config.connect_timeout_s)

    async def _api_versions(self, reader, writer) -> Ranges:
        body = await asyncio.wait_for(
            call(reader, writer, _API_VERSIONS_REQUEST), self.config.connect_timeout_s
        )
        try:
            return parse_api_versions_response(_API_VERSIONS_REQUEST.__version__, body)
        except (ApiVersionsError, FrameError) as exc:
            raise OSError(f"upstream ApiVersions: {exc}") from None

    async def authenticate(self, reader, writer) -> None:
        """SASL on a control connection (`upstream.sasl`); SaslFailed names the
        mechanism and the broker's message, never the password."""
        sasl = self.config.sasl
        assert sasl is not None
        answer = await call(reader, writer, SaslHandshakeRequest(mechanism=sasl.mechanism))
        error_code, enabled = parse_handshake_response(answer)
        if error_code != 0:
            raise SaslFailed(
                f"upstream does not enable {sasl.mechanism} (it offers {', '.join(enabled)})"
            )

        async def authenticate(token: bytes) -> bytes:
            body = await call(reader, writer, SaslAuthenticateRequest(auth_bytes=token))
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

    async def request(self, request) -> memoryview:
        """One request on a connection of the proxy's own to a known broker; the body of
        the answer. The whole exchange, authentication included, is bounded by
        `upstream.connect_timeout_s` per step."""
        async with self._session(*self.candidates()[0]) as send:
            return await send(request)

    @asynccontextmanager
    async def _session(self, host: str, port: int) -> AsyncIterator[Send]:
        """A connection of the proxy's own to host:port, authenticated as `upstream.sasl`;
        each request on it bounded by `upstream.connect_timeout_s`, one at a time."""
        timeout = self.config.connect_timeout_s
        reader, writer = await self.open(host, port)
        try:
            if self.config.sasl is not None:
                await asyncio.wait_for(self.authenticate(reader, writer), timeout)

            async def send(request: object) -> memoryview:
                return await asyncio.wait_for(call(reader, writer, request), timeout)

            yield send
        finally:
            await close_stream(writer, timeout)

    @asynccontextmanager
    async def at_leader(self, topic: str, partition: int) -> AsyncIterator[Send]:
        """A connection of the proxy's own to the leader of `topic`-`partition` as Kafka's
        Metadata names it now, for requests only the leader answers (ListOffsets); one
        request at a time, each bounded by `upstream.connect_timeout_s`. LookupError when
        the partition has no leader Kafka names, OSError when it cannot be reached."""
        request = _metadata_request(topic)
        body = await self.request(request)
        try:
            error_code, leaders = read_partition_leaders(request.__version__, body, topic)
            brokers = {row[0]: row for row in read_brokers(request.__version__, body)}
        except FrameError as exc:
            raise OSError(f"upstream Metadata: {exc}") from None
        code, leader, _ = leaders.get(partition, (-1, -1, -1))
        if error_code != 0 or code != 0 or leader not in brokers:
            raise LookupError(f"{topic}-{partition}: no leader (error codes {error_code}, {code})")
        _, host, port, _ = brokers[leader]
        async with self._session(host, port) as send:
            yield send

    async def topics(self) -> dict[str, int]:
        """Kafka's topics (name -> partition count), by one Metadata request for all."""
        body = await self.request(_ALL_TOPICS)
        return {
            name: partitions
            for error_code, name, _id, partitions in read_topics(_ALL_TOPICS.__version__, body)
            if error_code == 0 and name
        }

    async def describe_topics(self, names: list[str]) -> TopicsAnswer:
        """What Kafka says of upstream topics, by one Metadata request for all, and the
        id of the cluster that said it."""
        request = _metadata_request(*names)
        body = await self.request(request)
        try:
            return read_topics_answer(request.__version__, body)
        except FrameError as exc:
            raise OSError(f"upstream Metadata: {exc}") from None

    async def partition_leader_epochs(self, name: str) -> dict[int, int]:
        """{partition: leader epoch} of an upstream topic, as Kafka's Metadata answers it
        now (the epoch a leader answers in ListOffsets); LookupError if Kafka does not
        know the topic."""
        request = _metadata_request(name)
        body = await self.request(request)
        try:
            error_code, leaders = read_partition_leaders(request.__version__, body, name)
        except FrameError as exc:
            raise OSError(f"upstream Metadata: {exc}") from None
        if error_code != 0:
            raise LookupError(f"topic {name}: Kafka answers error code {error_code}")
        return {partition: epoch for partition, (_, _, epoch) in leaders.items()}


_API_VERSIONS_REQUEST = ApiVersionsRequest(
    client_software_name="tierproxy", client_software_version="0.1.0"
)
_METADATA_REQUEST = MetadataRequest(
    topics=(), allow_auto_topic_creation=False, include_topic_authorized_operations=False
)
_ALL_TOPICS = MetadataRequest(
    topics=None, allow_auto_topic_creation=False, include_topic_authorized_operations=False
)


def _metadata_request(*names: str) -> MetadataRequest:
    return MetadataRequest(
        topics=tuple(
            MetadataRequestTopic(topic_id=uuid.UUID(int=0), name=TopicName(name)) for name in names
        ),
        allow_auto_topic_creation=False,
        include_topic_authorized_operations=False,
    )


async def call(reader, writer, request) -> memoryview:
    """Send one request of the proxy's own; the body of its answer."""
    writer.write(encode_request(request, correlation_id=0))
    await writer.drain()
    (size,) = FRAME_SIZE.unpack(await reader.readexactly(4))
    frame = memoryview(await reader.readexactly(size))
    return frame[response_header_size(request.__api_key__, request.__version__, frame) :]


async def close_stream(writer: asyncio.StreamWriter, grace_s: float) -> None:
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
