"""A fleet half way through a rolling upgrade: one proxy of this release, one of the
release before the hand-off's sequences trailer (docs/operations.md, "Upgrades";
docs/sequencer.md, "Rolling upgrades").

The older proxy is that release's code, taken from this repository's history with
`git archive` and run as its own `tierproxy run` process; real Kafka, MinIO, `notify: s3`.
Idempotent librdkafka producers write through each proxy to a topic whose partitions
both own, so batches are handed over in both directions. The older proxy refuses an
append with bytes after its payload and closes the connection ("22 trailing bytes after
a AppendRequest"): on the release that added the trailer without the protocol level, the
hand-offs to it failed until the producer gave up. Now every record is acknowledged once
and the older proxy refuses nothing.
"""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest
from tieredfleet import TieredFleet, produce_librdkafka

from proxy.devstack.paths import repo_root
from proxy.devstack.process import ManagedProcess

pytestmark = [pytest.mark.kafka, pytest.mark.minio, pytest.mark.timeout(300)]

# main before the sequences trailer was merged (peer protocol level 1)
PREVIOUS_RELEASE = "934627c"
RECORDS = 200
PARTITIONS = 4


def _previous_release(into) -> str:
    root = repo_root()
    assert shutil.which("git") is not None and (root / ".git").exists(), (
        "the mixed-release test needs git and the repository's history (a clone, not an"
        f" export) to take the previous release's code ({PREVIOUS_RELEASE})"
    )
    tree = into / "previous-release"
    tree.mkdir()
    archive = subprocess.run(
        ["git", "archive", PREVIOUS_RELEASE, "proxy"],
        cwd=root,
        capture_output=True,
        check=True,
        timeout=60,
    )
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive.stdout, check=True, timeout=60)
    return str(tree)


def test_hand_offs_between_this_release_and_the_previous_one(kafka_cluster, s3_server, tmp_path):
    tree = _previous_release(tmp_path)
    fleet = TieredFleet(kafka_cluster.bootstrap, s3_server, tmp_path)
    old = fleet["zone-b"]
    process = old.process
    env = {**os.environ, "PYTHONPATH": tree}
    old.process = ManagedProcess(process.name, process.argv, process.log_path, env=env, cwd=tree)
    try:
        fleet.start()
        fleet.wait_until_owned()
        topic, topic_id = fleet.tiered_spread_topic(PARTITIONS)
        owners = {fleet.stream_owner(topic_id, p) for p in range(PARTITIONS)}
        assert owners == {fleet["zone-a"].name, old.name}  # hand-offs both ways
        for zone in ("zone-a", "zone-b"):
            produced = produce_librdkafka(
                fleet[zone].bootstrap,
                topic,
                zone,
                f"{zone}-p",
                RECORDS,
                PARTITIONS,
                100,
                timeout_s=30,
            )
            assert produced.errors == [] and produced.fatal == []
            assert len(produced.acked) == RECORDS
            assert len(set(produced.acked.values())) == RECORDS  # each at an offset of its own
        assert "trailing bytes" not in old.log()
    finally:
        fleet.close()
