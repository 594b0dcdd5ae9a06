"""Toxiproxy, built from source at a pinned version, as a real fault-injecting TCP proxy
between the components of a test: latency, bandwidth limits, connections cut mid-request,
half-open connections.

`ToxiproxyServer` runs `toxiproxy-server` on a free loopback port (its log in the test's
folder); `link(name, upstream)` opens a listening port that forwards to `upstream`, and
the returned `Link` adds and removes toxics on it through the server's HTTP API
(https://github.com/Shopify/toxiproxy#http-api). A toxic acts on the connections open
when it is added as well as on new ones, in one direction: `upstream` is what the client
sends (a PUT's body), `downstream` what the server answers (a GET's body).

A toxic that comes and goes more than once on a link, or is followed by others, is
`arm`ed first: added switched off (toxicity 0), then switched on and off by `add` and
`remove` through its toxicity. Toxiproxy v2.12.0 panics (index out of range in
`ToxicLink.AddToxic`, the whole server gone) when a toxic is added to a proxy whose
connection was closing while a toxic was removed: that connection keeps the removed
toxic's stage (`ToxicLink.RemoveToxic` returns early on a closed stage) and the next add
indexes past the proxy's chain (the flaky-network test's CI run of 2026-12-04). A
switched toxic never changes the chain. `Link` refuses to add an unarmed toxic to a link
a toxic was removed from.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from proxy.devstack.paths import DevstackError, cache_dir, free_port
from proxy.devstack.process import ManagedProcess

Stream = Literal["upstream", "downstream"]


def toxiproxy_binary() -> Path:
    binary = cache_dir() / "bin" / "toxiproxy-server"
    if not binary.exists():
        raise DevstackError(
            f"Toxiproxy not found at {binary}: run `scripts/setup.sh --toxiproxy` (or `make test`)"
        )
    return binary


@dataclass(frozen=True)
class Toxic:
    """One toxic as the API takes it; `toxicity` is the share of connections it acts on."""

    name: str
    type: str
    stream: Stream
    attributes: dict[str, int] = field(default_factory=dict)
    toxicity: float = 1.0

    def body(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "type": self.type,
            "stream": self.stream,
            "toxicity": self.toxicity,
            "attributes": self.attributes,
        }


def latency(ms: int, jitter_ms: int = 0, stream: Stream = "downstream") -> Toxic:
    """Every chunk of data delayed by `ms` ± `jitter_ms`."""
    return Toxic(f"latency-{stream}", "latency", stream, {"latency": ms, "jitter": jitter_ms})


def bandwidth(kb_per_s: int, stream: Stream = "downstream") -> Toxic:
    """At most `kb_per_s` KB a second per connection."""
    return Toxic(f"bandwidth-{stream}", "bandwidth", stream, {"rate": kb_per_s})


def reset_peer(after_ms: int, stream: Stream = "upstream", toxicity: float = 1.0) -> Toxic:
    """A TCP RST (connection reset by peer) `after_ms` into each connection."""
    return Toxic(f"reset-peer-{stream}", "reset_peer", stream, {"timeout": after_ms}, toxicity)


def timeout(ms: int = 0, stream: Stream = "downstream") -> Toxic:
    """No data gets through; the connection is closed after `ms`, or with 0 held open
    (half-open: the client hears nothing, not even a close) until the toxic goes."""
    return Toxic(f"timeout-{stream}", "timeout", stream, {"timeout": ms})


def slow_close(delay_ms: int, stream: Stream = "downstream") -> Toxic:
    """A close passed on `delay_ms` late."""
    return Toxic(f"slow-close-{stream}", "slow_close", stream, {"delay": delay_ms})


def limit_data(size: int, stream: Stream = "upstream", toxicity: float = 1.0) -> Toxic:
    """The connection closed once `size` bytes went through it that way: mid-request,
    on a kept-alive connection whichever request crosses the limit."""
    return Toxic(f"limit-data-{stream}", "limit_data", stream, {"bytes": size}, toxicity)


class Link:
    """One proxy of the server: `listen` (host:port) forwards to `upstream`."""

    def __init__(self, server: ToxiproxyServer, name: str, listen: str, upstream: str) -> None:
        self.server, self.name, self.listen, self.upstream = server, name, listen, upstream
        self.armed: dict[str, Toxic] = {}
        self.removed = False  # a toxic was taken off: unarmed ones cannot be added safely

    @property
    def port(self) -> int:
        return int(self.listen.rpartition(":")[2])

    def arm(self, *toxics: Toxic) -> None:
        """`toxics` added switched off, for `add` and `remove` to switch them on and off.
        Not a `timeout`: taking it off closes the connections it held (what a real link
        whose packets were lost ends in); switched off, they would go on with bytes
        dropped from their middle."""
        for toxic in toxics:
            if toxic.type == "timeout":
                raise DevstackError(f"a timeout toxic is added and removed, never armed: {toxic}")
            if toxic.name in self.armed:
                raise DevstackError(f"toxic {toxic.name} is armed on {self.name} already")
            if self.removed:  # arming adds a toxic to the chain, as `add` would
                raise DevstackError(
                    f"{toxic.name} armed on {self.name} after a toxic was removed from it "
                    "(toxiproxy can panic: see the module's docstring): arm toxics first"
                )
            self._post(toxic, toxicity=0.0)
            self.armed[toxic.name] = toxic

    def add(self, *toxics: Toxic) -> None:
        for toxic in toxics:
            armed = self.armed.get(toxic.name)
            if armed is not None:
                if (armed.type, armed.stream) != (toxic.type, toxic.stream):
                    raise DevstackError(f"{toxic} is not the toxic armed as {armed}")
                self._switch(toxic, toxic.toxicity)
            elif self.removed:
                raise DevstackError(
                    f"{toxic.name} added to {self.name} after a toxic was removed from it "
                    "(toxiproxy can panic: see the module's docstring): arm it first"
                )
            else:
                self._post(toxic, toxic.toxicity)

    def remove(self, *toxics: Toxic) -> None:
        for toxic in toxics:
            if toxic.name in self.armed:
                self._switch(toxic, 0.0)
            else:
                self.server.call("DELETE", f"/proxies/{self.name}/toxics/{toxic.name}")
                self.removed = True

    def _post(self, toxic: Toxic, toxicity: float) -> None:
        body = toxic.body() | {"toxicity": toxicity}
        self.server.call("POST", f"/proxies/{self.name}/toxics", body)

    def _switch(self, toxic: Toxic, toxicity: float) -> None:
        body = {"toxicity": toxicity, "attributes": toxic.attributes}
        self.server.call("POST", f"/proxies/{self.name}/toxics/{toxic.name}", body)

    def toxics(self) -> list[str]:
        return [t["name"] for t in self.server.call("GET", f"/proxies/{self.name}/toxics")]

    def enable(self, enabled: bool = True) -> None:
        """Disabled, the link refuses connections and closes those open (a cut)."""
        self.server.call("POST", f"/proxies/{self.name}", {"enabled": enabled})


class ToxiproxyServer:
    def __init__(self, base_dir: Path, name: str = "toxiproxy") -> None:
        self.port = free_port()
        self.process = ManagedProcess(
            name,
            [str(toxiproxy_binary()), "-host", "127.0.0.1", "-port", str(self.port)],
            log_path=base_dir / f"{name}.log",
            env={**os.environ, "LOG_LEVEL": "info"},  # debug: a line per API call
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 30.0) -> ToxiproxyServer:
        try:
            self.process.start()
            self.process.wait_ready(lambda: self.call("GET", "/version"), timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        self.process.stop()

    def __enter__(self) -> ToxiproxyServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def link(self, name: str, upstream: str, listen_port: int | None = None) -> Link:
        listen = f"127.0.0.1:{listen_port or free_port()}"
        body = {"name": name, "listen": listen, "upstream": upstream, "enabled": True}
        self.call("POST", "/proxies", body)
        return Link(self, name, listen, upstream)

    def reset(self) -> None:
        """Every link enabled again, every toxic removed."""
        self.call("POST", "/reset")

    def call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.url + path, data=data, method=method)
        request.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(request, timeout=10) as answer:
                text = answer.read()
        except urllib.error.HTTPError as exc:
            raise DevstackError(
                f"toxiproxy {method} {path}: {exc.code} {exc.read().decode(errors='replace')}"
            ) from exc
        return json.loads(text) if text.strip() else None
