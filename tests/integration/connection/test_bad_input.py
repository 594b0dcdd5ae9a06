"""Bad input closes that connection only, with a warning and a metric naming the reason.

One test per kind: a frame size out of range (refused on the 4 size bytes alone), a
connection that ends mid-frame, a header too short to read, an unknown API key or
version, an ApiVersions body the proxy (which answers it) cannot read, a Produce too
short to say its acks, garbage after a valid request. Each checks that the warning names
the client's address and the reason, that `tierproxy_rejected_frames{reason}` counted it
once, and that a connection opened before (a raw one with a request in flight, and a
librdkafka producer) is still served after.
"""

from __future__ import annotations

import logging
import socket
import struct
import time
import uuid

import pytest
from confluent_kafka import Producer

pytestmark = pytest.mark.kafka

MiB = 1 << 20
LOGGER = "tierproxy.connection"
HTTP = b"GET / HTTP/1.1\r\nHost: kafka\r\n\r\n"  # read as a frame size of 1.1 GB


def frame(payload: bytes) -> bytes:
    return struct.pack(">i", len(payload)) + payload


def header(api_key: int, version: int, correlation_id: int, flexible: bool) -> bytes:
    client_id = b"bad-input-test"
    head = struct.pack(">hhih", api_key, version, correlation_id, len(client_id)) + client_id
    return head + (b"\x00" if flexible else b"")


class Witness:
    """Connections opened before the bad input, which must carry on through it."""

    def __init__(self, raw_client, producer: Producer, topic: str, wire) -> None:
        self.raw = raw_client
        self.producer = producer
        self.topic = topic
        self.wire = wire
        self.raw.send(wire.metadata(1))
        self.raw.read_frame()
        self.raw.send(wire.metadata(2, topic))  # in flight while the bad client is served

    def still_served(self) -> None:
        assert self.wire.size.unpack_from(self.raw.read_frame())[0] == 2
        self.raw.send(self.wire.api_versions(3), self.wire.metadata(4, self.topic))
        answers = [self.raw.read_frame() for _ in range(2)]
        assert [self.wire.size.unpack_from(a)[0] for a in answers] == [3, 4]
        failed: list[str] = []
        self.producer.produce(
            self.topic,
            value=uuid.uuid4().bytes,
            on_delivery=lambda err, _msg: failed.append(str(err)) if err else None,
        )
        assert self.producer.flush(30) == 0 and not failed, failed


@pytest.fixture(scope="module")
def witness_producer(small_frames_proxy, kafka):
    """A librdkafka producer connected through the proxy for the whole module."""
    topic = kafka.create_topic("bad-input-witness")
    producer = Producer({"bootstrap.servers": small_frames_proxy.thread.bootstrap, "acks": -1})
    producer.produce(topic, value=b"first")
    assert producer.flush(30) == 0
    held = {"producer": producer, "topic": topic}
    del producer
    yield held
    held.pop("producer").flush(10)  # the last reference: librdkafka stops before the proxy


@pytest.fixture
def witness(small_frames_proxy, witness_producer, raw, wire) -> Witness:
    producer, topic = witness_producer["producer"], witness_producer["topic"]
    return Witness(raw(small_frames_proxy.address), producer, topic, wire)


@pytest.fixture
def warnings_log(caplog):
    caplog.set_level(logging.WARNING, logger=LOGGER)
    return caplog


def assert_rejected(proxy, client, caplog, reason: str, before: float, says: str) -> None:
    """The proxy closed `client`, counted `reason` once, and warned naming both."""
    assert client.closed_by_peer(timeout=10), "the proxy kept the connection open"
    deadline = time.monotonic() + 5
    while proxy.rejected(reason) < before + 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert proxy.rejected(reason) == before + 1
    warned = [
        record.getMessage()
        for record in caplog.records
        if record.name == LOGGER and record.levelno == logging.WARNING
    ]
    about_client = [message for message in warned if f"client {client.local} " in message]
    assert len(about_client) == 1, warned
    assert says in about_client[0]


