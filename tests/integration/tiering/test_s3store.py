"""S3Store against a real MinIO: multipart uploads, batching, paging, request counters,
errors that must not be retried, and outages (a frozen server times out, a stopped one
refuses connections) that must be retried a bounded number of times.

The behaviour both stores share is in test_objectstore_contract.py.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import time
from contextlib import contextmanager

import pytest
from botocore.exceptions import (
    ClientError,
    ConnectTimeoutError,
    EndpointConnectionError,
    ReadTimeoutError,
)
from prometheus_client import CollectorRegistry, generate_latest

from proxy.devstack import MinioServer
from proxy.objects.metrics import ObjectStoreMetrics
from proxy.objects.s3 import S3Store, body_checksum
from proxy.objects.s3config import S3Config
from proxy.objects.s3retry import DeleteErrors, backoff_delay, classify
from proxy.objects.store import ObjectNotFound, ObjectStoreError

MiB = 1024 * 1024
PART = 5 * MiB  # S3's smallest part: multipart tests stay quick

minio = pytest.mark.minio


# -- integrity ---------------------------------------------------------------------------


@minio
@pytest.mark.parametrize("sign_payload", [None, False])
async def test_a_put_carries_its_crc32c_and_the_server_checks_it(
    s3_server, make_s3_store, key_prefix, sign_payload
):
    """Every PutObject sends the body's CRC-32C (objects/s3.py, `body_checksum`), signed
    payload or not (over http, `sign_payload` None signs it); the server keeps it, and
    refuses a body that does not match, so a damaged upload fails instead of being
    acknowledged."""
    store = await make_s3_store(s3_server, sign_payload=sign_payload)
    data = os.urandom(300_000)
    pieces = [memoryview(data)[:1000], memoryview(data)[1000:]]
    key = key_prefix + f"crc-{sign_payload}"
    await store.put(key, pieces)
    assert await store.get(key) == data
    head = await store._client.head_object(
        Bucket=store.config.bucket, Key=key, ChecksumMode="ENABLED"
    )
    assert head["ChecksumCRC32C"] == body_checksum([memoryview(data)])

    wrong = body_checksum([memoryview(data[:-1] + bytes([data[-1] ^ 1]))])
    with pytest.raises(ClientError) as refused:
        await store._client.put_object(
            Bucket=store.config.bucket, Key=key + "-bad", Body=data, ChecksumCRC32C=wrong
        )
    assert refused.value.response["Error"]["Code"] in ("BadDigest", "XAmzContentChecksumMismatch")
    with pytest.raises(ObjectNotFound):
        await store.get(key + "-bad")

    # parts carry botocore's own checksum, signed or not
    parted = await make_s3_store(
        s3_server, sign_payload=sign_payload, multipart_threshold=PART, part_size=PART
    )
    big = os.urandom(PART + 4321)
    await parted.put(key + "-parts", memoryview(big))
    assert parted.metrics.count("UploadPart") == 2
    assert await parted.get(key + "-parts") == big


@minio
async def test_the_endpoint_and_checksum_setting_botocore_resolves_decide(
    s3_server, make_s3_store, key_prefix, monkeypatch
):
    """`sign_payload` unset: an http endpoint given by AWS_ENDPOINT_URL (no endpoint_url in
    the config) signs the body as one in the config would; AWS_REQUEST_CHECKSUM_CALCULATION
    =when_required (a store that refuses checksums) sends none of ours."""
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_server.endpoint)
    store = await make_s3_store(s3_server, endpoint_url=None)
    assert store._client.meta.endpoint_url.startswith("http://")
    assert store._client.meta.config.s3["payload_signing_enabled"] is True
    await store.put(key_prefix + "env-endpoint", b"x" * 1000)
    assert await store.get(key_prefix + "env-endpoint") == b"x" * 1000

    monkeypatch.setenv("AWS_REQUEST_CHECKSUM_CALCULATION", "when_required")
    plain = await make_s3_store(s3_server)
    assert not plain._checksums
    assert "payload_signing_enabled" not in plain._client.meta.config.s3
    await plain.put(key_prefix + "no-checksum", b"y" * 1000)
    head = await plain._client.head_object(
        Bucket=plain.config.bucket, Key=key_prefix + "no-checksum", ChecksumMode="ENABLED"
    )
    assert "ChecksumCRC32C" not in head


# -- multipart -----------------------------------------------------------------------------


@minio
async def test_multipart_put_from_pieces_is_byte_exact(s3_server, make_s3_store, key_prefix):
    store = await make_s3_store(s3_server, multipart_threshold=PART, part_size=PART)
    data = os.urandom(2 * PART + 12_345)
    # piece boundaries that do not line up with part boundaries
    pieces = [data[:1_000], memoryview(data)[1_000 : PART + 7], bytearray(data[PART + 7 :])]
    key = key_prefix + "big"
    await store.put(key, pieces)

    assert store.metrics.count("CreateMultipartUpload") == 1
    assert store.metrics.count("UploadPart") == 3
    assert store.metrics.count("CompleteMultipartUpload") == 1
    assert store.metrics.count("PutObject") == 0
    assert await store.size(key) == len(data)
    assert await store.get(key) == data
    for start, end in [(PART - 10, PART + 10), (2 * PART - 1, 2 * PART + 1), (0, 3), (7, None)]:
        assert await store.get(key, start, end) == data[start:end]
    assert await store.get_tail(key, 40) == data[-40:]


@minio
async def test_objects_up_to_the_threshold_take_one_put(s3_server, make_s3_store, key_prefix):
    store = await make_s3_store(s3_server, multipart_threshold=PART, part_size=PART)
    data = os.urandom(PART)
    await store.put(key_prefix + "exactly-threshold", memoryview(data))
    assert store.metrics.count("PutObject") == 1
    assert store.metrics.count("CreateMultipartUpload") == 0
    assert await store.get(key_prefix + "exactly-threshold") == data


@minio
async def test_parts_upload_with_bounded_concurrency(
    s3_server, make_s3_store, key_prefix, monkeypatch
):
    store = await make_s3_store(
        s3_server, multipart_threshold=PART, part_size=PART, part_concurrency=2
    )
    real_upload_part = store._client.upload_part
    in_flight = peak = 0

    async def counting_upload_part(**kwargs):
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        try:
            return await real_upload_part(**kwargs)
        finally:
            in_flight -= 1

    monkeypatch.setattr(store._client, "upload_part", counting_upload_part)
    data = os.urandom(5 * PART)
    await store.put(key_prefix + "five-parts", data)
    assert store.metrics.count("UploadPart") == 5
    assert peak == 2
    assert await store.get(key_prefix + "five-parts") == data


async def _open_uploads(store, key):
    answer = await store._client.list_multipart_uploads(Bucket=store.config.bucket, Prefix=key)
    return answer.get("Uploads", [])


@minio
async def test_a_failed_part_aborts_the_upload(s3_server, make_s3_store, key_prefix, monkeypatch):
    store = await make_s3_store(s3_server, multipart_threshold=PART, part_size=PART, max_attempts=2)
    real_upload_part = store._client.upload_part

    async def third_part_fails(**kwargs):
        if kwargs["PartNumber"] == 3:
            raise ClientError(
                {
                    "Error": {"Code": "InternalError", "Message": "injected"},
                    "ResponseMetadata": {"HTTPStatusCode": 500},
                },
                "UploadPart",
            )
        return await real_upload_part(**kwargs)

    monkeypatch.setattr(store._client, "upload_part", third_part_fails)
    key = key_prefix + "doomed"
    with pytest.raises(ObjectStoreError) as caught:
        await store.put(key, os.urandom(3 * PART))

    error = caught.value
    assert (error.key, error.operation, error.attempts, error.retryable) == (key, "put", 2, True)
    assert "InternalError" in str(error) and "UploadPart" in str(error)
    assert store.metrics.count("UploadPart", "server_error") == 2  # retried once, then gave up
    assert store.metrics.count("AbortMultipartUpload") == 1
    assert store.metrics.count("CompleteMultipartUpload") == 0
    assert await _open_uploads(store, key) == []
    with pytest.raises(ObjectNotFound):
        await store.size(key)


@minio
async def test_a_cancelled_multipart_put_aborts_the_upload(
    s3_server, make_s3_store, key_prefix, monkeypatch
):
    store = await make_s3_store(
        s3_server, multipart_threshold=PART, part_size=PART, part_concurrency=1
    )
    real_upload_part = store._client.upload_part
    first_part_done = asyncio.Event()

    async def signalling_upload_part(**kwargs):
        answer = await real_upload_part(**kwargs)
        first_part_done.set()
        return answer

    monkeypatch.setattr(store._client, "upload_part", signalling_upload_part)
    key = key_prefix + "cancelled"
    put = asyncio.create_task(store.put(key, os.urandom(4 * PART)))
    await first_part_done.wait()
    put.cancel()
    with pytest.raises(asyncio.CancelledError):
        await put
    assert store.metrics.count("UploadPart") < 4
    assert store.metrics.count("AbortMultipartUpload") == 1
    assert await _open_uploads(store, key) == []
    with pytest.raises(ObjectNotFound):
        await store.size(key)


@minio
async def test_a_complete_whose_answer_was_lost_is_not_redone(
    s3_server, make_s3_store, key_prefix, monkeypatch
):
    """S3 completed the upload but the answer never came: the retry finds no upload, and
    the store checks the object is there instead of failing the put."""
    store = await make_s3_store(s3_server, multipart_threshold=PART, part_size=PART)
    real_complete = store._client.complete_multipart_upload

    async def answer_lost(**kwargs):
        monkeypatch.setattr(store._client, "complete_multipart_upload", real_complete)
        await real_complete(**kwargs)
        raise ReadTimeoutError(endpoint_url=s3_server.endpoint)

    monkeypatch.setattr(store._client, "complete_multipart_upload", answer_lost)
    data = os.urandom(2 * PART + 1)
    await store.put(key_prefix + "once", data)
    assert store.metrics.count("CompleteMultipartUpload", "timeout") == 1
    assert store.metrics.count("CompleteMultipartUpload", "ok") == 1
    assert store.metrics.count("AbortMultipartUpload") == 0
    assert await store.get(key_prefix + "once") == data


# -- batching, paging, counters ------------------------------------------------------------


@minio
async def test_delete_goes_in_batches(s3_server, make_s3_store, key_prefix):
    store = await make_s3_store(s3_server, delete_batch_size=10)
    keys = [f"{key_prefix}d/{n:02d}" for n in range(25)]
    await asyncio.gather(*(store.put(key, b"x") for key in keys))
    await store.delete(keys)
    assert store.metrics.count("DeleteObjects") == 3  # 10 + 10 + 5
    assert [info async for info in store.list(key_prefix)] == []


@minio
async def test_list_follows_pages(s3_server, make_s3_store, key_prefix):
    store = await make_s3_store(s3_server, list_page_size=3)
    keys = [f"{key_prefix}l/{n}" for n in range(7)]
    await asyncio.gather(*(store.put(key, b"y" * n) for n, key in enumerate(keys)))
    assert [(info.key, info.size) async for info in store.list(key_prefix)] == [
        (key, n) for n, key in enumerate(keys)
    ]
    assert store.metrics.count("ListObjectsV2") == 3  # 3 + 3 + 1


@minio
async def test_requests_are_counted_by_api_and_outcome(s3_server, make_s3_store, key_prefix):
    registry = CollectorRegistry()
    store = await make_s3_store(s3_server, metrics=ObjectStoreMetrics(registry))
    await store.put(key_prefix + "a", b"0123456789")
    await store.get(key_prefix + "a")
    await store.get(key_prefix + "a", 2, 4)
    await store.get_tail(key_prefix + "a", 3)
    await store.size(key_prefix + "a")
    with pytest.raises(ObjectNotFound):
        await store.get(key_prefix + "missing")
    assert [info.key async for info in store.list(key_prefix)] == [key_prefix + "a"]
    await store.delete([key_prefix + "a"])

    metrics = store.metrics
    assert metrics.count("PutObject") == 1
    assert metrics.count("GetObject") == 3
    assert metrics.count("GetObject", "not_found") == 1
    assert metrics.count("HeadObject") == 1
    assert metrics.count("ListObjectsV2") == 1
    assert metrics.count("DeleteObjects") == 1
    sample = registry.get_sample_value
    assert sample("tierproxy_object_store_bytes_total", {"direction": "out"}) == 10
    assert sample("tierproxy_object_store_bytes_total", {"direction": "in"}) == 10 + 2 + 3
    assert sample("tierproxy_object_store_request_seconds_count", {"api": "GetObject"}) == 4
    exposition = generate_latest(registry).decode()
    assert 'tierproxy_object_store_requests_total{api="PutObject",outcome="ok"} 1.0' in exposition


# -- errors that are not retried -----------------------------------------------------------


@minio
async def test_a_missing_bucket_fails_at_once(s3_server, make_s3_store, key_prefix):
    store = await make_s3_store(s3_server, bucket="no-such-bucket", max_attempts=5)
    with pytest.raises(ObjectStoreError) as caught:
        await store.put(key_prefix + "k", b"x")
    assert caught.value.attempts == 1 and not caught.value.retryable
    assert "NoSuchBucket" in str(caught.value) and "s3://no-such-bucket" in str(caught.value)
    assert store.metrics.count("PutObject", "client_error") == 1
    # HEAD answers a bare 404 that cannot tell a missing bucket from a missing key
    with pytest.raises(ObjectNotFound):
        await store.size(key_prefix + "k")


@minio
async def test_bad_credentials_fail_at_once(s3_server, make_s3_store, key_prefix):
    store = await make_s3_store(s3_server, secret_access_key="wrong-secret", max_attempts=5)
    with pytest.raises(ObjectStoreError) as caught:
        await store.get(key_prefix + "k")
    assert caught.value.attempts == 1 and not caught.value.retryable
    assert "SignatureDoesNotMatch" in str(caught.value)
    assert store.metrics.count("GetObject", "client_error") == 1


# -- outages -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def own_minio():
    """A MinIO of this module's own, so freezing and stopping it disturbs no other test."""
    if os.environ.get("TIERPROXY_TEST_S3_ENDPOINT"):  # a MinIO binary may not be there
        pytest.skip("outage tests freeze and stop the server: they need a local MinIO")
    with MinioServer(name="minio-outages") as server:
        yield server


