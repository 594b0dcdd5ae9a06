"""Reading a stored object's index and a run of its blocks through any `ObjectStore`: the
compactor's, the log cleaner's and the clean job's reads (a run of one stream's blocks
is one ranged GET, never the whole object: a range in a stream set object is a small
part of it)."""

from __future__ import annotations

from collections.abc import Sequence

from proxy.objects.format import (
    IndexEntry,
    find_entries,
    index_in_tail,
    parse_footer,
    parse_index,
    read_block,
)
from proxy.objects.store import ObjectStore

INDEX_READ_BYTES = 64 * 1024  # the tail GET that finds an index: most indexes fit in it


async def read_index(store: ObjectStore, key: str, size: int) -> tuple[IndexEntry, ...]:
    """The index of object `key` of `size` bytes: one tail GET, a second if the index is
    larger than the tail read."""
    tail = await store.get_tail(key, min(size, INDEX_READ_BYTES))
    footer = parse_footer(tail, size, key)
    data = index_in_tail(tail, size, footer)
    if data is None:
        return parse_index(
            await store.get(key, footer.index_position, footer.index_end), footer, key
        )
    return parse_index(data, footer, key)


def stream_blocks(
    index: Sequence[IndexEntry], stream: int, start: int, end: int, key: str
) -> tuple[IndexEntry, ...]:
    """The blocks of object `key` holding exactly [start, end) of `stream`; ValueError
    when they do not tile it (a committed range is always a stream's whole span of
    blocks in its object)."""
    run = []
    for entry in find_entries(index, stream, start):
        if entry.start_offset >= end:
            break
        run.append(entry)
    if not run or run[0].start_offset != start or run[-1].end_offset != end:
        raise ValueError(
            f"object {key}: its blocks of stream {stream} do not cover [{start}, {end}) exactly"
        )
    return tuple(run)


async def read_blocks(
    store: ObjectStore, key: str, entries: Sequence[IndexEntry]
) -> list[memoryview]:
    """The bytes of `entries` (consecutive blocks of one object), CRC checked: one GET."""
    if not entries:
        return []
    first, last = entries[0].position, entries[-1].end_position
    data = await store.get(key, first, last)
    return [read_block(data, e, key, first) for e in entries]