def test_oversized_frame_is_refused_on_its_size_alone(
    small_frames_proxy, raw, wire, witness, warnings_log
):
    proxy = small_frames_proxy
    before = proxy.rejected("oversized_frame")
    bad = raw(proxy.address)
    bad.send(struct.pack(">i", MiB + 1))  # the size only: no body ever follows
    assert_rejected(
        proxy, bad, warnings_log, "oversized_frame", before, "frame size 1048577 exceeds limit"
    )
    witness.still_served()

    # The control: a frame of exactly the limit is read and forwarded (Kafka ignores
    # bytes after a request's fields).
    request = wire.metadata(5)
    padded = request[4:] + bytes(MiB - len(request) + 4)
    ok = raw(proxy.address)
    ok.send(frame(padded))
    assert wire.size.unpack_from(ok.read_frame())[0] == 5


def test_default_frame_limit_is_kafkas_100_mib(proxy, raw, warnings_log):
    before = proxy.rejected("oversized_frame")
    bad = raw(proxy.address)
    bad.send(struct.pack(">i", 100 * MiB + 1))
    assert_rejected(proxy, bad, warnings_log, "oversized_frame", before, "exceeds limit 104857600")
    at_limit = raw(proxy.address)
    at_limit.send(struct.pack(">i", 100 * MiB))
    assert at_limit.nothing_within(0.5), "a frame of 100 MiB was refused"


def test_negative_frame_size(small_frames_proxy, raw, witness, warnings_log):
    proxy = small_frames_proxy
    before = proxy.rejected("negative_frame_size")
    bad = raw(proxy.address)
    bad.send(b"\xff\xff\xff\xfe" + b"\x00" * 16)
    assert_rejected(
        proxy, bad, warnings_log, "negative_frame_size", before, "negative frame size -2"
    )
    witness.still_served()


@pytest.mark.parametrize(
    ("sent", "says"),
    [
        (b"\x00\x00", "after 2 of the 4 bytes of a frame size"),
        (struct.pack(">i", 100) + b"\x00" * 40, "after 40 of the 100 bytes of a frame"),
    ],
    ids=["in-the-size", "in-the-body"],
)
def test_connection_closed_mid_frame(small_frames_proxy, raw, witness, warnings_log, sent, says):
    proxy = small_frames_proxy
    before = proxy.rejected("truncated_frame")
    bad = raw(proxy.address)
    bad.send(sent)
    bad.sock.shutdown(socket.SHUT_WR)  # the end of what it sends, mid-frame
    assert_rejected(proxy, bad, warnings_log, "truncated_frame", before, says)
    witness.still_served()


@pytest.mark.parametrize(
    ("payload", "says"),
    [
        (b"\x00\x03\x00", "request header truncated: 3 bytes"),
        (struct.pack(">hhih", 3, 1, 7, 50) + b"abc", "client id of 50 bytes"),
        (struct.pack(">hhih", 3, 12, 7, 1) + b"x", "truncated Metadata v12 request header"),
    ],
    ids=["shorter-than-fixed-fields", "client-id-past-the-end", "flexible-no-tagged-fields"],
)
def test_truncated_header(small_frames_proxy, raw, witness, warnings_log, payload, says):
    proxy = small_frames_proxy
    before = proxy.rejected("truncated_header")
    bad = raw(proxy.address)
    bad.send(frame(payload))
    assert_rejected(proxy, bad, warnings_log, "truncated_header", before, says)
    witness.still_served()


@pytest.mark.parametrize("api_key", [12345, -1, 93])
def test_unknown_api_key_is_refused_before_anything_is_forwarded(
    small_frames_proxy, raw, witness, warnings_log, api_key
):
    proxy = small_frames_proxy
    before = proxy.rejected("unknown_api_key")
    opened = len(proxy.upstream_opened)
    bad = raw(proxy.address)
    bad.send(frame(header(api_key, 0, 7, flexible=False) + b"body"))
    assert_rejected(
        proxy, bad, warnings_log, "unknown_api_key", before, f"unknown API key {api_key}"
    )
    assert len(proxy.upstream_opened) == opened, "an upstream connection was opened for it"
    witness.still_served()


