"""Copies of a test topic in stream objects, as the offload job would write them: the
batches read from Kafka by the cluster reader, two objects per partition in MinIO, and a
metadata state committing them (the real rules). The verify and export tests use them."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from offload_jobs.cluster_reader import read_batches
from offload_jobs.kafka_client import describe_topic
from offload_jobs.migrate import StoreSpec
from proxy.metadata.codec import encode
from proxy.metadata.records import ObjectCommit, OffsetRange, ShardClaim, StreamCutover
from proxy.metadata.state import MetadataState
from proxy.metadata.streams import offload_object_id, stream_id
from proxy.objects.format_writer import BuiltObject, ObjectWriter
from proxy.objects.keys import ObjectKind
from proxy.objects.s3 import S3Store
from proxy.objects.s3config import S3Config

NOW_MS = 1_700_000_000_000
BLOCK_BYTES = 4096  # small blocks: a damaged block is a few batches, not the object


@dataclass
class Copy:
    """One partition's objects: [(start, end, built)] in offset order, and the batches
    each holds."""

    partition: int
    stream: int
    end: int
    objects: list[tuple[int, int, BuiltObject]]
    batches: list[list] | None = None


def s3_spec(server) -> StoreSpec:
    kwargs = server.client_kwargs()
    return StoreSpec("s3", s3={
        "bucket": server.bucket, "endpoint_url": kwargs["endpoint_url"],
        "region": kwargs["region_name"], "access_key_id": kwargs["aws_access_key_id"],
        "secret_access_key": kwargs["aws_secret_access_key"], "path_style": True,
    })  # fmt: skip


def put(server, objects: list[tuple[str, bytes]]) -> None:
    async def upload() -> None:
        async with S3Store(S3Config(**s3_spec(server).s3)) as store:
            for key, data in objects:
                await store.put(key, data)

    asyncio.run(upload())


def build(stream: int, batches, object_id: int | None = None) -> tuple[int, int, BuiltObject]:
    start, end = batches[0].base_offset, batches[-1].last_offset + 1
    writer = ObjectWriter(object_id or offload_object_id(stream, start, end), ObjectKind.STREAM)
    writer.add_batches(stream, b"".join(b.data for b in batches), max_block_bytes=BLOCK_BYTES)
    return start, end, writer.build()


def state_of(topic_id, copies: list[Copy], spanning: bool = False) -> dict[int, MetadataState]:
    """Shard 0 of 1: each partition cut over at its end, its objects committed below.
    `spanning`: cut over where its last object starts, that object committed as the
    proxy's upload from there (Kafka's log holds what is below)."""
    state = MetadataState(0, 1)

    def write(record) -> None:
        verdict = state.apply(*encode(record), state.next_offset)
        assert verdict.accepted, verdict.reason

    write(ShardClaim(0, 1, "offload-test", NOW_MS))
    for c in copies:
        objects = c.objects[-1:] if spanning else c.objects
        cutover = objects[0][0] if spanning else c.end
        write(StreamCutover(0, c.stream, 1, 1, topic_id, c.partition, 0, cutover, cutover, NOW_MS))
        for start, end, built in objects:
            ranges = (OffsetRange(c.stream, start, end),)
            object_id = built.footer.object_id
            write(ObjectCommit(0, object_id, ObjectKind.STREAM, built.size, 1, NOW_MS, ranges))
    return {0: state}


def offload(kafka_cluster, s3_server, mixed_topic):
    """The topic id and each partition's copy in two objects, uploaded."""
    topic_id, partitions = describe_topic(kafka_cluster.bootstrap, mixed_topic.name)
    copies = []
    for partition in range(partitions):
        batches = list(read_batches(kafka_cluster.bootstrap, mixed_topic.name, partition, 0))
        stream = stream_id(topic_id, partition)
        half = len(batches) // 2
        halves = [batches[:half], batches[half:]]
        objects = [build(stream, run) for run in halves]
        copies.append(Copy(partition, stream, objects[-1][1], objects, halves))
    put(s3_server, [(o.key, o.to_bytes()) for c in copies for _, _, o in c.objects])
    return topic_id, copies


def tampered(s3_server, copy: Copy, object_id: int):
    """The copy with its second object replaced by one (uploaded under its own key) whose
    third block has a flipped bit; and that block's index entry."""
    start, end, built = build(copy.stream, copy.batches[1], object_id=object_id)
    data = bytearray(built.to_bytes())
    block = built.index[2]
    data[block.position + block.size // 2] ^= 0x40
    put(s3_server, [(built.key, bytes(data))])
    changed = Copy(copy.partition, copy.stream, copy.end, [copy.objects[0], (start, end, built)])
    return changed, block


def other_id(stream: int, n: int) -> int:
    """An object id of this stream's own for test object n (streams, so ids, are new
    each session): keys no other test writes."""
    return offload_object_id(stream, 1_000_000 + n, 1_000_001 + n)
