"""External services named by environment variables, used instead of local processes.

TIERPROXY_TEST_BOOTSTRAP      an existing Kafka cluster's bootstrap servers
TIERPROXY_TEST_S3_ENDPOINT    an existing S3 endpoint, with
TIERPROXY_TEST_S3_ACCESS_KEY, TIERPROXY_TEST_S3_SECRET_KEY, TIERPROXY_TEST_S3_BUCKET
                              (bucket defaults to "tierproxy"; it must exist)
TIERPROXY_TEST_SERVICES       the description `python -m proxy.devstack.shared` wrote of
                              the Kafka and MinIO it runs for several test processes: both,
                              with every broker's id, port, rack and data directory
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SERVICES_ENV = "TIERPROXY_TEST_SERVICES"


@dataclass(frozen=True)
class ExternalNode:
    node_id: int
    port: int
    rack: str | None
    data_dir: Path
    controller_port: int
    extra_ports: dict[str, int] = field(default_factory=dict)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"


@dataclass(frozen=True)
class ExternalKafka:
    """A cluster this process did not start; `nodes` is known only from a services
    description (TIERPROXY_TEST_SERVICES), empty for a bare bootstrap address."""

    bootstrap: str
    nodes: tuple[ExternalNode, ...] = ()
    log_paths: tuple[Path, ...] = field(default=(), repr=False)

    def node(self, node_id: int) -> ExternalNode:
        for node in self.nodes:
            if node.node_id == node_id:
                return node
        raise KeyError(f"no broker {node_id} known of {self.bootstrap}")


@dataclass(frozen=True)
class ExternalS3:
    endpoint: str
    access_key: str
    secret_key: str
    bucket: str
    log_paths: tuple[Path, ...] = field(default=(), repr=False)

    def client_kwargs(self) -> dict[str, str]:
        return {
            "endpoint_url": self.endpoint,
            "aws_access_key_id": self.access_key,
            "aws_secret_access_key": self.secret_key,
            "region_name": os.environ.get("TIERPROXY_TEST_S3_REGION", "us-east-1"),
        }


def external_kafka() -> ExternalKafka | None:
    bootstrap = os.environ.get("TIERPROXY_TEST_BOOTSTRAP")
    if bootstrap:
        return ExternalKafka(bootstrap)
    services = _services()
    if services is None:
        return None
    kafka = services["kafka"]
    nodes = tuple(
        ExternalNode(
            node["node_id"],
            node["port"],
            node["rack"],
            Path(node["data_dir"]),
            node["controller_port"],
            dict(node["extra_ports"]),
        )
        for node in kafka["nodes"]
    )
    logs = tuple(Path(node["log_path"]) for node in kafka["nodes"])
    return ExternalKafka(kafka["bootstrap"], nodes, logs)


def external_s3() -> ExternalS3 | None:
    endpoint = os.environ.get("TIERPROXY_TEST_S3_ENDPOINT")
    if not endpoint:
        services = _services()
        if services is None:
            return None
        s3 = services["s3"]
        return ExternalS3(
            endpoint=s3["endpoint"],
            access_key=s3["access_key"],
            secret_key=s3["secret_key"],
            bucket=s3["bucket"],
            log_paths=(Path(s3["log_path"]),),
        )
    missing = [
        key
        for key in ("TIERPROXY_TEST_S3_ACCESS_KEY", "TIERPROXY_TEST_S3_SECRET_KEY")
        if not os.environ.get(key)
    ]
    if missing:
        raise RuntimeError(f"TIERPROXY_TEST_S3_ENDPOINT is set but {', '.join(missing)} is not")
    return ExternalS3(
        endpoint=endpoint,
        access_key=os.environ["TIERPROXY_TEST_S3_ACCESS_KEY"],
        secret_key=os.environ["TIERPROXY_TEST_S3_SECRET_KEY"],
        bucket=os.environ.get("TIERPROXY_TEST_S3_BUCKET", "tierproxy"),
    )


def _services() -> dict[str, Any] | None:
    path = os.environ.get(SERVICES_ENV)
    if not path:
        return None
    try:
        services: dict[str, Any] = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise RuntimeError(f"{SERVICES_ENV}={path}: not a services description ({exc})") from exc
    return services
