"""`tierproxy clean`'s commits (offload_jobs/clean.py; docs/offload.md, "Cleaning a
compacted topic"): a `CleanCommitRequest` names the objects the job wrote for one stream,
each replacing a run of its committed ranges. Any proxy takes it; the owner of the
stream's metadata shard commits them through its log cleaner (`LogCleaner.commit_job`:
under the lock the cleaner and the compactor share, the metadata rules refusing an object
whose replaced ranges a trim, a compaction or a clean changed since the job read them);
another proxy hands it on to that owner.

As with backfill (backfill.py), an object PUT longer ago than half of
`tiering.offload_orphan_grace_s` is refused: the orphan sweep may delete it.
"""

from __future__ import annotations

from kio.schema.errors import ErrorCode

from proxy.metadata.streams import shard_of
from proxy.peer.messages import CleanCommitRequest
from proxy.upkeep.backfill import too_old
from proxy.upkeep.log_cleaner import LogCleaner
from proxy.upkeep.ports import BackfillHost, owner_or_peer


async def commit_clean_job(
    service: BackfillHost, cleaner: LogCleaner | None, request: CleanCommitRequest
) -> tuple[int, str]:
    """Commit `request`'s objects on the shard's owner (here, or through the peer
    protocol); (error code, message)."""
    stream = request.stream_id
    shard = shard_of(stream, service.config.shard_count)
    owner = owner_or_peer(service, shard)
    if owner is None:
        return (
            ErrorCode.not_coordinator,
            f"clean of stream {stream}: metadata shard {shard} has no live owner right now",
        )
    if isinstance(owner, tuple):  # owned by another proxy: its peer address
        return await service.peers.clean_commit(owner, request)
    if cleaner is None:
        return ErrorCode.not_coordinator, "this proxy's log cleaner is not started yet"

    async def refusal(key: str, what: str) -> str | None:
        found = await too_old(service, key, what)
        return None if found is None else found[1]

    return await cleaner.commit_job(owner, request, refusal)
