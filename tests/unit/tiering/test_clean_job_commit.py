"""The clean job's commit at the shard's owner (`LogCleaner.commit_job`, proxy/upkeep/
clean_job.py), against a local directory store and a real metadata state.

What it shows: the job's objects commit with `replaces` as the proxy's cleaner's do, and
set the cleaner's checkpoint; an object whose replaced ranges a trim changed between the
job's plan and its commit is refused and deleted, the stream's other objects committing;
a request naming an object in use (a wrong id) is refused without deleting it."""

from __future__ import annotations

from types import SimpleNamespace
from uuid import UUID

from prometheus_client import CollectorRegistry

from proxy.cleaner.plan import Checkpoint
from proxy.metadata.codec import encode
from proxy.metadata.records import ObjectCommit, OffsetRange, ShardClaim, StreamCutover, StreamTrim
from proxy.metadata.state import MetadataState
from proxy.metadata.streams import OFFLOAD_ID_BIT, stream_id
from proxy.objects.format import FORMAT_VERSION
from proxy.objects.format_writer import ObjectWriter
from proxy.objects.keys import ObjectKind, object_key
from proxy.objects.local import LocalDirectoryStore
from proxy.objects.store import ObjectNotFound
from proxy.peer.messages import CleanCommitRequest, CleanedObject
from proxy.records.batches import with_base_offset
from proxy.upkeep.log_cleaner import LogCleaner
from tests.support.batches import build_batch
from tests.support.owners import Owner

TOPIC = UUID("6ba7b810-9dad-41d1-80b4-00c04fd430c8")
STREAM = stream_id(TOPIC, 0)
POLICY_VIOLATION = 44


class Shard:
    """One shard owned here, one stream cut over at 0, objects of 3 offsets each."""

    def __init__(self, tmp_path) -> None:
        self.store = LocalDirectoryStore(tmp_path / "objects")
        self.state = MetadataState(0, 1)
        self.apply(ShardClaim(0, 1, "proxy-a", 1))
        self.apply(StreamCutover(0, STREAM, 1, 1, TOPIC, 0, 0, 0, 0, 1))
        self.owner = Owner(self.state)
        config = SimpleNamespace(
            log_cleaner_interval_s=3600,
            log_cleaner_max_bytes=1 << 30,
            log_cleaner_map_keys=1000,
            stream_object_bytes=1 << 22,
            object_format_version=FORMAT_VERSION,
        )
        service = SimpleNamespace(
            config=config, bandwidth=None, registry=CollectorRegistry(), store=self.store
        )
        self.cleaner = LogCleaner(service, lambda: 1)  # type: ignore[arg-type]

    def apply(self, record) -> None:
        assert self.state.apply(*encode(record), self.state.next_offset).accepted

    async def put(self, number: int, start: int, end: int) -> int:
        """A stream object of [start, end) in the store; its size."""
        writer = ObjectWriter(number, ObjectKind.STREAM)
        batch = with_base_offset(
            build_batch([b"v"] * (end - start), keys=[b"k"] * (end - start)), start
        )
        writer.add_batches(STREAM, batch)
        built = writer.build()
        await self.store.put(built.key, built.pieces)
        return built.size

    async def upload(self, number: int) -> None:
        end = self.state.stream_end(STREAM)
        size = await self.put(number, end, end + 3)
        self.apply(
            ObjectCommit(
                0, number, ObjectKind.STREAM, size, 1, 1000, (OffsetRange(STREAM, end, end + 3),)
            )
        )

    async def exists(self, number: int) -> bool:
        try:
            await self.store.size(object_key(number, ObjectKind.STREAM))
        except ObjectNotFound:
            return False
        return True

    async def commit(self, objects: list[CleanedObject], clean_end: int = -1) -> tuple[int, str]:
        async def fresh(key: str, what: str) -> str | None:
            return None

        request = CleanCommitRequest(0, STREAM, clean_end, tuple(objects))
        return await self.cleaner.commit_job(self.owner, request, fresh)  # type: ignore[arg-type]


