"""Peer protocol level 13 over real sockets on 127.0.0.1 (a PeerServer and PeerClients, no
Kafka, no MinIO): an s3 append's batch header reaches the owner's handler and its
`referenced` answer reaches the caller's ProduceResult; an owner below 13 gets no header;
a held request is answered by the `on_held` handler, waits as long as it asks plus the
margin, and is refused before any I/O for an owner below 13; a server without the handler,
or whose handler fails, answers an error code the client raises as PeerRefused."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest
from kio.schema.errors import ErrorCode

from proxy.handoff.objects import S3WalLocation
from proxy.partition.rules import ProduceResult
from proxy.peer.clients import PeerClients, PeerRefused
from proxy.peer.codec import CONFIGS_PROTOCOL, REFERENCE_PROTOCOL
from proxy.peer.messages import AdminRequest, AppendRequest, HeldRequest
from proxy.peer.server import PeerServer
from tests.support.peers import peer_clients, peer_server
from tests.support.waiting import eventually

pytestmark = pytest.mark.timeout(60)

HEADER = bytes(range(61))


def location(stream_id: int, key: str = "wal/0001/proxy-b/0000000000000001") -> S3WalLocation:
    return S3WalLocation(key, stream_id * 100, stream_id * 100 + 61, stream_id, 99)


class Owner:
    """Handlers standing in for an owner that takes a batch by reference when it is sent
    its header, and releases the locations named in `released`."""

    def __init__(self) -> None:
        self.appends: list[AppendRequest] = []
        self.helds: list[HeldRequest] = []
        self.released: tuple[int, ...] = ()
        self.hold: asyncio.Event | None = None  # while unset, held requests wait
        self.fail: Exception | None = None
        self.asked = asyncio.Event()  # set once a held request has arrived

    async def on_append(self, request: AppendRequest) -> ProduceResult:
        self.appends.append(request)
        referenced = request.header is not None
        return ProduceResult(0, request.stream_id * 10, -1, 0, None, referenced=referenced)

    async def on_admin(self, request: AdminRequest) -> tuple[int, str]:
        return 0, ""

    async def on_held(self, request: HeldRequest) -> tuple[int, ...]:
        self.helds.append(request)
        self.asked.set()
        if self.fail is not None:
            raise self.fail
        if self.hold is not None:
            await self.hold.wait()
        return self.released


@pytest.fixture
async def owner():
    return Owner()


@pytest.fixture
async def server(owner):
    async with peer_server(
        owner.on_append, owner.on_admin, on_held=owner.on_held, name="owner"
    ) as server:
        yield server


@pytest.fixture
async def clients():
    async with peer_clients() as clients:
        yield clients


async def test_an_append_with_its_header_is_answered_referenced(owner, server, clients):
    address = ("127.0.0.1", server.port)
    result = await clients.append(
        address, 5, -1, 1000, location=location(5), header=HEADER, peer_protocol=REFERENCE_PROTOCOL
    )
    assert result == ProduceResult(0, 50, -1, 0, None, referenced=True)
    [request] = owner.appends
    assert (request.location, request.header) == (location(5), HEADER)
    # without a header the same owner answers from the bytes, as before
    plain = await clients.append(address, 6, -1, 1000, location=location(6))
    assert plain == ProduceResult(0, 60, -1, 0, None) and plain.referenced is False


async def test_an_owner_below_13_is_sent_no_header(owner, server, clients):
    address = ("127.0.0.1", server.port)
    result = await clients.append(
        address, 5, -1, 1000, location=location(5), header=HEADER, peer_protocol=CONFIGS_PROTOCOL
    )
    assert result is not None and result.referenced is False
    assert owner.appends[0].header is None


async def test_an_owner_that_answers_referenced_without_a_header_is_a_storage_error(
    server, clients, caplog
):
    """The sender may predate the flag; it would release what the owner still needs."""

    async def careless(request: AppendRequest) -> ProduceResult:
        return ProduceResult(0, 1, referenced=True)

    address = ("127.0.0.1", server.port)
    server._on_append = careless
    with caplog.at_level(logging.ERROR, logger="tierproxy.peers"):
        result = await clients.append(address, 5, -1, 1000, location=location(5))
    assert result is not None and (result.error_code, result.referenced) == (56, False)
    assert "without a batch header answered as referenced" in result.error_message
    assert [r.levelname for r in caplog.records] == ["ERROR"]


async def test_a_held_request_is_answered_by_the_handler(owner, server, clients):
    address = ("127.0.0.1", server.port)
    locations = [location(1), location(2, "wal/0001/proxy-b/2"), location(3)]
    owner.released = (2, 0, 2)  # any order, repeats: the server sorts and drops them
    released = await clients.held(address, locations, 500, peer_protocol=REFERENCE_PROTOCOL)
    assert released == (0, 2)
    [request] = owner.helds
    assert (request.timeout_ms, request.locations) == (500, tuple(locations))
    owner.released = ()
    assert await clients.held(address, locations[:1], 0, peer_protocol=REFERENCE_PROTOCOL) == ()


async def test_a_held_request_waits_for_the_owner_and_times_out_at_its_wait_plus_the_margin(
    owner, server
):
    clients = PeerClients(connect_timeout_s=2.0, timeout_margin_s=0.3)
    address = ("127.0.0.1", server.port)
    owner.hold = asyncio.Event()
    owner.released = (0,)
    try:
        call = asyncio.create_task(
            clients.held(address, [location(1)], 200, peer_protocol=REFERENCE_PROTOCOL)
        )
        await asyncio.wait_for(owner.asked.wait(), 5)
        await asyncio.sleep(0.3)  # past timeout_ms alone: the call still waits
        assert not call.done()
        owner.hold.set()
        assert await call == (0,)

        owner.hold = asyncio.Event()  # never set: the owner does not answer
        started = time.monotonic()
        with pytest.raises(TimeoutError, match="HeldRequest .* not answered within 0.5 s"):
            await clients.held(address, [location(1)], 200, peer_protocol=REFERENCE_PROTOCOL)
        assert 0.45 <= time.monotonic() - started < 3
    finally:
        owner.hold.set()
        await clients.close()


async def test_a_held_request_to_an_owner_below_13_is_refused_before_any_io(clients):
    address = ("127.0.0.1", 1)  # nothing listens: any I/O would be PeerUnavailable
    with pytest.raises(ValueError, match="at protocol 12: it reads them from 13 on"):
        await clients.held(address, [location(1)], 100, peer_protocol=CONFIGS_PROTOCOL)
    with pytest.raises(ValueError, match="locations count 0"):
        await clients.held(address, [], 100, peer_protocol=REFERENCE_PROTOCOL)


async def test_a_server_without_the_handler_answers_unsupported_version(owner, clients):
    server = PeerServer("127.0.0.1", 0, owner.on_append, owner.on_admin)
    await server.start()
    try:
        address = ("127.0.0.1", server.port)
        with pytest.raises(PeerRefused, match="error code 35") as refused:
            await clients.held(address, [location(1)], 100, peer_protocol=REFERENCE_PROTOCOL)
        assert refused.value.error_code == 35
        # the connection stays: the next call on it is answered
        assert await clients.append(address, 1, -1, 1000, location=location(1)) is not None
    finally:
        await server.close()


async def test_a_failing_or_wrong_handler_answers_an_error_and_is_logged(
    owner, server, clients, caplog
):
    address = ("127.0.0.1", server.port)
    owner.fail = RuntimeError("WAL on fire")
    with caplog.at_level(logging.ERROR, logger="tierproxy.peers"):
        with pytest.raises(PeerRefused) as failed:
            await clients.held(address, [location(1)], 100, peer_protocol=REFERENCE_PROTOCOL)
        owner.fail, owner.released = None, (0, 1)  # an index past the request's one location
        with pytest.raises(PeerRefused) as wrong:
            await clients.held(address, [location(1)], 100, peer_protocol=REFERENCE_PROTOCOL)
    assert failed.value.error_code == wrong.value.error_code == -1
    assert [type(r.exc_info[1]) for r in caplog.records] == [RuntimeError, ValueError]
    assert "released indexes [0, 1] of 1 locations" in str(caplog.records[1].exc_info[1])


async def test_a_held_request_naming_another_member_is_not_sent(owner, server, clients):
    """The proxy now at the owner's address is asked only if its ping names the owner:
    another one would know none of the locations and release them all."""
    address = ("127.0.0.1", server.port)
    owner.released = (0,)
    asked = [location(1)]
    released = await clients.held(
        address, asked, 0, peer_protocol=REFERENCE_PROTOCOL, member="owner"
    )
    assert released == (0,) and len(owner.helds) == 1
    with pytest.raises(PeerRefused) as refused:
        await clients.held(address, asked, 0, peer_protocol=REFERENCE_PROTOCOL, member="other")
    assert refused.value.error_code == ErrorCode.unknown_member_id
    assert "is 'owner', not 'other'" in str(refused.value)
    assert len(owner.helds) == 1  # never asked


async def test_a_header_goes_only_on_a_connection_known_to_reach_the_member(owner, server, clients):
    """With the owner's name given, the first append on a new connection goes by bytes
    (its ping is sent beside it, not waited for), the next ones with their header; to a
    proxy whose ping names another member, never with it."""
    address = ("127.0.0.1", server.port)

    async def append(stream: int, member: str):
        return await clients.append(
            address,
            stream,
            -1,
            1000,
            location=location(stream),
            header=HEADER,
            peer_protocol=REFERENCE_PROTOCOL,
            member=member,
        )

    first = await append(1, "owner")
    assert first is not None and not first.referenced and owner.appends[0].header is None
    # its ping's answer comes after the append's (written after it)
    await eventually(lambda: not clients._naming, what="the ping answered")
    second = await append(2, "owner")
    assert second is not None and second.referenced and owner.appends[1].header == HEADER
    third = await append(3, "someone-else")
    assert third is not None and not third.referenced and owner.appends[2].header is None
