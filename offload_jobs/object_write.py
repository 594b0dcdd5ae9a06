"""Writing an offload task's stream object without ever replacing one under its key.

An offload object's key is deterministic (`offload_object_id(stream, start, end)`): a
task run again, or a straggler of an earlier run, writes the same key, which may be
committed already. The object is created exclusively (`ObjectStore.create`); when the
key is taken:

- the same bytes: the re-run is a no-op (idempotent);
- other bytes that are a whole stream object of the same id holding the same offsets
  and records (an earlier run with another `tiering.object_format_version`): it is kept,
  and its size is the one to commit, as the earlier run did;
- anything else: the range fails with the key named, and the object stays.

So a committed object's bytes never change under its commit (docs/object-store.md,
"Exclusive creates").
"""

from __future__ import annotations

import logging

from proxy.objects.format import BuiltObject, IndexEntry, read_block, read_object
from proxy.objects.store import ObjectExists, ObjectStore

log = logging.getLogger(__name__)


class ObjectInTheWay(ValueError):
    """The key holds an object that is not this range's (the range fails alone)."""


async def write_stream_object(store: ObjectStore, built: BuiltObject) -> int:
    """Create `built`, or keep the equivalent object already there; the size stored."""
    try:
        await store.create(built.key, built.pieces)
        return built.size
    except ObjectExists:
        pass
    existing = await store.get(built.key)
    if existing == built.to_bytes():
        return len(existing)
    problem = _not_equivalent(existing, built)
    if problem is not None:
        raise ObjectInTheWay(
            f"{built.key}: another object is under this key ({problem}); it is not replaced: "
            "delete it if no commit names it, and run the job again"
        )
    log.info(
        "%s: kept the object an earlier run wrote (format version %d, %d bytes)",
        built.key,
        read_object(existing, built.key)[0].version,
        len(existing),
    )
    return len(existing)


def _not_equivalent(data: bytes, built: BuiltObject) -> str | None:
    """Why the object `data` is not `built` in another format version; None if it is."""
    try:
        footer, index = read_object(data, built.key)
        for entry in index:
            read_block(data, entry, built.key)  # every block whole (CRC)
    except ValueError as exc:  # ObjectFormatError
        return f"not a readable object: {exc}"
    if (footer.object_id, footer.kind) != (built.footer.object_id, built.footer.kind):
        return f"object {footer.object_id} of kind {footer.kind.name}"
    if _coverage(index) != _coverage(built.index):
        return f"it holds {_describe(index)}, this range {_describe(built.index)}"
    return None


def _coverage(index: tuple[IndexEntry, ...]) -> tuple | None:
    """(stream, first offset, end offset, records) of a one-stream run of blocks that
    continue one another; None otherwise."""
    if not index or len({e.stream_id for e in index}) != 1:
        return None
    if any(a.end_offset != b.start_offset for a, b in zip(index, index[1:], strict=False)):
        return None
    records = sum(e.record_count for e in index)
    return index[0].stream_id, index[0].start_offset, index[-1].end_offset, records


def _describe(index: tuple[IndexEntry, ...]) -> str:
    coverage = _coverage(index)
    if coverage is None:
        return f"{len(index)} blocks that are not one stream's continuous run"
    stream, start, end, records = coverage
    return f"stream {stream} offsets [{start}, {end}), {records} records"
