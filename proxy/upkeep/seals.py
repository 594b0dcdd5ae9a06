"""Untier without losing an acknowledged write (docs/tiering.md, "Untier").

The metadata knows only what is committed: a batch acknowledged into an owner's WAL and
not yet uploaded is past its partition's cutover too, and once the topic is passthrough
again Kafka would hand its offsets out a second time. So before the owner of the topic's
metadata shard writes the mode, every partition of the topic is sealed where it is owned:
closed (appends in flight finish; later produce is answered NOT_LEADER_OR_FOLLOWER and
retried, through Kafka once the mode is read), and the untier is refused if any holds
offsets past its cutover. Partitions owned by other proxies are sealed through the peer
protocol (admin ops `seal` / `unseal`); a shard with no live owner refuses the untier,
since its WAL cannot be looked at.

A seal is a lease: if the mode is not written within `SEAL_LEASE_S` (the proxy asking
died, say) the partitions start again. Once the mode is passthrough, the cutover loop
writes StreamUntier for them and the seal ends there.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from dataclasses import dataclass, field

from proxy.metadata.streams import shard_of, stream_id
from proxy.partition.owner import RecoveryError
from proxy.peer.clients import PeerUnavailable
from proxy.upkeep.ports import SealHost

log = logging.getLogger("tierproxy.untier")

SEAL_LEASE_S = 30.0


@dataclass
class Sealed:
    """What one untier closed: streams here and the peers that sealed theirs."""

    topic: str
    topic_id: uuid.UUID
    local: list[int] = field(default_factory=list)
    peers: list[tuple[str, int]] = field(default_factory=list)


class Seals:
    def __init__(self, service: SealHost) -> None:
        self.service = service
        self._leases: dict[int, tuple[uuid.UUID, float]] = {}  # stream -> topic id, until

    def __contains__(self, stream: int) -> bool:
        return stream in self._leases

    # -- on the owner of the topic's metadata shard ----------------------------------------

    async def seal_topic(
        self, topic: str, topic_id: uuid.UUID, partitions: int
    ) -> tuple[Sealed, str | None]:
        """Seal every partition of the topic, here and on its streams' owners, at once.
        Refused (every reason returned), whatever was sealed is started again."""
        sealed = Sealed(topic, topic_id)
        addresses, reasons = self._stream_owners(topic_id, partitions)
        here, *answers = await asyncio.gather(
            self.seal_here(topic_id, partitions),
            *(self._ask(address, "seal", topic, topic_id) for address in addresses),
        )
        sealed.local, refusal = here
        if refusal:
            reasons.insert(0, refusal)
        for address, (code, message) in zip(addresses, answers, strict=True):
            if code == 0:
                sealed.peers.append(address)
            else:
                reasons.append(message)
        if reasons:
            await self.unseal_topic(sealed)
            return Sealed(topic, topic_id), "; ".join(reasons)
        return sealed, None

    async def unseal_topic(self, sealed: Sealed) -> None:
        """The untier did not happen: start the sealed partitions again everywhere."""
        await asyncio.gather(
            self.unseal_here(sealed.local),
            *(self._ask(a, "unseal", sealed.topic, sealed.topic_id) for a in sealed.peers),
        )

    def _stream_owners(
        self, topic_id: uuid.UUID, partitions: int
    ) -> tuple[list[tuple[str, int]], list[str]]:
        """The peer addresses owning the topic's cut-over streams elsewhere; reasons to
        refuse for streams whose shard has no live owner."""
        service = self.service
        addresses: set[tuple[str, int]] = set()
        reasons: list[str] = []
        for partition in range(partitions):
            stream = stream_id(topic_id, partition)
            shard = shard_of(stream, service.config.shard_count)
            if service.shard_owner(shard) is not None:
                continue
            state = service.readers[shard].state
            address = service.peer_address(state.owner)
            if address is not None:
                addresses.add(address)  # a partition not cut over is sealed too: see below
            elif state.stream(stream) is not None:
                reasons.append(
                    f"partition {partition} (stream {stream}) is in metadata shard {shard}, "
                    f"which has no live owner right now (last {state.owner or 'none'}): "
                    "writes in its WAL not uploaded yet cannot be ruled out"
                )
            else:
                reasons.append(
                    f"partition {partition} (stream {stream}) is not cut over and metadata "
                    f"shard {shard} has no live owner right now (last "
                    f"{state.owner or 'none'}): its next owner could cut it over and take "
                    "records before the untier is written"
                )
        return sorted(addresses), reasons

    async def _ask(
        self, address: tuple[str, int], op: str, topic: str, topic_id: uuid.UUID
    ) -> tuple[int, str]:
        try:
            return await self.service.peers.admin(address, op, topic, topic_id)
        except (PeerUnavailable, TimeoutError, OSError) as exc:
            log.warning("%s of %s on the proxy at %s:%d failed: %r", op, topic, *address, exc)
            return -1, f"the proxy at {address[0]}:{address[1]} did not answer {op}: {exc}"

    # -- on a stream's owner -----------------------------------------------------------------

    async def seal_here(self, topic_id: uuid.UUID, partitions: int) -> tuple[list[int], str | None]:
        """Close the topic's partitions this proxy owns and refuse if any holds offsets
        past its cutover (refused, they start again). A partition not cut over yet (one
        just added, say) is sealed too: the cutover loop leaves a sealed stream alone, so
        it cannot be cut over and take records before the mode is written. Returns the
        streams sealed."""
        service = self.service
        assert service.partitions is not None  # the service is started
        sealed: list[int] = []
        reasons: list[str] = []
        until = time.monotonic() + SEAL_LEASE_S
        for partition in range(partitions):
            stream = stream_id(topic_id, partition)
            shard = shard_of(stream, service.config.shard_count)
            if service.shard_owner(shard) is None:
                continue
            info = service.state(stream).stream(stream)
            if info is None:  # not cut over: nothing was written to it, nothing can be
                self._leases[stream] = (topic_id, until)
                sealed.append(stream)
                continue
            tiered = service.partitions.get(stream)
            if tiered is None:  # starting (its WAL not read yet), broken, or sealed already
                reasons.append(
                    f"stream {stream} (topic id {topic_id} partition {partition}) is not "
                    f"running on {service.name} right now, so what its WAL holds is not "
                    "known: try again"
                )
                continue
            self._leases[stream] = (topic_id, until)  # before the await: no produce slips in
            sealed.append(stream)
            await service.partitions.remove(stream)
            if tiered.log_end_offset > info.cutover_offset:
                reasons.append(
                    f"stream {stream} (topic id {topic_id} partition {partition}) holds "
                    f"offsets [{info.cutover_offset}, {tiered.log_end_offset}) written after "
                    f"its cutover and not all uploaded yet: they exist only in the WAL and "
                    f"objects of {service.name}, Kafka's log ends at {info.cutover_offset}; "
                    "untier would lose them"
                )
        if reasons:
            await self.unseal_here(sealed)
            return [], "; ".join(reasons)
        return sealed, None

    async def unseal_here(self, streams: list[int]) -> None:
        """Start sealed partitions again, from the metadata, the WAL and, for what the
        uploader trimmed from the WAL meanwhile, the committed objects."""
        service = self.service
        assert service.partitions is not None  # the service is started
        for stream in streams:
            if self._leases.pop(stream, None) is None:
                continue
            owner = service.shard_owner(shard_of(stream, service.config.shard_count))
            if owner is None or service.partitions.get(stream) is not None:
                continue
            if owner.state.stream(stream) is None:  # sealed before its cutover: none runs
                continue
            try:
                await service.recover_streams(owner.state, [stream])
            except RecoveryError as exc:
                log.error("stream %d could not start again: %s", stream, exc)

    def streams_of(self, topic_id: uuid.UUID) -> list[int]:
        return [s for s, (t, _) in self._leases.items() if t == topic_id]

    def untiered(self, stream: int) -> None:
        """StreamUntier is written: the seal has done its work."""
        self._leases.pop(stream, None)

    async def expire(self) -> None:
        """Seals whose lease ended while their topic is still tiered: start them again.
        Those of streams never cut over of a topic no longer tiered just end (their
        untier was written: no StreamUntier ends them, nothing is to start)."""
        now = time.monotonic()
        service = self.service
        expired = []
        for stream, (topic_id, until) in list(self._leases.items()):
            if until > now:
                continue
            if service.topics.topic(topic_id) is not None:
                expired.append(stream)
            elif service.state(stream).stream(stream) is None:
                del self._leases[stream]
        if expired:
            log.warning("seals of streams %s expired with no untier: starting them", expired)
            await self.unseal_here(expired)
