"""The proxy fleet: who is in it, who is alive, and what each member has counted.

Membership goes through the upstream Kafka (docs/ARCHITECTURE.md, "Fleet membership"):
every proxy writes a heartbeat record, keyed by its name, to a compacted topic every
`heartbeat_interval_s`, and reads every member's. A member whose last heartbeat is older
than `member_timeout_s` is dead; one that stops cleanly writes a tombstone and is gone at
once. This module is the pure part: the record format and the view built from records.
Time is passed in (wall-clock seconds), so tests need no clock.

A heartbeat is JSON, versioned by its `v` field, so an operator can read the topic with
any console consumer. It also carries the member's cumulative zone byte counts, which is
how `tierproxy fleet status` sums the fleet's cross-zone bytes without scraping anyone.
New fields are optional, read with the value an older proxy means by leaving them out, and
`v` stays 1: a proxy of the previous release ignores fields it does not know, but refuses
another `v` (it would lose the member), so a rolling upgrade keeps every member visible.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field

HEARTBEAT_VERSION = 1
# The peer protocol of a member whose heartbeat does not say (a release before the
# `peer_protocol` field): `proxy/peer/codec.py`, PROTOCOL.
OLD_PEER_PROTOCOL = 1

# (client zone, proxy zone, upstream broker zone, direction) -> bytes
ZoneKey = tuple[str, str, str, str]
TO_BROKER = "to_broker"  # requests: client -> proxy -> broker
TO_CLIENT = "to_client"  # answers: broker -> proxy -> client
UNKNOWN_ZONE = "unknown"
NO_BROKER = "none"  # as broker zone: answered by the proxy itself, no broker hop


class HeartbeatError(ValueError):
    """A heartbeat record that cannot be read; the member is then ignored."""


@dataclass(frozen=True, slots=True)
class Member:
    name: str
    zone: str
    host: str  # what clients connect to
    bootstrap_port: int
    broker_port_base: int  # upstream broker N is at broker_port_base + N on this member

    def broker_address(self, node_id: int) -> tuple[str, int]:
        return self.host, self.broker_port_base + node_id


@dataclass(frozen=True, slots=True)
class Heartbeat:
    member: Member
    started_at: float  # wall-clock seconds, so a restart is told apart
    zone_bytes: dict[ZoneKey, int] = field(default_factory=dict)
    # tiering: where peers hand batches over (0: tiering off), and the ids of the topics
    # being cut over for which this proxy forwards no produce to Kafka any more
    peer_port: int = 0
    drained: frozenset[str] = frozenset()
    # the member's WAL bytes not yet uploaded and the oldest one's wait in seconds, for
    # `fleet status` and /v1/fleet (None: tiering off, or a member that does not say)
    uploader_lag: tuple[int, float] | None = None
    # what this member's peer listener understands (peer_codec.PROTOCOL), so a sender
    # writes nothing an older member would refuse during a rolling upgrade
    peer_protocol: int = OLD_PEER_PROTOCOL


def encode_heartbeat(heartbeat: Heartbeat) -> bytes:
    member = heartbeat.member
    lag = {} if heartbeat.uploader_lag is None else {"uploader_lag": [*heartbeat.uploader_lag]}
    return json.dumps(
        {
            **lag,
            "v": HEARTBEAT_VERSION,
            "name": member.name,
            "zone": member.zone,
            "host": member.host,
            "bootstrap_port": member.bootstrap_port,
            "broker_port_base": member.broker_port_base,
            "started_at": heartbeat.started_at,
            "zone_bytes": [[*key, count] for key, count in sorted(heartbeat.zone_bytes.items())],
            "peer_port": heartbeat.peer_port,
            "drained": sorted(heartbeat.drained),
            "peer_protocol": heartbeat.peer_protocol,
        },
        separators=(",", ":"),
    ).encode()


def decode_heartbeat(value: bytes) -> Heartbeat:
    try:
        raw = json.loads(value)
        if raw.get("v") != HEARTBEAT_VERSION:
            raise HeartbeatError(f"heartbeat version {raw.get('v')!r} is not {HEARTBEAT_VERSION}")
        member = Member(
            name=_text(raw, "name"),
            zone=_text(raw, "zone"),
            host=_text(raw, "host"),
            bootstrap_port=_port(raw, "bootstrap_port"),
            broker_port_base=_port(raw, "broker_port_base"),
        )
        zone_bytes = {}
        for entry in raw.get("zone_bytes", []):
            *key, count = entry
            if len(key) != 4 or not all(isinstance(part, str) for part in key):
                raise HeartbeatError(f"zone_bytes entry {entry!r} is not 4 zones and a count")
            if isinstance(count, bool) or not isinstance(count, int) or count < 0:
                raise HeartbeatError(f"zone_bytes count {count!r} is not a byte count")
            zone_bytes[tuple(key)] = count
        started_at = raw.get("started_at")
        if isinstance(started_at, bool) or not isinstance(started_at, int | float):
            raise HeartbeatError(f"started_at {started_at!r} is not a time")
        peer_port = raw.get("peer_port", 0)
        if peer_port != 0:
            peer_port = _port(raw, "peer_port")
        drained = raw.get("drained", [])
        if not isinstance(drained, list) or not all(isinstance(t, str) for t in drained):
            raise HeartbeatError(f"drained {drained!r} is not a list of topic ids")
        lag = raw.get("uploader_lag")
        if lag is not None:
            lag_bytes, lag_seconds = lag
            if isinstance(lag_bytes, bool) or not isinstance(lag_bytes, int) or lag_bytes < 0:
                raise HeartbeatError(f"uploader_lag bytes {lag_bytes!r} is not a byte count")
            if isinstance(lag_seconds, bool) or not isinstance(lag_seconds, int | float):
                raise HeartbeatError(f"uploader_lag seconds {lag_seconds!r} is not a number")
            lag = (lag_bytes, float(lag_seconds))
        protocol = raw.get("peer_protocol", OLD_PEER_PROTOCOL)
        if isinstance(protocol, bool) or not isinstance(protocol, int) or protocol < 1:
            raise HeartbeatError(f"peer_protocol {protocol!r} is not a protocol level")
        return Heartbeat(
            member, float(started_at), zone_bytes, peer_port, frozenset(drained), lag, protocol
        )
    except HeartbeatError:
        raise
    except (ValueError, TypeError, AttributeError) as exc:
        raise HeartbeatError(f"unreadable heartbeat: {exc}") from None


def _text(raw: dict, name: str) -> str:
    value = raw.get(name)
    if not isinstance(value, str) or not value:
        raise HeartbeatError(f"{name} {value!r} is not a non-empty string")
    return value


def _port(raw: dict, name: str) -> int:
    value = raw.get(name)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= 65535:
        raise HeartbeatError(f"{name} {value!r} is not a port")
    return value


class FleetView:
    """The members this proxy has heard from, and which of them are alive.

    `self_member` is always alive: a proxy serving clients knows it is up, even before
    its own first heartbeat comes back (or if Kafka is unreachable). `version` changes
    whenever the set of live members changes, so callers can cache what they derive.
    """

    def __init__(self, self_member: Member, member_timeout_s: float) -> None:
        self.self_member = self_member
        self.member_timeout_s = member_timeout_s
        self._heartbeats: dict[str, tuple[Heartbeat, float]] = {}  # name -> (last, seen at)
        self._live: tuple[Member, ...] = (self_member,)
        self.version = 0

    def observe(self, name: str, heartbeat: Heartbeat | None, sent_at: float, now: float) -> None:
        """A record of the membership topic: a heartbeat sent at `sent_at` (the record's
        timestamp), or a tombstone (None)."""
        if heartbeat is None:
            self._heartbeats.pop(name, None)
        else:
            self._heartbeats[name] = (heartbeat, min(sent_at, now))
        self.expire(now)

    def expire(self, now: float) -> bool:
        """Recompute who is alive; True if that changed."""
        live = {self.self_member.name: self.self_member}
        for name, (heartbeat, seen_at) in self._heartbeats.items():
            if name != self.self_member.name and now - seen_at <= self.member_timeout_s:
                live[name] = heartbeat.member
        members = tuple(sorted(live.values(), key=lambda member: member.name))
        if members == self._live:
            return False
        self._live = members
        self.version += 1
        return True

    def live(self) -> tuple[Member, ...]:
        return self._live

    def heartbeat(self, name: str) -> Heartbeat | None:
        """The last heartbeat of a member, live or not."""
        found = self._heartbeats.get(name)
        return None if found is None else found[0]

    def heartbeats(self) -> dict[str, tuple[Heartbeat, float]]:
        """Every member heard from and when, live or not (for `fleet status`)."""
        return dict(self._heartbeats)

    def forgettable(self, now: float, forget_after_s: float) -> list[str]:
        """Members silent for longer than `forget_after_s`: a crashed proxy never writes
        its tombstone, so a live one writes it for it, keeping the topic small."""
        return [
            name
            for name, (_, seen_at) in self._heartbeats.items()
            if name != self.self_member.name and now - seen_at > forget_after_s
        ]


def crossing_hops(key: ZoneKey) -> tuple[bool, bool]:
    """(client-to-proxy hop crosses zones, proxy-to-broker hop crosses zones) for bytes
    counted under `key`. `NO_BROKER`: the proxy answered, there is no broker hop. An
    unknown zone is counted as crossing (the conservative reading)."""
    client_zone, proxy_zone, broker_zone, _ = key
    client_hop = client_zone != proxy_zone or client_zone == UNKNOWN_ZONE
    broker_hop = broker_zone != NO_BROKER and (
        broker_zone != proxy_zone or broker_zone == UNKNOWN_ZONE
    )
    return client_hop, broker_hop


def cross_zone_bytes(zone_bytes: Iterable[tuple[ZoneKey, int]]) -> int:
    """Bytes that crossed a zone boundary, each crossing hop counted."""
    return sum(sum(crossing_hops(key)) * count for key, count in zone_bytes)
