"""The S3 object store, through aiobotocore: what production uses (MinIO in tests).

Every request goes through `S3Store._request`: one attempt per HTTP request, each bounded by
`request_timeout` on top of botocore's connect/read socket timeouts, retried with full-jitter
exponential backoff when the failure is transient (s3retry.classify), and counted by S3 API
and outcome. botocore's own retries are switched off so these are the only ones.
Its settings are `S3Config` (objects/s3config.py), the retry verdicts objects/s3retry.py.
Design notes: docs/object-store.md.
"""

from __future__ import annotations

import asyncio
import base64
import builtins  # `list` is a method of the store; annotations after it mean the type
import functools
import logging
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from contextlib import AsyncExitStack
from typing import Any, TypeVar

import crc32c
from aiobotocore.config import AioConfig
from aiobotocore.session import AioSession, get_session
from botocore.exceptions import ClientError

from proxy.objects.metrics import ObjectStoreMetrics
from proxy.objects.s3config import MAX_PARTS, S3Config
from proxy.objects.s3retry import NOT_FOUND, OK, DeleteErrors, backoff_delay, classify, error_code
from proxy.objects.store import (
    ObjectExists,
    ObjectInfo,
    ObjectNotFound,
    ObjectStoreError,
    Payload,
    check_key,
    check_range,
    check_tail_length,
    join_pieces,
    pieces_of,
)

T = TypeVar("T")
log = logging.getLogger(__name__)

PRECONDITION_FAILED = "PreconditionFailed"  # 412: `If-None-Match: *` met an object


def _s3_options(config: S3Config, endpoint_url: str | None, checksums: bool) -> dict[str, Any]:
    """botocore's S3 settings, for a client whose endpoint is `endpoint_url` (None: AWS's,
    https) and which sends checksums (`checksums`: botocore's
    `request_checksum_calculation` is not `when_required`).

    Then every PutObject carries the body's CRC-32C, computed here (`body_checksum`):
    botocore would otherwise compute a CRC-32 itself, in Python-driven 1 MiB steps, and,
    seeing a checksum header it did not make, would also hash the body for the signature
    over https. So the SHA-256 payload signature is set explicitly: off over https (what
    botocore does by default when it sends the checksum), on over http unless
    `sign_payload` says otherwise (S3Config). Without checksums (a store that refuses
    them) botocore's own rule stands."""
    options: dict[str, Any] = {"addressing_style": "path" if config.path_style else "auto"}
    sign = config.sign_payload
    if sign is None and checksums:
        sign = (endpoint_url or "https://").lower().startswith("http://")
    if sign is not None:
        options["payload_signing_enabled"] = sign
    return options


def body_checksum(pieces: Iterable[memoryview]) -> str:
    """The base64 of the big-endian CRC-32C of the pieces one after another, as S3's
    `x-amz-checksum-crc32c` header wants it (hardware CRC through the crc32c package)."""
    value = 0
    for piece in pieces:
        value = crc32c.crc32c(piece, value)
    return base64.b64encode(value.to_bytes(4, "big")).decode("ascii")


