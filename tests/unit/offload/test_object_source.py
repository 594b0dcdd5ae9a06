"""Batches of committed ranges read back from stream objects in a local directory store
(the embedded default store): verbatim and in order, only those inside each range; a
missing object, a damaged block and an object holding less than its range are each
reported at their offset, or raised."""

from __future__ import annotations

import pytest
from aiokafka.record.default_records import DefaultRecordBatchBuilder

from offload_jobs.object_source import ObjectReadError, object_batches
from proxy.metadata.streams import StreamRange
from proxy.objects.format import ObjectWriter
from proxy.objects.keys import ObjectKind
from proxy.objects.local import LocalDirectoryStore
from proxy.records.batches import with_base_offset

STREAM = 42


def batch(base: int, records: int) -> bytes:
    builder = DefaultRecordBatchBuilder(2, 0, False, -1, -1, -1, 1 << 20)
    for i in range(records):
        builder.append(i, timestamp=1_700_000_000_000, key=None, value=b"r%d" % i, headers=[])
    return bytes(with_base_offset(bytes(builder.build()), base))


RUN = [batch(0, 2), batch(2, 3), batch(5, 1), batch(6, 4)]  # offsets 0..9


async def stored(tmp_path, object_id: int, batches: list[bytes], data_edit=None):
    """A stream object of `batches` (a block per batch) in the store; (store, its range)."""
    writer = ObjectWriter(object_id, ObjectKind.STREAM)
    writer.add_batches(STREAM, b"".join(batches), max_block_bytes=1)
    built = writer.build()
    data = bytearray(built.to_bytes())
    if data_edit is not None:
        data_edit(data, built)
    store = LocalDirectoryStore(tmp_path)
    await store.put(built.key, bytes(data))
    first = built.index[0].start_offset
    return store, StreamRange(STREAM, first, built.index[-1].end_offset, object_id,
                              ObjectKind.STREAM, built.size)  # fmt: skip


async def read(store, ranges) -> tuple[list[bytes], list[tuple[int, str]]]:
    problems: list[tuple[int, str]] = []
    got = [
        bytes(b.data)
        async for b in object_batches(store, STREAM, ranges, lambda o, w: problems.append((o, w)))
    ]
    return got, problems


async def test_batches_inside_the_ranges_come_back_verbatim(tmp_path):
    store, whole = await stored(tmp_path, 1, RUN)
    async with store:
        assert await read(store, [whole]) == (RUN, [])
        inner = StreamRange(STREAM, 2, 6, 1, ObjectKind.STREAM, whole.object_size)
        assert await read(store, [inner]) == (RUN[1:3], [])


async def test_a_missing_object_is_reported_or_raised(tmp_path):
    store, whole = await stored(tmp_path, 1, RUN)
    gone = StreamRange(STREAM, 10, 12, 2, ObjectKind.STREAM, 100)
    async with store:
        got, problems = await read(store, [whole, gone])
        assert got == RUN and [o for o, _ in problems] == [10]
        assert "object holding [10, 12) unreadable" in problems[0][1]
        with pytest.raises(ObjectReadError, match="offset 10: object holding"):
            [b async for b in object_batches(store, STREAM, [gone])]


async def test_a_damaged_block_is_reported_at_its_first_offset(tmp_path):
    def flip(data, built):
        block = built.index[1]  # offsets [2, 5)
        data[block.position + block.size - 1] ^= 1

    store, whole = await stored(tmp_path, 1, RUN, flip)
    async with store:
        got, problems = await read(store, [whole])
    assert got == [RUN[0]] + RUN[2:]
    assert [o for o, _ in problems] == [2] and "block CRC mismatch" in problems[0][1]


async def test_an_object_holding_less_than_its_range_is_reported(tmp_path):
    store, whole = await stored(tmp_path, 1, RUN[:2])  # holds [0, 5)
    claimed = StreamRange(STREAM, 0, 10, 1, ObjectKind.STREAM, whole.object_size)
    async with store:
        got, problems = await read(store, [claimed])
    assert got == RUN[:2]
    assert problems == [
        (0, f"object {whole.object_key} does not hold all of its committed [0, 10)")
    ]
