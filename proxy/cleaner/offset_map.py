"""The cleaner's offset map: key -> the latest offset holding it, in bounded memory.

As Kafka's SkimpyOffsetMap, keys are kept as a 16-byte digest (BLAKE2b here, MD5 there):
a collision would take a record for another key's older copy, one chance in 2**64 for a
billion keys. The map holds at most `max_entries` keys (about 120 bytes each in CPython:
1,000,000 keys are about 120 MB); `put` answers False when a new key does not fit, and the
cleaner then stops the dirty section at the last range it indexed whole (Kafka stops at
the last segment it indexed whole, "dedupe buffer" full).

Pure: no I/O, no asyncio.
"""

from __future__ import annotations

import hashlib

DEFAULT_MAX_ENTRIES = 250_000


def digest(key: bytes) -> bytes:
    return hashlib.blake2b(key, digest_size=16).digest()


class OffsetMap:
    """key digest -> latest offset; `end` is the offset past the dirty section indexed."""

    def __init__(self, max_entries: int = DEFAULT_MAX_ENTRIES) -> None:
        if max_entries < 1:
            raise ValueError(f"offset map max_entries {max_entries} is not positive")
        self.max_entries = max_entries
        self._offsets: dict[bytes, int] = {}

    def __len__(self) -> int:
        return len(self._offsets)

    def put(self, key: bytes, offset: int) -> bool:
        """Record `offset` as the key's latest; False (nothing changed) when full."""
        d = digest(key)
        if d not in self._offsets and len(self._offsets) >= self.max_entries:
            return False
        self._offsets[d] = offset
        return True

    def get(self, key: bytes) -> int:
        """The key's latest offset in the map, -1 if it is not there."""
        return self._offsets.get(digest(key), -1)

    def digests(self) -> dict[bytes, int]:
        """The map itself: key digest -> latest offset (a job ships it to its tasks)."""
        return self._offsets

    @classmethod
    def of(cls, digests: dict[bytes, int]) -> OffsetMap:
        """A map holding `digests` (key digest -> latest offset), full as it is."""
        omap = cls(max(len(digests), 1))
        omap._offsets = digests
        return omap
