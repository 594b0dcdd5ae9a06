"""Reproducer of the consumer stuck after a `kill -9` (issue 18; docs/reliability.md,
"What the suite found"). Not part of the suite: pytest collects only `test_*.py`; run it by name:

    TIERPROXY_REPRO_CYCLES=40 [TIERPROXY_REPRO_REBOOTSTRAP=1] .venv/bin/python -m pytest \\
        tests/integration/faults/repro_consumer_stuck.py -q -s -p no:cacheprovider

`TIERPROXY_REPRO_REBOOTSTRAP=1` gives the consumer librdkafka's default re-bootstrap,
which the suite's consumers turn off (faultload.FleetConsumer): with it, the consumer
deadlocked in librdkafka (confluentinc/librdkafka#5476) at cycle 13 of the first run.

Both times the suite's consumer stopped for good, the proxy it reads through (zone-a) had
been killed again a few seconds after it came back, while the consumer was reconnecting.
This does that on purpose, in a loop: two proxies on the session's Kafka and a MinIO of
its own, the steady load (faultsteps.steady_load), then per cycle zone-a killed, started
again, killed once more 0.5-5 s after it listens, started again, and "recovered" (the
suite's, which examines a consumer still behind at the bound: a fresh consumer from its
positions and every thread's native stack). It stops at the first cycle that does not
recover, with the cycle's number in the failure.
"""

from __future__ import annotations

import os
import random
import time

import pytest
from cutover_load import LoadProducer
from faultchecks import TIERING, close_run
from faultload import Figures, FleetConsumer
from faultsteps import RECOVERY_BOUND_S, steady_load
from tieredfleet import TieredFleet

from proxy.devstack import MinioServer

pytestmark = [pytest.mark.faults, pytest.mark.timeout(7200)]


def test_consumer_reads_on_after_quick_second_kills(kafka_cluster, tmp_path):
    cycles = int(os.environ.get("TIERPROXY_REPRO_CYCLES", "20"))
    rng = random.Random(int(os.environ.get("TIERPROXY_FAULT_SEED", "0")))
    figures = Figures(seed=0)
    if os.environ.get("TIERPROXY_REPRO_REBOOTSTRAP") == "1":
        FleetConsumer.metadata_recovery = "rebootstrap"  # librdkafka's default
    minio = MinioServer(name="minio-repro", base_dir=tmp_path / "minio")
    fleet = None
    producers: list[LoadProducer] = []
    consumer = None
    try:
        minio.start()
        fleet = TieredFleet(kafka_cluster.bootstrap, minio, tmp_path, tiering=TIERING)
        fleet.start()
        fleet.wait_until_owned()
        _, injector = steady_load(fleet, 4, producers, tmp_path, figures)
        consumer = injector.consumer
        for cycle in range(cycles):
            victim = fleet["zone-a"]
            before = fleet.owners()
            injected = time.monotonic()
            fleet.kill("zone-a")
            fleet.start("zone-a")
            time.sleep(rng.uniform(0.5, 5.0))  # the moment of the second kill, not a wait
            fleet.kill("zone-a")
            fleet.start("zone-a")
            ended = time.monotonic()
            try:
                took = injector.recovered(
                    "kill -9 twice", injected, ended, RECOVERY_BOUND_S, victim.name, before
                )
            except AssertionError as exc:
                raise AssertionError(f"cycle {cycle}: {exc}") from None
            print(f"cycle {cycle}: recovered in {took:.1f} s", flush=True)
    finally:
        close_run([*producers, consumer], fleet, minio)
