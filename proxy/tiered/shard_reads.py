"""Every live member of the fleet reads a metadata shard up to an offset: what a
DeleteRecords on a tiered partition waits for before it is answered (docs/tiering.md,
"DeleteRecords").

Every proxy serves a tiered partition's reads from its own reader of the partition's
metadata shard: a StreamTrim the owner just wrote moves the log start there only once
that reader has applied it, some milliseconds later. Kafka answers a DeleteRecords once
every replica in sync has moved its log start (`DelayedDeleteRecords`), so a consumer
asking any of them afterwards finds the new log start. The owner therefore asks every
live member (`read_everywhere`) to read the shard past the trim before it answers; each
answers once its reader got there (`read_here`, a `ShardReadRequest`). A member older
than `SHARD_READ_PROTOCOL` is not asked (it catches up on its own, as before), and one
that cannot be reached or whose reader failed is left out and logged, as Kafka leaves a
replica out of sync; one that does not get there in time makes the delete
REQUEST_TIMED_OUT, as Kafka's expires (the trim stays: a retry finds it done and waits
again).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Protocol

from kio.schema.errors import ErrorCode

from proxy.metadata.reader import ShardReader
from proxy.peer.clients import PeerClients
from proxy.peer.codec import SHARD_READ_PROTOCOL
from proxy.peer.messages import ShardReadRequest

log = logging.getLogger("tierproxy.trims")


class ShardReadHost(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def readers(self) -> Sequence[ShardReader]: ...

    @property
    def peers(self) -> PeerClients: ...

    def live_peers(self) -> list[str]: ...

    def peer_protocol(self, member: str) -> int: ...

    def peer_address(self, member: str) -> tuple[str, int] | None: ...


async def read_everywhere(
    host: ShardReadHost, shard: int, offset: int, timeout_s: float
) -> list[str]:
    """This proxy's reader of `shard` (the owner's own writes are read back by a reader
    of their own) and every live member at `SHARD_READ_PROTOCOL` or later read it until
    every record below `offset` is applied, all at once: the members that did not within
    `timeout_s` (the others, and those left out, are logged)."""
    calls = {asyncio.ensure_future(_read_local(host, shard, offset)): host.name}
    for member in host.live_peers():
        calls[asyncio.ensure_future(_read_at(host, member, shard, offset, timeout_s))] = member
    done, pending = await asyncio.wait(calls, timeout=max(0.0, timeout_s))
    for call in pending:
        call.cancel()
    late = [calls[call] for call in pending]
    late.extend(calls[call] for call in done if call.result())
    return late


async def _read_local(host: ShardReadHost, shard: int, offset: int) -> bool:
    try:
        await host.readers[shard].read_to(offset)
    except RuntimeError as exc:  # the reader stopped: this proxy is stopping
        log.warning("shard %d not read to %d here: %s", shard, offset, exc)
    return False


async def _read_at(
    host: ShardReadHost, member: str, shard: int, offset: int, timeout_s: float
) -> bool:
    """Whether `member` did not read that far within `timeout_s`."""
    if host.peer_protocol(member) < SHARD_READ_PROTOCOL:
        return False  # an older member is not asked: its reader catches up on its own
    address = host.peer_address(member)
    if address is None:
        return False  # not live any more, or without tiering: it serves no tiered read
    try:
        code, message = await host.peers.read_shard(
            address, shard, offset, max(0, int(timeout_s * 1000))
        )
    except TimeoutError:
        return True
    except Exception as exc:  # unreachable (PeerUnavailable, OSError) or its answer bad
        log.info("%s not asked to read shard %d to %d: %r", member, shard, offset, exc)
        return False
    if code == ErrorCode.request_timed_out:
        log.warning("%s did not read shard %d to %d in time: %s", member, shard, offset, message)
        return True
    if code != ErrorCode.none:
        log.warning("%s could not read shard %d to %d: %s", member, shard, offset, message)
    return False


async def read_here(host: ShardReadHost, request: ShardReadRequest) -> tuple[int, str]:
    """A peer's `ShardReadRequest`: (error code, message) once this proxy's reader of the
    shard has applied every record below the offset, REQUEST_TIMED_OUT if it has not
    within the request's timeout."""
    shard, offset = request.shard, request.offset
    if shard >= len(host.readers):
        return ErrorCode.invalid_request.value, f"no metadata shard {shard} here"
    try:
        async with asyncio.timeout(request.timeout_ms / 1000):
            await host.readers[shard].read_to(offset)
    except TimeoutError:
        return ErrorCode.request_timed_out.value, f"shard {shard} not read to {offset} in time"
    except RuntimeError as exc:  # the reader stopped
        return ErrorCode.kafka_storage_error.value, str(exc)
    return 0, ""
