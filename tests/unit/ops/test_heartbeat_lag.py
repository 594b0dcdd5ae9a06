"""The uploader lag a member's heartbeat carries, for `fleet status` and /v1/fleet."""

from __future__ import annotations

import json

import pytest

from proxy.routing.fleet import (
    Heartbeat,
    HeartbeatError,
    Member,
    decode_heartbeat,
    encode_heartbeat,
)

MEMBER = Member("proxy-a1", "zone-a", "10.0.1.21", 9092, 19100)


def test_the_lag_round_trips_and_an_older_heartbeat_has_none():
    beat = Heartbeat(MEMBER, 1700000000.0, peer_port=19090, uploader_lag=(4096, 1.25))
    assert decode_heartbeat(encode_heartbeat(beat)) == beat
    without = Heartbeat(MEMBER, 1700000000.0)
    encoded = encode_heartbeat(without)
    assert b"uploader_lag" not in encoded  # what a proxy without tiering sends
    assert decode_heartbeat(encoded).uploader_lag is None


@pytest.mark.parametrize(
    ("lag", "words"),
    [
        ([-1, 0.5], "bytes -1 is not a byte count"),
        (["many", 0.5], "bytes 'many' is not a byte count"),
        ([10, "soon"], "seconds 'soon' is not a number"),
        ([10], "unreadable heartbeat"),
    ],
)
def test_a_bad_lag_makes_the_heartbeat_unreadable(lag, words):
    raw = json.loads(encode_heartbeat(Heartbeat(MEMBER, 1.0)))
    raw["uploader_lag"] = lag
    with pytest.raises(HeartbeatError) as bad:
        decode_heartbeat(json.dumps(raw).encode())
    assert words in str(bad.value)
