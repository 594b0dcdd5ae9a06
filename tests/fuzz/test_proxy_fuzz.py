"""Hypothesis throws over 100,000 malformed frames at a running proxy; normal clients
still work through it afterwards, and no connection is left behind.

Every malformed frame goes on a connection of its own: the first bad frame closes a
connection, so the proxy would never read a second one, and each frame counted here is
one the proxy had to judge. The kinds: sizes over the limit or negative, streams ending
inside a size or a body, headers shorter than their fixed fields or with a client id
running past the end, unknown API keys, unknown versions of known ones, ApiVersions
(answered by the proxy) and Produce (whose acks it reads) with bodies it cannot read,
raw random bytes, a valid request followed by a bad frame, and (1 in 100) a valid header
with a random body for a read-only API, which the proxy forwards and Kafka refuses or
answers. No frame is a whole request for an API that changes anything in the cluster.
Unless the stream is meant to end, a negative size follows the frame, so the proxy
closes the connection even when a random frame turned out valid.

Hypothesis draws, per example, ten recipes (a kind and its parameters) and a seed; each
recipe is thrown as drawn and as 99 siblings of the same kind whose parameters come from
a Random with that seed: a thousand frames per example at the cost of eleven draws,
which keeps the test within its time on a busy two-core machine. A child process (this
file run as a script) does the throwing, leaving this one to Hypothesis and the proxy's
thread. Per example, every connection must be closed by the proxy in time (Hypothesis
shrinks a failure to the recipe behind it); at the end the proxy thread is alive,
nothing was logged at ERROR (an exception the proxy did not expect), the connection
gauge and the proxy's set of connection tasks are back to the good clients, which it
still serves, and a librdkafka producer and consumer work through the same proxy.
"""

from __future__ import annotations

import asyncio
import logging
import pickle
import random
import struct
import subprocess
import sys
import time
import uuid
from collections import Counter

import pytest
import uvloop
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from proxy.config import parse_config
from proxy.devstack.paths import free_port, free_port_block
from proxy.devstack.proxy_thread import ProxyThread
from proxy.kafka.versions import APIS, request_header_version

MAX_FRAME = 1 << 20  # limits.max_frame_bytes of the proxy under test
API_VERSIONS, PRODUCE = 18, 0
CONCURRENCY = 64
CLOSE_TIMEOUT_S = 20.0  # Kafka refusing a forwarded body can take a while under load
_SIZE = struct.Struct(">i")
_FIXED = struct.Struct(">hhi")  # api key, api version, correlation id
_LENGTH = struct.Struct(">I")
END = _SIZE.pack(-1)  # a negative frame size, sent after a frame unless the stream ends


# -- the thrower: a child process ---------------------------------------------------


async def _throw(
    address: tuple[str, int], case: tuple[bytes, bool], gate: asyncio.Semaphore
) -> bool:
    """Send the bytes (and the end of the stream if asked); True if the proxy then
    closes the connection in time."""
    data, ends = case
    async with gate:
        reader, writer = await asyncio.open_connection(*address)
        try:
            writer.write(data)
            if ends:
                writer.write_eof()
            async with asyncio.timeout(CLOSE_TIMEOUT_S):
                while await reader.read(65536):
                    pass  # answers to what was valid, then the end
            return True
        except ConnectionError:
            return True  # closed with our bytes unread: a reset
        except TimeoutError:
            return False
        finally:
            writer.close()
            try:
                await writer.wait_closed()
            except ConnectionError:
                pass


async def _throw_all(address: tuple[str, int], batch: list[tuple[bytes, bool]]) -> list[bool]:
    gate = asyncio.Semaphore(CONCURRENCY)
    return await asyncio.gather(*(_throw(address, data, gate) for data in batch))


def _thrower_main(host: str, port: int) -> None:
    """Read batches (length-prefixed pickles) on stdin, answer which closed in time."""
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        while head := stdin.read(_LENGTH.size):
            batch = pickle.loads(stdin.read(_LENGTH.unpack(head)[0]))
            reply = pickle.dumps(runner.run(_throw_all((host, port), batch)))
            stdout.write(_LENGTH.pack(len(reply)) + reply)
            stdout.flush()


# -- the test -------------------------------------------------------------------------

pytestmark = pytest.mark.kafka

