"""The harness runs a real toxiproxy: an armed toxic is switched on and off by its
toxicity, on the connections already open, and the link refuses what could crash the
server (proxy/devstack/toxiproxy.py's docstring)."""

from __future__ import annotations

import socket
import socketserver
import threading
from collections.abc import Iterator

import pytest

from proxy.devstack.paths import DevstackError
from proxy.devstack.toxiproxy import Toxic, ToxiproxyServer, latency, limit_data, timeout

LIMIT = 4096


class _Echo(socketserver.StreamRequestHandler):
    def handle(self) -> None:
        while chunk := self.request.recv(65536):
            self.request.sendall(chunk)


@pytest.fixture
def echo() -> Iterator[str]:
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Echo)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def toxiproxy(tmp_path) -> Iterator[ToxiproxyServer]:
    with ToxiproxyServer(tmp_path) as server:
        yield server


def _echoes(sock: socket.socket, size: int) -> bool:
    """Whether `size` bytes sent come back whole (False: the link closed the connection)."""
    data = bytes(range(256)) * (size // 256)
    try:
        sock.sendall(data)
        got = b""
        while len(got) < len(data):
            chunk = sock.recv(65536)
            if not chunk:
                return False
            got += chunk
    except OSError:
        return False
    assert got == data
    return True


def _connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=10)


def test_an_armed_toxic_acts_only_while_switched_on(toxiproxy, echo):
    link = toxiproxy.link("echo", echo)
    cut = limit_data(LIMIT, "upstream")
    link.arm(cut)
    assert link.toxics() == [cut.name]

    with _connect(link.port) as open_before:
        assert _echoes(open_before, 2 * LIMIT)  # armed, off: nothing is cut
        link.add(cut)
        assert not _echoes(open_before, 2 * LIMIT)  # on, on a connection open before
    with _connect(link.port) as during:
        assert not _echoes(during, 2 * LIMIT)
    link.remove(cut)
    assert link.toxics() == [cut.name]  # still there, off
    with _connect(link.port) as after:
        assert _echoes(after, 2 * LIMIT)
        assert _echoes(after, 2 * LIMIT)

    link.add(cut)  # on again: what a removed toxic could not be
    with _connect(link.port) as again:
        assert not _echoes(again, 2 * LIMIT)


def test_a_link_refuses_what_could_crash_toxiproxy(toxiproxy, echo):
    link = toxiproxy.link("echo", echo)
    with pytest.raises(DevstackError, match="never armed"):
        link.arm(timeout(0))
    link.arm(latency(10))
    with pytest.raises(DevstackError, match="armed on echo already"):
        link.arm(latency(10))
    with pytest.raises(DevstackError, match="not the toxic armed"):
        link.add(Toxic("latency-downstream", "bandwidth", "downstream", {"rate": 1}))

    held = timeout(0)
    link.add(held)
    link.remove(held)
    assert link.toxics() == ["latency-downstream"]
    with pytest.raises(DevstackError, match="arm it first"):
        link.add(timeout(0))
    with pytest.raises(DevstackError, match="arm toxics first"):  # arming is an add too
        link.arm(Toxic("cut", "limit_data", "downstream", {"bytes": 1}))
    link.add(latency(10))  # an armed one is still switched
    with _connect(link.port) as sock:
        assert _echoes(sock, 1024)
