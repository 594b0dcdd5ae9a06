"""`workers: 2`: one `tierproxy run` of two worker processes sharing the client ports, a
worker killed with -9 under load (docs/operations.md, "Every core of a host").

One proxy (zone-a) on the session's Kafka and MinIO, local WAL, `workers: 2`: its parent
starts two workers, each a fleet member of its own (`<name>/w0`, `<name>/w1`) with its own
WAL and shards, both on the same bootstrap and broker ports (SO_REUSEPORT). A topic whose
partitions fall in both workers' shards is tiered; a librdkafka producer (idempotent,
acks=all) writes through the shared port and a librdkafka consumer reads through it. Then
worker 1 is killed with -9: the parent starts it again (same name, same WAL), it recovers
its WAL and takes its shards back, and the clients carry on. Every acknowledged record
must be committed once, where its producer was told, and read once by the consumer.
"""

from __future__ import annotations

import os
import re
import signal
import sys
import time
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient
from test_tiered_faults import PARTITIONS, Load, check_committed
from tieredfleet import TieredFleet, TieredProxy, wait_for_log, wal_backlog

from proxy.devstack.paths import free_port_block
from tests.support.waiting import wait_for

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "faults"))
from faultload import FleetConsumer  # noqa: E402 - the fault suite's consumer

pytestmark = [pytest.mark.kafka, pytest.mark.minio, pytest.mark.timeout(180)]

WORKERS = 2
_STARTED = re.compile(rb"worker (\d+) started \(pid (\d+)\)")


class WorkersFleet(TieredFleet):
    """One proxy of `workers: 2`. Its peer ports are the fleet's (worker i: peer_port + i,
    so `tier()` reaches worker 0), the admin API on a block of its own (admin.port + i),
    no metrics port (the admin API serves /metrics)."""

    def __init__(self, *args, **kwargs) -> None:
        self.admin_base = free_port_block(WORKERS)
        super().__init__(*args, zones=("zone-a",), **kwargs)

    def _config(self, name: str, zone: str, base: int, wal_dir: Path) -> dict:
        config = super()._config(name, zone, base, wal_dir)
        config["workers"] = WORKERS
        config["metrics"] = {}
        config["admin"] = {"port": self.admin_base}
        return config

    @property
    def proxy(self) -> TieredProxy:
        return self["zone-a"]

    def worker_names(self) -> set[str]:
        return {f"{self.proxy.name}/w{i}" for i in range(WORKERS)}

    def pids(self) -> dict[int, int]:
        """worker -> the pid its latest start logged (the parent's log lines)."""
        return {
            int(i): int(pid)
            for i, pid in _STARTED.findall(self.proxy.process.log_path.read_bytes())
        }

    def wait_ready(self, index: int, after: int, timeout: float = 60.0) -> None:
        wait_for_log(self.proxy, f"worker {index} is ready", timeout, after=after)


def test_a_worker_killed_under_load_is_restarted_and_nothing_is_lost_or_repeated(
    kafka_cluster, s3_server, tmp_path
):
    began = time.monotonic()
    fleet = WorkersFleet(kafka_cluster.bootstrap, s3_server, tmp_path)
    try:
        _run(fleet, began)
    finally:
        fleet.close()


def _run(fleet: WorkersFleet, began: float) -> None:
    load = consumer = None
    try:
        fleet.start()  # "proxy ready at", from the parent once both workers are
        fleet.wait_until_owned(fleet.worker_names())
        # each new connection reaches either worker (the kernel's choice): all answer alike,
        # every broker at the shared port for it
        answers = {
            frozenset(
                (b.id, b.host, b.port) for b in admin.list_topics(timeout=10).brokers.values()
            )
            for admin in (
                AdminClient({"bootstrap.servers": fleet.proxy.bootstrap}) for _ in range(6)
            )
        }
        assert len(answers) == 1, answers
        assert {port - node for node, _, port in next(iter(answers))} == {fleet.proxy.base_port}
        # the partitions fall in both workers' shards: a produce reaching the worker that
        # does not own its partition is handed over to its sibling through the peer protocol
        topic, topic_id = fleet.tiered_spread_topic(PARTITIONS)
        # each worker's WAL in a directory of its own beneath the configured one
        assert sorted(p.name for p in fleet.proxy.wal_dir.iterdir() if p.is_dir()) == [
            f"worker-{i}" for i in range(WORKERS)
        ]

        consumer = FleetConsumer(
            fleet.proxy.bootstrap, topic, dict.fromkeys(range(PARTITIONS), 0), "zone-a"
        )
        consumer.start()
        load = Load(fleet, topic, rate=1000)
        wait_for(load.acked, lambda n: n > 3000, "the load under way")

        victim = fleet.pids()[1]
        mark = fleet.proxy.log_size()
        killed = time.monotonic()
        os.kill(victim, signal.SIGKILL)
        backlog = wal_backlog(fleet.proxy.wal_dir / "worker-1")  # its acks not yet uploaded
        wait_for(lambda: fleet.pids()[1], lambda pid: pid != victim, "worker 1 started again", 30)
        fleet.wait_ready(1, after=mark)
        fleet.wait_until_owned(fleet.worker_names(), timeout=30)
        back = time.monotonic()
        acked = load.acked()
        wait_for(load.acked, lambda n: n > acked + 3000, "the load going on after the restart")
        produced = load.finish()
        ends = {}
        for p in produced:
            for partition, offset in p.acked.values():
                ends[partition] = max(ends.get(partition, 0), offset + 1)
        wait_for(lambda: consumer.caught_up(ends), bool, "the consumer at the end", 30)
        consumer.stop()
        parent = fleet.proxy.process
        assert parent.pid is not None
        os.kill(parent.pid, signal.SIGTERM)  # the parent only: it stops its workers
        wait_for(parent.returncode, lambda code: code is not None, "the parent's exit", 60)
        assert parent.returncode() == 0, parent.tail(30)
    finally:
        if load is not None:
            load.stop()
        if consumer is not None:
            consumer.stop()
        fleet.stop()
    total = check_committed(fleet.committed(topic_id, PARTITIONS), produced, exact=True)
    acked = {value: at for p in produced for value, at in p.acked.items()}
    read = [
        (value, (partition, offset))
        for partition, records in consumer.records.items()
        for offset, value in records
    ]
    values = [value for value, _ in read]
    assert len(values) == len(set(values)), "the consumer read a record twice"
    assert dict(read) == acked, "the consumer did not read exactly what was acknowledged"
    print(
        f"\nworker 1 (pid {victim}) killed with {backlog} WAL bytes not uploaded; started "
        f"again and owning its shards after "
        f"{back - killed:.1f} s; {total} records committed and read once; "
        f"test {time.monotonic() - began:.1f} s"
    )
