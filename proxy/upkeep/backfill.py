"""Offload jobs' commits (docs/offload.md): a `BackfillRequest` names a stream object an
offload job wrote, holding offsets [a, b) of a stream below its cutover. Any proxy takes
it; the owner of the stream's metadata shard checks it with the metadata rules and writes
the `ObjectCommit` (only an owner writes metadata); another proxy hands it on to that owner.

Answers (error code, message), as the admin requests do: 0 with "committed" or "committed
already" (the same object again: a re-run), or the reason it is refused.

An object whose PUT (its LastModified in the store) is older than half of
`tiering.offload_orphan_grace_s` is refused: the orphan sweep may delete it from then on
(orphan_plan.py). Running the job again PUTs it anew under the same key.
"""

from __future__ import annotations

import time

from kio.schema.errors import ErrorCode

from proxy.clock import now_ms
from proxy.metadata.records import ObjectCommit, OffsetRange
from proxy.metadata.rules import Outcome
from proxy.metadata.state import check_commit
from proxy.metadata.store import ShardFenced
from proxy.metadata.streams import OFFLOAD_ID_BIT, offload_object_id, shard_of
from proxy.objects.keys import ObjectKind
from proxy.objects.store import ObjectStoreError
from proxy.peer.messages import BackfillRequest
from proxy.upkeep.orphan_plan import commit_age_limit, too_old_to_commit
from proxy.upkeep.ports import BackfillHost, owner_or_peer

POLICY_VIOLATION = 44


async def commit_backfill(service: BackfillHost, request: BackfillRequest) -> tuple[int, str]:
    """Commit `request`'s object on the shard's owner (here, or through the peer protocol)."""
    r = request
    what = f"stream {r.stream_id} [{r.start_offset}, {r.end_offset}) in object {r.object_id}"
    # Only an offload object's id, for its very range: a job cannot take over an id the
    # upload path allocates, nor commit one object under two ranges.
    if r.object_id != offload_object_id(r.stream_id, r.start_offset, r.end_offset):
        return ErrorCode.invalid_request, f"{what}: not the offload object id of that range"
    assert r.object_id & OFFLOAD_ID_BIT
    shard = shard_of(r.stream_id, service.config.shard_count)
    owner = owner_or_peer(service, shard)
    if owner is None:
        return (
            ErrorCode.not_coordinator,
            f"{what}: metadata shard {shard} has no live owner right now",
        )
    if isinstance(owner, tuple):  # owned by another proxy: its peer address
        args = (r.object_id, r.size, r.stream_id, r.start_offset, r.end_offset)
        return await service.peers.backfill(owner, *args)
    state = owner.state
    info = state.stream(r.stream_id)
    if info is None:
        return ErrorCode.unknown_topic_or_partition, f"{what}: the stream is not tiered"
    # The rules would also take a tail range; an offload job only ever fills below the
    # cutover, so anything reaching past it is a mistake to refuse, not to commit.
    if r.end_offset > info.cutover_offset:
        return POLICY_VIOLATION, f"{what}: ends past the cutover {info.cutover_offset}"
    commit = ObjectCommit(
        state.generation,
        r.object_id,
        ObjectKind.STREAM,
        r.size,
        owner.epoch,
        now_ms(),
        (OffsetRange(r.stream_id, r.start_offset, r.end_offset),),
    )
    verdict = check_commit(state, commit)
    if verdict.outcome is Outcome.NO_OP:
        return 0, f"{what}: committed already"
    if verdict.outcome is Outcome.REFUSE:
        return POLICY_VIOLATION, verdict.reason
    refused = await too_old(service, commit.key, what)
    if refused is not None:
        return refused
    try:
        [verdict] = await owner.write([commit])
    except ShardFenced as exc:
        return ErrorCode.not_coordinator, str(exc)
    if verdict.outcome is Outcome.REFUSE:
        return POLICY_VIOLATION, verdict.reason
    return 0, f"{what}: committed"


async def too_old(service: BackfillHost, key: str, what: str) -> tuple[int, str] | None:
    """Why the object cannot be committed now (missing, or PUT too long ago), else None."""
    grace = service.config.offload_orphan_grace_s
    store = service.store
    assert store is not None  # the service is started
    try:
        found = [info async for info in store.list(key) if info.key == key]
    except ObjectStoreError as exc:
        return ErrorCode.kafka_storage_error, f"{what}: cannot look at object {key}: {exc}"
    if not found or found[0].last_modified is None:
        return POLICY_VIOLATION, f"{what}: object {key} is not in the store"
    put_at = found[0].last_modified
    if too_old_to_commit(put_at, time.time(), grace):
        return POLICY_VIOLATION, (
            f"{what}: object {key} was PUT {time.time() - put_at:.0f} s ago, more than "
            f"{commit_age_limit(grace):.0f} s (half of tiering.offload_orphan_grace_s): the "
            "orphan sweep may delete it; run the job again to PUT it anew"
        )
    return None
