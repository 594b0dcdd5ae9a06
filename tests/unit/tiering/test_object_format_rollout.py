"""Rolling out object format versions 2 and 3 (docs/operations.md, "Upgrades"): the setting
`tiering.object_format_version` is checked like the other tiering settings, reaches every
writer (the uploader, the compactor, the offload jobs), and what a writer set to 1 wrote
is read by this release: the objects' readers, the time index lookup, the compactor."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from test_compactor import SETTINGS, Fleet
from test_upload_plan import Wal, kafka_batch

from proxy.config import ConfigError, parse_config
from proxy.objects.format import (
    FORMAT_VERSION,
    INDEX_ENTRY_SIZE_V1,
    read_block,
    read_object,
)
from proxy.records.timestamp_search import candidate_blocks, in_batches
from proxy.tiered.uploads import uploader_config
from proxy.upkeep.compaction_plan import CompactionSettings
from proxy.upkeep.compactor import Compactor
from proxy.upload.plan import PlanLimits, build_object, plan_upload

BASE = {"upstream": {"bootstrap": "127.0.0.1:9092"}}


def tiering(**section):
    return parse_config({**BASE, "tiering": section}).tiering


def test_version_3_is_the_default_and_2_and_1_are_allowed():
    assert FORMAT_VERSION == 3
    assert tiering().object_format_version == 3
    assert tiering(object_format_version=2).object_format_version == 2
    assert tiering(object_format_version=1).object_format_version == 1


@pytest.mark.parametrize(
    ("value", "reason"),
    [(4, "not an object format version"), (0, "below the minimum"), ("2", "whole number")],
)
def test_other_versions_are_refused_naming_the_key(value, reason):
    with pytest.raises(ConfigError, match=reason) as caught:
        tiering(object_format_version=value)
    assert caught.value.key == "tiering.object_format_version"


def test_plan_limits_refuse_an_unknown_version():
    with pytest.raises(ValueError, match="format_version"):
        PlanLimits(format_version=4)
    with pytest.raises(ValueError, match="format_version"):
        CompactionSettings(format_version=0)


@pytest.mark.parametrize("version", [1, 2, 3])
def test_the_uploader_writes_the_configured_version_at_the_planned_size(version):
    config = uploader_config(tiering(object_format_version=version))
    assert config.object_format_version == version
    wal = Wal()
    for i in range(40):
        wal.append(10 + i % 3, kafka_batch(2, 30))
    limits = PlanLimits(2048, 2048, 512, config.limits.format_version)
    plan = plan_upload(wal.entries, limits)
    assert len(plan.objects) > 2  # sizes planned with the version's index entry size
    for n, planned in enumerate(plan.objects, start=1):
        built, uploaded = build_object(planned, n)
        data = built.to_bytes()
        assert len(data) == planned.size == uploaded.size  # exact, in either version
        footer, index = read_object(data, built.key)
        assert footer.version == version
        assert all((e.max_timestamp is None) == (version == 1) for e in index)


def test_an_uploaded_version_1_object_answers_timestamp_lookups():
    wal = Wal()
    for _ in range(5):
        wal.append(7, kafka_batch(3, 10))
    [planned] = plan_upload(wal.entries, PlanLimits(format_version=1)).objects
    built, _ = build_object(planned, 1)
    data = built.to_bytes()
    footer, index = read_object(data, built.key)
    assert footer.version == 1 and footer.index_size == len(index) * INDEX_ENTRY_SIZE_V1
    # no time index: every block is a candidate, and read to find the record
    target = 1_700_000_000_001
    assert candidate_blocks(index, target) == list(index)
    found = in_batches(read_block(data, index[0], built.key), target, 0)
    assert found is not None and (found.offset, found.timestamp) == (1, target)


@pytest.mark.parametrize(("sources", "written"), [(1, 1), (1, 2), (2, 1), (2, 3), (3, 2)])
async def test_the_compactor_reads_either_version_and_writes_the_configured_one(
    tmp_path, sources, written
):
    fleet = Fleet(tmp_path, 1)
    service = SimpleNamespace(
        config=tiering(object_format_version=written),
        store=fleet.store,
        block_cache=None,
        shard_owner=lambda k: None,
        readers={},
        registry=None,
        bandwidth=None,
    )
    made = Compactor.for_service(service, fleet.ids)
    assert made.settings.format_version == written
    await made.close()
    fleet.compactor.settings = CompactionSettings(
        small_object_bytes=SETTINGS.small_object_bytes,
        stream_object_bytes=SETTINGS.stream_object_bytes,
        min_objects=SETTINGS.min_objects,
        format_version=written,
    )
    try:
        for n in range(1, 5):
            await fleet.upload(n, version=sources)
        [result] = await fleet.compactor.run_once()
        assert result.replaced == (1, 2, 3, 4)
        [s] = fleet.streams
        [r] = fleet.owner.state.committed_ranges(s)
        data = await fleet.store.get(r.object_key)
        footer, index = read_object(data, r.object_key)
        assert footer.version == written
        blocks = b"".join(bytes(read_block(data, e, r.object_key)) for e in index)
        assert blocks == b"".join(fleet.batches[s])
    finally:
        await fleet.compactor.close()
        await fleet.store.close()
