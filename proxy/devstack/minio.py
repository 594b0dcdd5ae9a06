"""MinIO, built from source at a pinned version, as the S3 server of tests and benchmarks."""

from __future__ import annotations

import os
import shutil
import tempfile
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import botocore.session
from botocore.config import Config

from proxy.devstack.paths import free_port, minio_binary
from proxy.devstack.process import ManagedProcess
from proxy.objects.s3config import S3Config

ACCESS_KEY = "tierproxy"
SECRET_KEY = "tierproxy-secret"  # a throwaway credential of a loopback-only test server


class MinioServer:
    """One MinIO server on a free loopback port with its own data dir and a bucket."""

    def __init__(
        self,
        bucket: str = "tierproxy",
        base_dir: Path | None = None,
        name: str = "minio",
        env: dict[str, str] | None = None,
    ) -> None:
        """`env`: more of MinIO's settings, e.g. MINIO_API_REQUESTS_MAX."""
        self.bucket = bucket
        self.port = free_port()
        self.console_port = free_port()
        self._owns_dir = base_dir is None
        self.base_dir = Path(base_dir or tempfile.mkdtemp(prefix=f"tierproxy-{name}-"))
        settings = dict(os.environ)
        settings.update(
            MINIO_ROOT_USER=ACCESS_KEY,
            MINIO_ROOT_PASSWORD=SECRET_KEY,
            MINIO_BROWSER="off",
            MINIO_UPDATE="off",
        )
        settings.update(env or {})
        self.process = ManagedProcess(
            name,
            [
                str(minio_binary()),
                "server",
                "--quiet",
                "--address",
                f"127.0.0.1:{self.port}",
                "--console-address",
                f"127.0.0.1:{self.console_port}",
                str(self.base_dir / "data"),
            ],
            log_path=self.base_dir / "minio.log",
            env=settings,
        )

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def access_key(self) -> str:
        return ACCESS_KEY

    @property
    def secret_key(self) -> str:
        return SECRET_KEY

    def s3_config(self, **overrides: Any) -> S3Config:
        """An S3Config for this server's bucket (path style, as MinIO wants), with
        `overrides` of its other settings."""
        settings: dict[str, Any] = {
            "bucket": self.bucket,
            "endpoint_url": self.endpoint,
            "access_key_id": ACCESS_KEY,
            "secret_access_key": SECRET_KEY,
            "path_style": True,
        }
        return S3Config(**(settings | overrides))

    def client_kwargs(self) -> dict[str, str]:
        """Keyword arguments for a botocore/aiobotocore `create_client("s3", ...)`."""
        return {
            "endpoint_url": self.endpoint,
            "aws_access_key_id": ACCESS_KEY,
            "aws_secret_access_key": SECRET_KEY,
            "region_name": "us-east-1",
        }

    def start(self, timeout: float = 60.0) -> MinioServer:
        try:
            self.process.start()
            self.wait_ready(timeout)
            self._create_bucket()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        self.process.stop()
        if self._owns_dir:
            shutil.rmtree(self.base_dir, ignore_errors=True)

    def pause_service(self) -> None:
        """Stop the server but keep its data, for outage tests; `resume_service` restarts it."""
        self.process.stop()

    def resume_service(self, timeout: float = 60.0) -> None:
        self.process.start()
        self.wait_ready(timeout)

    def __enter__(self) -> MinioServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def wait_ready(self, timeout: float = 60.0) -> None:
        def ready() -> None:  # HTTPError (an OSError) unless 200
            urllib.request.urlopen(f"{self.endpoint}/minio/health/ready", timeout=2).close()

        self.process.wait_ready(ready, timeout)

    def _create_bucket(self) -> None:
        client = botocore.session.get_session().create_client(
            "s3", config=Config(retries={"max_attempts": 3}), **self.client_kwargs()
        )
        try:
            client.create_bucket(Bucket=self.bucket)
        except client.exceptions.BucketAlreadyOwnedByYou:
            pass
        finally:
            client.close()
