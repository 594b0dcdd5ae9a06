"""Which upstream broker each proxy listener stands for, and where that broker is.

The listener for upstream broker N listens on `broker_port_base + N`: the mapping needs
no state to agree on, so every proxy of a fleet and every restart of one tell clients the
same port for the same broker. Upstream addresses are learnt from the proxy's own
metadata requests and from every response that names a broker, so a broker added at run
time gets its listener the first time a client hears of it. What a client is told about
a broker is the zone router's decision (`routing.router`, `server.zoning`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class UpstreamBroker:
    node_id: int
    host: str
    port: int
    rack: str | None = None  # broker.rack: the broker's zone, if Kafka was told it


class BrokerDirectory:
    def __init__(
        self,
        broker_port_base: int,
        on_new_broker: Callable[[UpstreamBroker], None] | None = None,
    ) -> None:
        self.broker_port_base = broker_port_base
        self._on_new_broker = on_new_broker
        self._brokers: dict[int, UpstreamBroker] = {}

    def proxy_port(self, node_id: int) -> int:
        port = self.broker_port_base + node_id
        if not 0 < port <= 65535:
            raise ValueError(
                f"broker id {node_id} gives port {port}: lower listeners.broker_port_base"
            )
        return port

    def upstream(self, node_id: int) -> UpstreamBroker | None:
        return self._brokers.get(node_id)

    def brokers(self) -> list[UpstreamBroker]:
        return sorted(self._brokers.values(), key=lambda broker: broker.node_id)

    def zone_of(self, node_id: int | None) -> str | None:
        broker = self._brokers.get(node_id) if node_id is not None else None
        return broker.rack if broker is not None else None

    def learn(self, node_id: int, host: str, port: int, rack: str | None = None) -> None:
        """Record a broker's address; `rack` only comes from Metadata answers, so an
        address learnt elsewhere keeps the rack already known."""
        known = self._brokers.get(node_id)
        if rack is None and known is not None:
            rack = known.rack
        if known is not None and (known.host, known.port, known.rack) == (host, port, rack):
            return
        broker = UpstreamBroker(node_id, host, port, rack)
        self._brokers[node_id] = broker
        if known is None and self._on_new_broker is not None:
            self._on_new_broker(broker)