@contextmanager
def frozen(server):
    """SIGSTOP: connections are still accepted by the kernel, but nothing answers."""
    server.process.signal(signal.SIGSTOP)
    try:
        yield
    finally:
        server.process.signal(signal.SIGCONT)


OUTAGE_TIMEOUTS = {"connect_timeout": 0.5, "read_timeout": 0.5, "request_timeout": 0.75}


@minio
async def test_a_frozen_server_fails_after_bounded_attempts(own_minio, make_s3_store, key_prefix):
    store = await make_s3_store(own_minio, max_attempts=3, **OUTAGE_TIMEOUTS)
    await store.put(key_prefix + "k", b"before")
    with frozen(own_minio):
        began = time.monotonic()
        with pytest.raises(ObjectStoreError) as caught:
            await store.get(key_prefix + "k")
        elapsed = time.monotonic() - began
    # 3 attempts of at most 0.75 s, plus 2 backoffs of at most 0.05 s and 0.1 s (+ slack
    # for a loaded machine): bounded, not hanging
    assert elapsed < 3 * 0.75 + 0.15 + 1.5
    assert caught.value.attempts == 3 and caught.value.retryable
    assert store.metrics.count("GetObject", "timeout") == 3
    assert store.metrics.count("GetObject", "ok") == 0


