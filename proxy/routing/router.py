"""What a client in a given zone is told about each upstream broker.

Every upstream broker is shown as hosted by a live proxy of the client's zone, chosen by
`place_brokers` (rendezvous hashing with bounded loads), at that proxy's address for the
broker (`broker_port_base + node id`). Node ids stay the upstream ids. A zone with no
live proxy falls back to the zone of the proxy answering: the client reached it, so it
can reach its zone. The mapping depends only on the live members and the broker ids,
so every proxy of the fleet tells a client the same thing.

Pure: the caller feeds membership and brokers in; placements are cached per zone until
either changes.
"""

from __future__ import annotations

from dataclasses import dataclass

from proxy.routing.fleet import FleetView, Member
from proxy.routing.placement import place_brokers


@dataclass(frozen=True, slots=True)
class ZoneRoute:
    """The answer for one client zone."""

    client_zone: str
    serving_zone: str  # the client's zone, or the fallback's
    hosts: dict[int, Member]  # broker id -> the member that hosts it for this zone

    @property
    def fallback(self) -> bool:
        return self.serving_zone != self.client_zone


class ZoneRouter:
    def __init__(self, fleet: FleetView, epsilon: float = 0.25) -> None:
        self.fleet = fleet
        self.epsilon = epsilon
        self._broker_ids: frozenset[int] = frozenset()
        self._routes: dict[str, ZoneRoute] = {}
        self._built_for = (-1, self._broker_ids)

    def set_brokers(self, broker_ids: frozenset[int] | set[int]) -> None:
        self._broker_ids = frozenset(broker_ids)

    def add_broker(self, node_id: int) -> None:
        if node_id not in self._broker_ids:
            self._broker_ids = self._broker_ids | {node_id}

    def route(self, client_zone: str) -> ZoneRoute:
        key = (self.fleet.version, self._broker_ids)
        if key != self._built_for:
            self._routes = {}
            self._built_for = key
        route = self._routes.get(client_zone)
        if route is None:
            route = self._routes[client_zone] = self._build(client_zone)
        return route

    def host_for(self, client_zone: str, node_id: int) -> Member:
        """The member hosting broker `node_id` for clients of `client_zone`; a broker
        heard of for the first time joins the placement."""
        route = self.route(client_zone)
        member = route.hosts.get(node_id)
        if member is None:
            self.add_broker(node_id)
            member = self.route(client_zone).hosts[node_id]
        return member

    def _build(self, client_zone: str) -> ZoneRoute:
        members = self.fleet.live()
        in_zone = [member for member in members if member.zone == client_zone]
        serving_zone = client_zone
        if not in_zone:
            serving_zone = self.fleet.self_member.zone
            in_zone = [member for member in members if member.zone == serving_zone]
        by_name = {member.name: member for member in in_zone}
        placement = place_brokers(self._broker_ids, by_name, self.epsilon)
        hosts = {node_id: by_name[name] for node_id, name in placement.items()}
        return ZoneRoute(client_zone, serving_zone, hosts)
