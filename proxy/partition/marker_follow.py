"""Where the marker follower of a tiered partition is in Kafka's log of the partition, as
the partition's committed state knows it (docs/sequencer.md, "Transactions").

The position is the next upstream offset to consider. It moves when the append of a
marker commits, and past a skipped marker (one Kafka's leader would refuse) once the
appends pending before it commit: in upstream order either way, so a snapshot never
says a marker was considered whose append is not durable. `replayed` are the stream
offsets and identities of the control batches a rebuild replayed: the markers already
in the stream past the position (the stream's copy does not carry its upstream offset),
until a live marker moves the position past them.

`accounted_end` is the stream offset below which every marker is accounted for by the
position (each move sets it to the stream's end then). A producer snapshot taken at an
offset below the stream's end (with a trim: `PartitionSequencer.snapshot_at`) keeps
where to tell them apart again (`markers_end`): a rebuild replays the markers from the
snapshot's offset on, and only those from `markers_end` on are still to be met upstream;
the replayed ones the snapshot's offset cuts off are kept as identities.

Pure: no I/O, no asyncio. Owned by one `PartitionSequencer`.
"""

from __future__ import annotations

from collections.abc import Sequence

from proxy.partition.appends import PendingAppend

__all__ = ["MarkerFollow", "MarkerIdentity"]

MarkerIdentity = tuple[int, int, int]  # Marker.identity: (producer id, epoch, timestamp)


class MarkerFollow:
    def __init__(
        self,
        position: int | None = None,
        accounted_end: int = 0,
        expected: Sequence[MarkerIdentity] = (),
        expected_at: int = 0,
    ) -> None:
        """`expected`: identities of markers still to be met upstream whose batches lie
        below `expected_at` (a snapshot's offset: they are not replayed again)."""
        self.position = position  # committed; None: the cutover, nothing considered yet
        self.moves: dict[int, int] = {}  # base offset of a pending append -> position after
        self.accounted_end = accounted_end
        self.replayed: list[tuple[int, MarkerIdentity]] = [
            (expected_at - 1, identity) for identity in expected
        ]

    def pending_position(self, pending: Sequence[PendingAppend]) -> int | None:
        """The position once every pending append is committed."""
        for append in reversed(pending):
            moved = self.moves.get(append.base_offset)
            if moved is not None:
                return moved
        return self.position

    def appended(self, base_offset: int, position: int) -> None:
        """A marker's append at `base_offset` moves the position to `position` on commit."""
        self.moves[base_offset] = position

    def skipped(self, pending: Sequence[PendingAppend], position: int, end: int) -> None:
        """A skipped marker: move to `position` once what is pending now commits (`end`:
        the committed end of the stream, when nothing is)."""
        if pending:
            self.moves[pending[-1].base_offset] = position
        else:
            self._move(position, end)

    def committed(self, base_offset: int, end: int) -> None:
        """The pending append at `base_offset` committed; the stream now ends at `end`."""
        moved = self.moves.pop(base_offset, None)
        if moved is not None:
            self._move(moved, end)

    def replay(self, base_offset: int, identity: MarkerIdentity) -> None:
        """A rebuild replayed a control batch at `base_offset`: still to be met upstream
        unless the position accounts for it already."""
        if base_offset >= self.accounted_end:
            self.replayed.append((base_offset, identity))

    def markers_end(self) -> int:
        """The stream offset from which the markers are not accounted for by the position:
        the first replayed one still expected, or `accounted_end`."""
        return self.replayed[0][0] if self.replayed else self.accounted_end

    def _move(self, position: int, end: int) -> None:
        self.position = position
        self.accounted_end = end
        self.replayed.clear()  # the follower has passed them
