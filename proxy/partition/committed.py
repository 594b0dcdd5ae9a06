"""Batch headers of committed offsets, read back from the objects (a new owner's rebuild).

A proxy that takes a shard over rebuilds each stream's producer state from the batches
from the snapshot's offset (or the cutover) to the committed end: those its WAL does not
hold are read here. Headers only; the batch bytes are dropped as soon as they are read.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from proxy.metadata.state import MetadataState
from proxy.objects.format import find_entries, read_block, read_object
from proxy.objects.store import ObjectStore
from proxy.records.batches import BatchHeader, iter_batches


async def committed_headers(
    store: ObjectStore, state: MetadataState, stream: int, start: int, end: int
) -> AsyncIterator[BatchHeader]:
    """The headers of the stream's committed batches covering [start, end), in order.
    A corrupt object raises ObjectFormatError naming it; a missing one ObjectNotFound."""
    position = start
    while position < end:
        ranges = state.objects_for(stream, position, limit=1)
        if not ranges:
            return  # the caller's rebuild names the offsets nobody holds
        found = ranges[0]
        key = found.object_key
        data = await store.get(key)
        _, index = read_object(data, key)
        for entry in find_entries(index, stream, position):
            if entry.start_offset >= min(end, found.end_offset):
                break
            for header, _ in iter_batches(read_block(data, entry, key)):
                if header.next_offset > position:
                    yield header
        position = found.end_offset
