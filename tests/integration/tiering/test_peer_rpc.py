"""The peer protocol over real sockets on 127.0.0.1: a PeerServer and PeerClients.

Concurrent appends answered out of order each get their own result; acks=0 is not
answered; a bad frame closes only its connection; a server that goes away fails the calls
waiting on it and a restarted one is reached again; a call that times out leaves the
connection to the others. A fetch long-polls the owner's log cache while appends pass it on
the same connection; a failing fetch handler, or none, answers an error code and keeps the
connection; a frame type the server does not know closes only its own. A ping is answered
with the proxy's name and version. Nothing here needs
Kafka or MinIO.
"""

from __future__ import annotations

import asyncio
import logging
import random
import struct
import uuid

import pytest
import uvloop
from crc32c import crc32c

from proxy import __version__
from proxy.apis.fetch_split import TieredFetchResult
from proxy.handoff.objects import S3WalLocation
from proxy.objects.store import ObjectStoreError
from proxy.partition.rules import ProduceResult
from proxy.partition.sequence_holes import ProducerBatch
from proxy.peer.clients import PeerClients, PeerUnavailable
from proxy.peer.codec import encode_frame
from proxy.peer.messages import AdminRequest, AppendRequest, FetchRequest, FetchResponse
from proxy.peer.server import PeerServer
from proxy.reads.logcache import LogCache
from tests.support.peers import peer_clients, peer_server

pytestmark = pytest.mark.timeout(60)

TOPIC_ID = uuid.UUID("0e4f6c1a-2b3c-4d5e-8f90-a1b2c3d4e5f6")


class Owner:
    """Handlers standing in for an owner proxy. Each answer is computed from its request,
    so an answer matched to the wrong call shows; each comes after a random small delay."""

    def __init__(self, seed: int = 7) -> None:
        self.rng = random.Random(seed)
        self.max_delay_s = 0.02
        self.arrived: list[int] = []  # stream ids, in the order handlers started
        self.answered: list[int] = []
        self.running = 0
        self.gate: asyncio.Event | None = None  # while unset, appends wait
        self.fail: Exception | None = None
        self.slow: dict[int, float] = {}  # stream id -> delay
        self._change = asyncio.Event()

    def _changed(self) -> None:
        self._change.set()
        self._change = asyncio.Event()

    async def wait_for(self, condition, timeout_s: float = 5.0) -> None:
        async with asyncio.timeout(timeout_s):
            while not condition():
                await self._change.wait()

    async def on_append(self, request: AppendRequest) -> ProduceResult:
        self.arrived.append(request.stream_id)
        payload = payload_of(request)
        self.running += 1
        self._changed()
        try:
            await asyncio.sleep(
                self.slow.get(request.stream_id, self.rng.uniform(0, self.max_delay_s))
            )
            if self.gate is not None:
                await self.gate.wait()
            if self.fail is not None:
                raise self.fail
        finally:
            self.running -= 1
        self.answered.append(request.stream_id)
        self._changed()
        return expected_result(request.stream_id, payload)

    async def on_admin(self, request: AdminRequest) -> tuple[int, str]:
        if self.fail is not None:
            raise self.fail
        return 0, f"{request.op} {request.topic} {request.topic_id}"


def payload_of(request: AppendRequest) -> str:
    if request.records is not None:
        return bytes(request.records).decode()
    assert request.location is not None
    return f"{request.location.object_key}[{request.location.start}:{request.location.end}]"


def expected_result(stream_id: int, payload: str) -> ProduceResult:
    return ProduceResult(0, stream_id * 100, 1_700_000_000_000 + stream_id, stream_id, payload)


def location(stream_id: int) -> S3WalLocation:
    return S3WalLocation(
        f"wal/0001/proxy-b/{stream_id:016x}", stream_id, stream_id + 61, stream_id, 99
    )


@pytest.fixture
async def owner():
    return Owner()


@pytest.fixture
async def server(owner):
    async with peer_server(owner.on_append, owner.on_admin) as server:
        yield server


