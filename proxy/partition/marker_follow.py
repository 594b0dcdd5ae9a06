"""Where the marker follower of a tiered partition is in Kafka's log of the partition, as
the partition's committed state knows it (docs/sequencer.md, "Transactions").

The position is the next upstream offset to consider. It moves when the append of a
marker commits, and past a skipped marker (one Kafka's leader would refuse) once the
appends pending before it commit: in upstream order either way, so a snapshot never
says a marker was considered whose append is not durable. `replayed` are the identities
of the control batches a rebuild replayed: the markers already in the stream past the
position (the stream's copy does not carry its upstream offset), until a live marker
moves the position past them.

Pure: no I/O, no asyncio. Owned by one `PartitionSequencer`.
"""

from __future__ import annotations

from collections.abc import Sequence

from proxy.partition.appends import PendingAppend

__all__ = ["MarkerFollow", "MarkerIdentity"]

MarkerIdentity = tuple[int, int, int]  # Marker.identity: (producer id, epoch, timestamp)


class MarkerFollow:
    def __init__(self, position: int | None = None) -> None:
        self.position = position  # committed; None: the cutover, nothing considered yet
        self.moves: dict[int, int] = {}  # base offset of a pending append -> position after
        self.replayed: list[MarkerIdentity] = []

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

    def skipped(self, pending: Sequence[PendingAppend], position: int) -> None:
        """A skipped marker: move to `position` once what is pending now commits."""
        if pending:
            self.moves[pending[-1].base_offset] = position
        else:
            self._move(position)

    def committed(self, base_offset: int) -> None:
        moved = self.moves.pop(base_offset, None)
        if moved is not None:
            self._move(moved)

    def _move(self, position: int) -> None:
        self.position = position
        self.replayed.clear()  # the follower has passed them