FRAMES = 100_000
RECIPES = 10  # per example
SIBLINGS = 99  # per recipe
PER_EXAMPLE = RECIPES * (1 + SIBLINGS)
GOOD_CLIENTS = 3
# Read-only APIs: a random body that happens to parse changes nothing in the cluster.
FORWARDED_SAFE = (1, 2, 9, 15, 16, 32, 60, 61, 65, 66, 75)
KNOWN = sorted(set(APIS) - {API_VERSIONS})
UNKNOWN = [key for key in range(-(1 << 15), 1 << 15) if key not in APIS]


def sized(payload: bytes) -> bytes:
    return _SIZE.pack(len(payload)) + payload


def header(api_key: int, version: int, correlation_id: int) -> bytes:
    head = _FIXED.pack(api_key, version, correlation_id) + b"\x00\x04fuzz"
    return head + (b"\x00" if request_header_version(api_key, version) >= 2 else b"")


def is_harmless(data: bytes) -> bool:
    """Not a whole request for a known version of an API outside FORWARDED_SAFE."""
    if len(data) < 12:
        return True
    (size,) = _SIZE.unpack_from(data)
    if not 8 <= size <= len(data) - 4:
        return True
    api_key, version, _ = _FIXED.unpack_from(data, 4)
    spec = APIS.get(api_key)
    known = spec is not None and spec.min_version <= version <= spec.max_version
    return not known or api_key in FORWARDED_SAFE or api_key == API_VERSIONS


def build(kind: int, n: int, m: int, body: bytes) -> tuple[bytes, bool]:
    """A malformed frame of `kind` (0..99, by share) made from the numbers n (int32) and
    m (int16) and a short body: (the bytes to send, whether the stream ends after them).

    A stream that does not end gets END after the frame, so that the proxy closes the
    connection even if the frame happened to be valid; when it was not, END stays unread
    and the close is a reset, which leaves no TIME_WAIT socket on this shared machine.
    """
    if kind < 14:  # a size over the limit: refused on the 4 bytes alone
        return _SIZE.pack(MAX_FRAME + 1 + n % ((1 << 31) - 1 - MAX_FRAME)) + body + END, False
    if kind < 26:  # a negative size
        return _SIZE.pack(-1 - n % (1 << 31)) + body + END, False
    if kind < 28:  # the stream ends inside the size
        return (body + b"\x00\x00\x00")[: 1 + n % 3], True
    if kind < 31:  # ... or inside the body
        size = 1 + n % MAX_FRAME
        return _SIZE.pack(size) + body[: size - 1], True
    if kind < 43:  # a header shorter than its fixed fields
        return sized((body + bytes(8))[: n % 8]) + END, False
    if kind < 51:  # a client id running past the end of the frame
        api_key = KNOWN[n % len(KNOWN)]
        spec = APIS[api_key]
        version = spec.min_version + m % (spec.max_version - spec.min_version + 1)
        length = 1 + abs(m) % 0x7FFF
        client_id = struct.pack(">h", length) + body[: length - 1]
        return sized(_FIXED.pack(api_key, version, n) + client_id) + END, False
    if kind < 63:  # an API key the proxy does not know
        return sized(_FIXED.pack(UNKNOWN[n % len(UNKNOWN)], m, n) + body) + END, False
    if kind < 73:  # a version of a known API that the proxy does not know
        api_key = KNOWN[n % len(KNOWN)]
        spec = APIS[api_key]
        span = (1 << 16) - (spec.max_version - spec.min_version + 1)
        version = (spec.max_version + 1 + m % span + (1 << 15)) % (1 << 16) - (1 << 15)
        return sized(_FIXED.pack(api_key, version, n) + body) + END, False
    if kind < 83:  # an ApiVersions body the proxy cannot read (v0-v2 bodies are empty)
        spec = APIS[API_VERSIONS]
        version = spec.min_version + n % (spec.max_version - spec.min_version + 1)
        return sized(header(API_VERSIONS, version, m) + (body or b"\x00")) + END, False
    if kind < 88:  # a Produce too short to hold its acks
        spec = APIS[PRODUCE]
        version = spec.min_version + n % (spec.max_version - spec.min_version + 1)
        return sized(header(PRODUCE, version, m) + body[:2]) + END, False
    if kind < 93:  # anything at all (then the end), unless it spells a request that writes
        data = _SIZE.pack(n) + body
        return (data if is_harmless(data) else _SIZE.pack(-1) + body), True
    if kind < 99:  # a valid request, answered, then a bad frame
        data, ends = build(n % 93, n // 93, m, body)
        return sized(header(API_VERSIONS, 2, m)) + data, ends
    # a valid header and a random body for a read-only API: forwarded to Kafka
    api_key = FORWARDED_SAFE[n % len(FORWARDED_SAFE)]
    spec = APIS[api_key]
    version = spec.min_version + m % (spec.max_version - spec.min_version + 1)
    return sized(header(api_key, version, n) + body) + END, False


recipe = st.tuples(
    st.integers(0, 99),
    st.integers(-(1 << 31), (1 << 31) - 1),
    st.integers(-(1 << 15), (1 << 15) - 1),
    st.binary(max_size=24),
)


def expand(recipes: list[tuple[int, int, int, bytes]], seed: int) -> list[tuple[bytes, bool]]:
    """Each recipe as drawn, then SIBLINGS of its kind with parameters from the seed."""
    rng = random.Random(seed)
    frames = []
    for kind, n, m, body in recipes:
        frames.append(build(kind, n, m, body))
        for _ in range(SIBLINGS):
            frames.append(
                build(
                    kind,
                    rng.randrange(-(1 << 31), 1 << 31),
                    rng.randrange(-(1 << 15), 1 << 15),
                    rng.randbytes(rng.randrange(25)),
                )
            )
    return frames


class Thrower:
    """The child process that opens the connections."""

    def __init__(self, address: tuple[str, int]) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, __file__, address[0], str(address[1])],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )

    def throw(self, batch: list[tuple[bytes, bool]]) -> list[bool]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        data = pickle.dumps(batch)
        self.proc.stdin.write(_LENGTH.pack(len(data)) + data)
        self.proc.stdin.flush()
        head = self.proc.stdout.read(_LENGTH.size)
        assert len(head) == _LENGTH.size, "the thrower died"
        return pickle.loads(self.proc.stdout.read(_LENGTH.unpack(head)[0]))

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


