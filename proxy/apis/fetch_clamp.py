"""Kafka's Fetch answer for a tiered partition, cut at the partition's cutover.

Below its cutover a tiered partition is still read from Kafka, whose log of it ended at
the cutover C when it was cut over. Kafka's log can still grow past C behind the proxy:
its transaction coordinator writes an ABORT marker at C for a transactional producer whose
AddPartitionsToTxn reached it, or a producer writes straight to a broker. Served as it
came, Kafka's answer would hand a consumer that marker or those records as offsets C, C+1,
... and a high watermark past C: the consumer would go on past C and never read the
tiered records from C on. So the answer is cut at C, as if Kafka's log ended there:

- records: the batches whose base offset is below C, found from batch headers alone (base
  offset and length: one jump per batch, no record is read); a trailing piece too short to
  hold a batch header is kept (a client skips a partial batch);
- high watermark and last stable offset: at most C; the log start offset stays;
- aborted transactions: those starting at C or later are dropped.

Kafka's LSO and its aborted transactions below C are Kafka's part's: a transaction open
at the cutover (carried across: its marker lands past C) keeps Kafka's LSO at or below its
first offset, and once aborted Kafka lists it here with its first offset below C.

Everything else of the entry (error code, preferred read replica, the v12+ tags) is kept
as it came. Pure: `clamp_partition_answer` returns the pieces of the new entry, views of
the old one where nothing changed, what it saw past C, and whether a cut batch held data
(not a transaction marker: those are expected past C) for the caller to note.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from proxy.kafka.frames import FrameError
from proxy.kafka.wire import (
    read_array_length,
    read_nullable_bytes,
    skip,
    skip_tagged_fields,
    write_array_length,
    write_uvarint,
)

_BATCH_HEAD = struct.Struct(">qi")  # base_offset, batch_length (what follows the length)
_FIRST_OFFSET = struct.Struct(">q")  # an aborted transaction's first_offset, after its id
_ABORTED_SIZE = 16  # producer_id, first_offset
_ATTRIBUTES = struct.Struct(">h")  # a batch's attributes, at byte 21 of its header
_ATTRIBUTES_AT = 21
_CONTROL = 0x20  # the attributes' control bit: a transaction marker


@dataclass(frozen=True, slots=True)
class Clamped:
    """One partition entry cut at the cutover: its pieces, and the furthest offset Kafka's
    answer reached past the cutover (a high watermark, a cut batch's base offset, an
    aborted transaction's first offset)."""

    pieces: tuple[bytes | memoryview, ...]
    seen: int
    data_cut: bool = False  # a cut batch held records (not a marker): written behind the proxy


def batches_below(records: memoryview, cutover: int) -> tuple[memoryview, int | None]:
    """(the leading batches of `records` whose base offset is below `cutover`, the base
    offset of the first batch cut or None). A batch the answer cut short at its end is
    kept if its header says it starts below the cutover."""
    position, size = 0, len(records)
    while position < size:
        if size - position < _BATCH_HEAD.size:
            break  # not even a header: a partial batch, which clients skip
        base_offset, length = _BATCH_HEAD.unpack_from(records, position)
        if base_offset >= cutover:
            return records[:position], base_offset
        if length < 0:
            raise FrameError(f"record batch at byte {position} has length {length}")
        position += _BATCH_HEAD.size + length
    return records, None


def data_past(records: memoryview, position: int) -> bool:
    """Whether a batch of `records` from byte `position` on (its header alone, as far as
    the answer holds it) is a data batch rather than a control batch."""
    size = len(records)
    while size - position >= _ATTRIBUTES_AT + _ATTRIBUTES.size:
        (attributes,) = _ATTRIBUTES.unpack_from(records, position + _ATTRIBUTES_AT)
        if not attributes & _CONTROL:
            return True
        (length,) = _BATCH_HEAD.unpack_from(records, position)[1:]
        if length < 0:
            return False
        position += _BATCH_HEAD.size + length
    return False


def clamp_partition_answer(layout, entry: memoryview, cutover: int) -> Clamped | None:
    """The partition entry `entry` of a Fetch answer (fetch_split's layout of its
    version) cut at `cutover`; None when nothing in it reaches past the cutover.
    FrameError if the entry is malformed."""
    flexible = layout.flexible
    head = list(layout.answer_head.unpack_from(entry, 0))  # partition, error, hw, lso, [start]
    offset = skip(entry, 0, layout.answer_head.size)
    aborted_at = offset
    count, offset = read_array_length(entry, offset, flexible)
    if count > len(entry) - offset:
        raise FrameError(f"aborted_transactions array of {count} items at byte {aborted_at}")
    kept_aborted: list[memoryview] = []
    seen = -1
    for _ in range(max(count, 0)):
        start = offset
        offset = skip(entry, offset, _ABORTED_SIZE)
        offset = skip_tagged_fields(entry, offset) if flexible else offset
        (first_offset,) = _FIRST_OFFSET.unpack_from(entry, start + 8)
        if first_offset < cutover:
            kept_aborted.append(entry[start:offset])
        else:
            seen = max(seen, first_offset)
    after_aborted = offset
    if layout.preferred_read_replica:
        offset = skip(entry, offset, 4)
    replica = entry[after_aborted:offset]
    records, offset = read_nullable_bytes(entry, offset, flexible)
    tags = entry[offset:]
    if flexible:
        expect = skip_tagged_fields(entry, offset)
        if expect != len(entry):
            raise FrameError(f"{len(entry) - expect} bytes after the partition's tagged fields")
    kept, cut_at = (None, None) if records is None else batches_below(records, cutover)
    data_cut = False
    if records is not None and kept is not None and cut_at is not None:
        data_cut = data_past(records, len(kept))
    high_watermark, last_stable = head[2], head[3]
    seen = max(seen, high_watermark, last_stable, -1 if cut_at is None else cut_at)
    if seen <= cutover:
        return None
    head[2], head[3] = min(high_watermark, cutover), min(last_stable, cutover)
    pieces: list[bytes | memoryview] = [layout.answer_head.pack(*head)]
    pieces.append(write_array_length(-1 if count < 0 else len(kept_aborted), flexible))
    pieces += kept_aborted
    pieces.append(replica)
    if kept is None:
        pieces.append(entry[after_aborted + len(replica) : len(entry) - len(tags)])  # null
    else:
        size = len(kept)
        pieces.append(write_uvarint(size + 1) if flexible else struct.pack(">i", size))
        pieces.append(kept)
    pieces.append(tags)
    return Clamped(tuple(pieces), seen, data_cut)
