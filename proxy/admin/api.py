"""The admin API: HTTP on `admin.bind_host:admin.port`, served on the proxy's event loop.

    GET /healthz           200 while the process serves (no token needed)
    GET /readyz            200 ready / 503 not, with each check (no token needed);
                           see proxy/admin/views.py for what is checked
    GET /v1/topics         every topic's mode; tiered ones with their partitions
    GET /v1/topics/<name>  one topic (404 if neither Kafka nor the proxy knows it)
    GET /v1/fleet          members, zones, shard owners, this proxy's uploader lag
    GET /metrics           the Prometheus exposition (as on `metrics.port`)

With `admin.token` set, every path but the two probes needs `Authorization: Bearer
<token>` (401 otherwise). Handlers run on the loop that owns the state they read;
/metrics is rendered on a worker thread, as the metrics server does.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from proxy.admin import views as admin_views
from proxy.admin.http import (
    MAX_HEAD_BYTES,
    BadRequest,
    Request,
    authorized,
    error_response,
    head_end,
    json_response,
    parse_head,
    response,
)
from proxy.lifecycle import run_connection

log = logging.getLogger("tierproxy.admin")

READ_TIMEOUT_S = 10.0  # a client that sends no whole request head in this long is cut


# Kafka's topics (name -> partition count), asked on the proxy's control connection
# (`server.control.ControlConnection.topics`), authenticated as `upstream.sasl`.
UpstreamTopics = Callable[[], Awaitable[dict[str, int]]]


class AdminServer:
    def __init__(self, proxy, upstream_topics: UpstreamTopics) -> None:
        self.proxy = proxy  # proxy.server.app.Proxy: what the views show
        self._upstream_topics = upstream_topics
        self.config = proxy.config.admin
        self._server: asyncio.Server | None = None
        self._clients: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        self._server = await asyncio.start_server(
            self._accept, self.config.bind_host, self.config.port, reuse_address=True
        )
        log.info(
            "admin API on http://%s:%d%s",
            self.config.bind_host,
            self.port,
            " (bearer token required)" if self.config.token else "",
        )

    @property
    def port(self) -> int:
        assert self._server is not None
        return self._server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._clients):
            task.cancel()
        await asyncio.gather(*self._clients, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # A plain callback, so close() cancels the connection even before it first runs
        # (a task cancelled then runs no `finally`: run_connection closes its socket).
        run_connection(self._clients, writer, self._serve(reader, writer))

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            try:
                async with asyncio.timeout(READ_TIMEOUT_S):
                    request = parse_head(await _read_head(reader))
                answer = await self._answer(request)
            except BadRequest as exc:
                answer = error_response(exc.status, str(exc))
            except TimeoutError:
                answer = error_response(400, f"no request head within {READ_TIMEOUT_S} s")
            writer.write(answer)
            await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass  # the client went away
        finally:
            writer.close()
            try:
                await writer.wait_closed()
            except (OSError, asyncio.CancelledError):
                writer.transport.abort()

    async def _answer(self, request: Request) -> bytes:
        head_only = request.method == "HEAD"
        path = request.path.rstrip("/") or "/"
        if path not in ("/healthz", "/readyz") and not authorized(request, self.config.token):
            return json_response(401, {"error": "a bearer token is required"}, head_only=head_only)
        try:
            return await self._route(path, head_only)
        except Exception as exc:  # a view's failure answers 500; the server goes on
            log.warning("admin API %s failed: %r", path, exc)
            return error_response(500, f"{path}: {exc.__class__.__name__}: {exc}")

    async def _route(self, path: str, head_only: bool) -> bytes:
        if path == "/healthz":
            return json_response(200, admin_views.health(self.proxy), head_only=head_only)
        if path == "/readyz":
            ready, body = admin_views.readiness(self.proxy)
            return json_response(200 if ready else 503, body, head_only=head_only)
        if path == "/metrics":
            text = await asyncio.to_thread(generate_latest, self.proxy.metrics.registry)
            return response(200, text, CONTENT_TYPE_LATEST, head_only=head_only)
        if path == "/v1/fleet":
            return json_response(200, admin_views.fleet(self.proxy), head_only=head_only)
        if path == "/v1/topics":
            upstream = await self._upstream_topics()
            return json_response(
                200, {"topics": admin_views.topics(self.proxy, upstream)}, head_only=head_only
            )
        if path.startswith("/v1/topics/"):
            name = path.removeprefix("/v1/topics/")
            upstream = await self._upstream_topics()
            tiered = self.proxy.tiering is not None and self.proxy.tiering.topics.topic(name)
            if name not in upstream and not tiered:
                return error_response(404, f"topic {name!r} is not known to Kafka or the proxy")
            return json_response(
                200, admin_views.topic(self.proxy, name, upstream.get(name)), head_only=head_only
            )
        return error_response(404, f"no such path {path!r}")


async def _read_head(reader: asyncio.StreamReader) -> bytes:
    buffer = b""
    while (end := head_end(buffer)) < 0 and len(buffer) <= MAX_HEAD_BYTES:
        chunk = await reader.read(4096)
        if not chunk:
            raise asyncio.IncompleteReadError(buffer, None)
        buffer += chunk
    if end < 0 or end > MAX_HEAD_BYTES:
        raise BadRequest(431, f"request head longer than {MAX_HEAD_BYTES} bytes")
    return buffer[:end]
