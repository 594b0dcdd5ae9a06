"""Object stores for the tiering integration tests: S3Store on the session's MinIO (or the
external S3 named by TIERPROXY_TEST_S3_ENDPOINT) and LocalDirectoryStore on a temp dir.

Every test writes under a prefix of its own in the shared bucket, removed afterwards.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from aiobotocore.session import AioSession, get_session

from proxy.objects.s3 import S3Config, S3Store


def s3_config_for(server: Any, **overrides: Any) -> S3Config:
    """An S3Config for a MinioServer or an ExternalS3, with short timeouts for tests."""
    kwargs = server.client_kwargs()
    settings: dict[str, Any] = {
        "bucket": server.bucket,
        "endpoint_url": kwargs["endpoint_url"],
        "region": kwargs["region_name"],
        "access_key_id": kwargs["aws_access_key_id"],
        "secret_access_key": kwargs["aws_secret_access_key"],
        "path_style": True,
        "connect_timeout": 2.0,
        "read_timeout": 5.0,
        "request_timeout": 10.0,
        "max_attempts": 3,
        "backoff_base": 0.05,
        "backoff_cap": 0.5,
    }
    settings.update(overrides)
    return S3Config(**settings)


@pytest.fixture(scope="session")
def aio_session() -> AioSession:
    """One aiobotocore session for all tests: a client from a warm session starts in
    milliseconds instead of reloading botocore's S3 model."""
    return get_session()


@pytest.fixture
def key_prefix() -> str:
    return f"tests/{uuid.uuid4().hex}/"


MakeS3Store = Callable[..., Awaitable[S3Store]]


@pytest.fixture
async def make_s3_store(key_prefix, aio_session) -> AsyncIterator[MakeS3Store]:
    """`await make_s3_store(server, **config_overrides)`: an open S3Store on that server
    (`s3_server` or a test's own MinIO), closed after the test; the objects the test wrote
    under `key_prefix` are deleted then, while the server still runs."""
    stores: list[S3Store] = []
    servers: list[Any] = []

    async def make(server: Any, **overrides: Any) -> S3Store:
        metrics = overrides.pop("metrics", None)
        store = await S3Store.open(
            s3_config_for(server, **overrides), metrics=metrics, session=aio_session
        )
        stores.append(store)
        if server not in servers:
            servers.append(server)
        return store

    try:
        yield make
    finally:
        for store in stores:
            await store.close()
        for server in servers:
            async with S3Store(s3_config_for(server), session=aio_session) as cleaner:
                await cleaner.delete([info.key async for info in cleaner.list(key_prefix)])