@pytest.fixture
async def clients():
    async with peer_clients() as clients:
        yield clients


async def test_200_concurrent_appends_get_their_own_results_answered_out_of_order(
    owner, server, clients
):
    address = ("127.0.0.1", server.port)

    async def one(i: int) -> tuple[int, ProduceResult | None]:
        if i % 2:
            return i, await clients.append(address, i, -1, 5000, location=location(i))
        return i, await clients.append(address, i, -1, 5000, records=f"batch-{i}".encode())

    results = await asyncio.gather(*(one(i) for i in range(200)))
    for i, result in results:
        payload = f"{location(i).object_key}[{i}:{i + 61}]" if i % 2 else f"batch-{i}"
        assert result == expected_result(i, payload)
    assert owner.arrived == list(range(200))  # written in call order, handled in arrival order
    assert sorted(owner.answered) == list(range(200))
    assert owner.answered != list(range(200))  # the delays put the answers out of order


async def test_a_large_direct_payload_arrives_whole(owner, server, clients):
    records = bytes(range(256)) * 32 * 1024  # 8 MiB: many reads, joined once
    seen = []

    async def keep(request: AppendRequest) -> ProduceResult:
        seen.append(bytes(request.records))
        return ProduceResult(0, 1)

    big = PeerServer("127.0.0.1", 0, keep, owner.on_admin)
    await big.start()
    try:
        result = await clients.append(("127.0.0.1", big.port), 1, -1, 1000, records=records)
    finally:
        await big.close()
    assert result == ProduceResult(0, 1)
    assert seen == [records]


async def test_a_frame_over_the_limit_is_refused_before_any_io(server):
    small = PeerClients(max_frame_bytes=1024)
    try:
        with pytest.raises(ValueError, match="over the limit 1024"):
            await small.append(("127.0.0.1", server.port), 1, -1, 1000, records=b"x" * 2000)
        result = await small.append(("127.0.0.1", server.port), 1, -1, 1000, records=b"fits")
        assert result == expected_result(1, "fits")
    finally:
        await small.close()


async def test_acks_0_gets_no_answer_but_the_handler_runs(owner, server, clients):
    address = ("127.0.0.1", server.port)
    owner.max_delay_s = 0
    assert await clients.append(address, 3, 0, 1000, records=b"fire-and-forget") is None
    await owner.wait_for(lambda: owner.answered == [3])
    # No stray answer arrives to confuse the next call on the connection.
    assert await clients.append(address, 4, 1, 1000, records=b"next") == expected_result(4, "next")


async def test_admin_round_trip(server, clients):
    code, message = await clients.admin(("127.0.0.1", server.port), "untier", "orders", TOPIC_ID)
    assert (code, message) == (0, f"untier orders {TOPIC_ID}")


async def test_backfill_round_trip_and_a_server_without_a_handler(server, clients):
    asked = []

    async def on_backfill(request):
        asked.append(request)
        if request.end_offset > 100:
            raise RuntimeError("past the cutover")
        return 0, f"stream {request.stream_id} committed"

    backfills = PeerServer("127.0.0.1", 0, server._on_append, server._on_admin,
                           on_backfill=on_backfill)  # fmt: skip
    await backfills.start()
    try:
        address = ("127.0.0.1", backfills.port)
        assert await clients.backfill(address, 1 << 63 | 9, 4096, 42, 0, 100) == (
            0,
            "stream 42 committed",
        )
        code, message = await clients.backfill(address, 1 << 63 | 9, 4096, 42, 0, 101)
        assert code == -1 and "past the cutover" in message
        assert [
            (r.object_id, r.size, r.stream_id, r.start_offset, r.end_offset) for r in asked
        ] == [
            (1 << 63 | 9, 4096, 42, 0, 100),
            (1 << 63 | 9, 4096, 42, 0, 101),
        ]
    finally:
        await backfills.close()
    code, message = await clients.backfill(("127.0.0.1", server.port), 5, 1, 42, 0, 1)
    assert code == 35 and "no backfill" in message


