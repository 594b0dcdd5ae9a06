"""A stream's record batches as its committed objects hold them, for the offload jobs.

Each committed range names the object holding it; the object is read whole (one GET),
its index and each block's CRC checked by the object format, each batch's CRC here, and
the batches inside the range handed on as views of the object, in offset order. What is
wrong (an object missing or corrupt, a batch whose CRC fails) is reported at its offset:
to `on_problem` when the caller wants to go on (verification), else raised.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence

from offload_jobs.sources import SourceBatch
from proxy.metadata.streams import StreamRange
from proxy.objects.format import ObjectFormatError, find_entries, read_block, read_object
from proxy.objects.store import ObjectStoreError
from proxy.records.batches import CorruptBatchError, iter_batches, validate_batch


class ObjectReadError(Exception):
    """A committed range that cannot be read; `offset` is where the trouble starts."""

    def __init__(self, offset: int, what: str) -> None:
        super().__init__(f"offset {offset}: {what}")
        self.offset, self.what = offset, what


Problem = Callable[[int, str], None]


def _raise(offset: int, what: str) -> None:
    raise ObjectReadError(offset, what)


async def object_batches(
    store, stream: int, ranges: Sequence[StreamRange], on_problem: Problem = _raise
) -> AsyncIterator[SourceBatch]:
    """The batches of `ranges` (a stream's committed ranges, in offset order)."""
    for r in ranges:
        key, held = r.object_key, f"[{r.start_offset}, {r.end_offset})"
        try:
            data = await store.get(key)
            _, index = read_object(data, key)
        except (ObjectStoreError, ObjectFormatError) as exc:
            on_problem(r.start_offset, f"object holding {held} unreadable: {exc}")
            continue
        entries = [
            e for e in find_entries(index, stream, r.start_offset) if e.start_offset < r.end_offset
        ]
        if not entries or entries[-1].end_offset < r.end_offset:
            on_problem(r.start_offset, f"object {key} does not hold all of its committed {held}")
        for entry in entries:
            try:
                block = read_block(data, entry, key)
                for header, batch in iter_batches(block):
                    if header.next_offset <= r.start_offset or header.base_offset >= r.end_offset:
                        continue
                    try:
                        validate_batch(batch)
                    except CorruptBatchError as exc:
                        on_problem(header.base_offset, f"object {key}: {exc}")
                        continue
                    yield SourceBatch(header.base_offset, header.last_offset, batch)
            except ObjectFormatError as exc:  # names the object itself
                on_problem(entry.start_offset, str(exc))
            except CorruptBatchError as exc:
                on_problem(entry.start_offset, f"object {key}: {exc}")