class S3Store:
    """An ObjectStore on one S3 bucket. `await S3Store.open(config)` or
    `async with S3Store(config) as store`; `close()` releases the HTTP connections."""

    def __init__(
        self,
        config: S3Config,
        *,
        metrics: ObjectStoreMetrics | None = None,
        rng: random.Random | None = None,
        session: AioSession | None = None,
    ) -> None:
        """`session`: an aiobotocore session to share (creating a client from a warm one
        skips loading botocore's S3 model again); `rng`: the backoff jitter's source."""
        self.config = config
        self._session = session
        self.metrics = metrics or ObjectStoreMetrics()
        self._rng = rng or random.Random()
        self._stack = AsyncExitStack()
        self._client: Any = None
        self._checksums = True  # each PutObject sends its body's CRC-32C (`start`)
        self._where = f"s3://{config.bucket}"

    @classmethod
    async def open(cls, config: S3Config, **kwargs: Any) -> S3Store:
        store = cls(config, **kwargs)
        await store.start()
        return store

    async def start(self) -> None:
        """Opens the client. The endpoint and the checksum setting botocore resolves (an
        `AWS_ENDPOINT_URL`, `AWS_REQUEST_CHECKSUM_CALCULATION`, its config file) decide the
        payload signature (`_s3_options`): a first guess from `config`, and the client made
        again when the resolved ones differ."""
        config = self.config
        options = _s3_options(config, config.endpoint_url, checksums=True)
        client = await self._open_client(options)
        meta = client.meta
        self._checksums = meta.config.request_checksum_calculation != "when_required"
        resolved = _s3_options(config, meta.endpoint_url, self._checksums)
        if resolved != options:
            await self._stack.aclose()
            self._stack = AsyncExitStack()
            client = await self._open_client(resolved)
        self._client = client

    async def _open_client(self, s3_options: dict[str, Any]) -> Any:
        config = self.config
        client_config = AioConfig(
            connect_timeout=config.connect_timeout,
            read_timeout=config.read_timeout,
            retries={"mode": "standard", "total_max_attempts": 1},  # ours are the retries
            max_pool_connections=config.max_pool_connections,
            s3=s3_options,
        )
        return await self._stack.enter_async_context(
            (self._session or get_session()).create_client(
                "s3",
                region_name=config.region,
                endpoint_url=config.endpoint_url,
                aws_access_key_id=config.access_key_id,
                aws_secret_access_key=config.secret_access_key,
                aws_session_token=config.session_token,
                config=client_config,
            )
        )

    async def close(self) -> None:
        self._client = None
        await self._stack.aclose()

    async def __aenter__(self) -> S3Store:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- the ObjectStore interface ---------------------------------------------------------

    async def put(self, key: str, data: Payload) -> None:
        await self._put(key, data, exclusive=False)

    async def create(self, key: str, data: Payload) -> None:
        """A PUT with `If-None-Match: *` (S3 since 2024, MinIO): 412 PreconditionFailed,
        ObjectExists here, when the key names an object. An attempt after one that timed
        out may meet that attempt's object: it is ours when it holds our bytes."""
        await self._put(key, data, exclusive=True)

    async def _put(self, key: str, data: Payload, *, exclusive: bool) -> None:
        check_key(key)
        pieces = pieces_of(data)
        total = sum(piece.nbytes for piece in pieces)
        if total > self.config.multipart_threshold:
            await self._put_multipart(key, pieces, total, exclusive)
            return
        body = join_pieces(pieces, 0, total)
        condition = {"IfNoneMatch": "*"} if exclusive else {}
        # S3 refuses the PUT if the body differs
        checksum = {"ChecksumCRC32C": body_checksum(pieces)} if self._checksums else {}
        tries = 0

        async def attempt() -> None:
            nonlocal tries
            tries += 1
            try:
                await self._s3().put_object(
                    Bucket=self.config.bucket,
                    Key=key,
                    Body=body,
                    **checksum,
                    **condition,
                )
            except ClientError as exc:
                if not exclusive or error_code(exc) != PRECONDITION_FAILED:
                    raise
                if tries == 1 or not await self._holds(key, body):
                    raise ObjectExists(key, f"{self._where} PutObject") from exc

        await self._request("PutObject", "create" if exclusive else "put", key, attempt)
        self.metrics.uploaded(total)

    async def get(self, key: str, start: int | None = None, end: int | None = None) -> bytes:
        check_key(key)
        start, end = check_range(start, end)
        if end is not None and end <= start:
            return b""
        if start == 0 and end is None:
            return await self._get(key, None)
        return await self._get(key, f"bytes={start}-{'' if end is None else end - 1}")

    async def get_tail(self, key: str, length: int) -> bytes:
        check_key(key)
        return await self._get(key, f"bytes=-{check_tail_length(length)}")

    async def size(self, key: str) -> int:
        check_key(key)
        call = functools.partial(self._s3().head_object, Bucket=self.config.bucket, Key=key)
        answer = await self._request("HeadObject", "head", key, call)
        return int(answer["ContentLength"])

    async def delete(self, keys: Iterable[str]) -> None:
        if isinstance(keys, str):
            raise TypeError("delete takes a list of keys, not one key")
        keys = [check_key(key) for key in keys]
        size = self.config.delete_batch_size
        for first in range(0, len(keys), size):
            await self._delete_batch(keys[first : first + size])

    async def list(self, prefix: str = "") -> AsyncIterator[ObjectInfo]:
        token = None
        while True:
            args = {
                "Bucket": self.config.bucket,
                "Prefix": prefix,
                "MaxKeys": self.config.list_page_size,
            }
            if token:
                args["ContinuationToken"] = token
            call = functools.partial(self._s3().list_objects_v2, **args)
            page = await self._request("ListObjectsV2", "list", prefix, call)
            for item in page.get("Contents", ()):
                modified = item.get("LastModified")
                stamp = modified.timestamp() if modified is not None else None
                yield ObjectInfo(item["Key"], int(item["Size"]), stamp)
            token = page.get("NextContinuationToken")
            if not page.get("IsTruncated") or not token:
                return

    # -- requests --------------------------------------------------------------------------

    def _s3(self) -> Any:
        if self._client is None:
            raise RuntimeError("S3Store is not started: use `await S3Store.open(config)`")
        return self._client

    async def _request(
        self, api: str, operation: str, key: str | None, call: Callable[[], Awaitable[T]]
    ) -> T:
        """One S3 request with timeouts, retries and counting. `call` makes one attempt."""
        config = self.config
        attempt = 0
        while True:
            attempt += 1
            began = time.monotonic()
            try:
                async with asyncio.timeout(config.request_timeout):
                    result = await call()
            except Exception as exc:
                verdict = classify(exc)
                if verdict is None:
                    raise  # a bug or a misuse, not a failure of S3
                self.metrics.request(api, verdict.outcome, time.monotonic() - began)
                if verdict is NOT_FOUND:
                    raise ObjectNotFound(key or "", operation) from exc
                if not verdict.retryable or attempt >= config.max_attempts:
                    cause = exc if str(exc) else f"{type(exc).__name__} ({verdict.outcome})"
                    raise ObjectStoreError(
                        key,
                        operation,
                        cause,
                        attempts=attempt,
                        retryable=verdict.retryable,
                        where=f"{self._where} {api}",
                    ) from exc
                delay = backoff_delay(attempt, config.backoff_base, config.backoff_cap, self._rng)
                log.debug("%s %r: %s, retry %d in %.3fs", api, key, verdict.outcome, attempt, delay)
                await asyncio.sleep(delay)
            else:
                self.metrics.request(api, OK.outcome, time.monotonic() - began)
                return result

    async def _get(self, key: str, byte_range: str | None) -> bytes:
        args = {"Bucket": self.config.bucket, "Key": key}
        if byte_range:
            args["Range"] = byte_range

        async def attempt() -> bytes:
            try:
                answer = await self._s3().get_object(**args)
            except ClientError as exc:
                if error_code(exc) == "InvalidRange":
                    return b""  # the range starts at or past the end (or the object is empty)
                raise
            async with answer["Body"] as body:
                return await body.read()

        data = await self._request("GetObject", "get", key, attempt)
        self.metrics.downloaded(len(data))
        return data

    async def _delete_batch(self, keys: builtins.list[str]) -> None:
        remaining = keys

        async def attempt() -> None:
            nonlocal remaining
            answer = await self._s3().delete_objects(
                Bucket=self.config.bucket,
                Delete={"Objects": [{"Key": key} for key in remaining], "Quiet": True},
            )
            errors = [
                (error.get("Key", ""), error.get("Code", ""), error.get("Message", ""))
                for error in answer.get("Errors", ())
            ]
            if errors:
                failed = {key for key, _code, _message in errors}
                remaining = [key for key in remaining if key in failed]  # retry only these
                raise DeleteErrors(errors)

        key = keys[0] if len(keys) == 1 else None
        await self._request("DeleteObjects", "delete", key, attempt)

    # -- multipart upload ------------------------------------------------------------------

    async def _put_multipart(
        self, key: str, pieces: builtins.list[memoryview], total: int, exclusive: bool = False
    ) -> None:
        config = self.config
        s3 = self._s3()
        part_size = max(config.part_size, -(-total // MAX_PARTS))
        create = functools.partial(s3.create_multipart_upload, Bucket=config.bucket, Key=key)
        upload_id = (await self._request("CreateMultipartUpload", "put", key, create))["UploadId"]
        slots = asyncio.Semaphore(config.part_concurrency)

        async def upload_part(number: int, start: int, stop: int) -> dict[str, Any]:
            async with slots:
                # The copy happens here, under the semaphore: at most part_concurrency
                # parts are in memory besides the caller's data.
                call = functools.partial(
                    s3.upload_part,
                    Bucket=config.bucket,
                    Key=key,
                    UploadId=upload_id,
                    PartNumber=number,
                    Body=join_pieces(pieces, start, stop),
                )
                answer = await self._request("UploadPart", "put", key, call)
                self.metrics.uploaded(stop - start)
                return {"PartNumber": number, "ETag": answer["ETag"]}

        try:
            tasks = [
                asyncio.create_task(upload_part(number, start, min(start + part_size, total)))
                for number, start in enumerate(range(0, total, part_size), start=1)
            ]
            try:
                parts = await asyncio.gather(*tasks)
            except BaseException:
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
                raise
            await self._complete(key, upload_id, parts, total, exclusive)
        except BaseException:
            await self._abort(key, upload_id)
            raise

    async def _complete(
        self,
        key: str,
        upload_id: str,
        parts: builtins.list[dict[str, Any]],
        total: int,
        exclusive: bool = False,
    ) -> None:
        tries = 0
        condition = {"IfNoneMatch": "*"} if exclusive else {}

        async def attempt() -> None:
            nonlocal tries
            tries += 1
            try:
                await self._s3().complete_multipart_upload(
                    Bucket=self.config.bucket,
                    Key=key,
                    UploadId=upload_id,
                    MultipartUpload={"Parts": parts},
                    **condition,
                )
            except ClientError as exc:
                # An earlier attempt timed out after S3 had completed the upload: the
                # upload is gone and the object is there.
                code = error_code(exc)
                if exclusive and code == PRECONDITION_FAILED and tries == 1:
                    raise ObjectExists(key, f"{self._where} CompleteMultipartUpload") from exc
                if tries == 1 or code not in ("NoSuchUpload", PRECONDITION_FAILED):
                    raise
                if not await self._has_size(key, total):
                    if code == PRECONDITION_FAILED:
                        raise ObjectExists(key, f"{self._where} CompleteMultipartUpload") from exc
                    raise

        await self._request("CompleteMultipartUpload", "put", key, attempt)

    async def _holds(self, key: str, body: bytes) -> bool:
        """Whether the object under `key` is `body` (False when it cannot be read)."""
        try:
            return await self.get(key) == body
        except ObjectStoreError:
            return False

    async def _has_size(self, key: str, size: int) -> bool:
        try:
            return await self.size(key) == size
        except ObjectStoreError:
            return False

    async def _abort(self, key: str, upload_id: str) -> None:
        """Best effort: a failed abort leaves parts that the bucket's lifecycle rule
        (AbortIncompleteMultipartUpload) removes; see docs/object-store.md."""
        call = functools.partial(
            self._s3().abort_multipart_upload,
            Bucket=self.config.bucket,
            Key=key,
            UploadId=upload_id,
        )
        try:
            await self._request("AbortMultipartUpload", "put", key, call)
        except ObjectStoreError as exc:
            cause = exc.cause
            if isinstance(cause, ClientError) and error_code(cause) == "NoSuchUpload":
                return  # already gone: completed after all, or aborted by an earlier attempt
            log.warning("multipart upload %s of %r not aborted: %s", upload_id, key, exc)
