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

`committed_answer` adds the last stable offset (LSO): what a read_committed answer may
reach, from the partition's owner when known (Kafka's rule: the first offset of the oldest
open transaction, at most the high watermark), else what the batches read decide.

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


@dataclass(frozen=True, slots=True)
class CommittedAnswer:
    """A read_committed answer of a run of batches read from the fetch offset on."""

    count: int  # the leading batches to answer
    aborted: tuple[tuple[int, int], ...]  # (producer id, first offset) among them
    last_stable_offset: int
    # the first batch is decided (below the LSO) but its marker lies past the run: read on
    read_more: bool = False


def committed_answer(
    batches: Sequence[memoryview | bytes],
    offset: int,
    max_bytes: int,
    *,
    last_stable: int | None,
    end: int,
    exhausted: bool,
) -> CommittedAnswer:
    """What to answer read_committed from `batches` (whole v2 batches from the one holding
    `offset` on, in offset order) within `max_bytes` (the first batch whole).

    `last_stable` is the owner's LSO, None when unknown (no owner answered: then the LSO
    is what the batches decide: the first offset of a transaction undecided in them, else
    their end (`offset` when there are none), or `end` when they reach it). `end` is the
    high watermark answered; `exhausted` says that the run reaches it, so no marker lies
    past the run.

    Never a batch at or past the LSO, nor one of a transaction whose marker is not in the
    run: Kafka knows decisions from its transaction index, the proxy from the markers it
    reads, so a transaction below the LSO whose marker is past the run asks for a longer
    run (`read_more`) when it is the first batch, and stops the answer otherwise."""
    view = committed_view(batches)
    heads = [read_batch_header(batch) for batch in batches]
    known = last_stable is not None
    if last_stable is None:
        if view.undecided_at is not None:
            last_stable = view.undecided_at
        elif exhausted:
            last_stable = end
        else:
            last_stable = heads[-1].next_offset if heads else offset
    last_stable = min(last_stable, end)
    below = 0
    while below < len(heads) and heads[below].base_offset < last_stable:
        below += 1
    count = min(view.count, below)
    if count == 0:
        # known LSO: a first batch below it is decided; unknown: its marker may lie further
        more = bool(heads) and not exhausted and (below > 0 if known else view.count == 0)
        return CommittedAnswer(0, (), last_stable, more)
    size, fits = 0, 0
    for head in heads[:count]:
        if fits and size + head.size > max_bytes:
            break
        size += head.size
        fits += 1
    answered_end = heads[fits - 1].next_offset
    aborted = tuple(a for a in view.aborted if a[1] < answered_end)
    return CommittedAnswer(fits, aborted, last_stable)


def _varint(view: memoryview, pos: int) -> tuple[int, int]:
    """A zigzag varint (record_walk.read_varint); one past the batch is a bad control record."""
    try:
        return read_varint(view, pos)
    except IndexError:
        raise ControlRecordError(f"varint at byte {pos} runs past the batch") from None