@minio
async def test_a_frozen_server_that_thaws_is_retried_to_success(
    own_minio, make_s3_store, key_prefix
):
    store = await make_s3_store(own_minio, max_attempts=10, backoff_cap=0.2, **OUTAGE_TIMEOUTS)
    await store.put(key_prefix + "k", b"still here")
    with frozen(own_minio):
        thaw = asyncio.get_running_loop().call_later(1.2, own_minio.process.signal, signal.SIGCONT)
        try:
            assert await store.get(key_prefix + "k") == b"still here"
        finally:
            thaw.cancel()
    assert store.metrics.count("GetObject", "timeout") >= 1
    assert store.metrics.count("GetObject", "ok") == 1


@minio
async def test_a_stopped_server_is_retried_until_it_is_back(own_minio, make_s3_store, key_prefix):
    store = await make_s3_store(own_minio, max_attempts=120, backoff_cap=0.25, **OUTAGE_TIMEOUTS)
    await asyncio.to_thread(own_minio.pause_service)
    try:

        async def resume_soon() -> None:
            await asyncio.sleep(0.5)
            await asyncio.to_thread(own_minio.resume_service, 20.0)

        resumed = asyncio.create_task(resume_soon())
        await store.put(key_prefix + "k", b"written through an outage")
        await resumed
    finally:
        if not own_minio.process.running():
            own_minio.resume_service()
    assert store.metrics.count("PutObject", "connection_error") >= 1
    assert store.metrics.count("PutObject", "ok") == 1
    assert await store.get(key_prefix + "k") == b"written through an outage"