async def test_catch_up_round_trip_and_a_server_without_a_handler(server, clients):
    asked = []

    async def on_catch_up(request):
        asked.append((request.stream_id, request.timeout_ms))
        if request.stream_id == 13:
            raise RuntimeError("Kafka did not answer")
        return (0, "") if request.stream_id == 42 else (6, "not owned here")

    owner = PeerServer("127.0.0.1", 0, server._on_append, server._on_admin,
                       on_catch_up=on_catch_up)  # fmt: skip
    await owner.start()
    try:
        address = ("127.0.0.1", owner.port)
        assert await clients.catch_up(address, 42, 5000) == (0, "")
        assert await clients.catch_up(address, 7, 5000) == (6, "not owned here")
        code, message = await clients.catch_up(address, 13, 100)
        assert code == -1 and "Kafka did not answer" in message
        assert asked == [(42, 5000), (7, 5000), (13, 100)]
    finally:
        await owner.close()
    code, message = await clients.catch_up(("127.0.0.1", server.port), 42, 5000)
    assert code == 35 and "catches up nothing" in message


async def test_a_ping_is_answered_with_the_proxy_name_and_version_and_a_trim_round_trips(
    owner, clients
):
    """Without any handler; the same connection then carries a trim and its answer."""

    async def on_trim(request):
        return 0, request.offset, f"stream {request.stream_id} trimmed"

    named = PeerServer("127.0.0.1", 0, owner.on_append, owner.on_admin, on_trim=on_trim,
                       name="proxy-a")  # fmt: skip
    await named.start()
    try:
        address = ("127.0.0.1", named.port)
        hello = await clients.ping(address)
        assert (hello.name, hello.version) == ("proxy-a", __version__)
        assert await clients.trim(address, 42, 7, 500) == (0, 7, "stream 42 trimmed")
        assert (await clients.ping(address)).name == "proxy-a"
    finally:
        await named.close()


async def test_a_failing_handler_answers_an_error_and_is_logged(owner, server, clients, caplog):
    address = ("127.0.0.1", server.port)
    owner.fail = RuntimeError("disk on fire")
    with caplog.at_level(logging.ERROR, logger="tierproxy.peers"):
        result = await clients.append(address, 5, -1, 1000, records=b"x")
        code, message = await clients.admin(address, "tier", "orders", TOPIC_ID)
    assert result is not None and result.error_code == 56
    assert result.error_message == "RuntimeError: disk on fire"
    assert (code, message) == (-1, "RuntimeError: disk on fire")
    assert [r.exc_info[1] for r in caplog.records] == [owner.fail, owner.fail]


async def test_a_store_that_fails_an_append_is_a_storage_error_and_a_warning(
    owner, server, clients, caplog
):
    """The S3-WAL object could not be read (S3 throttling past the retries): a failure of
    the store, not a bug. The asker gets the retriable storage error; the log a WARNING
    without a traceback (an ERROR line is what the fault suites count as a finding)."""
    address = ("127.0.0.1", server.port)
    owner.fail = ObjectStoreError("wal/0001/x", "get", "SlowDown", attempts=5, retryable=True)
    with caplog.at_level(logging.INFO, logger="tierproxy.peers"):
        result = await clients.append(address, 5, -1, 1000, location=location(5))
    assert result is not None and result.error_code == 56
    assert [(r.levelname, r.exc_info) for r in caplog.records] == [("WARNING", None)]
    assert "wal/0001/x" in caplog.records[0].getMessage()


async def test_a_bad_frame_closes_only_its_own_connection(server, clients, caplog):
    address = ("127.0.0.1", server.port)
    assert await clients.append(address, 1, -1, 1000, records=b"before")
    reader, writer = await asyncio.open_connection(*address)
    local = "{}:{}".format(*writer.get_extra_info("sockname"))
    with caplog.at_level(logging.WARNING, logger="tierproxy.peers"):
        writer.write(b"\x00\x00\x00\x10" + b"\xab" * 20)  # a frame whose crc does not hold
        async with asyncio.timeout(5):
            assert await reader.read() == b""  # closed by the server
    writer.close()
    await writer.wait_closed()
    [warning] = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert local in warning.getMessage() and "bad crc" in warning.getMessage()
    assert await clients.append(address, 2, -1, 1000, records=b"after") == expected_result(
        2, "after"
    )


