"""Rolling upgrades of the peer protocol, pure: a frame of the first release is still read,
an append to a peer of that release carries nothing it would refuse, and a heartbeat
without `peer_protocol` (the previous release's) is read as protocol 1."""

from __future__ import annotations

import json
import struct

import pytest
from crc32c import crc32c

from proxy.handoff.objects import S3WalLocation
from proxy.partition.sequence_holes import ProducerBatch
from proxy.peer.codec import (
    PROTOCOL,
    SEQUENCES_PROTOCOL,
    STABLE_PROTOCOL,
    PeerProtocolError,
    decode_frame,
    encode_frame,
    for_peer,
)
from proxy.peer.messages import AppendRequest, FetchRequest, FetchResponse
from proxy.routing.fleet import (
    HEARTBEAT_VERSION,
    OLD_PEER_PROTOCOL,
    Heartbeat,
    HeartbeatError,
    Member,
    decode_heartbeat,
    encode_heartbeat,
)

BATCH = ProducerBatch(7, 3, 100, 104)
LOCATION = S3WalLocation("wal/k", 0, 10, 5, 9)
MEMBER = Member("p1", "zone-a", "127.0.0.1", 19092, 19100)


def release_1_frame(cid: int, stream: int, acks: int, timeout_ms: int, payload: bytes) -> bytes:
    """An append request exactly as the release before the sequences trailer wrote it:
    the body ends with the payload (an older receiver refuses any byte after it)."""
    body = struct.pack(">BBI", 1, 1, cid) + struct.pack(">QhiB", stream, acks, timeout_ms, 1)
    body += struct.pack(">I", len(payload)) + payload
    return struct.pack(">II", len(body), crc32c(body)) + body


def test_a_release_1_append_is_still_read_without_sequences():
    request = decode_frame(release_1_frame(9, 5, -1, 100, b"abc"))
    assert isinstance(request, AppendRequest)
    assert (request.stream_id, bytes(request.records), request.batch, request.hole) == (
        5,
        b"abc",
        None,
        -1,
    )


def test_an_append_to_a_protocol_1_peer_is_the_release_1_frame():
    request = AppendRequest(9, 5, -1, 100, records=b"abc", batch=BATCH, hole=95)
    old = for_peer(request, OLD_PEER_PROTOCOL)
    assert (old.batch, old.hole) == (None, -1)
    assert encode_frame(old) == release_1_frame(9, 5, -1, 100, b"abc")
    s3 = for_peer(AppendRequest(1, 5, -1, 100, location=LOCATION, batch=BATCH), 1)
    assert encode_frame(s3) == encode_frame(AppendRequest(1, 5, -1, 100, location=LOCATION))


def test_an_append_to_a_peer_that_reads_sequences_keeps_them():
    request = AppendRequest(9, 5, -1, 100, records=b"abc", batch=BATCH, hole=95)
    assert PROTOCOL >= SEQUENCES_PROTOCOL > OLD_PEER_PROTOCOL
    for level in (SEQUENCES_PROTOCOL, PROTOCOL, PROTOCOL + 1):  # a newer peer reads them too
        assert for_peer(request, level) is request
    decoded = decode_frame(encode_frame(for_peer(request, PROTOCOL)))
    assert (decoded.batch, decoded.hole) == (BATCH, 95)
    plain = AppendRequest(9, 5, -1, 100, records=b"abc")  # no producer id: nothing to drop
    assert for_peer(plain, OLD_PEER_PROTOCOL) is plain


def test_a_heartbeat_without_peer_protocol_is_protocol_1():
    raw = json.loads(encode_heartbeat(Heartbeat(MEMBER, 1.5, peer_port=4000, peer_protocol=2)))
    assert raw["v"] == HEARTBEAT_VERSION == 1  # an older proxy refuses any other v
    assert raw["peer_protocol"] == 2
    del raw["peer_protocol"]  # as the previous release writes it
    old = decode_heartbeat(json.dumps(raw).encode())
    assert (old.peer_port, old.peer_protocol) == (4000, OLD_PEER_PROTOCOL)
    assert Heartbeat(MEMBER, 1.5).peer_protocol == OLD_PEER_PROTOCOL
    new = Heartbeat(MEMBER, 1.5, peer_port=4000, peer_protocol=PROTOCOL)
    assert decode_heartbeat(encode_heartbeat(new)) == new


@pytest.mark.parametrize("value", [0, -1, "2", True, 1.5, None])
def test_a_heartbeat_with_a_bad_peer_protocol_is_refused(value):
    raw = json.loads(encode_heartbeat(Heartbeat(MEMBER, 1.5)))
    raw["peer_protocol"] = value
    with pytest.raises(HeartbeatError, match="peer_protocol"):
        decode_heartbeat(json.dumps(raw).encode())


def test_a_fetch_without_stable_is_the_release_3_frame_and_is_answered_without_a_trailer():
    """An asker of a release before the last stable offset sends the frame it always
    sent; the owner's answer to it holds nothing after the records (the asker would refuse
    it). A new asker sends the flags only to an owner at STABLE_PROTOCOL."""
    assert PROTOCOL >= STABLE_PROTOCOL > 3
    old = encode_frame(FetchRequest(3, 7, 100, 1024, 0))
    assert old[14:] == struct.pack(">Qqii", 7, 100, 1024, 0)
    assert decode_frame(old).stable is False
    new = encode_frame(FetchRequest(3, 7, 100, 1024, 0, stable=True))
    assert new[14:] == struct.pack(">QqiiB", 7, 100, 1024, 0, 1)
    assert decode_frame(new).stable is True

    class Result:
        error_code, high_watermark, log_start_offset, last_stable_offset = 0, 9, 0, 5
        records = (b"batch",)

    plain = FetchResponse.from_result(3, Result())
    assert encode_frame(plain)[14:] == struct.pack(">hqqI", 0, 9, 0, 5) + b"batch"
    stable = FetchResponse.from_result(3, Result(), stable=True)
    frame = encode_frame(stable)
    assert frame[14:] == struct.pack(">hqqI", 0, 9, 0, 5) + b"batch" + struct.pack(">q", 5)
    decoded = decode_frame(frame)
    assert (bytes(decoded.records[0]), decoded.last_stable_offset) == (b"batch", 5)


def test_a_fetch_request_with_unknown_flags_is_refused():
    frame = bytearray(encode_frame(FetchRequest(3, 7, 100, 1024, 0, stable=True)))
    frame[-1] = 3
    body = bytes(frame[8:])
    frame[:8] = struct.pack(">II", len(body), crc32c(body))
    with pytest.raises(PeerProtocolError, match="flags"):
        decode_frame(bytes(frame))