def test_unknown_api_version_is_refused(small_frames_proxy, raw, wire, witness, warnings_log):
    proxy = small_frames_proxy
    before = proxy.rejected("unsupported_version")
    opened = len(proxy.upstream_opened)
    bad = raw(proxy.address)
    bad.send(frame(header(3, 99, 7, flexible=True)))  # Metadata v99
    assert_rejected(
        proxy, bad, warnings_log, "unsupported_version", before, "unsupported version 99"
    )
    assert len(proxy.upstream_opened) == opened
    witness.still_served()

    # Except for ApiVersions, as in Kafka (KIP-511): answered with UNSUPPORTED_VERSION
    # in the v0 shape, so that a newer client can downgrade; the connection stays.
    newer = raw(proxy.address)
    newer.send(frame(header(18, 99, 8, flexible=True)))
    correlation_id, answer = newer.read_answer(wire.response_type("api_versions", 0))
    assert (correlation_id, answer.error_code) == (8, 35)
    newer.send(wire.api_versions(9))
    assert wire.size.unpack_from(newer.read_frame())[0] == 9


@pytest.mark.parametrize(
    ("body", "says"),
    [
        (b"\x05tool\x021\x00" + b"garbage", "ApiVersions v3 request: 7 bytes after its end"),
        (b"\x09tool", "ApiVersions v3 request: truncated"),
        (b"\x00\x021\x00", "ApiVersions v3 request: client_software_name is null"),
    ],
    ids=["trailing-garbage", "string-past-the-end", "null-name"],
)
def test_unreadable_api_versions_body(small_frames_proxy, raw, witness, warnings_log, body, says):
    """The proxy answers ApiVersions itself, so it reads the body as Kafka would (and
    is stricter about bytes after it, which Kafka ignores)."""
    proxy = small_frames_proxy
    before = proxy.rejected("malformed_request")
    bad = raw(proxy.address)
    bad.send(frame(header(18, 3, 7, flexible=True) + body))
    assert_rejected(proxy, bad, warnings_log, "malformed_request", before, says)
    witness.still_served()


def test_api_versions_with_tagged_fields_it_does_not_know_is_answered(
    small_frames_proxy, raw, wire
):
    """The control: Kafka adds tagged fields to existing versions; reading the body must
    skip them, not refuse them."""
    client = raw(small_frames_proxy.address)
    tagged = b"\x01" + b"\x07\x02hi"  # one field, tag 7, two bytes
    client.send(frame(header(18, 3, 7, flexible=True) + b"\x05tool\x021" + tagged))
    correlation_id, answer = client.read_answer(wire.response_type("api_versions", 3))
    assert (correlation_id, answer.error_code) == (7, 0)


def test_produce_too_short_to_say_its_acks(small_frames_proxy, raw, witness, warnings_log):
    """The proxy reads a Produce's acks to know whether an answer will come."""
    proxy = small_frames_proxy
    before = proxy.rejected("malformed_request")
    bad = raw(proxy.address)
    bad.send(frame(header(0, 9, 7, flexible=True) + b"\x00\x00"))  # null id, half the acks
    assert_rejected(proxy, bad, warnings_log, "malformed_request", before, "Produce v9")
    witness.still_served()


@pytest.mark.parametrize("first", ["metadata", "api_versions"], ids=["forwarded", "local"])
def test_garbage_after_a_valid_request(small_frames_proxy, raw, wire, witness, warnings_log, first):
    """The valid request is answered (as Kafka would: it reads a connection's next
    request only once it has answered the last), then the connection closes."""
    proxy = small_frames_proxy
    before = proxy.rejected("oversized_frame")
    bad = raw(proxy.address)
    bad.send(getattr(wire, first)(7), HTTP)
    correlation_id, _ = bad.read_answer(wire.response_type(first, 12 if first == "metadata" else 3))
    assert correlation_id == 7
    assert_rejected(
        proxy, bad, warnings_log, "oversized_frame", before, "frame size 1195725856 exceeds"
    )
    witness.still_served()