async def test_server_gone_mid_call_fails_the_calls_and_a_restart_is_reached_again(owner, clients):
    server = PeerServer("127.0.0.1", 0, owner.on_append, owner.on_admin)
    await server.start()
    address = ("127.0.0.1", server.port)
    owner.gate = asyncio.Event()
    calls = [
        asyncio.create_task(clients.append(address, i, -1, 1000, records=b"held")) for i in range(3)
    ]
    await owner.wait_for(lambda: owner.running == 3)
    await server.close()
    for call in calls:
        with pytest.raises(PeerUnavailable, match=f"peer 127.0.0.1:{address[1]}: "):
            await call
    with pytest.raises(PeerUnavailable, match="cannot connect"):
        await clients.append(address, 9, -1, 1000, records=b"refused")

    owner.gate = None
    again = PeerServer("127.0.0.1", address[1], owner.on_append, owner.on_admin)
    await again.start()
    try:
        assert await clients.append(address, 7, -1, 1000, records=b"back") == expected_result(
            7, "back"
        )
    finally:
        await again.close()


async def test_a_call_that_times_out_leaves_the_connection_to_the_others(
    owner, server, clients, caplog
):
    address = ("127.0.0.1", server.port)
    owner.slow[1] = 0.3
    slow = asyncio.create_task(
        clients.append(address, 1, -1, 1000, records=b"slow", timeout_s=0.05)
    )
    fast = await clients.append(address, 2, -1, 1000, records=b"fast")
    assert fast == expected_result(2, "fast")
    with pytest.raises(
        TimeoutError,
        match=rf"peer 127.0.0.1:{address[1]}: AppendRequest \d+ not answered within 0.05 s",
    ):
        await slow
    with caplog.at_level(logging.WARNING, logger="tierproxy.peers"):
        await owner.wait_for(lambda: owner.answered == [2, 1])  # the late answer arrives, dropped
        assert await clients.append(address, 3, -1, 1000, records=b"then") == expected_result(
            3, "then"
        )
    assert caplog.records == []


async def test_a_connection_holds_at_most_max_inflight_requests(owner, clients):
    owner.gate = asyncio.Event()
    server = PeerServer("127.0.0.1", 0, owner.on_append, owner.on_admin, max_inflight=4)
    await server.start()
    try:
        address = ("127.0.0.1", server.port)
        calls = [
            asyncio.create_task(clients.append(address, i, -1, 5000, records=b"r"))
            for i in range(20)
        ]
        await owner.wait_for(lambda: owner.running == 4)
        await asyncio.sleep(0.05)
        assert len(owner.arrived) == 4  # the rest wait in the socket, unread
        owner.gate.set()
        results = await asyncio.gather(*calls)
        assert results == [expected_result(i, "r") for i in range(20)]
    finally:
        await server.close()


async def test_an_unreachable_peer_fails_fast_with_its_address(clients):
    free = PeerServer("127.0.0.1", 0, Owner().on_append, Owner().on_admin)
    await free.start()
    port = free.port
    await free.close()
    with pytest.raises(PeerUnavailable, match=f"peer 127.0.0.1:{port}: cannot connect"):
        await clients.admin(("127.0.0.1", port), "tier", "orders", TOPIC_ID)


# -- fetch ---------------------------------------------------------------------------------


