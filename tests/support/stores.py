"""Object stores as a test wraps them: the store under test behind a key prefix of the
test's own, since the MinIO bucket (and a local directory) may be shared."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable

from proxy.objects.store import ObjectInfo, Payload


class PrefixedStore:
    """`inner` seen through `prefix`: keys in and out are the test's own."""

    def __init__(self, inner, prefix: str) -> None:
        self.inner, self.prefix = inner, prefix

    async def put(self, key: str, data: Payload) -> None:
        await self.inner.put(self.prefix + key, data)

    async def create(self, key: str, data: Payload) -> None:
        await self.inner.create(self.prefix + key, data)

    async def get(self, key: str, start: int | None = None, end: int | None = None) -> bytes:
        return await self.inner.get(self.prefix + key, start, end)

    async def get_tail(self, key: str, length: int) -> bytes:
        return await self.inner.get_tail(self.prefix + key, length)

    async def size(self, key: str) -> int:
        return await self.inner.size(self.prefix + key)

    async def delete(self, keys: Iterable[str]) -> None:
        await self.inner.delete([self.prefix + key for key in keys])

    async def list(self, prefix: str = "") -> AsyncIterator[ObjectInfo]:
        async for info in self.inner.list(self.prefix + prefix):
            yield ObjectInfo(info.key[len(self.prefix) :], info.size)

    async def close(self) -> None:
        pass  # the inner store is the fixture's to close
