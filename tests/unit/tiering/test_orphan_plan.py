"""The orphan sweep's decisions (proxy/upkeep/orphan_plan.py) and its config keys."""

from __future__ import annotations

import pytest

from proxy.config import ConfigError, parse_config
from proxy.handoff.objects import wal_object_key, writer_id_for, writer_prefix
from proxy.metadata.streams import OFFLOAD_ID_BIT
from proxy.objects.keys import ObjectKind, object_key
from proxy.objects.store import ObjectInfo
from proxy.upkeep.orphan_plan import (
    LIVE_WRITER_RETENTION_S,
    SweepLimits,
    commit_age_limit,
    plan_sweep,
    still_old,
    too_old_to_commit,
)

NOW = 1_800_000_000.0
LIMITS = SweepLimits(orphan_grace_s=100.0, offload_grace_s=1000.0, s3wal_retention_s=50.0)
NAMED = {1, OFFLOAD_ID_BIT | 1}


def info(key: str, age: float | None, size: int = 10) -> ObjectInfo:
    return ObjectInfo(key, size, None if age is None else NOW - age)


def plan(*infos: ObjectInfo):
    return plan_sweep(infos, NAMED.__contains__, NOW, LIMITS)


def test_unnamed_upload_and_compaction_objects_go_after_the_grace_only():
    old_set = info(object_key(2, ObjectKind.STREAM_SET), 100.0)
    old_stream = info(object_key(3, ObjectKind.STREAM), 5000.0)
    young = info(object_key(4, ObjectKind.STREAM_SET), 99.0)
    result = plan(old_set, old_stream, young)
    assert result.orphans == (old_set, old_stream)
    assert result.young == 1 and result.count == 2


def test_a_named_object_stays_however_old():
    result = plan(info(object_key(1, ObjectKind.STREAM_SET), 1e9))
    assert result.count == 0 and result.named == 1


def test_offload_objects_take_the_longer_grace():
    mid = info(object_key(OFFLOAD_ID_BIT | 2, ObjectKind.STREAM), 500.0)  # past the upload grace
    old = info(object_key(OFFLOAD_ID_BIT | 3, ObjectKind.STREAM), 1000.0)
    named = info(object_key(OFFLOAD_ID_BIT | 1, ObjectKind.STREAM), 1e9)
    result = plan(mid, old, named)
    assert result.offload_orphans == (old,) and result.orphans == ()
    assert result.young == 1 and result.named == 1


def test_s3wal_objects_go_after_their_retention():
    old = info(wal_object_key("proxy-a-1", 7), 50.0)
    young = info(wal_object_key("proxy-a-1", 8), 49.0)
    result = plan(old, young)
    assert result.s3wal == (old,) and result.young == 1


def test_a_live_writers_s3wal_objects_are_left_to_it_for_days():
    """An owner may hold a batch of one by reference (docs/wal.md) while it is down: the
    writer, alive, deletes the object once released; only past LIVE_WRITER_RETENTION_S
    does the sweep take it (a writer that lost count of it)."""
    live = writer_id_for("proxy-a", 1_000.0)
    assert live.startswith(writer_prefix("proxy-a", 1_000.0))
    kept = info(wal_object_key(live, 7), 5000.0)
    very_old = info(wal_object_key(live, 8), LIVE_WRITER_RETENTION_S)
    dead = info(wal_object_key(writer_id_for("proxy-a", 2_000.0), 9), 50.0)  # restarted
    prefixes = (writer_prefix("proxy-a", 1_000.0),)
    result = plan_sweep(
        (kept, very_old, dead), NAMED.__contains__, NOW, LIMITS, lambda w: w.startswith(prefixes)
    )
    assert result.s3wal == (very_old, dead) and result.young == 1


@pytest.mark.parametrize(
    "key",
    [
        "exports/part-0.parquet",  # not ours
        "wal/0000/not-a-sequence",  # under wal/ but no S3-WAL key
        "1234/stream-set/000000000000dcba",  # prefix does not match the id
        "tests/abc/" + object_key(2, ObjectKind.STREAM_SET),
    ],
)
def test_keys_of_neither_layout_are_never_touched(key):
    result = plan(info(key, 1e9))
    assert result.count == 0 and result.foreign == 1


def test_a_key_without_a_modification_time_is_left_alone():
    result = plan(info(object_key(2, ObjectKind.STREAM_SET), None))
    assert result.count == 0 and result.foreign == 1


def test_a_commit_is_refused_past_half_the_grace():
    assert commit_age_limit(3600.0) == 1800.0
    assert not too_old_to_commit(put_started=10.0, now=10.0 + 1800.0, grace_s=3600.0)
    assert too_old_to_commit(put_started=10.0, now=10.0 + 1800.1, grace_s=3600.0)
    # whatever passes the commit check is still half a grace from the sweep's judgement
    put, grace = 0.0, 100.0
    latest_commit = put + commit_age_limit(grace)
    assert latest_commit + grace / 2 <= put + grace


def test_an_offload_orphan_put_again_since_the_listing_is_not_deleted():
    first = info("k", 2000.0)
    assert still_old(first, info("k", 2000.0))
    assert not still_old(first, info("k", 1.0))  # a job ran again: a new PUT of the key
    assert not still_old(first, None)  # gone already


@pytest.mark.parametrize("value", [0, -1.0, True, "6h"])
def test_sweep_limits_refuse_what_is_not_a_positive_number(value):
    with pytest.raises(ValueError, match="tiering.orphan_grace_s"):
        SweepLimits(orphan_grace_s=value, offload_grace_s=1.0, s3wal_retention_s=1.0)


BASE = {"upstream": {"bootstrap": "127.0.0.1:9092"}}


def _tiering(**keys):
    return parse_config({**BASE, "tiering": keys}).tiering


def test_config_defaults_and_values():
    config = _tiering()
    assert config.orphan_grace_s == 6 * 3600.0
    assert config.offload_orphan_grace_s == 7 * 86400.0
    assert config.orphan_sweep_interval_s == 600.0 and config.s3wal_retention_s == 86400.0
    config = _tiering(orphan_grace_s=2, offload_orphan_grace_s=60, s3wal_retention_s=3)
    assert (config.orphan_grace_s, config.offload_orphan_grace_s) == (2.0, 60.0)
    assert config.s3wal_retention_s == 3.0


@pytest.mark.parametrize(
    ("keys", "key", "reason"),
    [
        ({"orphan_grace_s": 0}, "tiering.orphan_grace_s", "below the minimum"),
        ({"orphan_grace_s": 0.5}, "tiering.orphan_grace_s", "below the minimum 1.0"),
        ({"s3wal_retention_s": "1d"}, "tiering.s3wal_retention_s", "not a number"),
        ({"orphan_sweep_interval_s": -5}, "tiering.orphan_sweep_interval_s", "below"),
        (
            {"orphan_grace_s": 100, "offload_orphan_grace_s": 10},
            "tiering.offload_orphan_grace_s",
            "below orphan_grace_s",
        ),
    ],
)
def test_config_errors_name_the_key(keys, key, reason):
    with pytest.raises(ConfigError, match=reason) as error:
        _tiering(**keys)
    assert key in str(error.value)
