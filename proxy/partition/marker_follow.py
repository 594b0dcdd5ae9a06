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
the replayed ones the snapshot's offset cuts off are kept as identities. The place it
keeps is the one as of the stream's committed end (`place_at`), not the live one: a
marker the WAL alone holds is lost to a takeover without that WAL, and the follower must
meet it upstream again.

Pure: no I/O, no asyncio. Owned by one `PartitionSequencer`.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

from proxy.partition.appends import PendingAppend

__all__ = ["MarkerFollow", "MarkerIdentity", "Place", "markers_end"]

MarkerIdentity = tuple[int, int, int]  # Marker.identity: (producer id, epoch, timestamp)


# committed moves kept for a snapshot at the stream's committed end (`place_at`): past it
# the oldest is forgotten, and a snapshot needing the state before it is not taken
MAX_MOVES = 10_000

# (position, accounted end, replayed markers): the follower's place at some stream offset
Place = tuple[int | None, int, list[tuple[int, MarkerIdentity]]]


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
        # the committed moves (stream end then, position), oldest first, and the place
        # before the first of them, good for any stream end from `_base_from` on
        self._history: deque[tuple[int, int]] = deque()
        self._base: Place = (position, accounted_end, self.replayed)
        self._base_from = 0

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

    def place_at(self, end: int) -> Place | None:
        """The follower's place as of the stream's first `end` offsets: after the last
        committed move at or below `end` (a move past it may be of a marker only a WAL
        holds, which a takeover without that WAL loses: the follower must meet it again).
        None if the moves kept no longer reach back there (`MAX_MOVES`)."""
        for moved_at, position in reversed(self._history):
            if moved_at <= end:
                return position, moved_at, []
        return self._base if end >= self._base_from else None

    def forget_below(self, end: int) -> None:
        """No place below `end` will be asked for again (the stream's committed end,
        which only grows): the moves at or below it go, the last one as the base."""
        while self._history and self._history[0][0] <= end:
            self._rebase(*self._history.popleft())

    def _rebase(self, moved_at: int, position: int) -> None:
        self._base, self._base_from = (position, moved_at, []), moved_at

    def _move(self, position: int, end: int) -> None:
        self.position = position
        self.accounted_end = end
        self.replayed = []  # the follower has passed them (the base may keep the old list)
        self._history.append((end, position))
        if len(self._history) > MAX_MOVES:
            self._rebase(*self._history.popleft())


def markers_end(place: Place) -> int:
    """The stream offset from which the markers are not accounted for by the place's
    position: the first replayed one still expected, or its accounted end."""
    _, accounted_end, replayed = place
    return replayed[0][0] if replayed else accounted_end
