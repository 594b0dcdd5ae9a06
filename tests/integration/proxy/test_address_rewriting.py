"""The leak check itself: it finds Kafka's own broker addresses, and none behind the proxy.

Every proxy of this suite ends with a search of everything it sent to clients for the
upstream addresses. This file proves that search works on real answers: asked directly,
a Kafka broker's Metadata and FindCoordinator answers, in both the classic (int16-length
strings) and the flexible (compact strings) encodings, are found to hold upstream
addresses; the same requests through the proxy hold none, and hold the proxy's instead.
"""

from __future__ import annotations

import socket
import struct
import time

import pytest
from kio.schema.find_coordinator.v3.request import FindCoordinatorRequest as FindCoordinatorV3
from kio.schema.find_coordinator.v6.request import FindCoordinatorRequest as FindCoordinatorV6
from kio.schema.metadata.v4.request import MetadataRequest as MetadataV4
from kio.schema.metadata.v12.request import MetadataRequest as MetadataV12
from kio.static.primitive import i8

from proxy.kafka.messages import encode_request

pytestmark = pytest.mark.kafka

GROUP = i8(0)
REQUESTS = {
    "Metadata v4 (classic strings)": MetadataV4(topics=None, allow_auto_topic_creation=False),
    "Metadata v12 (compact strings)": MetadataV12(
        topics=None, allow_auto_topic_creation=False, include_topic_authorized_operations=False
    ),
    "FindCoordinator v3 (classic strings)": FindCoordinatorV3(key="compat-probe", key_type=GROUP),
    "FindCoordinator v6 (compact strings)": FindCoordinatorV6(
        key_type=GROUP, coordinator_keys=("compat-probe",)
    ),
}


def answer(address: str, request) -> bytes:
    """The raw answer frame (without its size) to one request on a fresh connection."""
    host, _, port = address.rpartition(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(encode_request(request, correlation_id=7, client_id="compat-probe"))
        (size,) = struct.unpack(">i", _read(sock, 4))
        return _read(sock, size)


def _read(sock: socket.socket, size: int) -> bytes:
    data = bytearray()
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        assert chunk, "connection closed mid-answer"
        data += chunk
    return bytes(data)


@pytest.mark.parametrize("name", REQUESTS)
def test_kafka_answers_name_upstream_brokers_and_proxy_answers_do_not(
    name, kafka_cluster, proxy, compat
):
    request = REQUESTS[name]
    upstream = compat.upstream_addresses(kafka_cluster)
    direct = answer_naming(kafka_cluster.bootstrap.split(",")[0], request, upstream, compat)
    assert compat.find_addresses(direct, upstream), f"the search misses {name} from Kafka"

    own = [("127.0.0.1", proxy.broker_port(node_id)) for node_id in (1, 2, 3)]
    proxied = answer_naming(proxy.bootstrap, request, own + upstream, compat)
    assert compat.find_addresses(proxied, upstream) == []
    assert compat.find_addresses(proxied, own), f"no proxy address in {proxied!r}"


def answer_naming(address: str, request, addresses, compat, timeout: float = 30.0) -> bytes:
    """The answer, asked again until it names a broker: the first FindCoordinator only
    starts creating __consumer_offsets and answers COORDINATOR_NOT_AVAILABLE."""
    deadline = time.monotonic() + timeout
    while True:
        data = answer(address, request)
        if compat.find_addresses(data, addresses) or time.monotonic() > deadline:
            return data
        time.sleep(0.3)
