"""A PeerServer on 127.0.0.1 and PeerClients for the peer protocol's socket tests
(tests/integration/tiering/test_peer_rpc.py, tests/unit/peer/test_reference_rpc.py):
started and closed around a block, so each test file's fixtures are one line."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from proxy.peer.clients import PeerClients
from proxy.peer.server import PeerServer


@asynccontextmanager
async def peer_server(on_append: Any, on_admin: Any, **options: Any) -> AsyncIterator[PeerServer]:
    """A started server on a free loopback port, closed after the block."""
    server = PeerServer("127.0.0.1", 0, on_append, on_admin, **options)
    await server.start()
    try:
        yield server
    finally:
        await server.close()


@asynccontextmanager
async def peer_clients(**options: Any) -> AsyncIterator[PeerClients]:
    """Clients with a short connect timeout (unless given), closed after the block."""
    clients = PeerClients(**{"connect_timeout_s": 2.0, **options})
    try:
        yield clients
    finally:
        await clients.close()