@minio
async def test_a_stopped_server_fails_after_bounded_attempts(own_minio, make_s3_store, key_prefix):
    store = await make_s3_store(own_minio, max_attempts=3, **OUTAGE_TIMEOUTS)
    await asyncio.to_thread(own_minio.pause_service)
    try:
        with pytest.raises(ObjectStoreError) as caught:
            await store.size(key_prefix + "k")
    finally:
        await asyncio.to_thread(own_minio.resume_service)
    assert caught.value.attempts == 3 and caught.value.retryable
    assert caught.value.operation == "head"
    assert store.metrics.count("HeadObject", "connection_error") == 3


class ThrottlingServer:
    """An HTTP server that answers `503 SlowDown` to the first `throttle` requests and an
    empty 200 after: MinIO cannot be made to throttle on cue. Counts what it receives,
    which shows botocore adds no retries of its own."""

    BODY = b"<Error><Code>SlowDown</Code><Message>Reduce your request rate.</Message></Error>"

    def __init__(self, throttle: int) -> None:
        self.throttle = throttle
        self.requests = 0

    async def __aenter__(self) -> ThrottlingServer:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._server.close()
        await self._server.wait_closed()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # One request per connection. botocore sends `Expect: 100-continue` with a body:
        # the final answer goes back at once and the body is never sent.
        try:
            await reader.readuntil(b"\r\n\r\n")
            self.requests += 1
            if self.requests <= self.throttle:
                status, body = b"503 Slow Down", self.BODY
            else:
                status, body = b"200 OK", b""
            writer.write(
                b"HTTP/1.1 " + status + b"\r\nContent-Type: application/xml\r\n"
                b"Connection: close\r\nContent-Length: "
                + str(len(body)).encode()
                + b"\r\n\r\n"
                + body
            )
            await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


