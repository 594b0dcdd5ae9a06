"""The S3 object store's settings (`S3Config`) and the limits S3 sets on requests.

Pure: no I/O, no asyncio; the store itself (aiobotocore) is objects/s3.py, so reading a
configuration imports no S3 client.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

MiB = 1024 * 1024
MIN_PART_SIZE = 5 * MiB  # S3 refuses smaller parts, except the last
MAX_PARTS = 10_000
MAX_DELETE_BATCH = 1000  # DeleteObjects' limit


@dataclass(frozen=True)
class S3Config:
    bucket: str
    endpoint_url: str | None = None  # None: AWS's endpoint for the region
    region: str = "us-east-1"
    access_key_id: str | None = None  # None: botocore's default credential chain
    secret_access_key: str | None = field(default=None, repr=False)
    session_token: str | None = field(default=None, repr=False)
    path_style: bool = False  # http://host/bucket/key, as MinIO usually wants
    # SHA-256 of each request body in its signature. None: only over http (botocore's rule:
    # over https the body's CRC-32C, which S3 checks, and TLS protect it). False over http
    # spares the proxy and the server hashing every byte (half the proxy's CPU of a PUT:
    # docs/benchmarks.md, "S3 PUTs") where the network is trusted: the CRC-32C still
    # catches damage, not a forger on the path
    sign_payload: bool | None = None
    multipart_threshold: int = 16 * MiB  # objects larger than this upload in parts
    part_size: int = 8 * MiB
    part_concurrency: int = 4  # parts in flight per multipart upload
    delete_batch_size: int = MAX_DELETE_BATCH
    list_page_size: int = 1000  # keys per ListObjectsV2 request (S3 returns at most 1000)
    connect_timeout: float = 3.0  # seconds to open a connection
    read_timeout: float = 10.0  # seconds without a byte from the server
    request_timeout: float = 30.0  # seconds for one whole attempt, body included
    max_attempts: int = 5  # per request, the first included
    backoff_base: float = 0.1  # seconds; the cap of the first retry's jitter window
    backoff_cap: float = 5.0
    max_pool_connections: int = 32

    def __post_init__(self) -> None:
        def refuse(name: str, reason: str) -> None:
            raise ValueError(f"S3 config {name}={getattr(self, name)!r}: {reason}")

        if not self.bucket:
            refuse("bucket", "must be set")
        for spec in fields(self):
            value = getattr(self, spec.name)
            if isinstance(value, int | float) and not isinstance(value, bool) and value <= 0:
                refuse(spec.name, "must be positive")
        if self.part_size < MIN_PART_SIZE:
            refuse("part_size", f"S3 parts are at least {MIN_PART_SIZE} bytes")
        if self.multipart_threshold < self.part_size:
            refuse("multipart_threshold", f"must be at least part_size ({self.part_size})")
        if self.list_page_size > 1000:
            refuse("list_page_size", "ListObjectsV2 returns at most 1000 keys")
        if self.delete_batch_size > MAX_DELETE_BATCH:
            refuse("delete_batch_size", f"DeleteObjects takes at most {MAX_DELETE_BATCH} keys")
        if self.backoff_cap < self.backoff_base:
            refuse("backoff_cap", f"must be at least backoff_base ({self.backoff_base})")
