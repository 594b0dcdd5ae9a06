"""What a read_committed Fetch answer of stored batches must say about transactions.

A read_committed consumer drops the records of aborted transactions itself, told by the
answer's `aborted_transactions` (producer id, first offset): from that offset on, that
producer's transactional batches are skipped until its ABORT marker (a control batch).
Kafka finds them in its transaction index; the proxy, serving batches an offload job
copied from Kafka, finds them in the batches it answers with:

- a transaction whose marker is in the answer is decided: if the marker is ABORT, the
  transaction's first batch in the answer is its entry;
- a transaction with no marker in the answer is undecided: the answer stops before its
  first batch, so every transaction answered is decided (Kafka's last stable offset does
  the same). When the very first batch is undecided the caller reads further.

Per batch: headers and each control batch's one record key are read; no record of a
data batch is. Pure: no I/O, no asyncio.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass

from proxy.records.batches import HEADER_SIZE, read_batch_header
from proxy.records.record_walk import read_varint

ABORT, COMMIT = 0, 1  # a control record's type, after its version, in its key
_CONTROL_KEY = struct.Struct(">hh")  # version, type


class ControlRecordError(ValueError):
    """A control batch whose record is not a transaction marker."""


@dataclass(frozen=True, slots=True)
class CommittedView:
    """How many of the batches to answer, and the aborted transactions among them."""

    count: int
    aborted: tuple[tuple[int, int], ...]  # (producer id, first offset), by first offset
    undecided_at: int | None = None  # the first batch's offset of a transaction with no marker


def marker_type(batch: memoryview | bytes) -> int:
    """ABORT or COMMIT, from a control batch's one record (control batches are never
    compressed): length, attributes, timestamp delta, offset delta, key length, key."""
    view = memoryview(batch)
    _length, pos = _varint(view, HEADER_SIZE)  # the records follow the header
    pos += 1  # attributes
    _timestamp_delta, pos = _varint(view, pos)
    _offset_delta, pos = _varint(view, pos)
    key_length, pos = _varint(view, pos)
    if key_length < _CONTROL_KEY.size or pos + key_length > len(view):
        raise ControlRecordError(f"control record key of {key_length} bytes")
    _version, kind = _CONTROL_KEY.unpack_from(view, pos)
    if kind not in (ABORT, COMMIT):
        raise ControlRecordError(f"control record of unknown type {kind}")
    return kind


def committed_view(batches: Sequence[memoryview | bytes]) -> CommittedView:
    """The read_committed answer of `batches` (whole v2 batches, in offset order)."""
    open_since: dict[int, tuple[int, int]] = {}  # producer id -> (index, offset) of its first
    aborted: list[tuple[int, int]] = []
    for i, batch in enumerate(batches):
        header = read_batch_header(batch)
        if not header.is_transactional:
            continue
        producer = header.producer_id
        if not header.is_control:
            open_since.setdefault(producer, (i, header.base_offset))
            continue
        first = open_since.pop(producer, None)
        if first is not None and marker_type(batch) == ABORT:
            aborted.append((producer, first[1]))
    if not open_since:
        return CommittedView(len(batches), tuple(sorted(aborted, key=lambda a: a[1])))
    cut, undecided_at = min(open_since.values())
    kept = sorted((a for a in aborted if a[1] < undecided_at), key=lambda a: a[1])
    return CommittedView(cut, tuple(kept), undecided_at)


def _varint(view: memoryview, pos: int) -> tuple[int, int]:
    """A zigzag varint (record_walk.read_varint); one past the batch is a bad control record."""
    try:
        return read_varint(view, pos)
    except IndexError:
        raise ControlRecordError(f"varint at byte {pos} runs past the batch") from None