async def test_throttling_is_retried_by_the_store_alone(aio_session):
    async def put_through(throttle: int, max_attempts: int):
        async with ThrottlingServer(throttle) as server:
            config = S3Config(
                bucket="tierproxy",
                endpoint_url=server.endpoint,
                access_key_id="a",
                secret_access_key="b",
                path_style=True,
                max_attempts=max_attempts,
                backoff_base=0.01,
                connect_timeout=1.0,
                read_timeout=1.0,
                request_timeout=2.0,
            )
            async with S3Store(config, session=aio_session) as store:
                try:
                    await store.put("k", b"x")
                except ObjectStoreError as exc:
                    return store.metrics, server.requests, exc
                return store.metrics, server.requests, None

    metrics, requests, error = await put_through(throttle=2, max_attempts=3)
    assert error is None
    assert requests == 3
    assert metrics.count("PutObject", "throttled") == 2
    assert metrics.count("PutObject", "ok") == 1

    metrics, requests, error = await put_through(throttle=100, max_attempts=4)
    assert requests == 4  # botocore retried nothing on its own
    assert error is not None and error.attempts == 4 and error.retryable
    assert "SlowDown" in str(error)
    assert metrics.count("PutObject", "throttled") == 4


# -- the retry policy and the config, as pure logic -----------------------------------------


