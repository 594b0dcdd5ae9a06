"""The object store interface: what the tiering code asks of S3 or of a local directory.

Two implementations hold to one contract (tests/integration/tiering/test_objectstore_contract.py):
`LocalDirectoryStore` (proxy/objects/local.py), the embedded default, and `S3Store`
(proxy/objects/s3.py). Design notes: docs/object-store.md.

Keys are chosen by the caller and checked by `check_key` in both stores, so a key one store
accepts the other accepts too.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

MAX_KEY_BYTES = 1024  # S3's limit on a key's UTF-8 length

# What `put` accepts: one buffer, or the pieces of one object in order (written as one
# object without being joined first where the store can avoid it).
Payload = bytes | bytearray | memoryview | Sequence[bytes | bytearray | memoryview]


class ObjectStoreError(Exception):
    """An operation on the store failed. Carries the key (None for a multi-key operation
    that failed as a whole), the operation, the cause, and whether retrying later may help
    (the store has already retried transient errors `attempts` times). `where` names the
    store and request for the message, e.g. `s3://bucket UploadPart`."""

    def __init__(
        self,
        key: str | None,
        operation: str,
        cause: BaseException | str,
        *,
        attempts: int = 1,
        retryable: bool = False,
        where: str | None = None,
    ) -> None:
        self.key = key
        self.operation = operation
        self.cause = cause
        self.attempts = attempts
        self.retryable = retryable
        what = f" of {key!r}" if key is not None else ""
        place = f" ({where})" if where else ""
        tries = f" after {attempts} attempts" if attempts > 1 else ""
        super().__init__(f"object store {operation}{what}{place} failed{tries}: {_describe(cause)}")


class ObjectNotFound(ObjectStoreError):
    """The key names no object."""

    def __init__(self, key: str, operation: str = "get") -> None:
        super().__init__(key, operation, "no such key")


class ObjectExists(ObjectStoreError):
    """`create` found an object under the key already (S3: 412 PreconditionFailed)."""

    def __init__(self, key: str, where: str | None = None) -> None:
        super().__init__(key, "create", "an object exists under this key", where=where)


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    """One listed object. `last_modified` (seconds since the epoch, the store's clock) is
    what the orphan sweep judges age by; it is left out of comparisons, so a listing
    compares by key and size."""

    key: str
    size: int
    last_modified: float | None = field(default=None, compare=False)


@runtime_checkable
class ObjectStore(Protocol):
    """An async object store. Every method may raise ObjectStoreError; reads of a missing
    key raise ObjectNotFound. Invalid arguments (a bad key, a bad range) raise ValueError
    before any I/O."""

    async def put(self, key: str, data: Payload) -> None:
        """Store `data` under `key`, replacing any object there. All or nothing: a reader
        sees the old object or the new one, never part of one."""
        ...

    async def create(self, key: str, data: Payload) -> None:
        """Store `data` under `key` only if no object is there, atomically (S3: a PUT with
        `If-None-Match: *`; the local store: a hard link, which never replaces a file);
        ObjectExists otherwise. For keys two writers could race on: a late write of a
        dead writer fails instead of replacing what a live one wrote (docs/object-store.md,
        "Exclusive creates"). A retried attempt that meets its own earlier attempt's
        object (same bytes) succeeds."""
        ...

    async def get(self, key: str, start: int | None = None, end: int | None = None) -> bytes:
        """Bytes [start, end) of the object, clipped to its size like a slice: `end` past
        the end reads to the end, `start` at or past the end reads b"". An empty range
        (end <= start) returns b"" without a request."""
        ...

    async def get_tail(self, key: str, length: int) -> bytes:
        """The last `length` bytes (the whole object if it is shorter), in one request:
        what a reader needs to find an object's footer without knowing its size."""
        ...

    async def size(self, key: str) -> int:
        """The object's size in bytes (HEAD)."""
        ...

    async def delete(self, keys: Iterable[str]) -> None:
        """Delete these objects; missing keys are not an error (deletes are idempotent)."""
        ...

    def list(self, prefix: str = "") -> AsyncIterator[ObjectInfo]:
        """The objects whose key starts with `prefix`, in key order (UTF-8 byte order)."""
        ...

    async def close(self) -> None: ...


def check_key(key: str) -> str:
    """Refuse keys that could escape a directory or mean different things to the two
    stores: empty, absolute, with empty, `.` or `..` segments, with a segment starting
    with `.` (reserved for the local store's temporary files), NUL, or over 1024 bytes."""
    if not isinstance(key, str):
        raise TypeError(f"object key must be str, not {type(key).__name__}")
    reason = _key_problem(key)
    if reason:
        raise ValueError(f"invalid object key {key!r}: {reason}")
    return key


def _key_problem(key: str) -> str | None:
    if not key:
        return "empty"
    if len(key.encode("utf-8", "surrogatepass")) > MAX_KEY_BYTES:
        return f"longer than {MAX_KEY_BYTES} bytes"
    if "\x00" in key:
        return "contains NUL"
    if key.startswith("/"):
        return "absolute"
    for segment in key.split("/"):
        if segment == "":
            return "has an empty segment"
        if segment in (".", ".."):
            return f"has a {segment!r} segment"
        if segment.startswith("."):
            return "has a segment starting with '.'"
    return None


def check_range(start: int | None, end: int | None) -> tuple[int, int | None]:
    """Validate a `get` range; returns (start, end) with start defaulted to 0."""
    start = 0 if start is None else start
    if start < 0:
        raise ValueError(f"range start {start} is negative (use get_tail for the last bytes)")
    if end is not None and end < 0:
        raise ValueError(f"range end {end} is negative")
    return start, end


def check_tail_length(length: int) -> int:
    if length <= 0:
        raise ValueError(f"tail length {length} must be positive")
    return length


def pieces_of(data: Payload) -> list[memoryview]:
    """The payload as a list of flat byte views, without copying."""
    if isinstance(data, bytes | bytearray | memoryview):
        items: Iterable[object] = (data,)
    elif isinstance(data, str):
        raise TypeError("object data must be bytes-like, not str")
    else:
        items = data
    views = []
    for item in items:
        if not isinstance(item, bytes | bytearray | memoryview):
            raise TypeError(f"object data piece must be bytes-like, not {type(item).__name__}")
        view = memoryview(item)
        if view.ndim != 1 or view.itemsize != 1:
            view = view.cast("B")
        views.append(view)
    return views


def _describe(cause: BaseException | str) -> str:
    if isinstance(cause, str):
        return cause
    text = str(cause)
    return f"{type(cause).__name__}: {text}" if text else type(cause).__name__
