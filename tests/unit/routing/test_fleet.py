"""Fleet membership, pure: heartbeat records, liveness, and the zone router built on it."""

from __future__ import annotations

import pytest

from proxy.routing.fleet import (
    TO_BROKER,
    TO_CLIENT,
    FleetView,
    Heartbeat,
    HeartbeatError,
    Member,
    cross_zone_bytes,
    decode_heartbeat,
    encode_heartbeat,
)
from proxy.routing.router import ZoneRouter

A1 = Member("a1", "zone-a", "127.0.1.1", 19092, 19100)
A2 = Member("a2", "zone-a", "127.0.1.2", 19092, 19100)
B1 = Member("b1", "zone-b", "127.0.2.1", 19092, 19100)
B2 = Member("b2", "zone-b", "127.0.2.2", 19092, 29100)


def beat(member: Member) -> Heartbeat:
    return Heartbeat(member, 1000.0)


def test_heartbeat_round_trip_with_zone_bytes():
    heartbeat = Heartbeat(
        A1, 1234.5, {("zone-a", "zone-a", "zone-b", TO_BROKER): 10, ("x", "y", "z", TO_CLIENT): 7}
    )
    assert decode_heartbeat(encode_heartbeat(heartbeat)) == heartbeat


@pytest.mark.parametrize(
    ("value", "says"),
    [
        (b"not json", "unreadable heartbeat"),
        (b'{"v": 2}', "heartbeat version 2"),
        (b'{"v": 1, "name": "", "zone": "z"}', "name"),
        (
            b'{"v":1,"name":"n","zone":"z","host":"h","bootstrap_port":70000,'
            b'"broker_port_base":1,"started_at":1}',
            "bootstrap_port 70000 is not a port",
        ),
        (
            b'{"v":1,"name":"n","zone":"z","host":"h","bootstrap_port":1,'
            b'"broker_port_base":1,"started_at":1,"zone_bytes":[["a","b",5]]}',
            "is not 4 zones and a count",
        ),
        (b"[1, 2]", "unreadable heartbeat"),
    ],
)
def test_unreadable_heartbeats_say_why(value, says):
    with pytest.raises(HeartbeatError, match=says):
        decode_heartbeat(value)


def test_members_live_until_their_heartbeats_are_too_old():
    view = FleetView(A1, member_timeout_s=5.0)
    assert view.live() == (A1,)
    view.observe("a2", beat(A2), sent_at=100.0, now=100.0)
    view.observe("b1", beat(B1), sent_at=100.0, now=100.0)
    assert view.live() == (A1, A2, B1)
    version = view.version
    view.observe("b1", beat(B1), sent_at=103.0, now=103.0)
    assert not view.expire(105.0) and view.version == version  # a2 is 5.0 s old: alive
    assert view.expire(105.1)  # a2 is now too old
    assert view.live() == (A1, B1)
    assert view.version == version + 1


def test_a_tombstone_removes_a_member_at_once_but_never_self():
    view = FleetView(A1, member_timeout_s=5.0)
    view.observe("a2", beat(A2), sent_at=100.0, now=100.0)
    view.observe("a2", None, sent_at=100.5, now=100.5)
    assert view.live() == (A1,)
    view.observe("a1", None, sent_at=101.0, now=101.0)  # our own old tombstone, replayed
    assert view.live() == (A1,)


def test_old_records_read_at_start_are_dead_and_later_forgettable():
    view = FleetView(A1, member_timeout_s=5.0)
    view.observe("b1", beat(B1), sent_at=10.0, now=1000.0)  # catching up on an old record
    assert view.live() == (A1,)
    assert view.forgettable(now=1000.0, forget_after_s=3600.0) == []
    assert view.forgettable(now=3611.0, forget_after_s=3600.0) == ["b1"]


def test_router_keeps_each_zone_on_its_own_proxies():
    view = FleetView(A1, member_timeout_s=5.0)
    for member in (A2, B1, B2):
        view.observe(member.name, beat(member), sent_at=0.0, now=0.0)
    router = ZoneRouter(view)
    router.set_brokers({1, 2, 3, 4})
    route_a = router.route("zone-a")
    assert set(route_a.hosts) == {1, 2, 3, 4}
    assert {member.zone for member in route_a.hosts.values()} == {"zone-a"}
    assert {member.name for member in route_a.hosts.values()} == {"a1", "a2"}  # spread
    assert not route_a.fallback
    route_b = router.route("zone-b")
    assert {member.zone for member in route_b.hosts.values()} == {"zone-b"}
    # the address shown is the hosting member's, with its own port base
    b2_brokers = [b for b, member in route_b.hosts.items() if member is B2]
    assert b2_brokers and all(
        router.host_for("zone-b", b).broker_address(b) == ("127.0.2.2", 29100 + b)
        for b in b2_brokers
    )


def test_router_is_the_same_on_every_member():
    """Two proxies with the same live set and brokers tell a client the same thing."""
    views = []
    for me in (A1, B2):
        view = FleetView(me, member_timeout_s=5.0)
        for member in (A1, A2, B1, B2):
            if member is not me:
                view.observe(member.name, beat(member), sent_at=0.0, now=0.0)
        views.append(view)
    routers = [ZoneRouter(view) for view in views]
    for router in routers:
        router.set_brokers(range(1, 10))
    for zone in ("zone-a", "zone-b"):
        assert routers[0].route(zone).hosts == routers[1].route(zone).hosts


def test_zone_without_proxy_falls_back_to_the_answering_proxys_zone():
    view = FleetView(B1, member_timeout_s=5.0)
    view.observe("a1", beat(A1), sent_at=0.0, now=0.0)
    router = ZoneRouter(view)
    router.set_brokers({1, 2, 3})
    route = router.route("zone-c")
    assert route.fallback and route.serving_zone == "zone-b"
    assert set(route.hosts.values()) == {B1}


def test_router_follows_membership_and_new_brokers():
    view = FleetView(A1, member_timeout_s=5.0)
    view.observe("a2", beat(A2), sent_at=0.0, now=0.0)
    router = ZoneRouter(view)
    router.set_brokers({1, 2, 3})
    assert {m.name for m in router.route("zone-a").hosts.values()} == {"a1", "a2"}
    view.expire(now=6.0)  # a2 died
    assert set(router.route("zone-a").hosts.values()) == {A1}
    assert router.host_for("zone-a", 7) == A1  # a broker first heard of joins the placement
    assert 7 in router.route("zone-a").hosts


def test_cross_zone_bytes_counts_each_hop_that_crosses():
    totals = {
        ("zone-a", "zone-a", "zone-a", TO_BROKER): 100,  # all in zone: 0
        ("zone-a", "zone-a", "zone-b", TO_BROKER): 10,  # proxy -> broker crosses: 10
        ("zone-b", "zone-a", "zone-a", TO_CLIENT): 1,  # client -> proxy crosses: 1
        ("zone-b", "zone-a", "zone-c", TO_CLIENT): 1000,  # both hops: 2000
        ("zone-a", "zone-a", "unknown", TO_CLIENT): 5,  # unknown counts as crossing
    }
    assert cross_zone_bytes(totals.items()) == 10 + 1 + 2000 + 5


def test_answers_of_the_proxy_itself_cross_only_the_client_hop():
    totals = {
        ("zone-a", "zone-a", "none", TO_CLIENT): 400,  # in zone, no broker: 0
        ("zone-b", "zone-a", "none", TO_CLIENT): 400,  # client hop only: 400
    }
    assert cross_zone_bytes(totals.items()) == 400
