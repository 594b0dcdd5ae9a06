"""Retention of tiered streams, the decisions (docs/tiering.md, "Retention").

Kafka's rule, applied to a tiered stream's committed ranges (one object's part of the
stream each) as Kafka applies it to a partition's closed segments, whole units only,
oldest first. The stream is one log: its ranges are all of them, those an offload job
migrated below the cutover and those uploaded from the cutover on. Offsets below the
cutover that no object holds are Kafka's own copy, which Kafka's retention trims; they
are no unit here, so they neither count nor stop a pass, and a trim past a migrated
range moves the log start past them too, as Kafka would have dropped them first (they
are older):

- **retention.ms**: a range goes when its largest record timestamp is more than
  `retention.ms` before now; the first range that is not expired stops the pass.
- **retention.bytes**: then the oldest of what is left go while the stream's size without
  them stays at least `retention.bytes`.
- Nothing goes unless the topic's `cleanup.policy` holds `delete`; -1 is unlimited.

The new log start is the end of the last range dropped.

Pure: no I/O, no asyncio, no clock (times are passed in).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from proxy.kafka.topic_configs import cleanup_policies, config_number

UNLIMITED = -1
# what the proxy asks Kafka (DescribeConfigs answers the effective value: the topic's
# override, else the broker's default)
CONFIG_KEYS = ("retention.ms", "retention.bytes", "cleanup.policy")


@dataclass(frozen=True, slots=True)
class RetentionConfig:
    """A topic's retention as Kafka resolves it; -1 is unlimited."""

    retention_ms: int = UNLIMITED
    retention_bytes: int = UNLIMITED
    delete: bool = True  # cleanup.policy holds "delete": time and size retention apply

    @property
    def unlimited(self) -> bool:
        return not self.delete or (self.retention_ms < 0 and self.retention_bytes < 0)


def retention_config(values: Mapping[str, str | None]) -> RetentionConfig:
    """The config from DescribeConfigs' answer (name -> value). A value missing or not a
    number counts as unlimited: when in doubt, keep the data."""
    policy = values.get("cleanup.policy")
    delete = policy is None or "delete" in cleanup_policies(policy)
    return RetentionConfig(
        config_number(values.get("retention.ms"), UNLIMITED),
        config_number(values.get("retention.bytes"), UNLIMITED),
        delete,
    )


@dataclass(frozen=True, slots=True)
class RangeFacts:
    """One committed range of a stream, as retention sees it."""

    start_offset: int
    end_offset: int
    size: int  # bytes of the stream's blocks in the object
    max_timestamp: int  # largest record timestamp, ms

    def __post_init__(self) -> None:
        if not 0 <= self.start_offset < self.end_offset or self.size < 0:
            raise ValueError(
                f"range [{self.start_offset}, {self.end_offset}) of {self.size} bytes: "
                "needs 0 <= start < end and a size >= 0"
            )


@dataclass(frozen=True, slots=True)
class TrimPlan:
    """How many of the oldest ranges go (`by_time` of them for retention.ms, the rest for
    retention.bytes), and the new log start: the end of the last one (None: nothing goes)."""

    dropped: int
    by_time: int
    log_start_offset: int | None

    @property
    def by_size(self) -> int:
        return self.dropped - self.by_time


def plan_trim(ranges: Sequence[RangeFacts], now_ms: int, config: RetentionConfig) -> TrimPlan:
    """Which of `ranges` (the stream's committed ranges in offset order) retention drops."""
    for before, after in zip(ranges, ranges[1:], strict=False):
        if after.start_offset < before.end_offset:
            raise ValueError(
                f"ranges [{before.start_offset}, {before.end_offset}) and "
                f"[{after.start_offset}, {after.end_offset}) overlap or are out of order"
            )
    if config.unlimited or not ranges:
        return TrimPlan(0, 0, None)
    by_time = 0
    if config.retention_ms >= 0:
        while (
            by_time < len(ranges) and now_ms - ranges[by_time].max_timestamp > config.retention_ms
        ):
            by_time += 1
    dropped = by_time
    if config.retention_bytes >= 0:
        excess = sum(r.size for r in ranges[by_time:]) - config.retention_bytes
        while dropped < len(ranges) and excess - ranges[dropped].size >= 0:
            excess -= ranges[dropped].size
            dropped += 1
    log_start = ranges[dropped - 1].end_offset if dropped else None
    return TrimPlan(dropped, by_time, log_start)