class LogCounter(logging.Handler):
    """Counts records by logger and level and keeps the ERROR ones; stands in for caplog,
    which would keep 100,000 warnings."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.counts: Counter[tuple[str, str]] = Counter()
        self.errors: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.counts[(record.name, record.levelname)] += 1
        if record.levelno >= logging.ERROR:
            self.errors.append(f"{record.name}: {record.getMessage()}")


@pytest.fixture
def counted_logs():
    """The proxy's connection log goes to a counter only; every other log to it too."""
    counter = LogCounter()
    connection_log = logging.getLogger("tierproxy.connection")
    connection_log.addHandler(counter)
    connection_log.propagate = False
    root = logging.getLogger()
    root.addHandler(counter)
    try:
        yield counter
    finally:
        connection_log.propagate = True
        connection_log.removeHandler(counter)
        root.removeHandler(counter)


@pytest.fixture
def fuzzed_proxy(kafka_cluster):
    config = parse_config(
        {
            "upstream": {"bootstrap": kafka_cluster.bootstrap},
            "listeners": {"bootstrap_port": free_port(), "broker_port_base": free_port_block(4)},
            "limits": {"max_frame_bytes": MAX_FRAME},
        }
    )
    with ProxyThread(config) as thread:
        yield thread


def metric(thread: ProxyThread, name: str, **labels: str) -> float:
    assert thread.proxy is not None
    value = thread.proxy.metrics.registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


def rejections(thread: ProxyThread) -> Counter[str]:
    assert thread.proxy is not None
    return Counter(
        {
            sample.labels["reason"]: int(sample.value)
            for family in thread.proxy.metrics.registry.collect()
            if family.name == "tierproxy_rejected_frames"
            for sample in family.samples
            if sample.name == "tierproxy_rejected_frames_total"
        }
    )


def good_clients_work(bootstrap: str, topic: str) -> None:
    values = [f"after-fuzz-{i}".encode() for i in range(100)]
    producer = Producer({"bootstrap.servers": bootstrap, "acks": -1})
    for value in values:
        producer.produce(topic, value=value, partition=0)
    assert producer.flush(60) == 0
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "unused"})
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        got: list[bytes] = []
        deadline = time.monotonic() + 60
        while len(got) < len(values) and time.monotonic() < deadline:
            for message in consumer.consume(100, timeout=0.5):
                assert message.error() is None, message.error()
                got.append(message.value())
    finally:
        consumer.close()
    assert got == values