class Tail:
    """An owner's fetch handler over a real log cache, answering as the owner's read path
    does (a `TieredFetchResult`): wait for data past the offset, then read from it."""

    def __init__(self) -> None:
        self.cache = LogCache(64 * 1024 * 1024)
        self.requests: list[FetchRequest] = []
        self.arrived = asyncio.Event()  # set as each fetch starts waiting or reading

    async def on_fetch(self, request: FetchRequest) -> TieredFetchResult:
        self.requests.append(request)
        self.arrived.set()
        stream, offset = request.stream_id, request.offset
        await self.cache.wait_for_data(stream, offset, request.max_wait_ms)
        records, _ = self.cache.read(stream, offset, request.max_bytes)
        end, start = self.cache.end_offset(stream), self.cache.start_offset(stream)
        return TieredFetchResult(0, high_watermark=end, log_start_offset=start, records=records)


def answer(response: FetchResponse) -> tuple[int, int, int, bytes]:
    return (
        response.error_code,
        response.high_watermark,
        response.log_start_offset,
        b"".join(response.records),
    )


@pytest.fixture
async def tail():
    return Tail()


@pytest.fixture
async def fetch_server(owner, tail):
    server = PeerServer("127.0.0.1", 0, owner.on_append, owner.on_admin, tail.on_fetch)
    await server.start()
    yield server
    await server.close()


async def test_a_fetch_long_polls_the_owner_while_appends_pass_it(tail, fetch_server, clients):
    address = ("127.0.0.1", fetch_server.port)
    first, second, third = (bytes([i]) * 300_000 for i in (1, 2, 3))  # over many reads
    tail.cache.append(7, 0, 9, first)
    assert answer(await clients.fetch(address, 7, 0, 1 << 20, 5000)) == (0, 10, 0, first)

    tail.arrived.clear()
    parked = asyncio.create_task(clients.fetch(address, 7, 10, 1 << 20, 5000))
    async with asyncio.timeout(5):
        await tail.arrived.wait()
    assert tail.cache.waiting == 1  # the handler is parked in the long poll
    assert await clients.append(address, 3, -1, 1000, records=b"meanwhile") == expected_result(
        3, "meanwhile"
    )
    assert not parked.done()
    tail.cache.append(7, 10, 19, second)
    tail.cache.append(7, 20, 29, third)
    async with asyncio.timeout(2):  # woken by the append, long before max_wait_ms
        response = await parked
    assert answer(response) == (0, 30, 0, second + third)
    assert len(response.records) == 1 and isinstance(response.records[0], memoryview)
    assert [(r.stream_id, r.offset, r.max_bytes, r.max_wait_ms) for r in tail.requests] == [
        (7, 0, 1 << 20, 5000),
        (7, 10, 1 << 20, 5000),
    ]


async def test_a_fetch_with_no_new_data_answers_empty_after_max_wait(tail, fetch_server, clients):
    address = ("127.0.0.1", fetch_server.port)
    tail.cache.append(7, 0, 4, b"batch")
    loop = asyncio.get_running_loop()
    started = loop.time()
    response = await clients.fetch(address, 7, 5, 1 << 20, 200)
    assert loop.time() - started >= 0.19
    assert answer(response) == (0, 5, 0, b"")
    assert response.records == ()


async def test_a_failing_fetch_handler_answers_a_storage_error_and_keeps_the_connection(
    owner, clients, caplog
):
    failures = [RuntimeError("log cache on fire"), None]

    async def on_fetch(request: FetchRequest) -> FetchResponse:
        failure = failures.pop(0)
        if failure is not None:
            raise failure
        return FetchResponse(0, 0, records=["not a buffer"])  # cannot be framed

    server = PeerServer("127.0.0.1", 0, owner.on_append, owner.on_admin, on_fetch=on_fetch)
    await server.start()
    try:
        address = ("127.0.0.1", server.port)
        assert await clients.append(address, 1, -1, 1000, records=b"before")
        connection = clients._connections[address]
        with caplog.at_level(logging.WARNING, logger="tierproxy.peers"):
            raised = await clients.fetch(address, 7, 0, 1024, 0)
            refused = await clients.fetch(address, 7, 0, 1024, 0)
        assert answer(raised) == answer(refused) == (56, -1, -1, b"")
        errors = [(r.levelno, str(r.exc_info[1])) for r in caplog.records]
        assert errors == [
            (logging.ERROR, "log cache on fire"),
            (logging.ERROR, "a records piece of type str: not a buffer"),
        ]
        assert "fetch of stream 7 at 0 from peer 127.0.0.1:" in caplog.records[0].getMessage()
        assert clients._connections[address] is connection and not connection.failed
        assert await clients.append(address, 2, -1, 1000, records=b"after") == expected_result(
            2, "after"
        )
    finally:
        await server.close()


