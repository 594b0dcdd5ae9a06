"""A client's zone: client.id keys first, then the CIDR map, the Fetch rack, the proxy."""

from __future__ import annotations

import pytest

from proxy.routing.zones import (
    CidrZones,
    ZoneSource,
    resolve_client_zone,
    zone_from_client_id,
)


@pytest.mark.parametrize(
    ("client_id", "zone"),
    [
        ("orders-service,tierproxy_az=zone-a", "zone-a"),
        ("tierproxy_az=eu-west-1a", "eu-west-1a"),
        ("automq_az=us-east-1b", "us-east-1b"),
        ("app ws_az=use1-az4", "use1-az4"),
        ("warpstream_az=zone-c;team=x", "zone-c"),
        ("bufstream-client|zone=zone-b", "zone-b"),
        # the project's own key wins over the others
        ("zone=zone-b,tierproxy_az=zone-a", "zone-a"),
        # not a key: a word that merely ends in one
        ("myzone=zone-a", None),
        ("no zone here", None),
        ("", None),
        (None, None),
    ],
)
def test_zone_from_client_id(client_id, zone):
    assert zone_from_client_id(client_id) == zone


def test_longest_cidr_prefix_wins_and_families_do_not_mix():
    zones = CidrZones(
        [("10.0.0.0/8", "zone-x"), ("10.1.0.0/16", "zone-a"), ("fd00::/8", "zone-v6")]
    )
    assert zones.zone_of("10.1.2.3") == "zone-a"
    assert zones.zone_of("10.9.2.3") == "zone-x"
    assert zones.zone_of("fd00::1") == "zone-v6"
    assert zones.zone_of("192.168.0.1") is None
    assert zones.zone_of("not-an-address") is None
    with pytest.raises(ValueError, match="'10.0.0.0/33' is not a network"):
        CidrZones([("10.0.0.0/33", "zone-a")])


def test_resolution_order():
    cidr = CidrZones([("127.0.2.0/24", "zone-b")])
    everything = dict(
        client_id="app,tierproxy_az=zone-a",
        source_address="127.0.2.9",
        cidr_zones=cidr,
        fetch_rack="zone-c",
    )
    resolved = resolve_client_zone("zone-p", **everything)
    assert (resolved.zone, resolved.source) == ("zone-a", ZoneSource.CLIENT_ID)
    everything["client_id"] = "app"
    resolved = resolve_client_zone("zone-p", **everything)
    assert (resolved.zone, resolved.source) == ("zone-b", ZoneSource.CIDR)
    everything["source_address"] = "127.0.9.9"
    resolved = resolve_client_zone("zone-p", **everything)
    assert (resolved.zone, resolved.source) == ("zone-c", ZoneSource.FETCH_RACK)
    resolved = resolve_client_zone("zone-p", client_id="app")
    assert (resolved.zone, resolved.source) == ("zone-p", ZoneSource.PROXY)
