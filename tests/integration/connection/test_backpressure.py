"""Bounded buffers both ways, measured on a `tierproxy run` process of its own.

A client that pipelines 25 Fetch requests of 8 MiB each (200 MiB) and then stops
reading must make the proxy stop reading from the broker (the bytes it has read,
/proc/<pid>/io rchar, stop growing) and keep its peak memory (VmHWM) bounded by its
buffers and at most an answer or two, not by what was asked; when the client reads
again it gets every batch, whole (CRC) and in order. Fetch v12, whose answers the proxy
passes through, and v17, whose answers it reads whole for the KIP-951 rewrite, are both
measured, and so is a client that reads at once, for comparison. The other way round, a
client that sends ApiVersions requests, which the proxy answers itself, without reading
the answers must stop being read.

The numbers are printed (run with -s) and recorded as test properties for the docs.
"""

from __future__ import annotations

import os
import select
import struct
import threading
import uuid
from dataclasses import dataclass

import crc32c
import pytest
from confluent_kafka import Producer

pytestmark = pytest.mark.kafka

MiB = 1 << 20
VALUE_BYTES = 256 * 1024  # one record per batch, every batch the same size
RECORDS = 800  # 200 MiB
PER_FETCH = 32  # records per Fetch answer: 8 MiB
FETCHES = RECORDS // PER_FETCH
SMALL_SOCKET_BUFFER = 64 * 1024  # the stalled client's kernel buffers hold little
# Fetch v12 answers are passed through a buffer at a time; from v16 they may name
# brokers (KIP-951), so the proxy reads each whole to rewrite it. Either way it holds a
# bounded amount, nowhere near the 200 MiB asked for: its buffers (1 MiB each way by
# default) and the kernel's for v12; for v17 also the 8 MiB answer being read and the
# one still being written (measured: +8 MiB and +25 MiB over the idle proxy).
FETCH_VERSIONS = pytest.mark.parametrize("version", [12, 17], ids=["fetch-v12", "fetch-v17"])
MAX_FETCH_GROWTH = {12: 20 * MiB, 17: 40 * MiB}
MAX_READ_WHILE_STALLED = 24 * MiB
API_VERSIONS_REQUESTS = 50_000  # 2.1 MB of requests, 32 MB of answers
SMALL_PROXY_BUFFERS = 64 * 1024  # limits.buffer_bytes: a few answers' worth
MAX_LOCAL_ANSWERS_GROWTH = 16 * MiB


@dataclass(frozen=True)
class BigTopic:
    name: str
    topic_id: uuid.UUID
    leader: int
    batch_bytes: int


@pytest.fixture(scope="module")
def big_topic(kafka, wire) -> BigTopic:
    """One partition of RECORDS records of VALUE_BYTES, each in a batch of its own; the
    value starts with the record's offset."""
    name = kafka.create_topic("backpressure", replication=1)
    filler = os.urandom(VALUE_BYTES - 8)
    producer = Producer(
        {
            "bootstrap.servers": kafka.bootstrap,  # straight to Kafka: this is the setup
            "acks": 1,
            "linger.ms": 0,
            "batch.size": 1024,  # smaller than a record: one record per batch
            "compression.type": "none",
        }
    )
    failed: list[str] = []
    for offset in range(RECORDS):
        while True:
            try:
                producer.produce(
                    name,
                    value=struct.pack(">q", offset) + filler,
                    partition=0,
                    on_delivery=lambda err, _msg: failed.append(str(err)) if err else None,
                )
                break
            except BufferError:
                producer.poll(0.1)
        producer.poll(0)
    assert producer.flush(120) == 0 and not failed, failed[:3]
    leader = kafka.leader(name, 0)
    client = kafka.connect(leader)
    try:  # KIP-74: an answer holds at least one whole batch, so max_bytes=1 gives one
        client.send(wire.fetch(1, name, 0, max_bytes=1), wire.metadata(2, name))
        _, answer = client.read_answer(wire.response_type("fetch", 12))
        _, metadata = client.read_answer(wire.response_type("metadata", 12))
    finally:
        client.close()
    records = answer.responses[0].partitions[0].records
    (batch_length,) = struct.unpack_from(">i", records, 8)
    assert len(records) == 12 + batch_length, "expected exactly one batch"
    return BigTopic(name, metadata.topics[0].topic_id, leader, 12 + batch_length)


def send_fetches(client, wire, topic: BigTopic, version: int) -> None:
    """FETCHES requests at once, each for the next PER_FETCH records exactly."""
    max_bytes = PER_FETCH * topic.batch_bytes
    client.send(
        *(
            wire.fetch(
                1000 + i,
                topic.name,
                i * PER_FETCH,
                max_bytes,
                version=version,
                topic_id=topic.topic_id,
            )
            for i in range(FETCHES)
        )
    )


def batch_offsets(records: bytes) -> list[int]:
    """Base offsets of the batches, each checked whole: CRC, and the value it holds."""
    view = memoryview(records)
    offsets = []
    at = 0
    while at < len(view):
        base_offset, batch_length = struct.unpack_from(">qi", view, at)
        end = at + 12 + batch_length
        assert end <= len(view), f"batch at offset {base_offset} cut short"
        (crc,) = struct.unpack_from(">I", view, at + 17)
        assert crc32c.crc32c(view[at + 21 : end]) == crc, f"batch {base_offset}: bad CRC"
        # The value is last in the record, before its header count (one byte: 0).
        assert struct.unpack_from(">q", view, end - 1 - VALUE_BYTES)[0] == base_offset
        offsets.append(base_offset)
        at = end
    return offsets