def test_unreadable_body_of_a_forwarded_request(small_frames_proxy, raw, witness, warnings_log):
    """The proxy forwards bodies unread; Kafka closes the connection on one it cannot
    parse, and the proxy closes the client's with a warning naming the request."""
    proxy = small_frames_proxy
    before = proxy.metric("tierproxy_upstream_errors_total", reason="closed")
    bad = raw(proxy.address)
    bad.send(frame(header(3, 12, 7, flexible=True) + b"\xff\xff\xff"))  # Metadata v12
    assert bad.closed_by_peer(timeout=10)
    deadline = time.monotonic() + 5
    while (
        proxy.metric("tierproxy_upstream_errors_total", reason="closed") < before + 1
        and time.monotonic() < deadline
    ):
        time.sleep(0.01)
    assert proxy.metric("tierproxy_upstream_errors_total", reason="closed") == before + 1
    warned = [
        record.getMessage()
        for record in warnings_log.records
        if f"client {bad.local} " in record.getMessage()
    ]
    assert len(warned) == 1 and "api key 3 v12 correlation id 7" in warned[0], warned
    witness.still_served()


def test_a_fault_in_the_relay_closes_that_connection_alone(
    small_frames_proxy, raw, wire, witness, warnings_log, monkeypatch
):
    """A request the relay (the forwarding done from the reader's callback) fails on is
    the proxy's own fault: that client's connection closes with an error naming it and
    the cause, and every other connection is served on."""
    from proxy.server import connection

    marker = "relay-breaker-" + uuid.uuid4().hex[:8]
    reads_acks = connection.produce_acks

    def breaks_on_marker(version, body):
        if marker.encode() in bytes(body):
            raise RuntimeError("a fault planted in the relay")
        return reads_acks(version, body)

    monkeypatch.setattr(connection, "produce_acks", breaks_on_marker)
    proxy = small_frames_proxy
    bad = raw(proxy.address)
    bad.send(wire.metadata(1))  # the first request is the loop's; the relay takes over
    assert wire.size.unpack_from(bad.read_frame())[0] == 1
    bad.send(wire.produce(2, 9, marker, [b"never forwarded"], acks=1))
    assert bad.closed_by_peer(timeout=10), "the proxy kept the connection open"
    _one_relay_error(warnings_log, bad.local, "requests")
    witness.still_served()  # its Produce goes through the same relay, unharmed


def test_a_fault_in_the_answer_relay_closes_that_connection_alone(
    small_frames_proxy, raw, wire, witness, warnings_log, monkeypatch
):
    """An answer the relay (sending answers on from the upstream reader's callback) fails
    on is the proxy's own fault too: that client's connection closes with one error
    naming it, the direction and the cause; upstream is not blamed, and every other
    connection is served on."""
    from proxy.server import connection

    rewrites = connection.ClientConnection._rewritten
    armed: set[str] = set()

    def breaks_when_armed(self, api, slot, framed):
        if self.peer in armed:
            raise RuntimeError("a fault planted in the answer relay")
        return rewrites(self, api, slot, framed)

    monkeypatch.setattr(connection.ClientConnection, "_rewritten", breaks_when_armed)
    proxy = small_frames_proxy
    lost = proxy.metric("tierproxy_upstream_errors_total", reason="closed")
    bad = raw(proxy.address)
    bad.send(wire.metadata(1))
    assert wire.size.unpack_from(bad.read_frame())[0] == 1  # rewritten, sent on
    armed.add(bad.local)  # the upstream loop waits for the next answer: the relay's
    bad.send(wire.metadata(2))
    assert bad.closed_by_peer(timeout=10), "the proxy kept the connection open"
    _one_relay_error(warnings_log, bad.local, "answers")
    assert proxy.metric("tierproxy_upstream_errors_total", reason="closed") == lost
    witness.still_served()  # its answers go through the same relay, unharmed


def _one_relay_error(warnings_log, client: str, direction: str) -> None:
    """The one record said of `client`: an ERROR that the relay of `direction` failed,
    with the planted RuntimeError as its cause."""
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and not [
        r for r in warnings_log.records if f"client {client} " in r.getMessage()
    ]:
        time.sleep(0.01)
    said = [r for r in warnings_log.records if f"client {client} " in r.getMessage()]
    assert len(said) == 1, [r.getMessage() for r in said]
    assert said[0].levelno == logging.ERROR
    assert f"relaying {direction} failed" in said[0].getMessage()
    assert said[0].exc_info is not None and isinstance(said[0].exc_info[1], RuntimeError)
