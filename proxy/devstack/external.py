"""External services named by environment variables, used instead of local processes.

TIERPROXY_TEST_BOOTSTRAP      an existing Kafka cluster's bootstrap servers
TIERPROXY_TEST_S3_ENDPOINT    an existing S3 endpoint, with
TIERPROXY_TEST_S3_ACCESS_KEY, TIERPROXY_TEST_S3_SECRET_KEY, TIERPROXY_TEST_S3_BUCKET
                              (bucket defaults to "tierproxy"; it must exist)
"""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class ExternalKafka:
    bootstrap: str


@dataclass(frozen=True)
class ExternalS3:
    endpoint: str
    access_key: str
    secret_key: str
    bucket: str

    def client_kwargs(self) -> dict[str, str]:
        return {
            "endpoint_url": self.endpoint,
            "aws_access_key_id": self.access_key,
            "aws_secret_access_key": self.secret_key,
            "region_name": os.environ.get("TIERPROXY_TEST_S3_REGION", "us-east-1"),
        }


def external_kafka() -> ExternalKafka | None:
    bootstrap = os.environ.get("TIERPROXY_TEST_BOOTSTRAP")
    return ExternalKafka(bootstrap) if bootstrap else None


def external_s3() -> ExternalS3 | None:
    endpoint = os.environ.get("TIERPROXY_TEST_S3_ENDPOINT")
    if not endpoint:
        return None
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
