"""One Kafka cluster and one MinIO server for several test processes at once.

`python -m proxy.devstack.shared DESCRIPTION` starts the suite's session services (three
KRaft brokers with racks zone-a, zone-b and zone-c, and a MinIO with a bucket), writes
DESCRIPTION once they are ready, and stops them on SIGTERM, SIGINT or its parent's death.
scripts/test.sh runs it for the shared part's xdist workers, which read the description
named by TIERPROXY_TEST_SERVICES (`external.external_kafka`, `external.external_s3`).

The description is JSON: every broker's id, ports, rack, data directory and log file (some
tests read a broker's log directory, some check every port a broker listens on, a failing
test shows the logs' tails), MinIO's endpoint, keys, bucket and log file.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from proxy.devstack.kafka import KafkaCluster
from proxy.devstack.minio import MinioServer

ZONES = ("zone-a", "zone-b", "zone-c")
_PR_SET_PDEATHSIG = 1


def describe(kafka: KafkaCluster, minio: MinioServer) -> dict[str, Any]:
    return {
        "kafka": {
            "bootstrap": kafka.bootstrap,
            "nodes": [
                {
                    "node_id": node.node_id,
                    "port": node.port,
                    "controller_port": node.controller_port,
                    "extra_ports": node.extra_ports,
                    "rack": node.rack,
                    "data_dir": str(node.data_dir),
                    "log_path": str(node.process.log_path),
                }
                for node in kafka.nodes
            ],
        },
        "s3": {
            "endpoint": minio.endpoint,
            "access_key": minio.access_key,
            "secret_key": minio.secret_key,
            "bucket": minio.bucket,
            "log_path": str(minio.process.log_path),
        },
    }


def serve(description: Path) -> None:
    """Start both, write `description` (atomically: a reader sees all of it or nothing),
    and keep them until told to stop."""
    stopping: list[int] = []  # a flag the handler sets (an Event's lock is not reentrant)
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda signum, _: stopping.append(signum))
    # the parent (scripts/test.sh) killed without its trap running: stop all the same
    parent = os.getppid()
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent:  # it died before the call
        return
    with (
        KafkaCluster(size=len(ZONES), racks=list(ZONES), name="kafka-shared") as kafka,
        MinioServer(name="minio-shared") as minio,
    ):
        partial = description.with_name(description.name + ".partial")
        partial.write_text(json.dumps(describe(kafka, minio), indent=2))
        os.replace(partial, description)
        while not stopping:
            time.sleep(0.5)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m proxy.devstack.shared DESCRIPTION")
    serve(Path(sys.argv[1]))
