"""What the WAL hands out and takes in: positions, entries, counters, settings, errors.

Pure values; nothing here does I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

from proxy.errors import TierproxyError


@dataclass(frozen=True, slots=True, order=True)
class WalPosition:
    """Where one entry lies in the WAL: the WAL offsets [start, end).

    WAL offsets count bytes across all segments since the WAL was created, so they only
    grow. `end` is the next entry's `start`; after an entry was uploaded and committed,
    `trim_to(position.end)` releases it."""

    start: int
    end: int

    @property
    def size(self) -> int:
        return self.end - self.start


@dataclass(frozen=True, slots=True)
class WalEntry:
    """One entry read back: what `append` was given, and where it was put.
    `batch` is a slice of the buffer the entry was read in, not a copy. `reference` is
    the opaque reference an append with one wrote (a version-2 entry: where the batch's
    whole bytes are, docs/wal.md), None for an ordinary entry; its bytes count in
    `position.size`."""

    position: WalPosition
    stream_id: int
    base_offset: int
    batch: memoryview
    reference: memoryview | None = None


@dataclass(frozen=True, slots=True)
class WalStats:
    """Counters since the WAL was opened. `appends / fsyncs` is the group-commit factor."""

    appends: int = 0  # acknowledged appends
    bytes_appended: int = 0  # framed bytes of those
    fsyncs: int = 0  # data fsyncs (one per group commit)
    dir_fsyncs: int = 0  # directory fsyncs (segment creation)
    largest_group: int = 0  # most appends one fsync covered
    segments_rolled: int = 0
    segments_deleted: int = 0
    throttled_appends: int = 0  # appends that had to wait for room
    throttled_seconds: float = 0.0  # time the head of the queue waited for room
    retained_bytes: int = 0  # WAL bytes not yet trimmed (counted against capacity)
    no_space_waits: int = 0  # times a write found the disk full (ENOSPC) and waited
    no_space_seconds: float = 0.0  # time appends waited for the disk to have room again
    waiting_for_space: bool = False  # the disk is full now: appends wait


@dataclass(frozen=True, slots=True)
class WalConfig:
    """The WAL's settings. Errors name the key, as the proxy's config errors do."""

    directory: str
    # a new segment is started when the next group would take the active one past this
    segment_bytes: int = 64 * 1024 * 1024
    # un-trimmed bytes allowed; an append that would pass it waits for `trim_to`
    capacity_bytes: int = 1024 * 1024 * 1024
    # the most bytes one write + fsync covers (one group commit); at least one entry
    max_group_bytes: int = 8 * 1024 * 1024
    # how much recovery and `read` ask of a file at once
    read_chunk_bytes: int = 8 * 1024 * 1024
    # a write that found the disk full is tried again after this (or after a trim)
    no_space_retry_s: float = 0.5

    def __post_init__(self) -> None:
        for key in ("segment_bytes", "capacity_bytes", "max_group_bytes", "read_chunk_bytes"):
            value = getattr(self, key)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"wal config error at {key}: {value!r} is not a positive int")
        if not self.directory:
            raise ValueError("wal config error at directory: empty")
        if not self.no_space_retry_s > 0:
            raise ValueError(
                f"wal config error at no_space_retry_s: {self.no_space_retry_s!r} is not > 0"
            )


class WalError(TierproxyError):
    """Base of the WAL's own failures (misuse raises ValueError instead)."""


class WalBrokenError(WalError):
    """A write or an fsync failed. What reached the disk is unknown, so every append
    waiting then failed with this, and the WAL refuses appends and trims until it is
    reopened (which recovers it). Entries acknowledged before the failure stay readable."""


class WalClosedError(WalError):
    """The WAL was closed before this append was written, or is closed now."""


class WalCorruptError(WalError):
    """Recovery found damage it must not repair by cutting: a bad entry before the last
    segment's tail, a gap between segments, or entries of a newer format."""


class WalOffsetOutOfRange(WalError):
    """A read asked for WAL offsets below the trimmed start or above the durable end."""