def _client_error(code: str, status: int) -> ClientError:
    return ClientError(
        {"Error": {"Code": code, "Message": ""}, "ResponseMetadata": {"HTTPStatusCode": status}},
        "GetObject",
    )


@pytest.mark.parametrize(
    ("error", "outcome", "retryable"),
    [
        (_client_error("NoSuchKey", 404), "not_found", False),
        (_client_error("404", 404), "not_found", False),
        (_client_error("SlowDown", 503), "throttled", True),
        (_client_error("TooManyRequests", 429), "throttled", True),
        (_client_error("InternalError", 500), "server_error", True),
        (_client_error("BadGateway", 502), "server_error", True),
        (_client_error("RequestTimeout", 400), "timeout", True),
        (_client_error("BadDigest", 400), "connection_error", True),
        (_client_error("XAmzContentChecksumMismatch", 400), "connection_error", True),
        (_client_error("InvalidDigest", 400), "client_error", False),
        (_client_error("AccessDenied", 403), "client_error", False),
        (_client_error("NoSuchBucket", 404), "client_error", False),
        (_client_error("InvalidAccessKeyId", 403), "client_error", False),
        (ConnectTimeoutError(endpoint_url="http://x"), "timeout", True),
        (TimeoutError(), "timeout", True),
        (EndpointConnectionError(endpoint_url="http://x"), "connection_error", True),
        (ConnectionResetError(), "connection_error", True),
        (DeleteErrors([("k", "InternalError", "")]), "server_error", True),
        (DeleteErrors([("k", "AccessDenied", ""), ("j", "SlowDown", "")]), "client_error", False),
    ],
)
def test_failures_are_classified(error, outcome, retryable):
    verdict = classify(error)
    assert (verdict.outcome, verdict.retryable) == (outcome, retryable)


def test_bugs_are_not_classified_as_store_failures():
    assert classify(TypeError("bad argument")) is None
    assert classify(KeyError("x")) is None


def test_backoff_is_full_jitter_under_a_growing_capped_window():
    rng = random.Random(7)
    for attempt, window in [(1, 0.1), (2, 0.2), (3, 0.4), (6, 3.2), (7, 5.0), (30, 5.0)]:
        delays = [backoff_delay(attempt, 0.1, 5.0, rng) for _ in range(500)]
        assert all(0 <= delay <= window for delay in delays)
        assert max(delays) > 0.9 * window  # the whole window is used, down to zero
        assert min(delays) < 0.1 * window


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"bucket": ""}, "bucket"),
        ({"part_size": 4 * MiB}, "part_size"),
        ({"multipart_threshold": 6 * MiB, "part_size": 8 * MiB}, "multipart_threshold"),
        ({"delete_batch_size": 1001}, "delete_batch_size"),
        ({"list_page_size": 5000}, "list_page_size"),
        ({"max_attempts": 0}, "max_attempts"),
        ({"request_timeout": 0}, "request_timeout"),
        ({"backoff_base": 2.0, "backoff_cap": 1.0}, "backoff_cap"),
    ],
)
def test_bad_config_is_refused_with_its_name(overrides, message):
    settings = {"bucket": "b", **overrides}
    with pytest.raises(ValueError, match=message):
        S3Config(**settings)


def test_secrets_stay_out_of_the_config_repr():
    assert "hunter2" not in repr(S3Config(bucket="b", secret_access_key="hunter2"))