async def test_a_fetch_to_a_server_without_a_handler_is_unsupported_version(server, clients):
    address = ("127.0.0.1", server.port)
    assert answer(await clients.fetch(address, 7, 0, 1024, 1000)) == (35, -1, -1, b"")
    assert await clients.append(address, 2, -1, 1000, records=b"after") == expected_result(
        2, "after"
    )


def unknown_type_frame() -> bytes:
    body = bytearray(encode_frame(FetchRequest(1, 7, 0, 1, 1))[8:])
    body[1] = 200  # a type from a newer peer
    return struct.pack(">II", len(body), crc32c(body)) + body


@pytest.mark.parametrize(
    "frame, reason",
    [
        (unknown_type_frame(), "unknown message type 200"),
        (encode_frame(FetchResponse(1, 0, records=[b"x"])), "a FetchResponse is not a request"),
    ],
    ids=["unknown type", "answer as request"],
)
async def test_a_frame_the_server_cannot_serve_closes_only_its_connection(
    tail, fetch_server, clients, caplog, frame, reason
):
    address = ("127.0.0.1", fetch_server.port)
    tail.cache.append(7, 0, 0, b"batch")
    assert answer(await clients.fetch(address, 7, 0, 1024, 0)) == (0, 1, 0, b"batch")
    connection = clients._connections[address]
    reader, writer = await asyncio.open_connection(*address)
    local = "{}:{}".format(*writer.get_extra_info("sockname"))
    with caplog.at_level(logging.WARNING, logger="tierproxy.peers"):
        writer.write(frame)
        async with asyncio.timeout(5):
            assert await reader.read() == b""  # closed by the server, nothing answered
    writer.close()
    await writer.wait_closed()
    [warning] = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert local in warning.getMessage() and reason in warning.getMessage()
    assert answer(await clients.fetch(address, 7, 0, 1024, 0)) == (0, 1, 0, b"batch")
    assert clients._connections[address] is connection and not connection.failed


async def test_a_fetch_answer_fits_a_frame_or_is_an_error(owner):
    asked = []

    async def on_fetch(request: FetchRequest) -> FetchResponse:
        asked.append(request.max_bytes)
        return FetchResponse(0, 0, 1, 0, [b"x" * 2000])  # a first batch over the limit

    server = PeerServer(
        "127.0.0.1", 0, owner.on_append, owner.on_admin, on_fetch, max_frame_bytes=1024
    )
    await server.start()
    small = PeerClients(max_frame_bytes=1024)
    try:
        response = await small.fetch(("127.0.0.1", server.port), 7, 0, 1 << 20, 0)
    finally:
        await small.close()
        await server.close()
    assert asked == [1024 - 36]  # cut to what the asker's frame limit holds past the head
    assert answer(response) == (56, -1, -1, b"")


async def test_a_fetch_times_out_at_max_wait_plus_the_margin(owner):
    never = asyncio.Event()

    async def on_fetch(request: FetchRequest) -> FetchResponse:
        await never.wait()  # an owner that ignores max_wait_ms
        raise AssertionError("unreachable")

    server = PeerServer("127.0.0.1", 0, owner.on_append, owner.on_admin, on_fetch)
    await server.start()
    clients = PeerClients(timeout_margin_s=0.5)
    try:
        with pytest.raises(TimeoutError, match=r"FetchRequest \d+ not answered within 0.6 s"):
            await clients.fetch(("127.0.0.1", server.port), 7, 0, 1024, 100)
    finally:
        await clients.close()
        await server.close()


