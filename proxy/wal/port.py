"""`Log`: the surface both write-ahead logs share, the local one (`log.WriteAheadLog`) and
the owner's log in the bucket (`s3log.S3WriteAheadLog`, `wal.mode: s3`).

The partitions and the uploader take a `Log`, so they cannot come to depend on what only
one of the two has; mypy checks that both still fit it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Protocol

from proxy.wal.fs import Buffer
from proxy.wal.segments import Segment
from proxy.wal.types import WalEntry, WalPosition, WalStats


class Log(Protocol):
    @property
    def log_start(self) -> int: ...

    @property
    def trimmed_to(self) -> int: ...

    @property
    def durable_end(self) -> int: ...

    @property
    def segments(self) -> tuple[Segment, ...]: ...

    @property
    def broken(self) -> BaseException | None: ...

    @property
    def stats(self) -> WalStats: ...

    async def append(
        self, stream_id: int, base_offset: int, batch: Buffer, reference: Buffer | None = None
    ) -> WalPosition: ...

    def submit(
        self, stream_id: int, base_offset: int, batch: Buffer, reference: Buffer | None = None
    ) -> asyncio.Future[WalPosition]: ...

    def withdraw(self, write: asyncio.Future[WalPosition]) -> bool: ...

    def next_full(self) -> asyncio.Future[None]: ...

    async def trim_to(self, offset: int) -> None: ...

    async def read(self, from_offset: int, max_bytes: int = ...) -> list[WalEntry]: ...

    def replay(self, max_bytes: int = ...) -> AsyncIterator[WalEntry]: ...

    async def close(self) -> None: ...
