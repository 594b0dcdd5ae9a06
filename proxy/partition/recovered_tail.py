"""The tail a rebuilt partition serves at once: its WAL entries not uploaded yet.

A restarted owner (or a new one, or one that un-seals a stream) rebuilds each partition
from its WAL (`partition.py`). The entries from the stream's committed end E on were
acknowledged and nothing else holds them until the uploader commits them, which may be
`upload_interval_s` away; consumers must read them meanwhile, as they read everything
below Kafka's high watermark. So the same pass over the WAL that rebuilds the producer
state collects them here, for the log cache (`LogCache.append`).

Bounded: the bytes of the newest entries (in WAL order, across streams) are kept while
they fit `budget`; the older ones keep only their WAL position (`LogCache.in_wal`), and a
read of them goes to the WAL (`TieredReads`). Keeping a suffix of the WAL keeps a suffix
of each stream, so what the cache holds of a stream stays contiguous up to its end.

Pure: no I/O. The bytes kept are copies (a local WAL's entries are views of the buffer
they were read in).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass

from proxy.wal.types import WalPosition

__all__ = ["RecoveredTail", "TailEntry"]


@dataclass(slots=True, eq=False)
class TailEntry:
    base_offset: int
    last_offset: int
    position: WalPosition
    data: bytes | None  # None: only in the WAL (over the budget)


class RecoveredTail:
    """Each stream's WAL entries from its committed end on, the newest with their bytes."""

    def __init__(self, committed_ends: Mapping[int, int], budget: int) -> None:
        self._next = dict(committed_ends)  # stream: the next offset wanted
        self.budget = max(budget, 0)
        self._entries: dict[int, list[TailEntry]] = {}
        self._held: deque[TailEntry] = deque()  # with bytes, oldest first
        self.held_bytes = 0

    def add(
        self,
        stream: int,
        base_offset: int,
        last_offset: int,
        position: WalPosition,
        batch: bytes | bytearray | memoryview | None,
    ) -> None:
        """One WAL entry, in WAL order. Ignored for other streams and below what is
        wanted (committed, or replayed already); the rebuild checks the rest for gaps.
        `batch` None: a reference entry, its bytes not here (partition/referenced.py):
        left in the WAL, and so is every entry of the stream before it (the log cache
        takes those noted in the WAL first, then bytes from the first one it holds)."""
        wanted = self._next.get(stream)
        if wanted is None or last_offset < wanted:
            return
        self._next[stream] = last_offset + 1
        entries = self._entries.setdefault(stream, [])
        if batch is None:
            for earlier in entries:
                if earlier.data is not None:
                    self.held_bytes -= len(earlier.data)
                    earlier.data = None
            entries.append(TailEntry(base_offset, last_offset, position, None))
            return
        data = bytes(batch)
        entry = TailEntry(base_offset, last_offset, position, data)
        entries.append(entry)
        self._held.append(entry)
        self.held_bytes += len(data)
        while self.held_bytes > self.budget:
            oldest = self._held.popleft()  # an entry over the budget goes at once
            if oldest.data is not None:  # else: dropped behind a reference entry
                self.held_bytes -= len(oldest.data)
                oldest.data = None

    def entries(self, stream: int) -> list[TailEntry]:
        """The stream's tail in offset order: those with data None first."""
        return self._entries.get(stream, [])