async def test_an_append_to_an_owner_older_than_sequences_carries_none(owner, clients):
    """Rolling upgrade: a proxy of the release before the sequences trailer refuses a frame
    with it (and drops the connection), so the sender leaves it out for an owner whose
    heartbeat says protocol 1; the batches still arrive and are answered."""
    seen: list[tuple[ProducerBatch | None, int]] = []
    on_append = owner.on_append

    async def recording(request: AppendRequest) -> ProduceResult:
        seen.append((request.batch, request.hole))
        return await on_append(request)

    server = PeerServer("127.0.0.1", 0, recording, owner.on_admin)
    await server.start()
    address = ("127.0.0.1", server.port)
    batch = ProducerBatch(7, 0, 10, 14)
    try:
        for protocol in (1, 2):
            result = await clients.append(
                address,
                3,
                -1,
                5000,
                records=b"b",
                batch=batch,
                hole=lambda: 4,
                peer_protocol=protocol,
            )
            assert result == expected_result(3, "b")
    finally:
        await server.close()
    assert seen == [(None, -1), (batch, 4)]


def test_a_call_on_a_connection_closed_under_uvloop_fails_as_unavailable():
    """The proxy runs on uvloop, whose transport raises RuntimeError on a write once it is
    closed (asyncio's ignores the write): a reset the transport saw before the connection's
    reader did escaped a Produce as a bug, its whole request answered KAFKA_STORAGE_ERROR
    (the flaky-network test cutting the peer link, docs/reliability.md)."""

    async def main() -> None:
        owner = Owner()
        server = PeerServer("127.0.0.1", 0, owner.on_append, owner.on_admin)
        await server.start()
        clients = PeerClients(connect_timeout_s=2.0)
        address = ("127.0.0.1", server.port)
        try:
            first = await clients.append(address, 1, -1, 1000, records=b"first")
            assert first == expected_result(1, "first")
            writer = clients._connections[address]._writer
            assert writer is not None
            # the call yields once (to the connect), then writes without yielding: the
            # reset lands in that yield, before the reader task can run
            lost = asyncio.create_task(clients.append(address, 2, -1, 1000, records=b"lost"))
            asyncio.get_running_loop().call_soon(writer.transport.abort)
            with pytest.raises(PeerUnavailable, match="connection lost: the connection was closed"):
                await lost
            again = await clients.append(address, 3, -1, 1000, records=b"again")
            assert again == expected_result(3, "again")
        finally:
            await clients.close()
            await server.close()

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(main())


async def test_a_call_that_times_out_with_nothing_read_drops_a_half_open_connection(clients):
    """A peer that takes the connection and then answers nothing, not even a close (gone
    without a FIN, a silent partition: TCP may take many minutes to notice): once a call
    times out with nothing read since it was written, the calls still waiting on that
    connection fail at once and the next call opens another (the flaky-network test's
    one-way cut of the peer link, docs/reliability.md). A call that times out while others
    are answered keeps the connection (the test above)."""
    accepted: list[asyncio.StreamWriter] = []

    async def black_hole(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(writer)
        await reader.read()  # reads what comes, answers nothing, closes nothing

    server = await asyncio.start_server(black_hole, "127.0.0.1", 0)
    address = ("127.0.0.1", server.sockets[0].getsockname()[1])
    try:
        waiting = asyncio.create_task(
            clients.append(address, 1, -1, 1000, records=b"waits", timeout_s=30)
        )
        with pytest.raises(TimeoutError, match="not answered within 0.2 s"):
            await clients.append(address, 2, -1, 1000, records=b"times out", timeout_s=0.2)
        with pytest.raises(PeerUnavailable, match="nothing read for 0.2 s: presumed dead"):
            await asyncio.wait_for(waiting, 5)
        with pytest.raises(TimeoutError):
            await clients.append(address, 3, -1, 1000, records=b"next", timeout_s=0.2)
        assert len(accepted) == 2, "the next call did not open another connection"
    finally:
        for writer in accepted:
            writer.close()
        server.close()
        await server.wait_closed()
