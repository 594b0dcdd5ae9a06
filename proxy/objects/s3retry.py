"""Which S3 failures are worth retrying, and how long to wait before the next attempt.

Pure decisions over exceptions; the retry loop itself is in objects/s3.py.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import aiohttp
from botocore.exceptions import (
    ClientError,
    ConnectTimeoutError,
    HTTPClientError,
    IncompleteReadError,
    ReadTimeoutError,
    SSLError,
)
from botocore.exceptions import (
    ConnectionError as BotoConnectionError,
)

NOT_FOUND_CODES = frozenset({"NoSuchKey", "NotFound", "404"})
THROTTLE_CODES = frozenset(
    {
        "SlowDown",
        "Throttling",
        "ThrottlingException",
        "TooManyRequests",
        "RequestLimitExceeded",
        "ServiceUnavailable",
    }
)
TIMEOUT_CODES = frozenset({"RequestTimeout", "RequestTimeoutException"})
# ConditionalRequestConflict (409): another conditional write to the key was in flight;
# retried, the create then meets that write's object or none
SERVER_CODES = frozenset({"InternalError", "PriorRequestNotComplete", "ConditionalRequestConflict"})
# 400: the body the server got does not match the checksum sent with it (objects/s3.py
# sends every PUT's CRC-32C): damaged on its way, like a connection reset mid-body
DAMAGED_CODES = frozenset({"BadDigest", "XAmzContentChecksumMismatch"})


@dataclass(frozen=True, slots=True)
class Verdict:
    outcome: str  # the metric label: ok, not_found, throttled, timeout, server_error, ...
    retryable: bool


OK = Verdict("ok", False)
NOT_FOUND = Verdict("not_found", False)
THROTTLED = Verdict("throttled", True)
TIMEOUT = Verdict("timeout", True)
SERVER_ERROR = Verdict("server_error", True)
CONNECTION_ERROR = Verdict("connection_error", True)
CLIENT_ERROR = Verdict("client_error", False)


class DeleteErrors(Exception):
    """DeleteObjects answered 200 but could not delete some keys: (key, code, message)."""

    def __init__(self, errors: list[tuple[str, str, str]]) -> None:
        self.errors = errors
        key, code, message = errors[0]
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        super().__init__(f"{code} deleting {key!r}: {message}{more}")

    @property
    def retryable(self) -> bool:
        return all(_code_verdict(code, 200).retryable for _key, code, _message in self.errors)


def classify(exc: BaseException) -> Verdict | None:
    """The verdict on one failed attempt, or None for an exception that is not an S3 or
    network failure (a bug or a misuse), which the store lets through unchanged."""
    if isinstance(exc, ClientError):
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
        return _code_verdict(error_code(exc), status)
    if isinstance(exc, DeleteErrors):
        return SERVER_ERROR if exc.retryable else CLIENT_ERROR
    if isinstance(exc, ReadTimeoutError | ConnectTimeoutError | TimeoutError):
        return TIMEOUT
    if isinstance(exc, SSLError):
        return CLIENT_ERROR  # a certificate that does not verify will not start to
    if isinstance(exc, BotoConnectionError | HTTPClientError | IncompleteReadError):
        return CONNECTION_ERROR
    if isinstance(exc, aiohttp.ClientError | OSError):
        return CONNECTION_ERROR  # a body read that aiobotocore did not wrap
    if type(exc).__module__.startswith("botocore"):
        return CLIENT_ERROR  # credentials, parameter validation: retrying will not help
    return None


def error_code(error: ClientError) -> str:
    """S3's error code in a failed request's answer ("NoSuchKey", "PreconditionFailed")."""
    return str(error.response.get("Error", {}).get("Code", ""))


def _code_verdict(code: str, status: int) -> Verdict:
    if code in NOT_FOUND_CODES:
        return NOT_FOUND
    if code in THROTTLE_CODES or status in (429, 503):
        return THROTTLED
    if code in TIMEOUT_CODES:
        return TIMEOUT
    if code in SERVER_CODES or status >= 500:
        return SERVER_ERROR
    if code in DAMAGED_CODES:
        return CONNECTION_ERROR
    return CLIENT_ERROR  # AccessDenied, NoSuchBucket, InvalidAccessKeyId, ...


def backoff_delay(attempt: int, base: float, cap: float, rng: random.Random) -> float:
    """Full jitter: uniform in [0, min(cap, base * 2^(attempt-1))] after failed `attempt`
    (1-based). Spreads the retries of many clients hit by one outage instead of
    synchronising them."""
    return rng.uniform(0.0, min(cap, base * 2 ** (attempt - 1)))
