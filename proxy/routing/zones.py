"""Which availability zone a client is in (DESIGN.md, "Metadata and zones").

Pure: the caller passes what it knows of the connection, this decides. In order:

1. a key in the client's `client.id`: `tierproxy_az=<zone>`, and, so that clients moving
   from those systems need no change, `automq_az=`, `warpstream_az=` / `ws_az=` and
   Bufstream's `zone=`;
2. the configured CIDR-to-zone map, on the client's source address (longest prefix wins);
3. the rack id the client sent in a Fetch request (KIP-392);
4. else the zone of the proxy the client reached.

The answer says where it came from, for the metrics and the logs.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum

# Keys accepted in client.id, in order of preference when a client.id holds several.
CLIENT_ID_KEYS = ("tierproxy_az", "automq_az", "warpstream_az", "ws_az", "zone")
_CLIENT_ID_KEY = re.compile(r"(?:^|[\s,;|&])(" + "|".join(CLIENT_ID_KEYS) + r")=([A-Za-z0-9._:-]+)")

IpNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


class ZoneSource(Enum):
    CLIENT_ID = "client_id"
    CIDR = "cidr"
    FETCH_RACK = "fetch_rack"
    PROXY = "proxy"


@dataclass(frozen=True, slots=True)
class ClientZone:
    zone: str
    source: ZoneSource


def zone_from_client_id(client_id: str | None) -> str | None:
    """The zone a client.id declares, or None. `app,tierproxy_az=eu-west-1a` and
    `ws_az=eu-west-1a;app` both declare eu-west-1a."""
    if not client_id:
        return None
    found = {key: value for key, value in _CLIENT_ID_KEY.findall(client_id)}
    for key in CLIENT_ID_KEYS:
        if key in found:
            return found[key]
    return None


class CidrZones:
    """A CIDR-to-zone map; the most specific network containing the address wins."""

    def __init__(self, entries: Iterable[tuple[str, str]]) -> None:
        networks: list[tuple[IpNetwork, str]] = []
        for cidr, zone in entries:
            try:
                networks.append((ipaddress.ip_network(cidr, strict=False), zone))
            except ValueError as exc:
                raise ValueError(f"{cidr!r} is not a network: {exc}") from None
        # most specific first, so the first match is the longest prefix
        self._networks = sorted(networks, key=lambda entry: -entry[0].prefixlen)

    def zone_of(self, address: str) -> str | None:
        try:
            ip = ipaddress.ip_address(address)
        except ValueError:
            return None
        for network, zone in self._networks:
            if ip.version == network.version and ip in network:
                return zone
        return None


def resolve_client_zone(
    proxy_zone: str,
    client_id: str | None = None,
    source_address: str | None = None,
    cidr_zones: CidrZones | None = None,
    fetch_rack: str | None = None,
) -> ClientZone:
    zone = zone_from_client_id(client_id)
    if zone is not None:
        return ClientZone(zone, ZoneSource.CLIENT_ID)
    if cidr_zones is not None and source_address is not None:
        zone = cidr_zones.zone_of(source_address)
        if zone is not None:
            return ClientZone(zone, ZoneSource.CIDR)
    if fetch_rack:
        return ClientZone(fetch_rack, ZoneSource.FETCH_RACK)
    return ClientZone(proxy_zone, ZoneSource.PROXY)