def check_fetch_answers(frames: list[bytes], wire, version: int) -> int:
    """Every answer in order and whole; returns the record bytes they carried."""
    answer_type = wire.response_type("fetch", version)
    carried = 0
    for i, frame in enumerate(frames):
        correlation_id, answer = wire.decode(frame, answer_type)
        assert correlation_id == 1000 + i
        partition = answer.responses[0].partitions[0]
        assert partition.error_code == 0
        assert batch_offsets(partition.records) == list(range(i * PER_FETCH, (i + 1) * PER_FETCH))
        carried += len(partition.records)
    return carried


def report(record_property, prefix: str, **numbers: float) -> None:
    for key, value in numbers.items():
        record_property(f"{prefix}_{key}", value)
    print(f"\n{prefix}: " + " ".join(f"{key}={value:.1f}" for key, value in numbers.items()))


@FETCH_VERSIONS
def test_stalled_fetch_client_stops_the_proxy_reading_upstream(
    big_topic, proxy_process, raw, wire, record_property, version
):
    proxy = proxy_process()
    client = raw(proxy.broker_address(big_topic.leader), rcvbuf=SMALL_SOCKET_BUFFER)
    client.send(wire.metadata(1))  # opens the upstream connection before measuring
    client.read_frame()
    idle = proxy.memory()["VmRSS"]
    read_before = proxy.reads_settle(quiet_s=0.5)

    send_fetches(client, wire, big_topic, version)  # 200 MiB asked for, and nothing read
    read_while_stalled = proxy.reads_settle(quiet_s=1.5) - read_before
    stalled = proxy.memory()

    frames = [client.read_frame(timeout=60) for _ in range(FETCHES)]
    carried = check_fetch_answers(frames, wire, version)
    after = proxy.memory()
    report(
        record_property,
        f"stalled_fetch_v{version}",
        idle_rss_mib=idle / MiB,
        read_while_stalled_mib=read_while_stalled / MiB,
        rss_while_stalled_mib=stalled["VmRSS"] / MiB,
        peak_rss_mib=after["VmHWM"] / MiB,
        carried_mib=carried / MiB,
    )
    assert proxy.alive()
    assert carried == RECORDS * big_topic.batch_bytes
    assert read_while_stalled < MAX_READ_WHILE_STALLED
    assert stalled["VmHWM"] - idle < MAX_FETCH_GROWTH[version]
    assert after["VmHWM"] - idle < MAX_FETCH_GROWTH[version]


@FETCH_VERSIONS
def test_reading_fetch_client_peak_memory(
    big_topic, proxy_process, raw, wire, record_property, version
):
    """The same 200 MiB to a client that reads at once: the baseline for the above."""
    proxy = proxy_process()
    client = raw(proxy.broker_address(big_topic.leader))
    client.send(wire.metadata(1))
    client.read_frame()
    idle = proxy.memory()["VmRSS"]

    send_fetches(client, wire, big_topic, version)
    frames = [client.read_frame(timeout=60) for _ in range(FETCHES)]
    carried = check_fetch_answers(frames, wire, version)
    after = proxy.memory()
    report(
        record_property,
        f"reading_fetch_v{version}",
        idle_rss_mib=idle / MiB,
        peak_rss_mib=after["VmHWM"] / MiB,
        carried_mib=carried / MiB,
    )
    assert carried == RECORDS * big_topic.batch_bytes
    assert after["VmHWM"] - idle < MAX_FETCH_GROWTH[version]


def test_client_not_reading_local_answers_stops_being_read(
    proxy_process, raw, wire, record_property
):
    proxy = proxy_process(buffer_bytes=SMALL_PROXY_BUFFERS)
    client = raw(proxy.bootstrap_address, rcvbuf=SMALL_SOCKET_BUFFER)
    client.send(wire.api_versions(0))
    client.read_frame()
    idle = proxy.memory()["VmRSS"]
    read_before = proxy.reads_settle(quiet_s=0.5)
    one = wire.api_versions(0)
    requests = bytearray(one * API_VERSIONS_REQUESTS)
    for i in range(API_VERSIONS_REQUESTS):  # correlation id i, after size, key, version
        wire.size.pack_into(requests, i * len(one) + 8, i)
    view = memoryview(requests)

    client.sock.setblocking(False)
    sent = 0
    while sent < len(view):
        _, writable, _ = select.select([], [client.sock], [], 1.0)
        if not writable:
            break  # the kernel buffers are full: the proxy stopped reading
        try:
            sent += client.sock.send(view[sent : sent + 65536])
        except BlockingIOError:
            continue
    read_while_stalled = proxy.reads_settle(quiet_s=1.5) - read_before
    stalled = proxy.memory()
    client.sock.setblocking(True)

    rest = threading.Thread(target=client.sock.sendall, args=(view[sent:],), daemon=True)
    rest.start()  # while the answers are read, or both sides would wait on each other
    answered = [
        wire.size.unpack_from(client.read_frame(timeout=60))[0]
        for _ in range(API_VERSIONS_REQUESTS)
    ]
    rest.join(30)
    after = proxy.memory()
    report(
        record_property,
        "local_answers",
        idle_rss_mib=idle / MiB,
        requests_mib=len(view) / MiB,
        sent_while_stalled_mib=sent / MiB,
        read_while_stalled_mib=read_while_stalled / MiB,
        rss_while_stalled_mib=stalled["VmRSS"] / MiB,
        peak_rss_mib=after["VmHWM"] / MiB,
    )
    # Each 43-byte request makes a 635-byte answer: a proxy that kept reading would
    # have read them all and hold most of ~38 MB of answers.
    assert read_while_stalled < min(sent, len(view)) / 2
    assert answered == list(range(API_VERSIONS_REQUESTS))
    assert stalled["VmHWM"] - idle < MAX_LOCAL_ANSWERS_GROWTH
    assert after["VmHWM"] - idle < MAX_LOCAL_ANSWERS_GROWTH
