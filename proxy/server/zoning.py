"""A client connection's zone: how it is learnt, what the client is told, what it costs.

The zone is resolved (`routing.zones`) when the connection's first request arrives, and
again if a later request carries another client.id, or if the client's first Fetch
names a rack (KIP-392) and nothing stronger was known. Every broker an answer names is
then shown at the proxy of that zone which hosts it (`routing.router`), and the
connection's bytes are counted under (client zone, proxy zone, upstream broker zone).
Each resolution is written to the `tierproxy.access` log: an operator (and the zone
tests) can see who connected where, as what.
"""

from __future__ import annotations

import logging

from proxy.routing.fleet import NO_BROKER, TO_BROKER, TO_CLIENT, UNKNOWN_ZONE
from proxy.routing.zones import ClientZone, ZoneSource, resolve_client_zone

access_log = logging.getLogger("tierproxy.access")


class ConnectionZone:
    def __init__(self, proxy, peer: str, source_address: str | None, listener: str) -> None:
        self.proxy = proxy
        self.peer = peer
        self.source_address = source_address
        self.listener = listener
        self.upstream_node: int | None = None
        self.upstream_connected = False
        self.client_id: str | None = None
        self.fetch_rack: str | None = None
        self.rack_checked = False  # a Fetch was looked at (once per connection)
        self.zone: ClientZone | None = None
        self._fallback_seen: object = None  # the route last counted as a fallback
        self._to_broker = self._to_client = None
        self._local_in = self._local_out = None  # requests the proxy answers itself

    @property
    def wants_fetch_rack(self) -> bool:
        """Whether the next Fetch should be read for its rack id: once per connection,
        and only if neither client.id nor the source address already said the zone."""
        return not self.rack_checked and (self.zone is None or self.zone.source is ZoneSource.PROXY)

    def on_client_id(self, client_id: str | None) -> None:
        if self.zone is not None and client_id == self.client_id:
            return
        self.client_id = client_id
        self._resolve()

    def on_fetch_rack(self, rack: str | None) -> None:
        self.rack_checked = True
        if rack and rack != self.fetch_rack:
            self.fetch_rack = rack
            self._resolve()

    def on_upstream(self, node_id: int | None) -> None:
        self.upstream_node = node_id
        self.upstream_connected = True
        self._counters()

    def _resolve(self) -> None:
        proxy = self.proxy
        zone = resolve_client_zone(
            proxy.fleet.self_member.zone,
            client_id=self.client_id,
            source_address=self.source_address,
            cidr_zones=proxy.cidr_zones,
            fetch_rack=self.fetch_rack,
        )
        if zone == self.zone:
            return
        self.zone = zone
        proxy.metrics.client_zones.labels(zone.zone, zone.source.value).inc()
        access_log.info(
            "client %s on %s/%s %s: client.id=%r zone=%s (from %s)",
            self.peer,
            proxy.fleet.self_member.name,
            self.listener,
            proxy.fleet.self_member.zone,
            self.client_id,
            zone.zone,
            zone.source.value,
        )
        self._counters()

    def _counters(self) -> None:
        if self.zone is None:
            return
        zone_bytes = self.proxy.metrics.zone_bytes
        zones = (self.zone.zone, self.proxy.fleet.self_member.zone)
        self._local_in = zone_bytes.labels(*zones, NO_BROKER, TO_BROKER)
        self._local_out = zone_bytes.labels(*zones, NO_BROKER, TO_CLIENT)
        if self.upstream_connected:  # no row for a broker zone not known yet
            broker_zone = self.proxy.brokers.zone_of(self.upstream_node) or UNKNOWN_ZONE
            self._to_broker = zone_bytes.labels(*zones, broker_zone, TO_BROKER)
            self._to_client = zone_bytes.labels(*zones, broker_zone, TO_CLIENT)

    def count_local(self, request_bytes: int, answer_bytes: int) -> None:
        """A request the proxy answered itself (ApiVersions): only the client hop."""
        if self._local_in is not None:
            self._local_in.inc(request_bytes)
            self._local_out.inc(answer_bytes)

    def count_to_broker(self, n: int) -> None:
        if self._to_broker is not None:
            self._to_broker.inc(n)

    def count_to_client(self, n: int) -> None:
        if self._to_client is not None:
            self._to_client.inc(n)

    def advertise(self, node_id: int, host: str, port: int) -> tuple[str, int]:
        """The rewriters' `Advertise` for this connection: upstream in, the address of
        the proxy hosting that broker for this client's zone out."""
        if node_id < 0:  # "no node" in error answers: nothing to hide, nothing to learn
            return host, port
        proxy = self.proxy
        proxy.brokers.learn(node_id, host, port)
        zone = self.zone.zone if self.zone is not None else proxy.fleet.self_member.zone
        member = proxy.router.host_for(zone, node_id)
        route = proxy.router.route(zone)
        if route.fallback and route is not self._fallback_seen:
            self._fallback_seen = route
            proxy.metrics.zone_fallbacks.labels(zone, route.serving_zone).inc()
        return member.broker_address(node_id)
