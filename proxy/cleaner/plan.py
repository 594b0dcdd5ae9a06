"""When and how far a compacted tiered partition is cleaned (Kafka's LogCleanerManager).

The unit is a committed range (one object's part of the stream), as Kafka's is a
segment: the uncommitted tail (the WAL, the log cache) is the active segment, never
cleaned. Kafka's rules on those units:

- **cleanable end**: the end of the last range such that every range before it has its
  largest timestamp at least `min.compaction.lag.ms` old, and that holds no transaction
  whose marker is not yet in the committed ranges (Kafka stops at the last stable
  offset);
- **dirty ratio**: the bytes from the first dirty offset (where the last clean ended) to
  the cleanable end over the bytes from the log start to it; a clean runs when it is
  above `min.cleanable.dirty.ratio`, or when the first dirty range is older than
  `max.compaction.lag.ms`;
- **groups**: the ranges cleaned are rewritten into new objects of about
  `target_bytes` of input each (Kafka groups segments up to segment.bytes).

`segment.ms` and `segment.bytes` are read but unused: the committed ranges stand for the
segments whatever they say (a range ends where an upload or a compaction ended it).

Pure: no I/O, no asyncio, no clock.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from proxy.kafka.topic_configs import cleanup_policies, config_number

CONFIG_KEYS = (
    "cleanup.policy",
    "min.cleanable.dirty.ratio",
    "min.compaction.lag.ms",
    "max.compaction.lag.ms",
    "delete.retention.ms",
    "segment.ms",
    "segment.bytes",
)
NO_LAG_LIMIT = 2**63 - 1


@dataclass(frozen=True, slots=True)
class CleanerConfig:
    """A topic's cleaner configs as Kafka resolves them (Kafka's defaults)."""

    compact: bool = False  # cleanup.policy holds "compact"
    min_cleanable_dirty_ratio: float = 0.5
    min_compaction_lag_ms: int = 0
    max_compaction_lag_ms: int = NO_LAG_LIMIT
    delete_retention_ms: int = 86_400_000
    segment_ms: int = 604_800_000
    segment_bytes: int = 1 << 30


def cleaner_config(values: Mapping[str, str | None]) -> CleanerConfig:
    """From DescribeConfigs' answer (name -> value); a value missing or unreadable takes
    Kafka's default."""
    default = CleanerConfig()
    try:
        ratio = float(values.get("min.cleanable.dirty.ratio") or default.min_cleanable_dirty_ratio)
    except ValueError:
        ratio = default.min_cleanable_dirty_ratio
    return CleanerConfig(
        "compact" in cleanup_policies(values.get("cleanup.policy")),
        min(max(ratio, 0.0), 1.0),
        config_number(values.get("min.compaction.lag.ms"), default.min_compaction_lag_ms),
        config_number(values.get("max.compaction.lag.ms"), default.max_compaction_lag_ms),
        config_number(values.get("delete.retention.ms"), default.delete_retention_ms),
        config_number(values.get("segment.ms"), default.segment_ms),
        config_number(values.get("segment.bytes"), default.segment_bytes),
    )


@dataclass(frozen=True, slots=True)
class Segment:
    """A committed range of the stream as the cleaner sees it."""

    start: int
    end: int
    size: int  # bytes of its batches
    max_timestamp: int  # largest batch max timestamp, -1 when none


def cleanable_count(
    segments: Sequence[Segment], now_ms: int, config: CleanerConfig, open_from: int | None
) -> int:
    """How many of the oldest `segments` may be cleaned."""
    count = 0
    for s in segments:
        if open_from is not None and s.end > open_from:
            break
        if config.min_compaction_lag_ms and now_ms - s.max_timestamp < config.min_compaction_lag_ms:
            break
        count += 1
    return count


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """Where a clean of a stream ended (Kafka's cleaner checkpoint), and the stream's
    backfill gaps then: the offsets below the cutover no object held yet."""

    end: int
    gaps: tuple[tuple[int, int], ...]

    def dirty_from(self, gaps: Sequence[tuple[int, int]]) -> int | None:
        """Where the dirty part starts now: at `end`, unless an offload job filled a gap
        since (`gaps` differ): the migrated ranges are below `end` and were never
        cleaned, so the whole log is dirty once more (None), as after a restart. Kafka's
        log only grows at its end; a backfill is the one way data appears below it."""
        return self.end if tuple(gaps) == self.gaps else None


def first_dirty_index(segments: Sequence[Segment], checkpoint: int | None) -> int:
    """The first segment not cleaned yet: the one holding `checkpoint` (where the last
    clean ended; None: nothing cleaned, as after a restart: the whole log is dirty)."""
    if checkpoint is None:
        return 0
    for i, s in enumerate(segments):
        if s.end > checkpoint:
            return i
    return len(segments)


def should_clean(
    segments: Sequence[Segment], dirty: int, cleanable: int, now_ms: int, config: CleanerConfig
) -> bool:
    """Kafka's trigger: the dirty ratio above the minimum, or the oldest dirty range past
    max.compaction.lag.ms."""
    if not config.compact or cleanable <= dirty:
        return False
    dirty_bytes = sum(s.size for s in segments[dirty:cleanable])
    total = sum(s.size for s in segments[:cleanable])
    if total and dirty_bytes / total > config.min_cleanable_dirty_ratio:
        return True
    first = segments[dirty].max_timestamp
    return first >= 0 and now_ms - first > config.max_compaction_lag_ms


def groups(segments: Sequence[Segment], count: int, target_bytes: int) -> list[tuple[int, int]]:
    """The first `count` segments cut into runs [i, j) of at most `target_bytes` of input
    each (a larger segment alone), each rewritten into one object."""
    out: list[tuple[int, int]] = []
    start, size = 0, 0
    for i in range(count):
        if i > start and size + segments[i].size > target_bytes:
            out.append((start, i))
            start, size = i, 0
        size += segments[i].size
    if count > start:
        out.append((start, count))
    return out
