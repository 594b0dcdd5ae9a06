"""Retention decisions (proxy/upkeep/retention_plan.py): Kafka's rule per whole range,
oldest first, for retention.ms and retention.bytes; the topic config as DescribeConfigs
gives it; the config keys."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.config import ConfigError, parse_config
from proxy.upkeep.retention_plan import (
    RangeFacts,
    RetentionConfig,
    TrimPlan,
    plan_trim,
    retention_config,
)

NOW = 1_700_000_000_000


def _ranges(*spec: tuple[int, int]) -> list[RangeFacts]:
    """Contiguous ranges of 10 offsets from 100 on, each (size, age in ms)."""
    return [
        RangeFacts(100 + 10 * n, 110 + 10 * n, size, NOW - age)
        for n, (size, age) in enumerate(spec)
    ]


def test_retention_ms_drops_the_expired_prefix_and_stops_at_the_first_kept_range():
    ranges = _ranges((5, 5000), (5, 4000), (5, 1000), (5, 9000))  # the last: late timestamps
    plan = plan_trim(ranges, NOW, RetentionConfig(retention_ms=3000))
    assert plan == TrimPlan(dropped=2, by_time=2, log_start_offset=120)
    assert plan.by_size == 0


def test_a_range_exactly_retention_ms_old_is_kept_as_in_kafka():
    ranges = _ranges((5, 3000), (5, 3001))
    assert plan_trim(ranges, NOW, RetentionConfig(retention_ms=3000)).dropped == 0
    assert plan_trim(ranges, NOW, RetentionConfig(retention_ms=2999)).dropped == 2


def test_every_range_may_go_the_log_start_is_then_the_committed_end():
    ranges = _ranges((5, 10_000), (5, 9_000))
    assert plan_trim(ranges, NOW, RetentionConfig(retention_ms=0)).log_start_offset == 120


def test_retention_bytes_drops_oldest_while_the_rest_stays_at_least_the_limit():
    ranges = _ranges((100, 0), (50, 0), (30, 0), (20, 0))  # 200 bytes in all
    assert plan_trim(ranges, NOW, RetentionConfig(retention_bytes=50)) == TrimPlan(2, 0, 120)
    assert plan_trim(ranges, NOW, RetentionConfig(retention_bytes=20)) == TrimPlan(3, 0, 130)
    # exactly the limit left: it goes (Kafka: size - segment >= retention.bytes)
    assert plan_trim(ranges, NOW, RetentionConfig(retention_bytes=100)).dropped == 1
    assert plan_trim(ranges, NOW, RetentionConfig(retention_bytes=101)).dropped == 0
    assert plan_trim(ranges, NOW, RetentionConfig(retention_bytes=200)).dropped == 0
    assert plan_trim(ranges, NOW, RetentionConfig(retention_bytes=0)).dropped == 4


def test_size_counts_what_time_left_and_both_add_up():
    ranges = _ranges((100, 9000), (50, 9000), (30, 0), (20, 0))
    plan = plan_trim(ranges, NOW, RetentionConfig(retention_ms=5000, retention_bytes=20))
    assert plan == TrimPlan(dropped=3, by_time=2, log_start_offset=130)
    assert plan.by_size == 1


def test_migrated_ranges_below_the_cutover_and_uploaded_ones_are_one_log():
    # offload objects [0, 40) and [60, 100) (Kafka alone holds [40, 60): no unit here),
    # cutover 100, uploads [100, 110) and [110, 120); oldest first across all of them
    ranges = [
        RangeFacts(0, 40, 100, NOW - 9000),
        RangeFacts(60, 100, 100, NOW - 8000),
        RangeFacts(100, 110, 10, NOW - 7000),
        RangeFacts(110, 120, 10, NOW),
    ]
    by_time = RetentionConfig(retention_ms=8500)
    assert plan_trim(ranges, NOW, by_time) == TrimPlan(1, 1, 40)  # below the cutover
    assert plan_trim(ranges, NOW, RetentionConfig(retention_ms=7500)).log_start_offset == 100
    # retention.bytes counts the migrated bytes too: 220 in all
    assert plan_trim(ranges, NOW, RetentionConfig(retention_bytes=120)) == TrimPlan(1, 0, 40)
    assert plan_trim(ranges, NOW, RetentionConfig(retention_bytes=20)) == TrimPlan(2, 0, 100)
    assert plan_trim(ranges, NOW, RetentionConfig(retention_bytes=10)) == TrimPlan(3, 0, 110)


def test_unlimited_and_compact_only_topics_drop_nothing():
    ranges = _ranges((100, 10**9), (50, 10**9))
    assert plan_trim(ranges, NOW, RetentionConfig()) == TrimPlan(0, 0, None)
    compact = RetentionConfig(retention_ms=1, retention_bytes=0, delete=False)
    assert plan_trim(ranges, NOW, compact).dropped == 0
    assert plan_trim([], NOW, RetentionConfig(retention_ms=0)) == TrimPlan(0, 0, None)


def test_ranges_out_of_order_are_misuse():
    with pytest.raises(ValueError, match="overlap or are out of order"):
        plan_trim(list(reversed(_ranges((1, 0), (1, 0)))), NOW, RetentionConfig(retention_ms=0))
    with pytest.raises(ValueError, match="start < end"):
        RangeFacts(5, 5, 1, NOW)


@given(
    st.lists(st.tuples(st.integers(1, 1000), st.integers(0, 10_000)), max_size=12),
    st.integers(-1, 12_000),
    st.integers(-1, 6000),
)
def test_a_plan_drops_a_prefix_and_keeps_kafkas_invariants(spec, retention_ms, retention_bytes):
    ranges = _ranges(*spec)
    config = RetentionConfig(retention_ms=retention_ms, retention_bytes=retention_bytes)
    plan = plan_trim(ranges, NOW, config)
    kept = ranges[plan.dropped :]
    assert 0 <= plan.by_time <= plan.dropped <= len(ranges)
    assert (plan.log_start_offset is None) == (plan.dropped == 0)
    if plan.dropped:
        assert plan.log_start_offset == ranges[plan.dropped - 1].end_offset
    for r in ranges[: plan.by_time]:  # expired, each of them
        assert retention_ms >= 0 and NOW - r.max_timestamp > retention_ms
    if retention_ms >= 0 and plan.by_time < len(ranges):  # the first kept by time is not
        assert NOW - ranges[plan.by_time].max_timestamp <= retention_ms
    if retention_bytes >= 0 and plan.by_size:  # what is left is still at least the limit
        assert sum(r.size for r in kept) >= retention_bytes
    if retention_bytes >= 0 and kept:  # and one more would take it below
        assert sum(r.size for r in kept[1:]) < retention_bytes
    if retention_bytes < 0:
        assert plan.by_size == 0


def test_the_topic_config_as_describe_configs_answers_it():
    values = {"retention.ms": "604800000", "retention.bytes": "-1", "cleanup.policy": "delete"}
    assert retention_config(values) == RetentionConfig(604_800_000, -1, True)
    both = {"retention.ms": "10", "retention.bytes": "20", "cleanup.policy": "compact,delete"}
    assert retention_config(both) == RetentionConfig(10, 20, True)
    compact = retention_config({"retention.ms": "10", "cleanup.policy": "compact"})
    assert compact.unlimited and not compact.delete
    # missing or unreadable values keep the data
    assert retention_config({}).unlimited
    assert retention_config({"retention.ms": "soon", "retention.bytes": None}).unlimited


def test_the_config_keys_have_defaults_and_are_checked():
    base = {"upstream": {"bootstrap": "127.0.0.1:9092"}}
    config = parse_config({**base, "tiering": {}}).tiering
    assert (config.retention_check_interval_s, config.object_delete_grace_s) == (60.0, 60.0)
    tiering = {"retention_check_interval_s": 5, "object_delete_grace_s": 0}
    config = parse_config({**base, "tiering": tiering}).tiering
    assert (config.retention_check_interval_s, config.object_delete_grace_s) == (5.0, 0.0)
    with pytest.raises(ConfigError, match="tiering.retention_check_interval_s"):
        parse_config({**base, "tiering": {"retention_check_interval_s": 0}})
    with pytest.raises(ConfigError, match="tiering.object_delete_grace_s"):
        parse_config({**base, "tiering": {"object_delete_grace_s": -1}})
    with pytest.raises(ConfigError, match="tiering.object_delete_grace_s"):
        parse_config({**base, "tiering": {"object_delete_grace_s": "1m"}})