async def _open(address: tuple[str, int], count: int):
    return [await asyncio.open_connection(*address) for _ in range(count)]


async def _still_served(good) -> list[int]:
    for i, (_, writer) in enumerate(good):
        writer.write(sized(header(API_VERSIONS, 2, i)))
    answers = [await asyncio.wait_for(reader.readexactly(8), 10) for reader, _ in good]
    return [_SIZE.unpack_from(answer, 4)[0] for answer in answers]


async def _close(good) -> None:
    for _, writer in good:
        writer.close()
    await asyncio.gather(*(writer.wait_closed() for _, writer in good), return_exceptions=True)


def test_proxy_survives_100k_malformed_frames(fuzzed_proxy, kafka_cluster, counted_logs):
    thread = fuzzed_proxy
    proxy = thread.proxy
    assert proxy is not None and thread.alive
    host, _, port = thread.bootstrap.rpartition(":")
    address = (host, int(port))
    loop = uvloop.new_event_loop()
    good = loop.run_until_complete(_open(address, GOOD_CLIENTS))
    thrower = Thrower(address)
    thrown = Counter[str]()
    before = rejections(thread)
    started = time.monotonic()

    @settings(
        max_examples=FRAMES // PER_EXAMPLE,
        deadline=None,
        database=None,
        phases=[Phase.generate, Phase.shrink],
        suppress_health_check=list(HealthCheck),
    )
    @given(st.lists(recipe, min_size=RECIPES, max_size=RECIPES), st.integers(0, 2**32 - 1))
    def throw_batch(recipes: list[tuple[int, int, int, bytes]], seed: int) -> None:
        batch = expand(recipes, seed)
        closed = thrower.throw(batch)
        kept_open = [case for case, ok in zip(batch, closed, strict=True) if not ok]
        assert not kept_open, f"the proxy kept {len(kept_open)} open, e.g. {kept_open[:3]}"
        assert thread.alive
        thrown["frames"] += len(batch)
        thrown["connections"] += len(batch)

    try:
        while thrown["frames"] < FRAMES:  # Hypothesis may stop short of max_examples
            throw_batch()
        elapsed = time.monotonic() - started

        # every connection task ends: the gauge drops before a task's close completes,
        # so wait for both (a loaded machine shows the gap)
        deadline = time.monotonic() + 30
        while (
            metric(thread, "tierproxy_client_connections") != GOOD_CLIENTS
            or len(proxy._connections) != GOOD_CLIENTS
        ):
            assert time.monotonic() < deadline, (
                metric(thread, "tierproxy_client_connections"),
                len(proxy._connections),
            )
            time.sleep(0.1)
        assert loop.run_until_complete(_still_served(good)) == list(range(GOOD_CLIENTS))
    finally:
        thrower.close()
        loop.run_until_complete(_close(good))
        loop.close()

    rejected = rejections(thread) - before
    upstream_closed = metric(thread, "tierproxy_upstream_errors_total", reason="closed")
    warnings = counted_logs.counts[("tierproxy.connection", "WARNING")]
    print(
        f"\nfuzz: {thrown['frames']} malformed frames, each on its own connection, in "
        f"{elapsed:.1f} s; the proxy refused {rejected.total()} {dict(rejected)}; "
        f"Kafka closed {upstream_closed:.0f}; {warnings} warnings"
    )
    assert thrown["frames"] >= FRAMES
    assert thread.alive
    assert not counted_logs.errors, counted_logs.errors[:5]
    # All but a few are refused by the proxy itself; the rest were forwarded (Kafka
    # answered or closed) or ApiVersions bodies that happened to be valid.
    assert rejected.total() >= 0.9 * thrown["frames"]
    assert warnings >= rejected.total()

    admin = AdminClient({"bootstrap.servers": kafka_cluster.bootstrap})
    topic = f"fuzz-{uuid.uuid4().hex[:10]}"
    admin.create_topics([NewTopic(topic, 1, 3)])[topic].result(30)
    try:
        good_clients_work(thread.bootstrap, topic)
    finally:
        admin.delete_topics([topic])[topic].result(30)


if __name__ == "__main__":  # the thrower, started by the test
    _thrower_main(sys.argv[1], int(sys.argv[2]))
