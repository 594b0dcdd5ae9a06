"""Batch headers of committed offsets, read back from the objects (a new owner's rebuild).

A proxy that takes a shard over rebuilds each stream's producer state from the batches
from the snapshot's offset (or the cutover) to the committed end: those its WAL does not
hold are read here, block by block with what each block's index entry says (its offsets
and record count: `rules.CommittedBlock`, how a log cleaner's block declares its holes).
Headers only; the batch bytes are dropped as soon as they are read.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from proxy.metadata.state import MetadataState
from proxy.objects.format import find_entries, read_block, read_object
from proxy.objects.store import ObjectStore
from proxy.partition.rules import CommittedBlock
from proxy.records.batches import iter_batches


async def committed_blocks(
    store: ObjectStore, state: MetadataState, stream: int, start: int, end: int
) -> AsyncIterator[CommittedBlock]:
    """The stream's committed blocks covering [start, end), in order, each with every
    batch header it holds. A corrupt object raises ObjectFormatError naming it; a missing
    one ObjectNotFound."""
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
            headers = tuple(header for header, _ in iter_batches(read_block(data, entry, key)))
            yield CommittedBlock(entry.start_offset, entry.end_offset, entry.record_count, headers)
        position = found.end_offset
