"""A proxy running on its own event loop in a background thread of this process.

Tests and benchmarks use it so that blocking clients (librdkafka, kafka-python) and
asyncio clients can both talk to it, and so a test can look inside it (metrics, the
bytes it sent to clients). `tierproxy run` is the same Proxy in a process of its own.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import uvloop

from proxy.config import ProxyConfig
from proxy.server.app import Proxy

T = TypeVar("T")


class ProxyThread:
    def __init__(self, config: ProxyConfig, tap: Callable[[bytes], None] | None = None) -> None:
        self.config = config
        self.tap = tap
        self.proxy: Proxy | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._stopped: asyncio.Event | None = None
        self._error: BaseException | None = None

    @property
    def bootstrap(self) -> str:
        assert self.proxy is not None
        return self.proxy.bootstrap

    def start(self, timeout: float = 30.0) -> ProxyThread:
        self._thread = threading.Thread(target=self._main, name="tierproxy", daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout):
            raise TimeoutError("proxy did not start in time")
        if self._error is not None:
            raise self._error
        return self

    def _main(self) -> None:
        uvloop.run(self._serve())

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stopped = asyncio.Event()
        try:
            self.proxy = Proxy(self.config)
            self.proxy.tap = self.tap
            await self.proxy.start()
        except BaseException as exc:
            self._error = exc
            self._ready.set()
            return
        self._ready.set()
        try:
            await self._stopped.wait()
        finally:
            await self.proxy.stop()

    def call(self, fn: Callable[[], object]) -> None:
        """Run fn on the proxy's loop (thread-safe)."""
        assert self._loop is not None
        self._loop.call_soon_threadsafe(fn)

    def run(self, make: Callable[[], Coroutine[Any, Any, T]], timeout: float = 60.0) -> T:
        """Run the coroutine `make()` returns on the proxy's loop; its result (thread-safe)."""
        assert self._loop is not None

        async def call() -> T:
            return await make()

        return asyncio.run_coroutine_threadsafe(call(), self._loop).result(timeout)

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def stop(self, timeout: float = 30.0) -> None:
        """Stop the proxy and wait for its thread; TimeoutError if it is still running."""
        if self._loop is not None and self._stopped is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._stopped.set)
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                raise TimeoutError(f"the proxy did not stop within {timeout} s")

    def __enter__(self) -> ProxyThread:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
