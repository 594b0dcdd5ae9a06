"""What a job checks on the driver before its first Spark task: that Kafka knows the
topic, that the proxy at `--peer` answers, that the object store can be read.

A wrong `--peer` found at commit time leaves every object written and none committed,
and with nothing to move it would never be found at all; a topic that does not exist is
named as such rather than as an error code. Each check fails with a `PreflightError`
whose message says what is wrong and where.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable

from offload_jobs.kafka_client import UnknownTopic, describe_topic
from proxy.peer.messages import PingResponse


class PreflightError(Exception):
    """Something a job needs is missing or unreachable; the message says which."""


def kafka_topic(bootstrap: str, topic: str, **settings) -> tuple[uuid.UUID, int]:
    """(topic id, partition count), or PreflightError naming the problem in words."""
    try:
        return describe_topic(bootstrap, topic, **settings)
    except UnknownTopic:
        raise PreflightError(f"topic {topic} does not exist in Kafka at {bootstrap}") from None
    except LookupError as exc:
        raise PreflightError(f"Kafka at {bootstrap}: {exc}") from None
    except Exception as exc:  # no broker answers, a refused connection, a bad frame
        raise PreflightError(f"cannot reach Kafka at {bootstrap}: {exc}") from None


async def peer(address: tuple[str, int], timeout_s: float = 10.0) -> PingResponse:
    """The proxy's peer listener answers a ping; its answer (the proxy's name in its fleet
    and its version). Anything else (no listener, another protocol, silence, a proxy
    too old to know pings) fails here, naming what was found."""
    from proxy.peer.clients import PeerClients, PeerUnavailable

    where = f"{address[0]}:{address[1]}"
    clients = PeerClients(connect_timeout_s=timeout_s, admin_timeout_s=timeout_s)
    try:
        return await clients.ping(address, timeout_s=timeout_s)
    except PeerUnavailable as exc:
        if "cannot connect" in str(exc):
            raise PreflightError(
                f"--peer {where}: no proxy's peer listener answers there ({exc}); give the "
                "peer_port (tiering.peer_port) of a running proxy"
            ) from None
        raise PreflightError(
            f"--peer {where}: what answers there is not a proxy's peer listener, or a proxy "
            f"older than this job ({exc})"
        ) from None
    except (OSError, TimeoutError) as exc:
        raise PreflightError(
            f"--peer {where}: no proxy's peer listener answers there ({exc or type(exc).__name__}"
            "); give the peer_port (tiering.peer_port) of a running proxy"
        ) from None
    finally:
        await clients.close()


async def store(spec, timeout_s: float = 30.0) -> None:
    """The object store opens and answers a read (a key no job writes: not found is the
    expected answer; a missing bucket or refused credentials fail here)."""
    from proxy.objects.store import ObjectNotFound

    try:
        async with asyncio.timeout(timeout_s):
            opened = await spec.open()
            try:
                await opened.size("tierproxy-preflight/none")
            except ObjectNotFound:
                pass
            finally:
                await opened.close()
    except Exception as exc:
        where = spec.directory if spec.kind == "local" else (spec.s3 or {}).get("bucket")
        raise PreflightError(
            f"the object store ({spec.kind} {where}) cannot be read: {exc}"
        ) from None


def check(
    bootstrap: str,
    topic: str,
    *,
    peer_address: tuple[str, int] | None = None,
    store_spec=None,
    settings: dict | None = None,
    say: Callable[[str], None] | None = None,
) -> tuple[uuid.UUID, int]:
    """Every check the job needs, Kafka first; (topic id, partition count). `say` gets a
    line naming the proxy found at `peer_address`."""
    found = kafka_topic(bootstrap, topic, **(settings or {}))

    async def rest() -> None:
        if peer_address is not None:
            hello = await peer(peer_address)
            if say is not None:
                host, port = peer_address
                say(f"peer {host}:{port}: proxy {hello.name} (tierproxy {hello.version})")
        if store_spec is not None:
            await store(store_spec)

    asyncio.run(rest())
    return found