async def test_the_jobs_objects_commit_with_replaces_and_set_the_checkpoint(tmp_path) -> None:
    shard = Shard(tmp_path)
    for number in (1, 2, 3):
        await shard.upload(number)
    new = OFFLOAD_ID_BIT | 77
    size = await shard.put(new, 0, 6)
    code, message = await shard.commit([CleanedObject(new, size, 0, 6, (1, 2))], clean_end=9)
    assert code == 0, message
    ranges = [
        (r.object_id, r.start_offset, r.end_offset) for r in shard.state.committed_ranges(STREAM)
    ]
    assert ranges == [(new, 0, 6), (3, 6, 9)]
    assert shard.cleaner._checkpoints[STREAM] == Checkpoint(9, ())
    # sent again (an answer lost): committed already, nothing deleted
    code, message = await shard.commit([CleanedObject(new, size, 0, 6, (1, 2))])
    assert code == 0 and await shard.exists(new), message


async def test_an_object_a_trim_raced_is_refused_and_deleted_the_others_commit(tmp_path) -> None:
    shard = Shard(tmp_path)
    for number in (1, 2, 3, 4):
        await shard.upload(number)
    below, above = OFFLOAD_ID_BIT | 5, OFFLOAD_ID_BIT | 6
    objects = [
        CleanedObject(below, await shard.put(below, 0, 6), 0, 6, (1, 2)),
        CleanedObject(above, await shard.put(above, 6, 12), 6, 12, (3, 4)),
    ]
    shard.apply(StreamTrim(0, STREAM, 1, 4, 1, 7))  # DeleteRecords after the job's plan
    code, message = await shard.commit(objects, clean_end=12)
    assert code == POLICY_VIOLATION and "1 of 2 objects refused" in message, message
    assert not await shard.exists(below) and await shard.exists(above)
    assert [r.object_id for r in shard.state.committed_ranges(STREAM)][-1] == above
    assert STREAM not in shard.cleaner._checkpoints  # not every object committed


async def test_a_request_naming_an_object_in_use_deletes_nothing(tmp_path) -> None:
    shard = Shard(tmp_path)
    for number in (1, 2):
        await shard.upload(number)
    size = await shard.store.size(object_key(2, ObjectKind.STREAM))
    # object 2 (an upload's id) and an offload id committed already, named as new objects
    in_use = OFFLOAD_ID_BIT | 9
    await shard.upload(in_use)
    for number in (2, in_use):
        code, message = await shard.commit([CleanedObject(number, size, 0, 3, (1,))])
        assert code == POLICY_VIOLATION, message
        assert await shard.exists(number)


async def test_a_proxy_not_owning_the_shard_hands_the_request_on() -> None:
    from proxy.upkeep.clean_job import commit_clean_job

    sent: list = []

    async def clean_commit(address, request):
        sent.append((address, request))
        return 0, "committed there"

    def service(owner_address):
        return SimpleNamespace(
            config=SimpleNamespace(shard_count=1),
            shard_owner=lambda shard: None,
            readers=[SimpleNamespace(state=SimpleNamespace(owner="proxy-b"))],
            peer_address=lambda name: owner_address,
            peers=SimpleNamespace(clean_commit=clean_commit),
        )

    request = CleanCommitRequest(0, STREAM, -1, (CleanedObject(OFFLOAD_ID_BIT | 1, 9, 0, 3, (1,)),))
    answer = await commit_clean_job(service(("10.0.0.2", 19090)), None, request)  # type: ignore[arg-type]
    assert answer == (0, "committed there") and sent == [(("10.0.0.2", 19090), request)]
    code, message = await commit_clean_job(service(None), None, request)  # type: ignore[arg-type]
    assert code == 16 and "no live owner" in message  # NOT_COORDINATOR: retriable
